"""Make the upgrade fixtures: a SQLite store and a PostgreSQL dump written by an earlier release.

Run it with that release's code, not this checkout's (the fixtures in ``tests/data/stores/`` were
made with main at 7128ac6, schema 10)::

    git worktree add --detach /tmp/base 7128ac6
    (cd /tmp/base && python3 -m venv .venv && .venv/bin/pip install -q -e .)
    . .ci/pg.env     # a PostgreSQL server (bash .ci/pg start)
    /tmp/base/.venv/bin/python tests/store/make_main_stores.py tests/data/stores main-7128ac6

Writes ``<name>.db`` (the SQLite file), ``<name>.pg.sql`` (``pg_dump --inserts`` of a schema
named ``cp_fixture``: the test restores it into a fresh schema under another name) and
``<name>.json`` (what the release read back through its own API, every table's rows, the
release's commit).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from main_stores import populate, postgres_rows, snapshot, sqlite_rows

SCHEMA = "cp_fixture"


def _with_schema(url: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("search_path", SCHEMA)])))


async def _made(url: str) -> dict[str, object]:
    from proxy.store import open_store

    store = await open_store(url)
    try:
        await populate(store)
        return await snapshot(store)
    finally:
        await store.close()


async def _reset_schema(base: str, create: bool) -> None:
    admin = await asyncpg.connect(base)
    try:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
        if create:
            await admin.execute(f'CREATE SCHEMA "{SCHEMA}"')
    finally:
        await admin.close()


async def _made_pg(base: str) -> tuple[dict[str, object], dict[str, list[list[object]]]]:
    await _reset_schema(base, True)
    return await _made(_with_schema(base)), await postgres_rows(_with_schema(base))


def main(folder: Path, name: str) -> None:
    import proxy

    root = Path(proxy.__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    sqlite_api = asyncio.run(_made(f"sqlite:///{db}"))
    sqlite_table_rows = sqlite_rows(str(db))
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)

    base = os.environ["CONTEXT_PROXY_TEST_PG"]
    pg_api, pg_rows = asyncio.run(_made_pg(base))
    dump = subprocess.run(
        ["pg_dump", "--schema", SCHEMA, "--inserts", "--no-owner", "--no-privileges",
         "--no-comments", "--dbname", base],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (folder / f"{name}.pg.sql").write_text(dump)
    asyncio.run(_reset_schema(base, False))

    expected = {
        "commit": commit,
        "sqlite": {"api": sqlite_api, "rows": sqlite_table_rows},
        "postgres": {"api": pg_api, "rows": pg_rows},
    }
    (folder / f"{name}.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
