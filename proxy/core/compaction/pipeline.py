"""The entry point: ``compact`` -> (``Done`` | ``NeedsSummary`` -> ``step`` ...).

Sans-I/O in steps, because L4 needs model calls that only the edge can make (one, or a bounded
chain of them when what is removed is over the summariser's input budget), and naming the removed
turns needs the transcript's event numbers, which only the store knows::

    outcome = compact(request, policy, counter, plans, tenant)
    while not isinstance(outcome, Done):
        if isinstance(outcome, NeedsNaming):       # only with request.transcript not looked up
            seqs = await store_lookup(outcome.keys)  # event key -> sequence number
            outcome = named(outcome.continuation, outcome.sequences(seqs))
        else:
            text = await call_the_model(outcome.summary_request)   # None on any failure
            outcome = step(outcome.continuation, text)
    result = outcome.result

(``run_compaction`` does exactly that with a callable.) Order of work:

1. Dump each message once (canonical JSON): that serves the token count (message memo) and the
   prefix hashes (``digest``; a ``Resent`` list carries them for the messages an earlier request
   already had, and only the new ones are dumped). Look up the longest matching plan. With a
   plan, the starting view is ``plan view + the messages after its prefix``, else the client's
   messages. The plan's ``PlanView`` (kept with it in the cache) spares a reused request any
   walk over the history: its items are taken by reference from the request, and only edited
   items whose message carries a ``cache_control`` marker are rebuilt and recounted.
2. Calibrated tokens of that view <= ``threshold``: done (``plan_status`` ``reused`` or ``none``).
3. Otherwise compact toward ``threshold * target_ratio``, lightest layer first, stopping as soon
   as the view is under that target: L1 truncate, L2 dedup, L3 prune (+ L4 summary of what L3
   cut, when ``policy.summarize``). A new plan for the prefix ``messages[0:n-1]`` is stored.
4. Still over ``hard_limit`` -> ``over_hard_limit``: the edge answers 400 without forwarding.

Never mutates its input; same input and same cache state give byte-identical output. The plan
cache and the token counter are the only state touched (memos).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from proxy.core.compaction.bridge import Bridge, TranscriptNaming, TranscriptRange
from proxy.core.compaction.context import (
    LayerContext,
    calibrate,
    compaction_end,
    frozen_len,
)
from proxy.core.compaction.dedup import dedup
from proxy.core.compaction.digest import Digests, digests
from proxy.core.compaction.manifest import ManifestRecord, Removed, Summarized, Truncated
from proxy.core.compaction.markers import cap_markers
from proxy.core.compaction.plan import (
    LAYERS,
    Plan,
    PlanCache,
    PlanView,
)
from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.prune import Region, choose_region, window_start
from proxy.core.compaction.summarize import (
    SummaryPlan,
    SummaryRequest,
    clean_summary,
    plan_summary,
    summary_request,
)
from proxy.core.compaction.truncate import truncate
from proxy.core.compaction.view import (
    Entry,
    FromClient,
    Inserted,
    Message,
    materialize,
    role_of,
)
from proxy.core.event_keys import message_key
from proxy.core.protocol import validate_messages
from proxy.core.tokens import Canonical, RequestCount, TokenCounter

__all__ = [
    "CompactionInput",
    "CompactionOutcome",
    "CompactionResult",
    "Continuation",
    "Done",
    "NeedsNaming",
    "NeedsSummary",
    "compact",
    "finish",
    "named",
    "run_compaction",
    "step",
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
    # With a session whose transcript holds these messages, the bridge names the removed turns
    # by their transcript pointers (the model can read them back: context_proxy_retrieve).
    transcript: TranscriptNaming | None = None
    # the canonical JSON of (some of) ``messages`` when the edge made it already
    canonical: Canonical | None = None


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
    # of the request's messages: a later request that re-uses these message objects (a
    # ``Resent`` list) takes them instead of hashing its history again
    digests: Digests | None = None
    # summariser calls this request's compaction made (0 unless ``plan_status`` is ``new``)
    summary_calls: int = 0


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
    # per client message: False when it certainly holds no cache_control marker (a view message
    # made from it then holds none either)
    marked: tuple[bool, ...]
    digests: Digests


@dataclass(frozen=True, slots=True)
class Continuation:
    """Everything ``step`` / ``finish`` need after a summary call. Opaque to the edge."""

    run: _Run
    region: Region
    records: tuple[ManifestRecord, ...]
    applied: tuple[str, ...]
    summary: SummaryPlan | None = None  # the chain of calls (None: one call, no plan kept)
    index: int = 0  # the call this continuation waits for (0-based)

    @property
    def calls(self) -> int:
        """Calls of the whole chain."""
        return self.summary.calls if self.summary is not None else 1

    @property
    def origins(self) -> tuple[int, ...]:
        """The client message indices the awaited call's text renders."""
        return self.summary.origins[self.index] if self.summary is not None else ()


