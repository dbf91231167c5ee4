"""What only the SQLite backend has: its file, its pragmas, its migration table."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from proxy.core.durable import Create, Fact
from proxy.store import SQLiteStore, StoreError, StoreUnavailable, open_store, sqlite_path
from proxy.store.migrations import MIGRATIONS
from proxy.store.sql import Tx


async def test_pragmas_of_the_connection(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db", busy_timeout_ms=1234)
    try:

        async def job(tx: Tx) -> tuple[object, ...]:
            names = ("journal_mode", "synchronous", "busy_timeout")
            return tuple([await tx.value(f"PRAGMA {name}") for name in names])

        pragmas = await store._run(job)
    finally:
        await store.close()
    assert pragmas == ("wal", 2, 1234)  # synchronous 2 == FULL


async def test_schema_migrations_table(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "s.db"  # folders are created
    store = await open_store(f"sqlite:///{path}")
    await store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT version, name FROM schema_migrations ORDER BY version"
        ).fetchall()
    assert rows == [(m.version, m.name) for m in MIGRATIONS]
    versions = [m.version for m in MIGRATIONS]  # increasing (numbers may be reserved by branches)
    assert versions == sorted(set(versions)) and versions[0] == 1


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await (await open_store(f"sqlite:///{path}")).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, 'from the future', '2030-01-01T00:00:00Z')",
            (max(m.version for m in MIGRATIONS) + 1,),
        )
    with pytest.raises(StoreError, match="does not know"):
        await open_store(f"sqlite:///{path}")


async def test_unopenable_file_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreUnavailable) as caught:
        await open_store(f"sqlite:///{blocker / 'store.db'}")
    assert str(tmp_path) not in str(caught.value)

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailable):
        await open_store(f"sqlite:///{garbage}")


def test_url_paths() -> None:
    assert sqlite_path("sqlite:///state/context-proxy.db") == "state/context-proxy.db"
    assert sqlite_path("sqlite:////var/lib/cp/x.db") == "/var/lib/cp/x.db"
    for bad in ("sqlite:///", "sqlite:///:memory:", "sqlite://x.db", "sqlite:///dir/"):
        with pytest.raises(ValueError):
            sqlite_path(bad)


async def test_history_written_by_another_connection_is_folded_in(tmp_path: Path) -> None:
    """The in-memory view cache only ever reads rows after the last seq it folded."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    a, b = await open_store(url), await open_store(url)
    try:
        await a.write_changes(
            "t", "s1", [Create(Fact("f1", "x", "transcript:s1:1", "2025-01-01T00:00:00Z"))]
        )
        assert len((await a.current_state("t", "s1")).facts) == 1  # now cached in a
        for n in range(2, 5):
            fact = Fact(f"f{n}", "x", "transcript:s1:1", "2025-01-01T00:00:00Z")
            await b.write_changes("t", "s1", [Create(fact)])
        assert [f.id for f in (await a.current_state("t", "s1")).facts] == ["f1", "f2", "f3", "f4"]
        assert await a.write_changes(
            "t", "s1", [Create(Fact("f5", "x", "transcript:s1:1", "2025-01-01T00:00:00Z"))]
        ) == (1,)
        assert [h.seq for h in await b.history("t", "s1")] == [1, 2, 3, 4, 5]
    finally:
        await a.close()
        await b.close()


async def test_many_replicas_opening_one_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Switching a new file to WAL answers SQLITE_BUSY at once (no busy wait) while another
    connection does the same: every opener must wait its turn, not fail (failed ~5% of rounds
    of 12 openers before the retry)."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'r{round_}' / 'store.db'}"
        stores = await asyncio.gather(*(open_store(url) for _ in range(12)))
        try:
            assert len({len(await s.applied_migrations()) for s in stores}) == 1
        finally:
            for store in stores:
                await store.close()
