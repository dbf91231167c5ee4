"""The values the store takes and gives back, on every backend (frozen, no I/O).

Transcripts: per conversation (tenant, session and agent: ``agent=""`` is the session's main
conversation, see ``proxy.store.agents``), events get sequence numbers 1, 2, 3... with no gap and
no duplicate, even with concurrent appenders in several processes. An append also records the
session's *prefix*: how many of the conversation's messages are recorded so far and their rolling
hash (whatever the caller uses, e.g. ``proxy.core.compaction.plan.prefix_hashes``), so the next
request can tell which of its messages are new. Every stored event keeps the prefix recorded with
its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.durable import ChangeEvent
from proxy.core.pointers import TranscriptPointer, format_pointer

__all__ = [
    "EMPTY_PREFIX",
    "EVENT_TYPES",
    "AppliedMigration",
    "EventType",
    "HistoryEntry",
    "KeyedEvent",
    "Prefix",
    "Recorded",
    "RecordedEvent",
    "StoredManifest",
    "SummaryClaim",
    "SummaryRow",
    "TranscriptEvent",
]

EventType = Literal["message", "answer"]
EVENT_TYPES: tuple[EventType, ...] = ("message", "answer")


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
class KeyedEvent:
    """An event and its idempotency key (at most ``MAX_KEY_CHARS`` printable ASCII): see
    ``proxy.store.transcripts``."""

    key: str
    event: TranscriptEvent


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``record_transcript`` did: the sequence numbers it gave, in batch order (the events
    already held are not in it), and the session's last sequence number after it."""

    seqs: tuple[int, ...]
    last_seq: int


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