@dataclass(frozen=True, slots=True)
class Done:
    result: CompactionResult


@dataclass(frozen=True, slots=True)
class NeedsSummary:
    summary_request: SummaryRequest
    continuation: Continuation


@dataclass(frozen=True, slots=True)
class NeedsNaming:
    """The removed messages (client indices) and their transcript event keys
    (``proxy.core.event_keys``): the edge looks up which sequence numbers the conversation's
    transcript gave them, and continues with ``named``."""

    indices: tuple[int, ...]
    keys: tuple[str, ...]  # one per index
    continuation: Continuation

    def sequences(self, found: Mapping[str, int]) -> dict[int, int]:
        """``found`` (event key -> sequence number, as the store answered) by message index."""
        return {i: found[k] for i, k in zip(self.indices, self.keys, strict=True) if k in found}


CompactionOutcome = Done | NeedsSummary | NeedsNaming


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
        digests=run.digests,
    )


def _output(
    run: _Run, messages: Sequence[Message], marked: Sequence[bool], frozen: int
) -> list[Message]:
    """The view's messages as forwarded: markers capped. ``marked``: per view message, whether it
    may hold a marker; ``frozen``: ``compaction_end`` of the view."""
    request = run.request
    stop = len(messages) - 1
    while stop >= 0 and role_of(messages[stop]) != "assistant":
        stop -= 1
    if stop < 0:
        stop = len(messages) - 1
    return cap_markers(
        request.system,
        request.tools,
        messages,
        max(1, frozen),
        min(stop, len(messages) - 1),
        marked,
    )


def _marked(run: _Run, item: object) -> bool:
    """Whether the view message of ``item`` may hold a marker (only its source's can)."""
    return not isinstance(item, FromClient) or run.marked[item.origin]


def _view_of(
    run: _Run, entries: Sequence[Entry], client_frozen: int, compaction_id: str
) -> PlanView:
    """The ``PlanView`` of a plan whose items are ``entries`` (made from this request)."""
    tokens = tuple(
        [
            None
            if isinstance(e.item, FromClient)
            and (e.item.blocks is None or run.marked[e.item.origin])
            else e.tokens
            for e in entries
        ]
    )
    return PlanView(tokens, frozen_len(entries), client_frozen, compaction_id)


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
        client_frozen = compaction_end(run.request.messages[: n - 1])
        run.plans.put(plan, _view_of(run, entries[:-1], client_frozen, plan.compaction_id))
        status = "new"
    tokens_after = run.ctx.total(entries)
    return CompactionResult(
        messages=_output(
            run,
            [e.message for e in entries],
            [_marked(run, e.item) for e in entries],
            frozen_len(entries),
        ),
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
        digests=run.digests,
    )


def _reused(
    run: _Run,
    plan: Plan,
    view: PlanView,
    messages: Sequence[Message],
    marked: Sequence[bool],
    frozen: int,
    tokens_after: int,
) -> CompactionResult:
    """``_finalize`` of a reused plan whose view (``messages``, ``frozen`` its compaction end)
    is under the threshold, without building entries or walking the view."""
    return CompactionResult(
        messages=_output(run, messages, marked, frozen),
        tokens_before=run.tokens_before,
        tokens_after=tokens_after,
        layers=plan.layers,
        plan_status="reused",
        summary_status="skipped",
        manifest=plan.manifest,
        compaction_id=view.compaction_id,
        changed=True,
        over_hard_limit=tokens_after > run.policy.hard_limit,
        plan=plan,
        digests=run.digests,
    )


def _keeps_frozen(plan: Plan, frozen: int) -> bool:
    """Whether the plan leaves the client's messages up to the last ``compaction`` block (the
    first ``frozen``) as they are (a plan made before the provider compacted does not)."""
    if frozen > len(plan.items):
        return False
    return all(plan.items[i] == FromClient(i) for i in range(frozen))


