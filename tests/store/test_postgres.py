"""What only the PostgreSQL backend has: its settings, locks, errors, migrations and crash safety.

The shared contract runs in ``test_store.py`` on both backends. Tests here that need a server use
the one ``.ci/pg start`` started (skipped without ``CONTEXT_PROXY_TEST_PG``), each in a fresh
schema; the server-crash test makes its own throwaway cluster.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from proxy.core.durable import Create, Fact, InvalidWrite
from proxy.store import (
    PostgresStore,
    Store,
    StoreError,
    StoreUnavailable,
    TranscriptEvent,
    open_store,
)
from proxy.store.migrations import MIGRATIONS
from proxy.store.sql import POSTGRES, SQLITE
from tests.pg_server import PrivateServer, fresh_schema, index_problems, server_url
from tests.store.test_crash_safety import (
    Acked,
    run_and_kill,
    verify,
    wait_for_lines,
    writer_process,
)

T0 = "2025-03-01T10:00:00Z"


def fact(item_id: str) -> Fact:
    return Fact(item_id, "x", "transcript:s1:1", T0)


def event(event_id: str, role: str = "user") -> TranscriptEvent:
    return TranscriptEvent(event_id, T0, "message", role, "text", True)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(pg_url)
    yield store
    await store.close()


async def _admin(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url)


# -- schema ---------------------------------------------------------------------------------------


def test_every_migration_has_statements_for_both_databases() -> None:
    for m in MIGRATIONS:
        assert m.statements_for(POSTGRES) and m.statements_for(SQLITE), m.version


async def test_schema_migrations_table(pg_store: PostgresStore, pg_url: str) -> None:
    conn = await _admin(pg_url)
    try:
        rows = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() ORDER BY table_name"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [(m.version, m.name) for m in MIGRATIONS]
    assert [t["table_name"] for t in tables] == [
        "artifact_manifests",
        "calibration",
        "durable_changes",
        "gc_leases",
        "manifests",
        "plans",
        "quota_counters",
        "schema_migrations",
        "session_agents",
        "sessions",
        "source_audit",
        "summaries",
        "transcript_events",
        "transcript_heads",
        "usage_ledger",
    ]


async def test_a_newer_schema_is_refused(pg_store: PostgresStore, pg_url: str) -> None:
    conn = await _admin(pg_url)
    try:
        await conn.execute(
            "INSERT INTO schema_migrations VALUES ($1, 'from the future', '2030-01-01T00:00:00Z')",
            max(m.version for m in MIGRATIONS) + 1,
        )
    finally:
        await conn.close()
    with pytest.raises(StoreError, match="does not know"):
        await open_store(pg_url)


# -- connection settings and locks ----------------------------------------------------------------


async def test_connection_settings(pg_url: str) -> None:
    store = await open_store(pg_url, busy_timeout_ms=1234)
    assert isinstance(store, PostgresStore)
    try:
        row = await store._run(
            lambda tx: tx.row(
                "SELECT current_setting('lock_timeout'), current_setting('synchronous_commit'),"
                " current_setting('application_name'), current_setting('transaction_isolation')"
            )
        )
    finally:
        await store.close()
    assert tuple(row) == ("1234ms", "on", "context-proxy", "read committed")


async def test_synchronous_commit_off_is_overridden(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url + "&synchronous_commit=off")
    try:
        setting = await store._run(lambda tx: tx.value("SHOW synchronous_commit"))
    finally:
        await store.close()
    assert setting == "on"


async def test_a_writer_waits_for_the_session_lock_then_is_unavailable(pg_url: str) -> None:
    store = await open_store(pg_url, busy_timeout_ms=300)
    other = await _admin(pg_url)
    try:
        await store.write_changes("t", "s1", [Create(fact("f1"))])
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM sessions WHERE tenant = 't' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="LockNotAvailable"):
            await store.write_changes("t", "s1", [Create(fact("f2"))])
        with pytest.raises(StoreUnavailable):
            await store.append_transcript("t", "s1", [event("e1")], 1, "h")
        assert time.monotonic() - started < 5
        assert [f.id for f in (await store.current_state("t", "s1")).facts] == ["f1"]  # reads go on
        await tx.rollback()
        assert await store.write_changes("t", "s1", [Create(fact("f2"))]) == (1,)
        assert await store.append_transcript("t", "s1", [event("e1")], 1, "h") == 1
    finally:
        await other.close()
        await store.close()


async def test_dropped_connections_are_replaced(pg_store: PostgresStore, pg_url: str) -> None:
    await pg_store.write_changes("t", "s1", [Create(fact("f1"))])
    conn = await _admin(pg_url)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'context-proxy' AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    assert killed >= 1
    await asyncio.sleep(0.05)
    assert [f.id for f in (await pg_store.current_state("t", "s1")).facts] == ["f1"]
    assert await pg_store.ping() is True


# -- errors ---------------------------------------------------------------------------------------


async def test_unreachable_server_is_unavailable_without_the_password() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        await open_store("postgresql://user:secret@127.0.0.1:1/x")
    assert "secret" not in str(caught.value) and caught.value.__cause__ is None


async def test_unusable_url_is_a_value_error_without_the_password() -> None:
    for url in ("postgresql://user:secret@host:notaport/x", "postgres://u:secret@[::1/x"):
        with pytest.raises(ValueError) as caught:
            await open_store(url)
        assert "secret" not in str(caught.value) and caught.value.__cause__ is None


async def test_refused_logins_are_unavailable_without_the_password() -> None:
    base = server_url()
    if base is None:
        pytest.skip("needs CONTEXT_PROXY_TEST_PG")
    head, _, _ = base.rpartition("/")
    for url in (head + "/no_such_database", head.replace("postgres@", "nobody:secret@") + "/x"):
        with pytest.raises(StoreUnavailable) as caught:
            await open_store(url)
        assert "secret" not in str(caught.value) and "nobody" not in str(caught.value)


async def test_nul_characters_are_refused_by_field(pg_store: PostgresStore) -> None:
    with pytest.raises(InvalidWrite) as caught:
        await pg_store.append_transcript(
            "t", "s1", [event("e1"), event("e\x00", role="us\x00er")], 1, "h\x00"
        )
    assert [e.field for e in caught.value.errors] == [
        "prefix_hash",
        "events[1].event_id",
        "events[1].role",
    ]
    with pytest.raises(InvalidWrite) as caught:
        await pg_store.put_manifest("t", "c\x00", "s1", "{}")
    assert [e.field for e in caught.value.errors] == ["compaction_id"]
    assert await pg_store.get_manifest("t", "c\x00") is None
    assert await pg_store.list_sessions("t") == ()


async def test_closed_store(pg_store: PostgresStore) -> None:
    await pg_store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await pg_store.list_sessions("t")


# -- parity that a PostgreSQL default would break ---------------------------------------------------


async def test_sessions_sort_by_code_point(store: Store) -> None:
    """SQLite's BINARY order; a PostgreSQL locale collation would sort case-insensitively."""
    for session in ("b1", "B2", "a-x", "A_y", "a.z", "a1", "Z9"):
        await store.write_changes("t", session, [Create(fact("f1"))])
    assert await store.list_sessions("t") == ("A_y", "B2", "Z9", "a-x", "a.z", "a1", "b1")


