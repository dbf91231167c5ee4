"""Forward a request that cannot reach the compaction threshold at once; count it meanwhile.

The exact estimate of a request tokenises what the counter has not seen: its new messages. A
request whose bound (``proxy.core.compaction.bound``) is under the threshold (and under the
hard limit) for a conversation without a plan gets nothing compacted whatever the exact figure:
the edge forwards the client's bytes straight away and the exact count runs while the provider
works. Up to ``LOOP_BYTES`` new (an agent's usual turn) it runs on the event loop once the
request is on its way, which the loop would otherwise spend waiting: a worker thread would
contend for the GIL with the loop while it sends the request (measured: 0.26 ms more per turn
on the real session, bench/README.md). More than that goes to a worker thread (the tokenizer
releases the GIL): the loop never stalls long. A request with few new bytes (``DEFER_BYTES``)
is counted on the spot: the bound would cost more than the count.
``CompactionService.settle`` then reports it (the ``x-compaction-*`` headers, the ledger row, calibration) exactly as if it had
been counted first: it is the same ``compact`` call, on a plan cache that holds no plan, which is
what the cache held for the conversation when the request was checked.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from proxy.core.compaction import (
    CompactionInput,
    CompactionOutcome,
    CompactionPolicy,
    PlanCache,
    compact,
)
from proxy.core.compaction.bound import tokens_at_most
from proxy.core.compaction.context import calibrate
from proxy.core.compaction.digest import Digests, Resent, digests
from proxy.core.tokens import TokenCounter

__all__ = ["Counting", "count_while_forwarding", "with_digests"]

# Never written: a request under the threshold matches no plan and makes none.
_NO_PLANS = PlanCache(1)
# Fewer new bytes than this are counted on the spot: working out the bound costs more
DEFER_BYTES = 1 << 10
# Up to this many new bytes are counted on the event loop once the request is sent (tokenising
# ~160 us a KiB of an agent's JSON here: ~1.3 ms at most), more in a worker thread
LOOP_BYTES = 8 << 10


@dataclass(frozen=True, slots=True)
class Counting:
    """The exact count of a forwarded request, under way."""

    task: asyncio.Future[CompactionOutcome]
    ratio: float  # the calibration it is counted with


def with_digests(request: CompactionInput) -> tuple[Digests | None, CompactionInput]:
    """The digests of ``request``'s messages, made once (from the edge's canonical JSON where
    it made some), and the request carrying them (a ``Resent`` list: ``compact`` takes them
    instead of making them again, and ``plan_reads.anchor_of`` reads the anchor there).
    ``None`` and ``request`` as it is when a message is not JSON: ``compact`` says what it
    does with it."""
    messages = request.messages
    try:
        dg = digests(messages, hashed=len(messages) >= 2, made=request.canonical)
    except (TypeError, ValueError):
        return None, request
    return dg, replace(request, messages=Resent(messages, dg))


def count_while_forwarding(
    request: CompactionInput,
    dg: Digests | None,
    policy: CompactionPolicy,
    counter: TokenCounter,
    plans: PlanCache,
    scope: str,
    anchor: str | None,
) -> Counting | None:
    """The count under way (on the loop once the request is sent, or in a worker thread: see
    the module) when ``request`` (carrying ``dg``, its digests: ``with_digests``) cannot reach
    the threshold and its conversation has no plan; ``None`` otherwise: the caller compacts
    ``request`` as ever. Call it from the request's handler task just before it forwards (the
    loop-side count starts at the handler's next suspension)."""
    messages = request.messages
    if dg is None or (anchor is None and len(messages) >= 2):
        return None  # not JSON all through: compact() says what it does with it
    if anchor is not None and plans.plans(scope, anchor):
        return None  # a plan's view is forwarded even under the threshold
    if sum([len(c) for c in dg.fresh if c is not None]) < DEFER_BYTES:
        return None  # few bytes new since the conversation's previous request
    bound = tokens_at_most(request.system, request.tools, messages, dg, counter)
    if bound is None or bound.new_bytes < DEFER_BYTES:
        return None
    if calibrate(bound.tokens, request.calibration) > min(policy.threshold, policy.hard_limit):
        return None
    if bound.new_bytes > LOOP_BYTES:
        task = asyncio.ensure_future(
            asyncio.to_thread(compact, request, policy, counter, _NO_PLANS, scope)
        )
        return Counting(task, request.calibration)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[CompactionOutcome] = loop.create_future()

    def count() -> None:
        if done.cancelled():
            return
        try:
            done.set_result(compact(request, policy, counter, _NO_PLANS, scope))
        except Exception as exc:  # reported by whoever awaits it (settle)
            done.set_exception(exc)

    # The handler's next suspension is in ``Forwarder.open``, once the request's head is
    # written; aiohttp writes the body in a task it schedules then. Two turns of the loop's
    # ready queue start the count after both, while the provider works on the request.
    loop.call_soon(loop.call_soon, count)
    return Counting(done, request.calibration)