def _frozen(
    plan: Plan,
    view: PlanView | None,
    messages: Sequence[Message],
    maybe: Sequence[bool] | None,
) -> tuple[int, int]:
    """``compaction_end`` of ``messages`` and of the plan's prefix ``messages[:prefix_len]``.

    The prefix is the one the plan's view was made from: only the messages after it are
    searched when the view knows its end. ``maybe``: per message, whether its canonical JSON
    shows ``"compaction"`` (``None``: walk everything, as ever)."""
    start = plan.prefix_len
    tail = compaction_end(messages[start:], maybe=None if maybe is None else maybe[start:])
    if view is not None and maybe is not None:
        prefix = view.client_frozen
    elif tail and view is not None:
        prefix = 0  # not needed: the end is in the tail, and the view exists
    else:
        prefix = compaction_end(messages[:start], maybe=None if maybe is None else maybe[:start])
    return (start + tail if tail else prefix), prefix


ViewMessage = tuple[FromClient | Inserted, Message, int, bool]  # item, message, tokens, marked


def _plan_part(
    run: _Run, plan: Plan, view: PlanView | None, count: RequestCount, client_frozen: int
) -> tuple[list[ViewMessage], PlanView]:
    """The plan's items materialised for this request: ``(item, message, tokens, marked)`` each,
    and the plan's view (``view``, or a new one when the plan had none yet; ``client_frozen``:
    ``compaction_end`` of the plan's prefix in this request).

    Whole client messages are taken by reference with the tokens the request count found;
    inserted messages and edited messages whose source holds no marker take the view's tokens;
    the rest (edited messages with markers, or no view yet) are counted."""
    messages = run.request.messages
    marked = run.marked
    ctx = run.ctx
    cached = view.tokens if view is not None else (None,) * len(plan.items)
    out: list[ViewMessage] = []
    for item, tokens in zip(plan.items, cached, strict=True):
        if isinstance(item, Inserted):
            message = item.message
            if tokens is None:
                tokens = ctx.counter.count_message(message)
            out.append((item, message, tokens, True))
            continue
        origin = item.origin
        if item.blocks is None:
            out.append((item, messages[origin], count.messages[origin], marked[origin]))
            continue
        message = materialize(item, messages)
        if tokens is None or marked[origin]:
            tokens = ctx.counter.count_message(message)
        out.append((item, message, tokens, marked[origin]))
    if view is None:
        entries = [Entry(item, message, tokens) for item, message, tokens, _ in out]
        view = _view_of(run, entries, client_frozen, plan.compaction_id)
    return out, view


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
    # one canonical dump per message (none for messages whose digests a ``Resent`` list
    # carries) serves the token memo, the prefix hashes and the searches for markers and
    # compaction blocks (which walk the blocks only of messages that may have one)
    dg = digests(messages, hashed=n >= 2, made=request.canonical)
    count = counter.count_request(
        request.system, request.tools, messages, keys=dg.keys, same_objects=True
    )
    ratio = request.calibration
    ctx = LayerContext(
        messages, policy, counter, count.system + count.tools, ratio, request.artifact_session
    )
    hashes = dg.hashes
    plain = all([isinstance(m, dict) for m in messages])  # else: walk everything, as ever
    marked = dg.marked if plain else (True,) * n
    run = _Run(
        request=request,
        policy=policy,
        plans=plans,
        tenant=tenant,
        ctx=ctx,
        hashes=hashes,
        tokens_before=calibrate(count.total, ratio),
        base=None,
        marked=marked,
        digests=dg,
    )
    if n < 2:
        return Done(_unchanged(run))
    found = plans.match(tenant, hashes[1], hashes, n - 1)
    frozen = client_frozen = 0
    if found is not None:
        frozen, client_frozen = _frozen(*found, messages, dg.compaction if plain else None)
        if not _keeps_frozen(found[0], frozen):
            found = None  # a provider compaction block arrived after the plan: start afresh
    if found is not None:
        base, view = found
        run = replace(run, base=base)
        part, made = _plan_part(run, base, view, count, client_frozen)
        if made is not view:
            plans.attach(base, made)
        start = base.prefix_len
        view_messages = [m for _, m, _, _ in part]
        view_messages += messages[start:]
        tokens_after = ctx.calibrated_total(
            sum([t for _, _, t, _ in part]) + sum(count.messages[start:])
        )
        if tokens_after <= policy.threshold:
            view_marked = [k for _, _, _, k in part]
            view_marked += marked[start:]
            # the view's compaction end: in the new messages, else in the plan's items
            view_frozen = len(part) + frozen - start if frozen > start else made.frozen
            return Done(
                _reused(run, base, made, view_messages, view_marked, view_frozen, tokens_after)
            )
        entries = [Entry(item, m, t) for item, m, t, _ in part]
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
    # L1 spares the recent window first: pruning (and the summary) may make cutting it needless
    entries, truncated = truncate(entries, ctx, stop=window_start(entries, policy.keep_recent))
    records.extend(truncated)
    if not ctx.under_target(entries):
        entries, removed = dedup(entries, ctx)
        if removed:
            applied.append("dedup")
            records.extend(removed)
    region: Region | None = None
    if not ctx.under_target(entries):
        region = choose_region(entries, ctx, run.base.bridge if run.base is not None else None)
    if region is not None and ctx.calibrated_total(region.kept_tokens) > policy.target:
        # the cut alone is not enough: now L1 cuts inside the kept window too
        rest = list(region.rest)
        outside = region.kept_tokens - sum(e.tokens for e in rest)
        rest, late = truncate(rest, ctx, extra=outside)
        if late:
            kept = outside + sum(e.tokens for e in rest)
            region = replace(region, rest=tuple(rest), kept_tokens=kept)
            records.extend(late)
    elif region is None and not ctx.under_target(entries):
        entries, late = truncate(entries, ctx)
        records.extend(late)
    if any(isinstance(r, Truncated) for r in records):
        applied.insert(0, "truncate")
    if region is not None:
        continuation = Continuation(run, region, tuple(records), tuple(applied))
        naming = request.transcript
        if naming is not None and naming.sequences is None:
            indices = tuple(region.message_indices)
            keys = tuple(message_key(i, messages[i], hashes) for i in indices)
            return NeedsNaming(indices, keys, continuation)
        return _after_region(continuation)
    return Done(_finalize(run, entries, records, applied, "skipped", None))


