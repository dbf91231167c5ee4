"""The entry point: ``compact`` -> (``Done`` | ``NeedsSummary`` -> ``finish``).

Sans-I/O in two steps, because L4 needs a model call that only the edge can make::

    outcome = compact(request, policy, counter, plans, tenant)
    if isinstance(outcome, NeedsSummary):
        text = await call_the_model(outcome.summary_request)   # None on any failure
        result = finish(outcome.continuation, text)
    else:
        result = outcome.result

(``run_compaction`` does exactly that with a callable.) Order of work:

1. Count the request; compute the prefix hashes; look up the longest matching plan. With a plan,
   the starting view is ``plan view + the messages after its prefix``, else the client's messages.
2. Calibrated tokens of that view <= ``threshold``: done (``plan_status`` ``reused`` or ``none``).
3. Otherwise compact toward ``threshold * target_ratio``, lightest layer first, stopping as soon
   as the view is under that target: L1 truncate, L2 dedup, L3 prune (+ L4 summary of what L3
   cut, when ``policy.summarize``). A new plan for the prefix ``messages[0:n-1]`` is stored.
4. Still over ``hard_limit`` -> ``over_hard_limit``: the edge answers 400 without forwarding.

Never mutates its input; same input and same cache state give byte-identical output. The plan
cache and the token counter are the only state touched (memos).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.core.compaction.bridge import Bridge
from proxy.core.compaction.context import (
    LayerContext,
    calibrate,
    compaction_end,
    frozen_len,
    latest_assistant,
)
from proxy.core.compaction.dedup import dedup
from proxy.core.compaction.manifest import ManifestRecord, Removed, Summarized
from proxy.core.compaction.markers import cap_markers
from proxy.core.compaction.plan import LAYERS, Plan, PlanCache, prefix_hashes
from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.prune import Region, choose_region
from proxy.core.compaction.summarize import (
    SummaryRequest,
    clean_summary,
    render_region,
    summary_request,
)
from proxy.core.compaction.truncate import truncate
from proxy.core.compaction.view import Entry, FromClient, Message
from proxy.core.protocol import validate_messages
from proxy.core.tokens import TokenCounter

__all__ = [
    "CompactionInput",
    "CompactionOutcome",
    "CompactionResult",
    "Continuation",
    "Done",
    "NeedsSummary",
    "compact",
    "finish",
    "run_compaction",
]

PlanStatus = Literal["new", "reused", "none"]
SummaryStatus = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class CompactionInput:
    """The parsed client request (never mutated) and the model's calibration ratio."""

    system: object
    tools: object
    messages: Sequence[Message]
    model: str
    calibration: float = 1.0  # real / estimate; estimates are multiplied by it
    # With a session, each cut tool result's full text is named as an artifact of it (the edge
    # stores the bytes of ``artifact_of(...)``), and the truncation marker carries its pointer.
    artifact_session: str | None = None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The view to forward and what was done to get it. Token figures are calibrated."""

    messages: list[Message]
    tokens_before: int
    tokens_after: int
    layers: tuple[str, ...]
    plan_status: PlanStatus
    summary_status: SummaryStatus
    manifest: tuple[ManifestRecord, ...]
    compaction_id: str | None
    changed: bool
    over_hard_limit: bool
    plan: Plan | None  # the plan in effect (``new``: persist it; ``reused``: already known)


@dataclass(frozen=True, slots=True)
class _Run:
    request: CompactionInput
    policy: CompactionPolicy
    plans: PlanCache
    tenant: str
    ctx: LayerContext
    hashes: tuple[str, ...]
    tokens_before: int
    base: Plan | None  # the plan the starting view came from


@dataclass(frozen=True, slots=True)
class Continuation:
    """Everything ``finish`` needs after the summary call. Opaque to the edge."""

    run: _Run
    region: Region
    records: tuple[ManifestRecord, ...]
    applied: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Done:
    result: CompactionResult


@dataclass(frozen=True, slots=True)
class NeedsSummary:
    summary_request: SummaryRequest
    continuation: Continuation


CompactionOutcome = Done | NeedsSummary


def _unchanged(run: _Run) -> CompactionResult:
    return CompactionResult(
        messages=list(run.request.messages),
        tokens_before=run.tokens_before,
        tokens_after=run.tokens_before,
        layers=(),
        plan_status="none",
        summary_status="skipped",
        manifest=(),
        compaction_id=None,
        changed=False,
        over_hard_limit=run.tokens_before > run.policy.hard_limit,
        plan=None,
    )


def _output(run: _Run, entries: Sequence[Entry]) -> list[Message]:
    request = run.request
    stop = latest_assistant(entries)
    if stop < 0:
        stop = len(entries) - 1
    start = max(1, frozen_len(entries))
    return cap_markers(
        request.system,
        request.tools,
        [e.message for e in entries],
        start,
        min(stop, len(entries) - 1),
    )


def _finalize(
    run: _Run,
    entries: Sequence[Entry],
    records: Sequence[ManifestRecord],
    applied: Sequence[str],
    summary_status: SummaryStatus,
    bridge: Bridge | None,
) -> CompactionResult:
    """Build the result; store a new plan when this run changed the view."""
    n = len(run.request.messages)
    base = run.base
    if not applied:
        if base is None:
            return _unchanged(run)
        plan: Plan = base
        status: PlanStatus = "reused"
    else:
        last = entries[-1].item
        if not (isinstance(last, FromClient) and last.origin == n - 1 and last.blocks is None):
            raise AssertionError("compaction changed the last message")
        done = {*applied, *(base.layers if base is not None else ())}
        if bridge is None and base is not None:
            bridge = base.bridge
        plan = Plan(
            tenant=run.tenant,
            anchor=run.hashes[1],
            prefix_len=n - 1,
            prefix_hash=run.hashes[n - 1],
            items=tuple(e.item for e in entries[:-1]),
            layers=tuple(layer for layer in LAYERS if layer in done),
            manifest=(*(base.manifest if base is not None else ()), *records),
            bridge=None if bridge is None or bridge.empty else bridge,
            summary_status=summary_status,
        )
        run.plans.put(plan)
        status = "new"
    tokens_after = run.ctx.total(entries)
    return CompactionResult(
        messages=_output(run, entries),
        tokens_before=run.tokens_before,
        tokens_after=tokens_after,
        layers=plan.layers,
        plan_status=status,
        summary_status=summary_status if status == "new" else "skipped",
        manifest=plan.manifest,
        compaction_id=plan.compaction_id,
        changed=True,
        over_hard_limit=tokens_after > run.policy.hard_limit,
        plan=plan,
    )


def _keeps_frozen(plan: Plan, messages: Sequence[Message]) -> bool:
    """Whether the plan leaves the client's messages up to the last ``compaction`` block as
    they are (a plan made before the provider compacted does not)."""
    frozen = compaction_end(messages)
    if frozen > len(plan.items):
        return False
    return all(plan.items[i] == FromClient(i) for i in range(frozen))


def compact(
    request: CompactionInput,
    policy: CompactionPolicy,
    counter: TokenCounter,
    plans: PlanCache,
    tenant: str,
) -> CompactionOutcome:
    """Run L1-L3 as needed; ``NeedsSummary`` when L4 must call a model, else ``Done``."""
    messages = request.messages
    n = len(messages)
    count = counter.count_request(request.system, request.tools, messages)
    ratio = request.calibration
    ctx = LayerContext(
        messages, policy, counter, count.system + count.tools, ratio, request.artifact_session
    )
    hashes = prefix_hashes(messages) if n >= 2 else ()
    run = _Run(request, policy, plans, tenant, ctx, hashes, calibrate(count.total, ratio), None)
    if n < 2:
        return Done(_unchanged(run))
    base = plans.lookup(tenant, hashes[1], hashes, n - 1)
    if base is not None and not _keeps_frozen(base, messages):
        base = None  # a provider compaction block arrived after the plan: start afresh
    if base is not None:
        run = _Run(request, policy, plans, tenant, ctx, hashes, run.tokens_before, base)
        entries = [ctx.entry(item) for item in base.items]
        start = base.prefix_len
    else:
        if run.tokens_before <= policy.threshold:
            return Done(_unchanged(run))
        entries = []
        start = 0
    entries += [Entry(FromClient(i), messages[i], count.messages[i]) for i in range(start, n)]
    if ctx.total(entries) <= policy.threshold:
        return Done(_finalize(run, entries, (), (), "skipped", None))
    if validate_messages(list(messages)) is not None:
        return Done(_unchanged(run))  # never rewrite a conversation that is already broken

    applied: list[str] = []
    records: list[ManifestRecord] = []
    entries, truncated = truncate(entries, ctx)
    if truncated:
        applied.append("truncate")
        records.extend(truncated)
    if not ctx.under_target(entries):
        entries, removed = dedup(entries, ctx)
        if removed:
            applied.append("dedup")
            records.extend(removed)
    if not ctx.under_target(entries):
        region = choose_region(entries, ctx, base.bridge if base is not None else None)
        if region is not None:
            if policy.summarize:
                text = render_region(
                    region.previous, [e.message for e in region.removed], policy, ctx.text_tokens
                )
                return NeedsSummary(
                    summary_request(text, policy, request.model),
                    Continuation(run, region, tuple(records), tuple(applied)),
                )
            return Done(_pruned(run, region, records, applied, "skipped"))
    return Done(_finalize(run, entries, records, applied, "skipped", None))


def _fallback_bridge(region: Region) -> Bridge:
    previous = region.previous
    return Bridge(previous.summary if previous is not None else None, region.carried)


def _pruned(
    run: _Run,
    region: Region,
    records: Sequence[ManifestRecord],
    applied: Sequence[str],
    status: SummaryStatus,
) -> CompactionResult:
    bridge = _fallback_bridge(region)
    record = Removed(region.message_indices, region.tool_use_ids, region.removed_tokens, "prune")
    return _finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*records, record],
        [*applied, "prune"],
        status,
        bridge,
    )


def finish(continuation: Continuation, summary_text: str | None) -> CompactionResult:
    """Complete a compaction with the summariser's answer.

    ``None``, empty or whitespace-only text means the call failed: the L1-L3 view stands (the
    region is dropped, a previous summary and the carried user texts stay in the bridge) and
    ``summary_status`` is ``failed``. No error text ever enters the conversation.
    """
    run = continuation.run
    region = continuation.region
    summary = clean_summary(summary_text, run.policy, run.ctx.text_tokens)
    if summary is None:
        return _pruned(run, region, continuation.records, continuation.applied, "failed")
    bridge = Bridge(summary, region.carried)
    record = Summarized(
        region.message_indices,
        region.tool_use_ids,
        region.removed_tokens,
        run.ctx.text_tokens(summary),
    )
    return _finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*continuation.records, record],
        [*continuation.applied, "summarize"],
        "ok",
        bridge,
    )


async def run_compaction(
    request: CompactionInput,
    policy: CompactionPolicy,
    counter: TokenCounter,
    plans: PlanCache,
    tenant: str,
    summarize: Callable[[SummaryRequest], Awaitable[str | None]],
) -> CompactionResult:
    """``compact``, the summary call when one is needed, ``finish``.

    ``summarize`` returns ``None`` (or empty text) on failure; exceptions it raises propagate.
    """
    outcome = compact(request, policy, counter, plans, tenant)
    if isinstance(outcome, Done):
        return outcome.result
    text = await summarize(outcome.summary_request)
    return finish(outcome.continuation, text)
