"""The session store's interface: an async :class:`Store` protocol over backend-neutral values.

Every method takes the tenant first; nothing a method returns or changes crosses tenants. A
backend (SQLite now, PostgreSQL later) implements the protocol; callers never see SQL, a
connection or a backend's exceptions. Errors::

    StoreError                  base
    ├── StoreUnavailable        the database cannot be opened, read or written (I/O, a lost or
    │   │                       refused connection, closed store); the edge answers 503 /
    │   │                       renders the "store unavailable" block
    │   └── StoreBusy           a lock (a session's row) still held by another writer after the
    │                           busy timeout: the database answered (``health`` counts it as up)
    ├── PrefixConflict          append_transcript(expected_prefix=...) found another prefix
    ├── DuplicateEvent          an event_id already recorded in the session
    └── ManifestConflict        a different manifest already stored under the compaction id
    InvalidWrite (ValueError)   from proxy.core.durable: field-named errors, nothing written (422)

Transcripts: per conversation (tenant, session and agent: ``agent=""`` is the session's main
conversation, see ``proxy.store.agents``), events get sequence numbers 1, 2, 3... with no gap and
no duplicate, even with concurrent appenders in several processes. An append also records the
session's *prefix*: how many of the conversation's messages are recorded so far and their rolling
hash (whatever the caller uses, e.g. ``proxy.core.compaction.plan.prefix_hashes``), so the next
request can tell which of its messages are new. Every stored event keeps the prefix recorded with
its batch.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from proxy.core.durable import (
    Change,
    ChangeEvent,
    DurableState,
    FieldError,
    InvalidWrite,
    check_timestamp,
)
from proxy.core.pointers import (
    TranscriptPointer,
    format_pointer,
    is_valid_agent_id,
    is_valid_session_id,
)

if TYPE_CHECKING:
    from datetime import datetime

    from proxy.core.ledger import LedgerEntry
    from proxy.core.quota import Counter
    from proxy.store.agents import AgentRecord
    from proxy.store.health import StoreHealth
    from proxy.store.quota import CounterRow
    from proxy.store.transcript_keys import KeyedEvent, Recorded
    from proxy.store.usage import UsageGroup, UsageQuery, UsageRow

__all__ = [
    "DEFAULT_EVENT_LIMIT",
    "DEFAULT_PLAN_LIMIT",
    "EMPTY_PREFIX",
    "AppliedMigration",
    "DuplicateEvent",
    "EventType",
    "HistoryEntry",
    "ManifestConflict",
    "Prefix",
    "PrefixConflict",
    "RecordedEvent",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredManifest",
    "SummaryClaim",
    "SummaryRow",
    "TranscriptEvent",
    "check_calibration",
    "check_keys",
    "check_plan_limit",
    "check_prefix",
    "check_settle",
    "check_summary_claim",
    "decide_claim",
    "decide_settle",
    "encode_events",
    "encode_manifest",
    "encode_plan",
]

EventType = Literal["message", "answer"]
EVENT_TYPES: tuple[EventType, ...] = ("message", "answer")
DEFAULT_EVENT_LIMIT = 1000
DEFAULT_PLAN_LIMIT = 4  # plans of one conversation fetched at once (``PlanCache``'s default)
MAX_PLAN_LIMIT = 100
MAX_TENANT_CHARS = 200


class StoreError(Exception):
    """Base of the store's own errors. Messages never contain paths, URLs or content."""


class StoreUnavailable(StoreError):
    pass


class StoreBusy(StoreUnavailable):
    pass


class PrefixConflict(StoreError):
    def __init__(self, current: Prefix) -> None:
        super().__init__("the session's recorded prefix changed")
        self.current = current


class DuplicateEvent(StoreError):
    pass


