"""What the garbage collector needs from the store, on both backends (issue 11 #5).

* **One runner at a time.** ``gc_leases`` holds one row per job (``retention``): a replica runs the
  collector only while it holds that row's lease, renewed between batches and released at the
  end; a crashed holder's lease expires after ``retention.lease_seconds``. Taking it is one
  upsert that succeeds only when the row is absent, expired, or already ours (the same statement
  on SQLite and PostgreSQL), so two replicas can never both hold it.
* **Small statements.** The collector reads candidates (``query``) and deletes them by primary key
  (``delete``), a batch per transaction; each delete re-checks its row's timestamp and liveness
  in its ``WHERE``, so a row that changed since it was read (a summary claimed again, a
  calibration figure refreshed) is kept.
* SQL is written with ``?`` placeholders; the PostgreSQL backend numbers them (``$1``...).
* SQLite work runs on the store's writer thread (never on the event loop), PostgreSQL's on the pool.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.store.postgres import PostgresStore
    from proxy.store.sqlite import SQLiteStore

__all__ = [
    "PG_MIGRATION_STATEMENTS",
    "SQLITE_MIGRATION_STATEMENTS",
    "RetentionBackend",
    "backend_for",
]

MIGRATION_NAME = "garbage collector leases and time indexes"
# The collector reads each tenant's rows oldest first: an index per collected table on
# (tenant, time) keeps that a range scan, not a sort of the tenant's whole table.
_TIME_INDEXES = (
    "CREATE INDEX plans_by_time ON plans (tenant, created_at)",
    "CREATE INDEX summaries_by_time ON summaries (tenant, updated_at)",
    "CREATE INDEX manifests_by_time ON manifests (tenant, stored_at)",
    "CREATE INDEX transcript_events_by_time ON transcript_events (tenant, recorded_at)",
)
SQLITE_MIGRATION_STATEMENTS = (
    """CREATE TABLE gc_leases (
        name TEXT NOT NULL PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID""",
    *_TIME_INDEXES,
)
PG_MIGRATION_STATEMENTS = (
    """CREATE TABLE gc_leases (
        name TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )""",
    *_TIME_INDEXES,
)

_TAKE_LEASE = (
    "INSERT INTO gc_leases (name, holder, expires_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at"
    " WHERE gc_leases.expires_at <= ? OR gc_leases.holder = excluded.holder"
    " RETURNING holder"
)
_RELEASE_LEASE = "UPDATE gc_leases SET expires_at = 0 WHERE name = ? AND holder = ?"


class RetentionBackend(Protocol):
    async def take_lease(self, name: str, holder: str, now: float, seconds: float) -> bool:
        """Hold (or renew) the lease ``name`` until ``now + seconds``; False if another holds it."""
        ...

    async def release_lease(self, name: str, holder: str) -> None: ...

    async def has_table(self, table: str) -> bool: ...

    async def query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]: ...

    async def delete(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        """Run ``sql`` once per row in one transaction; the number of rows it deleted."""
        ...


class _SQLiteRetention:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def take_lease(self, name: str, holder: str, now: float, seconds: float) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(_TAKE_LEASE, (name, holder, now + seconds, now)).fetchone()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return row is not None

        return await self._store._run(job)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._store._run(lambda conn: conn.execute(_RELEASE_LEASE, (name, holder)))

    async def has_table(self, table: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            return row is not None

        return await self._store._read(job)

    async def query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        return await self._store._read(
            lambda conn: [tuple(r) for r in conn.execute(sql, tuple(params)).fetchall()]
        )

    async def delete(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        def job(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                deleted = 0
                for row in rows:
                    deleted += conn.execute(sql, tuple(row)).rowcount
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return deleted

        return await self._store._run(job)


_PLACEHOLDER = re.compile(r"\?")


def _numbered(sql: str) -> str:
    counter = iter(range(1, 10_000))
    return _PLACEHOLDER.sub(lambda _m: f"${next(counter)}", sql)


class _PostgresRetention:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def take_lease(self, name: str, holder: str, now: float, seconds: float) -> bool:
        async def job(conn: Any) -> bool:
            row = await conn.fetchrow(_numbered(_TAKE_LEASE), name, holder, now + seconds, now)
            return row is not None

        return await self._store._run(job)

    async def release_lease(self, name: str, holder: str) -> None:
        async def job(conn: Any) -> None:
            await conn.execute(_numbered(_RELEASE_LEASE), name, holder)

        await self._store._run(job)

    async def has_table(self, table: str) -> bool:
        async def job(conn: Any) -> bool:
            return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table))

        return await self._store._run(job)

    async def query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        async def job(conn: Any) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await conn.fetch(_numbered(sql), *params)]

        return await self._store._run(job)

    async def delete(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        statement = _numbered(sql)

        async def job(conn: Any) -> int:
            deleted = 0
            async with conn.transaction():
                for row in rows:
                    status = await conn.execute(statement, *row)
                    deleted += int(str(status).rsplit(" ", 1)[-1])
            return deleted

        return await self._store._run(job)


def backend_for(store: object) -> RetentionBackend | None:
    """The retention operations of ``store`` (None for a store that is neither backend)."""
    from proxy.store.postgres import PostgresStore
    from proxy.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return _SQLiteRetention(store)
    if isinstance(store, PostgresStore):
        return _PostgresRetention(store)
    return None
