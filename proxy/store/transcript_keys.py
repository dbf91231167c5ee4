"""Exactly-once transcript appends: every event carries an idempotency key, unique per
conversation (a session's main conversation or one of its agents', ``proxy.store.agents``).

``record_transcript`` appends, under the session's lock, only the events whose key the session
does not hold yet (nor an earlier event of the same batch), gives them the next sequence numbers
and records the session's new prefix: the same batch sent twice, by two replicas at once or by a
retry, is stored once, in the order of its first arrival. Keys are chosen by the caller
(``proxy.server.context.durable``: the position in the conversation and the prefix hash), so a key
means the same event on every replica. Rows written before migration 4 have no key (``NULL``: never
equal to a key, never in the way).

The SQL of both backends is here (the backends' methods are thin wrappers).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.durable import FieldError, InvalidWrite
from proxy.store.base import Prefix, TranscriptEvent

__all__ = [
    "MAX_KEY_CHARS",
    "MIGRATION_NAME",
    "PG_STATEMENTS",
    "SQLITE_STATEMENTS",
    "KeyedEvent",
    "Recorded",
    "check_keys_list",
    "pg_existing",
    "pg_record",
    "pg_seqs",
    "sqlite_existing",
    "sqlite_record",
    "sqlite_seqs",
]

MAX_KEY_CHARS = 200
_CHUNK = 500  # keys per ``IN (...)`` query (SQLite's variable limit is far above)

MIGRATION_NAME = "transcript event keys (exactly once)"
SQLITE_STATEMENTS = (
    "ALTER TABLE transcript_events ADD COLUMN event_key TEXT",
    "CREATE UNIQUE INDEX transcript_events_by_key ON transcript_events (tenant, session, event_key)",
)
PG_STATEMENTS = (
    'ALTER TABLE transcript_events ADD COLUMN event_key TEXT COLLATE "C"',
    "CREATE UNIQUE INDEX transcript_events_by_key ON transcript_events (tenant, session, event_key)",
)


@dataclass(frozen=True, slots=True)
class KeyedEvent:
    """An event and its idempotency key (at most ``MAX_KEY_CHARS`` printable ASCII)."""

    key: str
    event: TranscriptEvent


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``record_transcript`` did: the sequence numbers it gave, in batch order (the events
    already held are not in it), and the session's last sequence number after it."""

    seqs: tuple[int, ...]
    last_seq: int


def check_keys_list(keys: Iterable[object]) -> None:
    errors = [
        FieldError(f"events[{i}].key", f"expected 1-{MAX_KEY_CHARS} printable ASCII characters")
        for i, key in enumerate(keys)
        if not isinstance(key, str)
        or not 0 < len(key) <= MAX_KEY_CHARS
        or not key.isascii()
        or not key.isprintable()
    ]
    if errors:
        raise InvalidWrite(errors)


def _new(events: Sequence[KeyedEvent], held: set[str]) -> list[int]:
    """Indexes of the events to insert: key not held, first of its key in the batch."""
    out: list[int] = []
    seen = set(held)
    for i, keyed in enumerate(events):
        if keyed.key not in seen:
            seen.add(keyed.key)
            out.append(i)
    return out


def _row(
    tenant: str,
    session: str,
    agent: str,
    seq: int,
    keyed: KeyedEvent,
    content: bytes,
    prefix: Prefix,
) -> tuple[Any, ...]:
    e = keyed.event
    return (
        tenant,
        session,
        agent,
        seq,
        e.event_id,
        e.recorded_at,
        e.type,
        e.role,
        content.decode(),
        e.complete,
        prefix.count,
        prefix.hash,
        keyed.key,
    )


# -- SQLite (inside the caller's BEGIN IMMEDIATE) ----------------------------------------------


def sqlite_seqs(
    conn: sqlite3.Connection, tenant: str, session: str, agent: str, keys: Sequence[str]
) -> dict[str, int]:
    """The sequence number of each of ``keys`` the conversation holds."""
    found: dict[str, int] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), _CHUNK):
        part = unique[start : start + _CHUNK]
        marks = ",".join("?" * len(part))
        rows = conn.execute(
            "SELECT event_key, seq FROM transcript_events WHERE tenant = ? AND session = ?"
            f" AND agent = ? AND event_key IN ({marks})",
            (tenant, session, agent, *part),
        ).fetchall()
        found.update((str(r[0]), int(r[1])) for r in rows)
    return found


