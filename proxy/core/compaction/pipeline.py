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

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from proxy.core.compaction.context import LayerContext, calibrate, compaction_end
from proxy.core.compaction.dedup import dedup
from proxy.core.compaction.digest import digests
from proxy.core.compaction.manifest import ManifestRecord, Truncated
from proxy.core.compaction.outcome import (
    CompactionInput,
    CompactionOutcome,
    CompactionResult,
    Continuation,
    Done,
    NeedsNaming,
    NeedsSummary,
    Run,
    finalize,
    output,
    unchanged,
    view_of,
)
from proxy.core.compaction.plan import Plan, PlanCache, PlanView
from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.provider import CompactionCall
from proxy.core.compaction.prune import Region, choose_region, window_start
from proxy.core.compaction.steps import after_region, finish, named, step
from proxy.core.compaction.summarize import SummaryRequest
from proxy.core.compaction.truncate import truncate
from proxy.core.compaction.view import Entry, FromClient, Inserted, Message, materialize
from proxy.core.event_keys import message_key
from proxy.core.protocol import validate_messages
from proxy.core.tokens import RequestCount, TokenCounter

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


def _reused(
    run: Run,
    plan: Plan,
    view: PlanView,
    messages: Sequence[Message],
    marked: Sequence[bool],
    frozen: int,
    tokens_after: int,
) -> CompactionResult:
    """``finalize`` of a reused plan whose view (``messages``, ``frozen`` its compaction end)
    is under the threshold, without building entries or walking the view."""
    return CompactionResult(
        messages=output(run, messages, marked, frozen),
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
    run: Run, plan: Plan, view: PlanView | None, count: RequestCount, client_frozen: int
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
        view = view_of(run, entries, client_frozen, plan.compaction_id)
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
    run = Run(
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
        return Done(unchanged(run))
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
            return Done(unchanged(run))
        entries = []
        start = 0
    entries += [Entry(FromClient(i), messages[i], count.messages[i]) for i in range(start, n)]
    if ctx.total(entries) <= policy.threshold:
        return Done(finalize(run, entries, (), (), "skipped", None))
    if validate_messages(list(messages)) is not None:
        return Done(unchanged(run))  # never rewrite a conversation that is already broken

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
            if policy.summarize and policy.summary_mode == "provider":
                indices = (*region.head_indices, *indices)  # the provider compacts the head too
            keys = tuple(message_key(i, messages[i], hashes) for i in indices)
            return NeedsNaming(indices, keys, continuation)
        return after_region(continuation)
    return Done(finalize(run, entries, records, applied, "skipped", None))


async def run_compaction(
    request: CompactionInput,
    policy: CompactionPolicy,
    counter: TokenCounter,
    plans: PlanCache,
    tenant: str,
    summarize: Callable[[SummaryRequest | CompactionCall], Awaitable[str | None]],
) -> CompactionResult:
    """``compact``, the summary call when one is needed, ``finish``.

    ``summarize`` returns ``None`` (or empty text) on failure; exceptions it raises propagate.
    For a ``CompactionCall`` (``summary_mode: provider``) it answers the block's JSON text
    (``provider.block_of_answer``), or ``None`` to fall back to the proxy's summary."""
    outcome = compact(request, policy, counter, plans, tenant)
    while not isinstance(outcome, Done):
        if isinstance(outcome, NeedsNaming):  # offline: nothing is recorded, nothing named
            outcome = named(outcome.continuation, {})
            continue
        text = await summarize(outcome.summary_request)
        outcome = step(outcome.continuation, text)
    return outcome.result
