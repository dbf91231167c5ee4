"""Plans read through to the shared store, and where the store had none.

A conversation that another replica compacted has its plans in the store; ``PlanCache`` is the
read-through cache of this process. Most conversations never reach the threshold, so most have
no plan at all: reading the store for them on every request (a SQLite read through its reader
thread, a PostgreSQL round trip) costs more than everything else the pre-check does. So a read
that found nothing is remembered (``AbsentPlans``) and, for ``ABSENT_SECONDS``, the next requests
of the conversation do not read again.

What that may cost, and why it is bounded: a read before *reusing* is skipped, never the one
before *compacting anew* (``refresh``): a request about to make a plan always reads first, so a
plan another replica made is adopted rather than made twice (and no second summary call is
made). Skipping the read can only change what is forwarded when the store holds a plan for this
conversation that this process has not seen *and* this request is under the threshold without
it: the conversation moved to another replica, which compacted it, and came back within
``ABSENT_SECONDS`` while this replica judges it under the threshold (another calibration ratio,
a policy reloaded, a model with another window). The request then goes as the client sent it (a
valid request under the threshold) and the plan is picked up at the first read after that.

A store failure is not remembered as "none": it only costs the reuse, and the next request
reads again. Entries are dropped when this process learns of a plan for the conversation (it
stored one, or a read found one), and the whole map is bounded (LRU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy.core.bounded import Bounded
from proxy.core.compaction import Plan, PlanCache, prefix_hashes
from proxy.core.compaction.digest import Resent
from proxy.core.durable import InvalidWrite
from proxy.store import Store, StoreError

__all__ = ["ABSENT_SECONDS", "SCOPE_SEPARATOR", "AbsentPlans", "PlanReads", "anchor_of", "stored_as"]

log = logging.getLogger("context_proxy.compaction")

# How long "the store had no plan for this conversation" is trusted before it is read again.
ABSENT_SECONDS = 30.0
MAX_ABSENT = 10_000
ABSENT_BYTES = 420  # one entry: a (scope, anchor) key and a time (tests/test_bounded_caches.py)

SCOPE_SEPARATOR = "\x1f"


def stored_as(scope: str) -> tuple[str, str]:
    """The store tenant of a plan scope and the prefix of its keys there (per session)."""
    tenant, _, session = scope.partition(SCOPE_SEPARATOR)
    return tenant, f"{session}/" if session else ""


def anchor_of(messages: Any) -> str | None:
    """The conversation's anchor (``prefix_hashes(messages[:1])[1]``), ``None`` when the request
    has no plans to look for (fewer than two messages, or not JSON).

    A re-sent history (``Resent``) whose first message is the earlier request's object carries it
    in its digests: nothing is dumped or hashed again."""
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    known = messages.known if isinstance(messages, Resent) else None
    if known is not None and known.hashed and known.messages and known.messages[0] is messages[0]:
        return known.hashes[1]
    try:
        return prefix_hashes(messages[:1])[1]
    except (TypeError, ValueError):
        return None  # not JSON: compaction will not plan it either


class AbsentPlans:
    """``(scope, anchor)`` → when the store last had no plan for it; trusted for ``ttl`` seconds.

    Bounded (``absent_plans`` in the metrics): at most ``max_entries``, and entries older than
    ``ttl`` leave as new ones are noted (the oldest noted go first), so it holds about the
    conversations seen in the last ``ttl`` seconds. A miss costs one store read. One event loop."""

    def __init__(
        self,
        ttl: float = ABSENT_SECONDS,
        max_entries: int = MAX_ABSENT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 0 or max_entries < 1:
            raise ValueError("ttl must be >= 0 and max_entries >= 1")
        self.ttl = ttl
        self.clock = clock
        # ordered by when noted (``fresh`` does not reorder), so the expired ones are in front
        self.cache: Bounded[tuple[str, str], float] = Bounded(
            "absent_plans", max_entries, entry_bytes=ABSENT_BYTES
        )

    @property
    def max_entries(self) -> int:
        return self.cache.max_entries

    def __len__(self) -> int:
        return len(self.cache)

    def fresh(self, scope: str, anchor: str) -> bool:
        """The store had no plan for the conversation less than ``ttl`` seconds ago."""
        key = (scope, anchor)
        at = self.cache.peek(key)
        if at is None:
            return False
        if self.clock() - at < self.ttl:
            return True
        self.cache.pop(key)  # expired: the next read notes it again
        return False

    def note(self, scope: str, anchor: str) -> None:
        """The store has no plan for the conversation now."""
        now = self.clock()
        cache = self.cache
        while (oldest := cache.oldest()) is not None and now - oldest[1] >= self.ttl:
            cache.pop(oldest[0])  # expired: no longer trusted anyway
        cache.put((scope, anchor), now)

    def forget(self, scope: str, anchor: str) -> None:
        """The conversation has a plan (this process stored one, or a read found one)."""
        self.cache.pop((scope, anchor))


class PlanReads:
    """The read-through from ``plans`` (this process's cache) to the shared store."""

    def __init__(self, plans: PlanCache, absent: AbsentPlans | None = None) -> None:
        self.plans = plans
        self.absent = absent if absent is not None else AbsentPlans()
        self.reads = 0  # store reads made (for tests and the bench)

    async def prefetch(
        self, store: Store | None, scope: str, anchor: str | None, *, refresh: bool = False
    ) -> bool:
        """Read the conversation's plans from the store into the cache: when the cache holds
        none for it (and the store was not found empty just before), or with ``refresh`` (the
        request is about to compact: the plans another replica made since are read first, every
        time). True when a plan the cache lacked was added. A store failure only costs the reuse
        (logged)."""
        if store is None or anchor is None:
            return False
        known = {plan.prefix_hash for plan in self.plans.plans(scope, anchor)}
        if not refresh and (known or self.absent.fresh(scope, anchor)):
            return False
        tenant, salt = stored_as(scope)
        self.reads += 1
        try:
            stored = await store.plans_for(tenant, salt + anchor)
        except (StoreError, InvalidWrite) as exc:
            store.health.lost("compaction plans", exc, "compacted here without the stored plans")
            return False
        added = self._add(stored, scope, anchor, known)
        if added or known:
            self.absent.forget(scope, anchor)
        else:
            self.absent.note(scope, anchor)  # nothing this process can use
        return added

    def _add(self, stored: Sequence[str], scope: str, anchor: str, known: set[str]) -> bool:
        added = False
        for text in reversed(stored):  # shortest first: the cache keeps the longest ones
            try:
                plan = Plan.from_json(text)
            except ValueError:
                log.warning("[compact] a stored plan is malformed; ignored")
                continue
            if plan.tenant == scope and plan.anchor == anchor and plan.prefix_hash not in known:
                self.plans.put(plan, weight=len(text))
                added = True
        return added

    async def persist(self, store: Store | None, plan: Plan) -> None:
        """Store a new plan before answering, so the next turn may go to another replica."""
        if store is None:
            return
        self.absent.forget(plan.tenant, plan.anchor)
        mine = plan.to_json().decode()
        tenant, salt = stored_as(plan.tenant)
        try:
            stored = await store.put_plan(
                tenant, salt + plan.anchor, salt + plan.prefix_hash, plan.prefix_len, mine
            )
        except (StoreError, InvalidWrite) as exc:
            store.health.lost("compaction plans", exc, "a plan not shared")
            return
        if stored != mine:
            # Another replica stored a plan for this prefix first: from the next turn on, every
            # replica (this one included) forwards that one's view.
            try:
                self.plans.put(Plan.from_json(stored), weight=len(stored))
            except ValueError:
                log.warning("[compact] a stored plan is malformed; ignored")