class ManifestConflict(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class Prefix:
    """``count`` messages recorded, with rolling hash ``hash``; ``Prefix(0, "")`` = nothing yet."""

    count: int
    hash: str


EMPTY_PREFIX = Prefix(0, "")


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    event_id: str
    recorded_at: str  # ISO 8601 with an offset
    type: EventType
    role: str
    content: Any  # JSON: what orjson serialises (str keys, 64-bit ints)
    complete: bool  # False for a cut or cancelled stream


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    session: str
    seq: int
    event: TranscriptEvent
    prefix_count: int  # the prefix recorded with this event's batch
    prefix_hash: str
    agent: str = ""  # "": the session's main conversation

    @property
    def pointer(self) -> str:
        """``transcript:<session>:<seq>`` (``transcript:<session>:<agent>:<seq>`` for an
        agent's event)."""
        return format_pointer(TranscriptPointer(self.session, self.seq, self.agent))


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One durable change as recorded: its position in the session's history and when."""

    seq: int
    recorded_at: str
    event: ChangeEvent


@dataclass(frozen=True, slots=True)
class StoredManifest:
    compaction_id: str
    session: str
    manifest_json: str
    stored_at: str


@dataclass(frozen=True, slots=True)
class SummaryClaim:
    """The answer to ``claim_summary``.

    ``acquired``: the caller holds the lease (until ``wait_seconds`` from now) and makes the call;
    ``held``: another caller does, ask again within ``wait_seconds``; ``ok``: the summary is
    stored (``text``); ``failed``: the holder's call failed a moment ago (keep the view without a
    summary, as the holder did).
    """

    state: Literal["acquired", "held", "ok", "failed"]
    text: str | None = None
    wait_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """A ``summaries`` row as the backends store it (``expires_at``: epoch seconds)."""

    state: Literal["pending", "ok", "failed"]
    holder: str
    expires_at: float
    text: str | None


@dataclass(frozen=True, slots=True)
class AppliedMigration:
    version: int
    name: str
    applied_at: str


class Store(Protocol):
    """The session store. Every write the methods acknowledge (return from) is durable.

    ``health`` holds what its operations found (``proxy.store.health``): ``/readyz`` answers
    from it, and callers report what an outage cost them through it, one line per interval.
    """

    health: StoreHealth

    async def write_changes(
        self, tenant: str, session: str, changes: Sequence[Change]
    ) -> tuple[int, ...]:
        """Validate ``changes`` against the current state and append them, all or nothing.

        Returns the item version each change produced. Raises ``InvalidWrite``.
        """
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
        hold yet (``proxy.store.transcript_keys``), and record ``prefix`` as its prefix. An
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


# -- checks shared by backends (pure) ----------------------------------------------------------


def check_keys(tenant: object, session: object | None = None, agent: object = "") -> None:
    """Raise ``InvalidWrite`` unless the tenant (and session id, and agent id: ``""`` for the
    session's main conversation) are usable keys."""
    errors: list[FieldError] = []
    if (
        not isinstance(tenant, str)
        or not tenant
        or len(tenant) > MAX_TENANT_CHARS
        or any(unicodedata.category(ch).startswith(("C", "Z")) for ch in tenant)
    ):
        errors.append(FieldError("tenant", "expected a non-empty tenant id without spaces"))
    if session is not None and not is_valid_session_id(session):
        errors.append(FieldError("session", "not a valid session id"))
    if agent != "" and not is_valid_agent_id(agent):
        errors.append(FieldError("agent", "not a valid agent id"))
    if errors:
        raise InvalidWrite(errors)


def encode_events(events: Sequence[TranscriptEvent]) -> list[bytes]:
    """Each event's content as JSON bytes; ``InvalidWrite`` naming every bad field."""
    if not events:
        raise InvalidWrite([FieldError("events", "expected at least one event")])
    errors: list[FieldError] = []
    encoded: list[bytes] = []
    seen: set[str] = set()
    for i, event in enumerate(events):
        prefix = f"events[{i}]"
        if not isinstance(event, TranscriptEvent):
            errors.append(FieldError(prefix, "expected a transcript event"))
            continue
        if not isinstance(event.event_id, str) or not event.event_id.strip():
            errors.append(FieldError(f"{prefix}.event_id", "expected a non-empty id"))
        elif event.event_id in seen:
            errors.append(FieldError(f"{prefix}.event_id", "repeated in this batch"))
        else:
            seen.add(event.event_id)
        problem = check_timestamp(event.recorded_at)
        if problem:
            errors.append(FieldError(f"{prefix}.recorded_at", problem))
        if event.type not in EVENT_TYPES:
            errors.append(FieldError(f"{prefix}.type", "expected message or answer"))
        if not isinstance(event.role, str) or not event.role:
            errors.append(FieldError(f"{prefix}.role", "expected a non-empty role"))
        if not isinstance(event.complete, bool):
            errors.append(FieldError(f"{prefix}.complete", "expected true or false"))
        try:
            encoded.append(orjson.dumps(event.content))
        except TypeError:
            errors.append(FieldError(f"{prefix}.content", "not JSON-serialisable"))
    if errors:
        raise InvalidWrite(errors)
    return encoded


def check_prefix(prefix_count: object, prefix_hash: object) -> None:
    errors: list[FieldError] = []
    if isinstance(prefix_count, bool) or not isinstance(prefix_count, int) or prefix_count < 0:
        errors.append(FieldError("prefix_count", "expected an integer >= 0"))
    if not isinstance(prefix_hash, str):
        errors.append(FieldError("prefix_hash", "expected a string"))
    if errors:
        raise InvalidWrite(errors)


def encode_manifest(compaction_id: object, manifest_json: object) -> str:
    """The manifest text, checked to be one JSON value; ``InvalidWrite`` otherwise."""
    errors: list[FieldError] = []
    if not isinstance(compaction_id, str) or not compaction_id.strip():
        errors.append(FieldError("compaction_id", "expected a non-empty id"))
    if not isinstance(manifest_json, str):
        errors.append(FieldError("manifest_json", "expected JSON text"))
    else:
        try:
            orjson.loads(manifest_json)
        except orjson.JSONDecodeError:
            errors.append(FieldError("manifest_json", "not valid JSON"))
    if errors:
        raise InvalidWrite(errors)
    assert isinstance(manifest_json, str)
    return manifest_json


def encode_plan(anchor: object, prefix_hash: object, prefix_len: object, plan_json: object) -> str:
    """The plan text, checked to be a JSON object; ``InvalidWrite`` naming every bad field."""
    errors: list[FieldError] = []
    if not isinstance(anchor, str) or not anchor.strip():
        errors.append(FieldError("anchor", "expected a non-empty hash"))
    if not isinstance(prefix_hash, str) or not prefix_hash.strip():
        errors.append(FieldError("prefix_hash", "expected a non-empty hash"))
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 1:
        errors.append(FieldError("prefix_len", "expected an integer >= 1"))
    if not isinstance(plan_json, str):
        errors.append(FieldError("plan_json", "expected JSON text"))
    else:
        try:
            if not isinstance(orjson.loads(plan_json), dict):
                errors.append(FieldError("plan_json", "expected a JSON object"))
        except orjson.JSONDecodeError:
            errors.append(FieldError("plan_json", "not valid JSON"))
    if errors:
        raise InvalidWrite(errors)
    assert isinstance(plan_json, str)
    return plan_json


def check_plan_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidWrite([FieldError("limit", "expected an integer >= 1")])
    return min(limit, MAX_PLAN_LIMIT)


MAX_KEY_CHARS = 200


def _finite_positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < float(value) < float("inf")
    )


