"""The session store's interface: an async :class:`Store` protocol over backend-neutral values.

Every method takes the tenant first; nothing a method returns or changes crosses tenants. A
backend (``proxy.store.sqlite``, ``proxy.store.postgres``: one query layer, ``proxy.store.sql``)
implements the protocol; callers never see SQL, a connection or a backend's exceptions. The errors
(``proxy.store.errors``) and values (``proxy.store.values``) the protocol speaks in are named here
too, as its callers import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol

from proxy.core.durable import Change, DurableState
from proxy.core.ledger import LedgerEntry
from proxy.core.quota import Counter
from proxy.store.agents import AgentRecord
from proxy.store.checks import DEFAULT_EVENT_LIMIT, DEFAULT_PLAN_LIMIT
from proxy.store.errors import (
    DuplicateEvent,
    ManifestConflict,
    PrefixConflict,
    SchemaTooNew,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)
from proxy.store.folding import StateCache
from proxy.store.health import StoreHealth
from proxy.store.quota import CounterRow
from proxy.store.usage import UsageGroup, UsageQuery, UsageRow
from proxy.store.values import (
    EMPTY_PREFIX,
    AppliedMigration,
    HistoryEntry,
    KeyedEvent,
    Prefix,
    Recorded,
    RecordedEvent,
    StoredManifest,
    SummaryClaim,
    TranscriptEvent,
)

__all__ = [
    "EMPTY_PREFIX",
    "AppliedMigration",
    "DuplicateEvent",
    "HistoryEntry",
    "KeyedEvent",
    "ManifestConflict",
    "Prefix",
    "PrefixConflict",
    "Recorded",
    "RecordedEvent",
    "SchemaTooNew",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredManifest",
    "SummaryClaim",
    "TranscriptEvent",
]


class Store(Protocol):
    """The session store. Every write the methods acknowledge (return from) is durable.

    ``health`` holds what its operations found (``proxy.store.health``): ``/readyz`` answers
    from it, and callers report what an outage cost them through it, one line per interval.
    ``states`` is the folded durable state of the sessions used last (bounded; the app sets its
    bound from ``limits.durable_states``, and forgets idle sessions' after
    ``limits.cache_idle_seconds``).
    """

    health: StoreHealth
    states: StateCache

    async def write_changes(
        self, tenant: str, session: str, changes: Sequence[Change]
    ) -> tuple[int, ...]:
        """Validate ``changes`` against the current state and append them, all or nothing.

        Returns the item version each change produced. Raises ``InvalidWrite``.
        """
        ...

    def forget_idle_states(self, now: float, idle: float) -> int:
        """Forget the folded states (``states``) of sessions idle for ``idle`` seconds."""
        ...

    async def current_state(self, tenant: str, session: str) -> DurableState: ...

    async def history(self, tenant: str, session: str) -> tuple[HistoryEntry, ...]: ...

    async def append_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[TranscriptEvent],
        prefix_count: int,
        prefix_hash: str,
        *,
        expected_prefix: Prefix | None = None,
    ) -> int:
        """Append ``events`` (at least one) atomically and record the session's new prefix.

        Returns the first event's sequence number. With ``expected_prefix``, the append happens
        only if that is still the recorded prefix (else ``PrefixConflict``, nothing written).
        """
        ...

    async def transcript_events(
        self,
        tenant: str,
        session: str,
        after_seq: int = 0,
        limit: int = DEFAULT_EVENT_LIMIT,
        *,
        agent: str = "",
    ) -> tuple[RecordedEvent, ...]: ...

    async def recorded_prefix(self, tenant: str, session: str, *, agent: str = "") -> Prefix: ...

    async def transcript_seqs(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> dict[str, int]:
        """The sequence number of each of ``keys`` (``record_transcript``'s idempotency keys)
        the conversation's transcript holds; keys it does not hold are absent."""
        ...

    async def session_agents(self, tenant: str, session: str) -> tuple[AgentRecord, ...]:
        """The session's conversations: its main one first (agent ``""``; absent for an unknown
        session), then the agents recorded in it (``record_transcript`` with an ``agent``), first
        seen first, with their parents and their transcripts' sizes."""
        ...

    async def put_manifest(
        self, tenant: str, compaction_id: str, session: str, manifest_json: str
    ) -> None:
        """Store a manifest once; storing the identical one again is a no-op."""
        ...

    async def get_manifest(self, tenant: str, compaction_id: str) -> StoredManifest | None: ...

    async def put_plan(
        self, tenant: str, anchor: str, prefix_hash: str, prefix_len: int, plan_json: str
    ) -> str:
        """Store a compaction plan once per ``(tenant, prefix_hash)``; return the stored JSON.

        Idempotent: when a plan is already stored under the key (even with other bytes: two
        replicas compacted the same prefix at once), the first one is kept and returned.
        """
        ...

    async def plans_for(
        self, tenant: str, anchor: str, limit: int = DEFAULT_PLAN_LIMIT
    ) -> tuple[str, ...]:
        """The plan JSON of the conversation ``(tenant, anchor)``, longest prefix first."""
        ...

    async def claim_summary(
        self, tenant: str, key: str, holder: str, lease_seconds: float
    ) -> SummaryClaim:
        """One summary per ``(tenant, key)`` across every replica: a lease, or the stored text.

        The first caller (or the first after a lease or a failure expired) gets ``acquired``;
        claiming again with the same ``holder`` while it holds the lease renews it.
        """
        ...

    async def settle_summary(
        self, tenant: str, key: str, holder: str, text: str | None, retry_seconds: float
    ) -> None:
        """The holder's outcome: ``text`` is stored for good; ``None`` (the call failed) is
        remembered for ``retry_seconds``, then the next claimer may try again. A no-op when
        ``holder`` no longer holds the lease (it expired and another caller took over)."""
        ...

    async def record_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[KeyedEvent],
        prefix: Prefix,
        *,
        agent: str = "",
        parent: str = "",
    ) -> Recorded:
        """Append, atomically and in order, the events whose key the conversation does not
        hold yet (``proxy.store.transcripts``), and record ``prefix`` as its prefix. An
        ``agent``'s conversation is noted in the session's agents (``parent``: the agent that
        spawned it, ``""`` the main conversation; the first one recorded stands)."""
        ...

    async def transcript_keys_held(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> frozenset[str]:
        """Which of ``keys`` the conversation's transcript holds."""
        ...

    async def put_calibration(self, tenant: str, model: str, ratio: float) -> None:
        """Store the tenant's real/estimate ratio for ``model`` (last writer wins)."""
        ...

    async def get_calibration(self, tenant: str, model: str) -> float | None: ...

    async def list_sessions(self, tenant: str) -> tuple[str, ...]: ...

    async def applied_migrations(self) -> tuple[AppliedMigration, ...]: ...

    async def ping(self) -> bool:
        """True when the database answers a read (for ``/readyz``); never raises."""
        ...

    async def close(self) -> None: ...

    # -- the usage ledger (proxy.store.usage) -------------------------------------------------

    async def record_usage(self, entries: Sequence[LedgerEntry]) -> None:
        """Append ledger rows (of any tenants) at once; ``InvalidWrite`` naming bad entries."""
        ...

    async def usage_rows(self, tenant: str, query: UsageQuery) -> tuple[UsageRow, ...]:
        """The tenant's rows matching ``query``, by id (increasing; decreasing with
        ``query.descending``), at most ``query.limit``."""
        ...

    async def usage_groups(
        self,
        tenant: str,
        query: UsageQuery,
        by: Literal["bucket", "session"],
        bucket_ms: int = 0,
    ) -> tuple[UsageGroup, ...]:
        """Sums per model and time bucket (from ``query.since_ms``) or per model and session."""
        ...

    async def delete_usage_before(
        self, tenant: str | None, cutoff: datetime | str | float
    ) -> int:
        """Delete ledger rows older than ``cutoff`` (one tenant's, or all); return how many."""
        ...

    # -- budget and rate-limit counters (proxy.store.quota) ---------------------------------

    async def quota_add(
        self, tenant: str, counters: Sequence[Counter]
    ) -> dict[tuple[str, str, int], int]:
        """Add each counter's ``delta`` to its window's row, atomically, in one statement; the
        values after, by ``(scope, metric, window start)``."""
        ...

    async def quota_current(self, tenant: str, now_ms: int) -> tuple[CounterRow, ...]:
        """The tenant's counters (every scope) whose window holds ``now_ms``."""
        ...

    async def delete_quota_before(self, cutoff_ms: int) -> int:
        """Delete every counter whose window ended before ``cutoff_ms``; return how many."""
        ...