def _after_region(continuation: Continuation) -> CompactionOutcome:
    """What follows once the region to remove is chosen (and its turns named): the summary
    call, or the pruned view."""
    run, region = continuation.run, continuation.region
    policy, ctx = run.policy, run.ctx
    if policy.summarize and ctx.calibrated_total(region.kept_tokens) <= policy.hard_limit:
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
    return Done(_pruned(run, region, continuation.records, continuation.applied, "skipped"))


def named(continuation: Continuation, sequences: Mapping[int, int]) -> CompactionOutcome:
    """Continue a ``NeedsNaming`` with the sequence numbers found (by message index; a message
    the transcript does not hold is left out, and not named)."""
    run = continuation.run
    naming = run.request.transcript
    if naming is None:
        return _after_region(continuation)
    resolved = replace(naming, sequences=tuple(sorted(sequences.items())))
    run = replace(run, request=replace(run.request, transcript=resolved))
    return _after_region(replace(continuation, run=run))


def _removed_range(run: _Run, region: Region) -> TranscriptRange | None:
    naming = run.request.transcript
    return None if naming is None else naming.range_of(region.message_indices, region.previous)


def _fallback_bridge(run: _Run, region: Region) -> Bridge:
    previous = region.previous
    summary = previous.summary if previous is not None else None
    return Bridge(summary, region.carried, _removed_range(run, region))


def _pruned(
    run: _Run,
    region: Region,
    records: Sequence[ManifestRecord],
    applied: Sequence[str],
    status: SummaryStatus,
) -> CompactionResult:
    bridge = _fallback_bridge(run, region)
    record = Removed(region.message_indices, region.tool_use_ids, region.removed_tokens, "prune")
    return _finalize(
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
    run = continuation.run
    region = continuation.region
    calls = continuation.index + 1
    summary = clean_summary(summary_text, run.policy, run.ctx.text_tokens)
    if summary is None:
        failed = _pruned(run, region, continuation.records, continuation.applied, "failed")
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
    result = _finalize(
        run,
        region.assemble(bridge, run.ctx),
        [*continuation.records, record],
        [*continuation.applied, "summarize"],
        "ok",
        bridge,
    )
    return Done(replace(result, summary_calls=calls))


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
    while not isinstance(outcome, Done):
        if isinstance(outcome, NeedsNaming):  # offline: nothing is recorded, nothing named
            outcome = named(outcome.continuation, {})
            continue
        text = await summarize(outcome.summary_request)
        outcome = step(outcome.continuation, text)
    return outcome.result