def sqlite_existing(
    conn: sqlite3.Connection, tenant: str, session: str, agent: str, keys: Sequence[str]
) -> set[str]:
    return set(sqlite_seqs(conn, tenant, session, agent, keys))


def sqlite_record(
    conn: sqlite3.Connection,
    tenant: str,
    session: str,
    events: Sequence[KeyedEvent],
    contents: Sequence[bytes],
    prefix: Prefix,
    agent: str = "",
) -> Recorded:
    head = conn.execute(
        "SELECT last_seq FROM transcript_heads WHERE tenant = ? AND session = ? AND agent = ?",
        (tenant, session, agent),
    ).fetchone()
    last_seq = 0 if head is None else int(head[0])
    todo = _new(events, sqlite_existing(conn, tenant, session, agent, [k.key for k in events]))
    rows = [
        _row(tenant, session, agent, last_seq + n, events[i], contents[i], prefix)
        for n, i in enumerate(todo, 1)
    ]
    if rows:
        conn.executemany(
            "INSERT INTO transcript_events (tenant, session, agent, seq, event_id, recorded_at,"
            " type, role, content, complete, prefix_count, prefix_hash, event_key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*r[:9], int(r[9]), *r[10:]) for r in rows],
        )
    last = last_seq + len(rows)
    conn.execute(
        "INSERT INTO transcript_heads (tenant, session, agent, last_seq, prefix_count,"
        " prefix_hash) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session, agent) DO UPDATE"
        " SET last_seq = excluded.last_seq, prefix_count = excluded.prefix_count,"
        " prefix_hash = excluded.prefix_hash",
        (tenant, session, agent, last, prefix.count, prefix.hash),
    )
    return Recorded(tuple(last_seq + n for n in range(1, len(rows) + 1)), last)


# -- PostgreSQL (inside the caller's transaction, the session's row locked) ----------------------


async def pg_seqs(
    conn: Any, tenant: str, session: str, agent: str, keys: Sequence[str]
) -> dict[str, int]:
    """The sequence number of each of ``keys`` the conversation holds."""
    rows = await conn.fetch(
        "SELECT event_key, seq FROM transcript_events WHERE tenant = $1 AND session = $2"
        " AND agent = $3 AND event_key = ANY($4::text[])",
        tenant,
        session,
        agent,
        list(dict.fromkeys(keys)),
    )
    return {str(r["event_key"]): int(r["seq"]) for r in rows}


async def pg_existing(
    conn: Any, tenant: str, session: str, agent: str, keys: Sequence[str]
) -> set[str]:
    return set(await pg_seqs(conn, tenant, session, agent, keys))


async def pg_record(
    conn: Any,
    tenant: str,
    session: str,
    events: Sequence[KeyedEvent],
    contents: Sequence[bytes],
    prefix: Prefix,
    agent: str = "",
) -> Recorded:
    head = await conn.fetchrow(
        "SELECT last_seq FROM transcript_heads WHERE tenant = $1 AND session = $2"
        " AND agent = $3",
        tenant,
        session,
        agent,
    )
    last_seq = 0 if head is None else int(head["last_seq"])
    todo = _new(events, await pg_existing(conn, tenant, session, agent, [k.key for k in events]))
    rows = [
        _row(tenant, session, agent, last_seq + n, events[i], contents[i], prefix)
        for n, i in enumerate(todo, 1)
    ]
    if rows:
        await conn.executemany(
            "INSERT INTO transcript_events (tenant, session, agent, seq, event_id, recorded_at,"
            " type, role, content, complete, prefix_count, prefix_hash, event_key)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            rows,
        )
    last = last_seq + len(rows)
    await conn.execute(
        "INSERT INTO transcript_heads (tenant, session, agent, last_seq, prefix_count,"
        " prefix_hash) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, session, agent)"
        " DO UPDATE SET last_seq = excluded.last_seq, prefix_count = excluded.prefix_count,"
        " prefix_hash = excluded.prefix_hash",
        tenant,
        session,
        agent,
        last,
        prefix.count,
        prefix.hash,
    )
    return Recorded(tuple(last_seq + n for n in range(1, len(rows) + 1)), last)
