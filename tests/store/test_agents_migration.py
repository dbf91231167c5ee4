"""Migration 8 (``proxy.store.agents``): a store written before agents keeps every event.

A database is built at version 7 exactly as the previous release wrote it (its migrations'
statements, its rows), then opened by this code: every event is the main conversation's, under
the same sequence number, with the same record bytes -- so every ``transcript:<session>:<seq>``
pointer written before redeems the same event, with the same evidence digest -- and the
recorder goes on where it stopped. Both backends.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import asyncpg
import orjson
import pytest

from proxy.core.pointers import TranscriptPointer, format_pointer
from proxy.sources.transcript_records import record_sha256
from proxy.store import Prefix, TranscriptEvent, open_store
from proxy.store.migrations import MIGRATIONS
from proxy.store.sql import POSTGRES, SQLITE
from proxy.store.values import KeyedEvent
from tests.pg_server import fresh_schema

T0 = "2026-11-30T10:00:00.000000+00:00"
ROWS = [
    # session, seq, event_id, type, role, content, complete, event_key
    ("s1", 1, "evt_a", "message", "user", [{"type": "text", "text": "first"}], True, "m0:k1"),
    ("s1", 2, "evt_b", "answer", "assistant", {"content": [{"type": "text", "text": "hi"}]}, True, "a1:k1"),
    ("s1", 3, "evt_c", "message", "user", "a plain string", True, None),  # before migration 4
    ("s2", 1, "evt_d", "answer", "assistant", None, False, "x1:k:d"),
]


def _expected_record(session: str, seq: int, event_id: str, type_: str, role: str, content: object, complete: bool) -> bytes:
    """The record bytes the previous release wrote for an event (its JSONL line, its digest)."""
    return orjson.dumps(
        {
            "schema_version": 1,
            "sequence": seq,
            "recorded_at": T0,
            "session_id": session,
            "event_id": event_id,
            "type": type_ if complete else f"{type_}.incomplete",
            "role": role,
            "content": content,
        }
    )


def _sqlite_at_7(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at TEXT NOT NULL)"
    )
    for migration in MIGRATIONS:
        if migration.version > 7:
            break
        for statement in migration.statements_for(SQLITE):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, ?)", (migration.version, migration.name, T0)
        )
    for session, seq, event_id, type_, role, content, complete, key in ROWS:
        conn.execute(
            "INSERT INTO transcript_events (tenant, session, seq, event_id, recorded_at, type, role,"
            " content, complete, prefix_count, prefix_hash, event_key)"
            " VALUES ('t', ?, ?, ?, ?, ?, ?, ?, ?, 1, 'h', ?)",
            (session, seq, event_id, T0, type_, role, orjson.dumps(content).decode(), int(complete), key),
        )
    for session, last in (("s1", 3), ("s2", 1)):
        conn.execute(
            "INSERT INTO transcript_heads VALUES ('t', ?, ?, ?, 'head')", (session, last, last)
        )
        conn.execute("INSERT INTO sessions VALUES ('t', ?, ?, ?)", (session, T0, T0))
    conn.close()


async def _pg_at_7(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at TEXT NOT NULL)"
        )
        for migration in MIGRATIONS:
            if migration.version > 7:
                break
            for statement in migration.statements_for(POSTGRES):
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_migrations VALUES ($1, $2, $3)", migration.version, migration.name, T0
            )
        for session, seq, event_id, type_, role, content, complete, key in ROWS:
            await conn.execute(
                "INSERT INTO transcript_events (tenant, session, seq, event_id, recorded_at, type,"
                " role, content, complete, prefix_count, prefix_hash, event_key)"
                " VALUES ('t', $1, $2, $3, $4, $5, $6, $7, $8, 1, 'h', $9)",
                session, seq, event_id, T0, type_, role, orjson.dumps(content).decode(), complete, key,
            )
        for session, last in (("s1", 3), ("s2", 1)):
            await conn.execute(
                "INSERT INTO transcript_heads VALUES ('t', $1, $2, $3, 'head')", session, last, last
            )
            await conn.execute("INSERT INTO sessions VALUES ('t', $1, $2, $2)", session, T0)
    finally:
        await conn.close()


async def _check_upgraded(url: str) -> None:
    store = await open_store(url)
    try:
        assert 8 in [m.version for m in await store.applied_migrations()]
        for session, seq, event_id, type_, role, content, complete, _key in ROWS:
            events = await store.transcript_events("t", session, seq - 1, 1)
            assert len(events) == 1
            recorded = events[0]
            assert (recorded.seq, recorded.agent, recorded.event.event_id) == (seq, "", event_id)
            assert recorded.event.content == content
            assert recorded.pointer == format_pointer(TranscriptPointer(session, seq))
            expected = _expected_record(session, seq, event_id, type_, role, content, complete)
            assert record_sha256(recorded) == hashlib.sha256(expected).hexdigest()
        # the recorder goes on where it stopped, and the old keys still hold their events
        assert await store.recorded_prefix("t", "s1") == Prefix(3, "head")
        assert await store.transcript_keys_held("t", "s1", ["m0:k1", "a1:k1", "zz"]) == {"m0:k1", "a1:k1"}
        assert await store.transcript_seqs("t", "s1", ["m0:k1", "a1:k1"]) == {"m0:k1": 1, "a1:k1": 2}
        new = TranscriptEvent("evt_new", T0, "message", "user", "next", True)
        recorded_now = await store.record_transcript("t", "s1", [KeyedEvent("m3:k4", new)], Prefix(4, "h4"))
        assert recorded_now.seqs == (4,)
        # an agent of the same session starts its own numbering, and is listed
        agent = TranscriptEvent("evt_agent", T0, "message", "user", "sub", True)
        got = await store.record_transcript(
            "t", "s1", [KeyedEvent("m0:k1", agent)], Prefix(1, "a"), agent="sub1", parent=""
        )
        assert got.seqs == (1,)
        assert [(a.agent, a.events) for a in await store.session_agents("t", "s1")] == [("", 4), ("sub1", 1)]
        assert [e.event.event_id for e in await store.transcript_events("t", "s1")] == [
            "evt_a", "evt_b", "evt_c", "evt_new"
        ]
    finally:
        await store.close()


async def test_sqlite_keeps_every_event_and_pointer(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _sqlite_at_7(path)
    await _check_upgraded(f"sqlite:///{path}")


async def test_postgres_keeps_every_event_and_pointer() -> None:
    with fresh_schema("agents") as url:
        await _pg_at_7(url)
        await _check_upgraded(url)


def test_the_migration_is_named_once_on_both_backends() -> None:
    (eighth,) = [m for m in MIGRATIONS if m.version == 8]
    assert eighth.name.startswith("conversations per agent")
    assert eighth.statements_for(SQLITE) and eighth.statements_for(POSTGRES)


@pytest.mark.parametrize("agent", ["", "a1"])
async def test_an_agent_id_is_checked_like_a_session_id(tmp_path: Path, agent: str) -> None:
    from proxy.core.durable import InvalidWrite

    store = await open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        with pytest.raises(InvalidWrite):
            await store.transcript_events("t", "s1", agent="../x")
        with pytest.raises(InvalidWrite):
            await store.record_transcript(
                "t", "s1", [KeyedEvent("k", TranscriptEvent("e", T0, "message", "user", "x", True))],
                Prefix(1, "h"), agent=agent, parent="bad parent",
            )
    finally:
        await store.close()
