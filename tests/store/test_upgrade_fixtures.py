"""Stores made by an earlier release open, migrate in place and read back every row.

The fixtures in ``tests/data/stores/`` were written by main at 7128ac6 (schema 10) through its own
API (``make_main_stores.py``, ``main_stores.populate``): the SQLite file itself, and a
``pg_dump --inserts`` of the PostgreSQL schema, restored here into a fresh schema. Today's code
opens each (migrating it to the latest schema), and then:

* every row of every table the release wrote is still there, unchanged (read with the database's
  own driver, not through the proxy);
* what the release read back through the ``Store`` protocol reads back the same today: durable
  state and history, every conversation's transcript, pointers, prefixes and keys, agents,
  manifests, plans, summaries, calibration, usage rows and sums, quota counters, artifact
  manifests and audit rows.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import asyncpg
import pytest

from proxy.store import open_store
from proxy.store.migrations import MIGRATIONS
from tests.pg_server import fresh_schema
from tests.store.main_stores import postgres_rows, snapshot, sqlite_rows

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "stores"
RELEASES = ["main-7128ac6"]


def expected(release: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{release}.json").read_text())
    return data


def _json(value: Any) -> Any:
    """As the maker wrote it (JSON: tuples are lists, keys are text)."""
    return json.loads(json.dumps(value))


def _latest(rows: dict[str, list[list[Any]]]) -> dict[str, list[list[Any]]]:
    """The rows without the migrations this code applied on top of the release's."""
    out = dict(rows)
    out["schema_migrations"] = [r for r in rows["schema_migrations"] if r[0] <= 10]
    return out


async def _check(url: str, rows: Any, before: dict[str, Any]) -> None:
    store = await open_store(url)
    try:
        applied = [m.version for m in await store.applied_migrations()]
        assert applied == [m.version for m in MIGRATIONS]
        after_rows = _json(_latest(await rows()))
        assert after_rows == before["rows"]
        got = _json(await snapshot(store))
        want = dict(before["api"])
        want["migrations"] = [[m.version, m.name] for m in MIGRATIONS]
        assert got == want
    finally:
        await store.close()


@pytest.mark.parametrize("release", RELEASES)
async def test_a_sqlite_store_of_an_earlier_release_reads_back_every_row(
    release: str, tmp_path: Path
) -> None:
    before = expected(release)["sqlite"]
    db = tmp_path / "store.db"
    shutil.copyfile(FIXTURES / f"{release}.db", db)
    assert _json(sqlite_rows(str(db))) == before["rows"]  # the fixture is what the maker read

    async def rows() -> dict[str, list[list[Any]]]:
        return sqlite_rows(str(db))

    await _check(f"sqlite:///{db}", rows, before)


def restore_statements(dump: str, schema: str) -> str:
    """A ``pg_dump`` of the schema ``cp_fixture`` as SQL for another (existing) schema: comments,
    psql's backslash commands and the ``CREATE SCHEMA`` left out."""
    lines = [
        line.replace("cp_fixture.", f'"{schema}".')
        for line in dump.splitlines()
        if not line.startswith(("\\", "--")) and line.strip() != "CREATE SCHEMA cp_fixture;"
    ]
    text = "\n".join(lines)
    assert not re.search(r"\bcp_fixture\b", text)
    return text


@pytest.mark.parametrize("release", RELEASES)
async def test_a_postgres_store_of_an_earlier_release_reads_back_every_row(release: str) -> None:
    before = expected(release)["postgres"]
    with fresh_schema() as url:
        schema = dict(parse_qsl(urlsplit(url).query))["search_path"]
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                restore_statements((FIXTURES / f"{release}.pg.sql").read_text(), schema)
            )
        finally:
            await conn.close()
        assert _json(await postgres_rows(url)) == before["rows"]

        async def rows() -> dict[str, list[list[Any]]]:
            return await postgres_rows(url)

        await _check(url, rows, before)


# -- the schema a new store gets is the schema an upgraded one has -----------------------------


def _sqlite_schema(path: str) -> list[tuple[str, str, str]]:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return [(t, n, " ".join((s or "").replace("(", " ( ").replace(")", " ) ").split())) for t, n, s in rows]


async def _postgres_schema(url: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type, collation_name, is_nullable, column_default,"
            " is_identity FROM information_schema.columns WHERE table_schema = current_schema()"
            " ORDER BY table_name, column_name"
        )
        constraints = await conn.fetch(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = current_schema() ORDER BY 1, 2"
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexname, replace(indexdef, current_schema() || '.', '')"
            " FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1, 2"
        )
    finally:
        await conn.close()
    return [tuple(r) for r in (*columns, *constraints, *indexes)]


@pytest.mark.parametrize("release", RELEASES)
async def test_a_new_sqlite_store_has_the_schema_of_an_upgraded_one(release: str, tmp_path: Path) -> None:
    upgraded = tmp_path / "upgraded.db"
    shutil.copyfile(FIXTURES / f"{release}.db", upgraded)
    await (await open_store(f"sqlite:///{upgraded}")).close()
    fresh = tmp_path / "fresh.db"
    await (await open_store(f"sqlite:///{fresh}")).close()
    assert _sqlite_schema(str(fresh)) == _sqlite_schema(str(upgraded))


@pytest.mark.parametrize("release", RELEASES)
async def test_a_new_postgres_store_has_the_schema_of_an_upgraded_one(release: str) -> None:
    with fresh_schema() as upgraded, fresh_schema() as fresh:
        schema = dict(parse_qsl(urlsplit(upgraded).query))["search_path"]
        conn = await asyncpg.connect(upgraded)
        try:
            await conn.execute(restore_statements((FIXTURES / f"{release}.pg.sql").read_text(), schema))
        finally:
            await conn.close()
        for url in (upgraded, fresh):
            await (await open_store(url)).close()
        assert await _postgres_schema(fresh) == await _postgres_schema(upgraded)