def _short_key(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value.strip()) and len(value) <= MAX_KEY_CHARS


def check_summary_claim(key: object, holder: object, seconds: object, what: str) -> None:
    """``InvalidWrite`` unless the summary key, holder and a duration are usable."""
    errors: list[FieldError] = []
    if not _short_key(key):
        errors.append(FieldError("key", f"expected a non-empty key of at most {MAX_KEY_CHARS}"))
    if not _short_key(holder):
        errors.append(FieldError("holder", "expected a non-empty holder id"))
    if not _finite_positive(seconds):
        errors.append(FieldError(what, "expected a positive number of seconds"))
    if errors:
        raise InvalidWrite(errors)


def check_settle(key: object, holder: object, text: object, retry_seconds: object) -> None:
    """``InvalidWrite`` unless ``settle_summary``'s arguments are usable."""
    check_summary_claim(key, holder, retry_seconds, "retry_seconds")
    if text is not None and not isinstance(text, str):
        raise InvalidWrite([FieldError("text", "expected text or null")])


def check_calibration(model: object, ratio: object | None = None, *, with_ratio: bool) -> None:
    errors: list[FieldError] = []
    if not isinstance(model, str) or len(model) > MAX_KEY_CHARS:
        errors.append(FieldError("model", f"expected a model name of at most {MAX_KEY_CHARS}"))
    if with_ratio and not _finite_positive(ratio):
        errors.append(FieldError("ratio", "expected a positive finite number"))
    if errors:
        raise InvalidWrite(errors)


def decide_claim(
    row: SummaryRow | None, holder: str, now: float, lease_seconds: float
) -> tuple[SummaryClaim, SummaryRow | None]:
    """What ``claim_summary`` answers for the stored ``row``, and the row to write (or None)."""
    if row is not None and row.state == "ok":
        return SummaryClaim("ok", row.text), None
    if row is not None and row.expires_at > now:
        if row.state == "failed":
            return SummaryClaim("failed"), None
        if row.holder != holder:
            return SummaryClaim("held", wait_seconds=row.expires_at - now), None
    # absent, expired, or our own lease (a renewal): take it
    return (
        SummaryClaim("acquired", wait_seconds=lease_seconds),
        SummaryRow("pending", holder, now + lease_seconds, None),
    )


def decide_settle(
    row: SummaryRow | None, holder: str, text: str | None, now: float, retry_seconds: float
) -> SummaryRow | None:
    """The row ``settle_summary`` writes, or None when ``holder`` no longer holds the lease."""
    if row is None or row.state != "pending" or row.holder != holder:
        return None
    if text is None:
        return SummaryRow("failed", holder, now + retry_seconds, None)
    return SummaryRow("ok", holder, now, text)