# -- crash safety: the writer killed -----------------------------------------------------------------


def client_crash_loop(tmp_path: Path, kills: int) -> None:
    """``test_crash_safety``'s loop against PostgreSQL, with amcheck instead of integrity_check."""
    with fresh_schema("crash") as url:
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        acked = Acked()
        for run in range(kills):
            for line in run_and_kill(url, run, rng, tmp_path / "writer.stderr"):
                acked.add(line)
            try:
                asyncio.run(verify(url, acked))
                assert index_problems(url) == []
            except AssertionError as exc:
                raise AssertionError(f"after kill {run + 1} (seed {seed}): {exc}") from exc
        assert len(acked.facts) >= kills
        assert acked.batches


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    client_crash_loop(tmp_path, kills=10)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_acknowledged_writes_survive_sigkill_100_times(tmp_path: Path) -> None:
    client_crash_loop(tmp_path, kills=100)


# -- crash safety: the server crashed ----------------------------------------------------------------


def run_until_server_crash(
    server: PrivateServer, url: str, run: int, rng: random.Random, stderr_path: Path
) -> list[str]:
    """Start the writer, crash the server under it, return the writes it acknowledged."""
    with writer_process(url, run, stderr_path) as (proc, lines):
        wait_for_lines(proc, lines, rng.randint(1, 60))
        time.sleep(rng.uniform(0.0, 0.01))
        assert proc.poll() is None, "the writer stopped by itself"
        server.crash()
        returncode = proc.wait(30)  # the writer fails by itself: StoreUnavailable
    errors = stderr_path.read_text(errors="replace")
    assert returncode == 1 and "StoreUnavailable" in errors, errors
    return lines


def server_crash_loop(tmp_path: Path, crashes: int) -> None:
    server = PrivateServer()
    try:
        server.start()
        url = server.url
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        acked = Acked()
        for run in range(crashes):
            for line in run_until_server_crash(server, url, run, rng, tmp_path / "w.stderr"):
                acked.add(line)
            server.start()  # crash recovery replays the WAL
            try:
                asyncio.run(verify(url, acked))
                assert index_problems(url) == []
            except AssertionError as exc:
                raise AssertionError(f"after crash {run + 1} (seed {seed}): {exc}") from exc
        assert acked.batches
    finally:
        server.remove()


def test_acknowledged_writes_survive_a_server_crash(tmp_path: Path) -> None:
    server_crash_loop(tmp_path, crashes=3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_acknowledged_writes_survive_30_server_crashes(tmp_path: Path) -> None:
    server_crash_loop(tmp_path, crashes=30)


def test_an_open_store_outlives_a_server_restart() -> None:
    server = PrivateServer()

    async def scenario() -> None:
        store = await open_store(server.url)
        try:
            await store.write_changes("t", "s1", [Create(fact("f1"))])
            server.crash()
            with pytest.raises(StoreUnavailable):
                await store.write_changes("t", "s1", [Create(fact("f2"))])
            assert await store.ping() is False
            server.start()
            assert await store.ping() is True
            assert await store.write_changes("t", "s1", [Create(fact("f2"))]) == (1,)
            assert [f.id for f in (await store.current_state("t", "s1")).facts] == ["f1", "f2"]
        finally:
            await store.close()

    try:
        server.start()
        asyncio.run(scenario())
    finally:
        server.remove()
