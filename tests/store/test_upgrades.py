"""Upgrades that say what they do (issue 26 #5), on SQLite and PostgreSQL, as an operator runs them:

* each migration applied at start logs one line: its number, its name, how long it took (and one
  line before, saying what is about to happen); a failed migration rolls them all back and says so;
* ``context-proxy migrate --check`` reports the schema and the pending migrations and changes
  nothing (exit 1 when some are pending); ``context-proxy migrate`` applies them;
* a release on a store a newer release migrated exits with one line (the schema found, the one
  supported, what to do), no traceback, and changes nothing: ``serve`` and ``migrate`` alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest

from proxy.store import StoreUnavailable, open_store
from proxy.store.migrations import LATEST, MIGRATIONS
from proxy.store.sql import POSTGRES, SQLITE
from tests.pg_server import fresh_schema

FUTURE = LATEST + 1


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema("upgrades") as pg:
            yield pg
    else:
        yield f"sqlite:///{tmp_path / 'state' / 'store.db'}"


def _sql(url: str, *statements: tuple[str, tuple[object, ...]]) -> list[list[object]]:
    """Run statements on the store's database with its own driver; the last one's rows."""
    rows: list[list[object]] = []
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            for sql, params in statements:
                rows = [list(r) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()
        return rows

    async def run() -> list[list[object]]:
        conn = await asyncpg.connect(url)
        try:
            out: list[list[object]] = []
            for sql, params in statements:
                out = [list(r.values()) for r in await conn.fetch(POSTGRES.sql(sql), *params)]
            return out
        finally:
            await conn.close()

    with ThreadPoolExecutor(max_workers=1) as pool:  # callers may be inside a loop
        return pool.submit(asyncio.run, run()).result()


def at_version(url: str, version: int) -> None:
    """A store as a release at ``version`` left it (its migrations, recorded)."""
    dialect = SQLITE if url.startswith("sqlite") else POSTGRES
    statements: list[tuple[str, tuple[object, ...]]] = [
        ("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
         " applied_at TEXT NOT NULL)", ()),
    ]  # fmt: skip
    for m in MIGRATIONS:
        if m.version <= version:
            statements += [(s, ()) for s in m.statements_for(dialect)]
            statements.append(
                ("INSERT INTO schema_migrations VALUES (?, ?, '2026-01-01T00:00:00Z')", (m.version, m.name))
            )
    _sql(url, *statements)


def recorded(url: str) -> list[int]:
    rows = _sql(url, ("SELECT version FROM schema_migrations ORDER BY version", ()))
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


def has_table(url: str, table: str) -> bool:
    dialect = SQLITE if url.startswith("sqlite") else POSTGRES
    return bool(_sql(url, (dialect.has_table, (table,))))


def cli(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nstore:\n  url: '{url}'\n")
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )


# -- log lines ------------------------------------------------------------------------------------


async def test_each_migration_applied_at_start_logs_its_number_name_and_duration(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    at_version(url, 7)
    with caplog.at_level(logging.INFO, logger="context_proxy.store.migrations"):
        store = await open_store(url)
        await store.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "context_proxy.store.migrations"]
    assert lines[0] == f"store schema 7 -> {LATEST}: applying 3 migrations (8, 9, 10)"
    pending = [m for m in MIGRATIONS if m.version > 7]
    assert len(lines) == 1 + len(pending)
    for line, m in zip(lines[1:], pending, strict=True):
        assert re.fullmatch(rf"store migration {m.version} applied in \d+\.\d{{3}} s: {re.escape(m.name)}", line)
    assert recorded(url) == [m.version for m in MIGRATIONS]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="context_proxy.store.migrations"):
        store = await open_store(url)  # up to date: nothing to say
        await store.close()
    assert [r for r in caplog.records if r.name == "context_proxy.store.migrations"] == []


async def test_a_failed_migration_rolls_every_one_back_and_says_so(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    at_version(url, 7)
    # a column migration 9 adds, already there (a hand-made change): 9 fails, 8 is undone too
    _sql(url, ("ALTER TABLE usage_ledger ADD COLUMN agent TEXT", ()))
    with caplog.at_level(logging.INFO, logger="context_proxy.store.migrations"), pytest.raises(StoreUnavailable):
        await open_store(url)
    lines = [r.getMessage() for r in caplog.records if r.name == "context_proxy.store.migrations"]
    assert lines[0].startswith("store schema 7 -> ")
    assert re.fullmatch(r"store migrations rolled back \(\w+\): the schema stays at version 7", lines[-1])
    assert not any("applied in" in line for line in lines)
    assert recorded(url) == [1, 2, 3, 4, 5, 6, 7] and not has_table(url, "session_agents")


# -- migrate --check, migrate ----------------------------------------------------------------------


def test_migrate_check_lists_what_is_pending_and_changes_nothing(url: str, tmp_path: Path) -> None:
    at_version(url, 7)
    checked = cli(tmp_path, url, "migrate", "--check")
    assert checked.returncode == 1, checked.stderr
    lines = checked.stdout.splitlines()
    assert f"schema 7; 3 migrations pending (this release: {LATEST})" in lines[0]
    assert "one-way (back up first)" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["8", "9", "10"]
    assert "conversations per agent" in lines[1] and "existing rows: SQLite copies" in lines[1]
    assert "password" not in checked.stdout and checked.stderr == ""
    assert recorded(url) == [1, 2, 3, 4, 5, 6, 7] and not has_table(url, "session_agents")

    applied = cli(tmp_path, url, "migrate")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip().endswith(f"schema {LATEST}; applied 8, 9, 10")
    assert re.search(r"store migration 8 applied in \d+\.\d{3} s: conversations per agent", applied.stderr)
    assert recorded(url) == [m.version for m in MIGRATIONS]

    again = cli(tmp_path, url, "migrate", "--check")
    assert again.returncode == 0 and again.stdout.strip().endswith(f"schema {LATEST}, up to date (this release: {LATEST})")


def test_migrate_check_on_no_store_yet_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state" / "store.db"
    checked = cli(tmp_path, f"sqlite:///{path}", "migrate", "--check")
    assert checked.returncode == 1, checked.stderr
    assert f"no store yet; {LATEST} migrations pending" in checked.stdout
    assert not path.exists() and not path.parent.exists()


def test_migrate_check_on_an_unreachable_store_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    checked = cli(tmp_path, f"sqlite:///{blocker / 'store.db'}", "migrate")
    assert checked.returncode == 2
    assert len(checked.stderr.splitlines()) == 1 and "Traceback" not in checked.stderr
    assert checked.stderr.startswith("context-proxy migrate: sqlite:///") and "cannot" in checked.stderr


# -- a store migrated by a newer release --------------------------------------------------------


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["migrate"], ["migrate", "--check"]])
def test_a_store_of_a_newer_release_is_one_clear_line_and_no_change(
    url: str, tmp_path: Path, command: list[str]
) -> None:
    store_at_latest = cli(tmp_path, url, "migrate")
    assert store_at_latest.returncode == 0, store_at_latest.stderr
    _sql(url, ("INSERT INTO schema_migrations VALUES (?, 'from the future', '2030-01-01T00:00:00Z')", (FUTURE,)))
    before = recorded(url)

    done = cli(tmp_path, url, *command)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()  # one line, nothing else (no traceback, no log line)
    assert line == (
        f"context-proxy: the store's schema is version {FUTURE}, newer than this release supports"
        f" (up to {LATEST}; unknown migrations: {FUTURE}): a newer release migrated it. Run that"
        " release or a later one, or restore the backup taken before the upgrade"
        " (docs/operations/upgrading.md); nothing was changed"
    )
    assert recorded(url) == before
