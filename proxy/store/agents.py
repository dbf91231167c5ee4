"""One session, many conversations: the transcript of each agent, and the agents of a session.

A client session (``x-session-id``, Claude Code's ``x-claude-code-session-id``) may hold several
conversations at once: Claude Code's main conversation and every subagent it spawns share one
session id, a subagent's requests adding ``x-claude-code-agent-id`` (and a nested one's
``x-claude-code-parent-agent-id``). Each conversation has its own transcript, numbered from 1:
``agent = ''`` is the session's main conversation (every event recorded before this migration
is one of its, with its sequence number unchanged, so every pointer written before still redeems
the same event); any other value is an agent's. ``session_agents`` lists the agents seen in a
session, with the parent that spawned each (``''``: the main conversation), for the admin API
and the console.

Migration 8 rebuilds the two transcript tables with ``agent`` in their keys (SQLite cannot alter
a primary key: new table, copy, drop, rename, in the migration's one transaction) and adds
``session_agents``. The SQL both backends run for the agents list is here; the transcript
queries take the agent as one more key column (``transcript_keys``, the backends).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAIN",
    "MIGRATION_NAME",
    "PG_STATEMENTS",
    "SQLITE_STATEMENTS",
    "VERSION",
    "AgentRecord",
    "pg_agents",
    "pg_note_agent",
    "sqlite_agents",
    "sqlite_note_agent",
]

VERSION = 8
MIGRATION_NAME = "conversations per agent: transcripts keyed by agent, session_agents"
MAIN = ""  # the agent id of a session's main conversation

_EVENT_COLUMNS = (
    "tenant, session, seq, event_id, recorded_at, type, role, content, complete,"
    " prefix_count, prefix_hash, event_key"
)

SQLITE_STATEMENTS = (
    """CREATE TABLE transcript_events_v8 (
        tenant TEXT NOT NULL,
        session TEXT NOT NULL,
        agent TEXT NOT NULL DEFAULT '',
        seq INTEGER NOT NULL CHECK (seq >= 1),
        event_id TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        type TEXT NOT NULL CHECK (type IN ('message', 'answer')),
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
        prefix_count INTEGER NOT NULL,
        prefix_hash TEXT NOT NULL,
        event_key TEXT,
        PRIMARY KEY (tenant, session, agent, seq),
        UNIQUE (tenant, session, agent, event_id)
    ) WITHOUT ROWID""",
    f"INSERT INTO transcript_events_v8 ({_EVENT_COLUMNS}, agent)"
    f" SELECT {_EVENT_COLUMNS}, '' FROM transcript_events",
    "DROP TABLE transcript_events",
    "ALTER TABLE transcript_events_v8 RENAME TO transcript_events",
    "CREATE UNIQUE INDEX transcript_events_by_key"
    " ON transcript_events (tenant, session, agent, event_key)",
    "CREATE INDEX transcript_events_by_time ON transcript_events (tenant, recorded_at)",
    """CREATE TABLE transcript_heads_v8 (
        tenant TEXT NOT NULL,
        session TEXT NOT NULL,
        agent TEXT NOT NULL DEFAULT '',
        last_seq INTEGER NOT NULL CHECK (last_seq >= 0),
        prefix_count INTEGER NOT NULL CHECK (prefix_count >= 0),
        prefix_hash TEXT NOT NULL,
        PRIMARY KEY (tenant, session, agent)
    ) WITHOUT ROWID""",
    "INSERT INTO transcript_heads_v8 (tenant, session, agent, last_seq, prefix_count,"
    " prefix_hash) SELECT tenant, session, '', last_seq, prefix_count, prefix_hash"
    " FROM transcript_heads",
    "DROP TABLE transcript_heads",
    "ALTER TABLE transcript_heads_v8 RENAME TO transcript_heads",
    """CREATE TABLE session_agents (
        tenant TEXT NOT NULL,
        session TEXT NOT NULL,
        agent TEXT NOT NULL,
        parent TEXT NOT NULL DEFAULT '',
        first_seen TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (tenant, session, agent)
    ) WITHOUT ROWID""",
)

PG_STATEMENTS = (
    """ALTER TABLE transcript_events ADD COLUMN agent TEXT COLLATE "C" NOT NULL DEFAULT ''""",
    "ALTER TABLE transcript_events DROP CONSTRAINT transcript_events_pkey",
    "ALTER TABLE transcript_events ADD CONSTRAINT transcript_events_pkey"
    " PRIMARY KEY (tenant, session, agent, seq)",
    "ALTER TABLE transcript_events DROP CONSTRAINT transcript_events_event_id_key",
    "ALTER TABLE transcript_events ADD CONSTRAINT transcript_events_event_id_key"
    " UNIQUE (tenant, session, agent, event_id)",
    "DROP INDEX transcript_events_by_key",
    "CREATE UNIQUE INDEX transcript_events_by_key"
    " ON transcript_events (tenant, session, agent, event_key)",
    """ALTER TABLE transcript_heads ADD COLUMN agent TEXT COLLATE "C" NOT NULL DEFAULT ''""",
    "ALTER TABLE transcript_heads DROP CONSTRAINT transcript_heads_pkey",
    "ALTER TABLE transcript_heads ADD CONSTRAINT transcript_heads_pkey"
    " PRIMARY KEY (tenant, session, agent)",
    """CREATE TABLE session_agents (
        tenant TEXT COLLATE "C" NOT NULL,
        session TEXT COLLATE "C" NOT NULL,
        agent TEXT COLLATE "C" NOT NULL,
        parent TEXT COLLATE "C" NOT NULL DEFAULT '',
        first_seen TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (tenant, session, agent)
    )""",
)


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """A conversation of a session: an agent (who spawned it: ``''`` the main conversation),
    or the main conversation itself (``agent`` ``''``); when it was first and last recorded, and
    how many events its transcript holds (its last sequence)."""

    agent: str
    parent: str
    first_seen: str
    last_seen: str
    events: int


# The first recorded parent stands (a nested agent names it on every request; a later request
# without the header does not orphan it).
_NOTE = (
    "INSERT INTO session_agents (tenant, session, agent, parent, first_seen, last_seen)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session, agent)"
    " DO UPDATE SET last_seen = excluded.last_seen"
)
# the main conversation: the session's own row (it exists once anything was recorded)
_MAIN = (
    "SELECT '', '', s.created_at, s.updated_at, COALESCE(h.last_seq, 0) FROM sessions s"
    " LEFT JOIN transcript_heads h"
    " ON h.tenant = s.tenant AND h.session = s.session AND h.agent = ''"
    " WHERE s.tenant = ? AND s.session = ?"
)
_LIST = (
    "SELECT a.agent, a.parent, a.first_seen, a.last_seen, COALESCE(h.last_seq, 0)"
    " FROM session_agents a LEFT JOIN transcript_heads h"
    " ON h.tenant = a.tenant AND h.session = a.session AND h.agent = a.agent"
    " WHERE a.tenant = ? AND a.session = ? ORDER BY a.first_seen, a.agent"
)


def _pg(sql: str) -> str:
    parts = sql.split("?")
    return "".join(f"{p}${i}" if i < len(parts) else p for i, p in enumerate(parts, 1))


def sqlite_note_agent(
    conn: sqlite3.Connection, tenant: str, session: str, agent: str, parent: str, now: str
) -> None:
    conn.execute(_NOTE, (tenant, session, agent, parent, now, now))


async def pg_note_agent(
    conn: Any, tenant: str, session: str, agent: str, parent: str, now: str
) -> None:
    await conn.execute(_pg(_NOTE), tenant, session, agent, parent, now, now)


def _records(rows: Sequence[Sequence[Any]]) -> tuple[AgentRecord, ...]:
    return tuple(AgentRecord(str(a), str(p), str(f), str(la), int(n)) for a, p, f, la, n in rows)


def sqlite_agents(conn: sqlite3.Connection, tenant: str, session: str) -> tuple[AgentRecord, ...]:
    main = conn.execute(_MAIN, (tenant, session)).fetchall()
    return _records([*main, *conn.execute(_LIST, (tenant, session)).fetchall()])


async def pg_agents(conn: Any, tenant: str, session: str) -> tuple[AgentRecord, ...]:
    main = await conn.fetch(_pg(_MAIN), tenant, session)
    rows = await conn.fetch(_pg(_LIST), tenant, session)
    return _records([tuple(r) for r in (*main, *rows)])
