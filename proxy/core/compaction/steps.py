"""After the region to remove is chosen: naming its turns, the summary, the provider's compaction.

``compact`` (``pipeline``) answers ``NeedsNaming`` (the removed turns' transcript events, looked
up by the edge) or ``NeedsSummary`` (a model call the edge makes); the functions here continue
from the edge's answer to the next step or the finished compaction. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from proxy.core.compaction.bridge import Bridge, TranscriptRange, carry_texts
from proxy.core.compaction.manifest import ManifestRecord, Removed, Summarized
from proxy.core.compaction.outcome import (
    CompactionOutcome,
    CompactionResult,
    Continuation,
    Done,
    NeedsSummary,
    Run,
    SummaryStatus,
    finalize,
)
from proxy.core.compaction.provider import compaction_call, parse_block
from proxy.core.compaction.prune import Region, typed_user_texts
from proxy.core.compaction.summarize import clean_summary, plan_summary, summary_request

__all__ = ["after_region", "finish", "named", "step"]


def after_region(continuation: Continuation) -> CompactionOutcome:
    """What follows once the region to remove is chosen (and its turns named): the summary
    call, or the pruned view."""
    run, region = continuation.run, continuation.region
    policy, ctx = run.policy, run.ctx
    if policy.summarize and ctx.calibrated_total(region.kept_tokens) <= policy.hard_limit:
        if policy.summary_mode == "provider" and not continuation.provider_failed:
            call = compaction_call(
                run.request.model,
                policy.summary_max_tokens,
                run.request.system,
                run.request.tools,
                [e.message for e in (*region.head, *region.span)],
            )
            return NeedsSummary(call, replace(continuation, provider=True))
        chain = plan_summary(
            region.previous,
            [(e.origin, e.message) for e in region.removed if e.origin is not None],
            policy,
            ctx.text_tokens,
        )
        return NeedsSummary(
            summary_request(chain.text(0, None), policy, run.request.model),
            replace(continuation, summary=chain),
        )
    # no summary call for a view that would be refused anyway (over the hard limit even
    # with the summary): the pruned view, which is smaller, is all there is
    return Done(pruned(run, region, continuation.records, continuation.applied, "skipped"))


def named(continuation: Continuation, sequences: Mapping[int, int]) -> CompactionOutcome:
    """Continue a ``NeedsNaming`` with the sequence numbers found (by message index; a message
    the transcript does not hold is left out, and not named)."""
    run = continuation.run
    naming = run.request.transcript
    if naming is None:
        return after_region(continuation)
    resolved = replace(naming, sequences=tuple(sorted(sequences.items())))
    run = replace(run, request=replace(run.request, transcript=resolved))
    return after_region(replace(continuation, run=run))


def _removed_range(run: Run, region: Region) -> TranscriptRange | None:
    naming = run.request.transcript
    return None if naming is None else naming.range_of(region.message_indices, region.previous)


def _fallback_bridge(run: Run, region: Region) -> Bridge:
    previous = region.previous
    summary = previous.summary if previous is not None else None
    return Bridge(summary, region.carried, _removed_range(run, region))


def pruned(
    run: Run,
    region: Region,
    records: Sequence[ManifestRecord],
    applied: Sequence[str],
    status: SummaryStatus,
) -> CompactionResult:
    bridge = _fallback_bridge(run, region)
    record = Removed(region.message_indices, region.tool_use_ids, region.removed_tokens, "prune")
    return finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*records, record],
        [*applied, "prune"],
        status,
        bridge,
    )


def step(continuation: Continuation, summary_text: str | None) -> CompactionOutcome:
    """Feed the summariser's answer to the awaited call: the next call of the chain
    (``NeedsSummary``), or the finished compaction (``Done``).

    ``None``, empty or whitespace-only text means the call failed, wherever it is in the chain:
    the L1-L3 view stands (the region is dropped, a previous summary and the carried user texts
    stay in the bridge) and ``summary_status`` is ``failed``. No error text ever enters the
    conversation, and no half-made chain's summary either.
    """
    if continuation.provider:
        return _compacted(continuation, summary_text)
    run = continuation.run
    region = continuation.region
    calls = continuation.index + 1 + continuation.earlier_calls
    summary = clean_summary(summary_text, run.policy, run.ctx.text_tokens)
    if summary is None:
        failed = pruned(run, region, continuation.records, continuation.applied, "failed")
        return Done(replace(failed, summary_calls=calls))
    chain = continuation.summary
    if chain is not None and calls < chain.calls:
        nxt = replace(continuation, index=calls)
        return NeedsSummary(
            summary_request(chain.text(calls, summary), run.policy, run.request.model), nxt
        )
    bridge = Bridge(summary, region.carried, _removed_range(run, region))
    record = Summarized(
        region.message_indices,
        region.tool_use_ids,
        region.removed_tokens,
        run.ctx.text_tokens(summary),
        calls,
    )
    result = finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*continuation.records, record],
        [*continuation.applied, "summarize"],
        "ok",
        bridge,
    )
    return Done(replace(result, summary_calls=calls))


def _compacted(continuation: Continuation, block_text: str | None) -> CompactionOutcome:
    """The provider's compaction answered (``block_text``: its block, or ``None``): its block
    leads the view, or the proxy's own summary is asked for instead (``provider``)."""
    block = parse_block(block_text)
    if block is None:
        return after_region(
            replace(continuation, provider=False, provider_failed=True, earlier_calls=1)
        )
    run, region = continuation.run, continuation.region
    base = run.base.bridge if run.base is not None else None
    previous = base if base is not None and base.compaction is not None else region.previous
    indices = (*region.head_indices, *region.message_indices)
    head_texts = [t for e in region.head if e.origin is not None for t in typed_user_texts(e.message)]
    older = (*(previous.carried if previous is not None else ()), *head_texts)
    carried = carry_texts(older, region.carried, run.policy.carried_text_cap, run.ctx.text_tokens)
    naming = run.request.transcript
    named = None if naming is None else naming.range_of(indices, previous)
    bridge = Bridge(None, carried, named, block)
    head_tokens = sum(e.tokens for e in region.head)
    record = Summarized(
        indices,
        region.tool_use_ids,
        region.removed_tokens + head_tokens,
        run.ctx.text_tokens(str(block["content"])),
        1,
    )
    result = finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*continuation.records, record],
        [*continuation.applied, "summarize"],
        "ok",
        bridge,
    )
    return Done(replace(result, summary_calls=1))


def finish(continuation: Continuation, summary_text: str | None) -> CompactionResult:
    """``step`` for the last call of a chain (or a failed one): the finished compaction.

    Raises ``ValueError`` when the chain still has calls to make (use ``step``)."""
    outcome = step(continuation, summary_text)
    if not isinstance(outcome, Done):
        raise ValueError(
            f"the summary chain has {continuation.calls - continuation.index - 1} more call(s):"
            " use step()"
        )
    return outcome.result
