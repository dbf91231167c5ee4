"""The PostgreSQL backend: a pool of asyncpg connections, the families' jobs awaited on the loop.

The queries are the families' (``proxy.store.sql``: the same as SQLite's); what is PostgreSQL's
own is how the database is driven:

* **Locking.** ``READ COMMITTED`` transactions; a write about a session begins with the upsert of
  its ``sessions`` row, which locks it until commit (``proxy.store.durable.lock_session``). A
  writer waits at most ``lock_timeout`` (the ``busy_timeout_ms`` of
  :func:`proxy.store.open_store`) for a lock, then gets :class:`StoreBusy`, as SQLite does after
  its busy timeout.
* **Durability.** A method returns after ``COMMIT`` returned. ``synchronous_commit`` is left at
  the server's setting unless that is ``off``: then the store's connections set it to ``on``.
* **Schema.** The migrations of :mod:`proxy.store.schema`, applied at open in one transaction
  under a transaction-scoped advisory lock, so replicas starting together migrate once. Tables go
  in the first schema of the connection's ``search_path`` (a URL query parameter such as
  ``?search_path=cp`` is passed to the server as a setting). Text keys use the ``"C"`` collation
  so ``list_sessions`` sorts by code point, as SQLite's ``BINARY`` does.
* **Errors.** asyncpg, socket and timeout errors become :class:`StoreUnavailable` in one place
  (:meth:`PostgresStore._run`), a lock wait past ``lock_timeout`` (or a deadlock) becomes
  :class:`StoreBusy`; messages name the error class and SQLSTATE, never the URL (it may hold a
  password) or content. Every outcome goes to ``health`` (:mod:`proxy.store.health`).
* **Connections.** The pool keeps no floor (``min_size`` 0): asyncpg restores a floor in the
  background, and logs a traceback for every failed attempt while the server is down (with
  backoff, up to a minute apart, long after an outage). Connections are made when an operation
  needs one, so a failure surfaces once, in that operation, as ``StoreUnavailable``; an idle
  connection is closed after asyncpg's 300 s, and the next operation pays one connect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import asyncpg

import proxy.store.clock as clock
from proxy.store.backend import SQLStore
from proxy.store.errors import StoreBusy, StoreError, StoreUnavailable
from proxy.store.health import Kind
from proxy.store.migrations import SchemaStatus, migrate, schema_status
from proxy.store.sql import POSTGRES, Job, Row, Tx

__all__ = ["PgTx", "PostgresStore", "describe_error"]

T = TypeVar("T")

DEFAULT_LOCK_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_SECONDS = 10.0
COMMAND_TIMEOUT_SECONDS = 30.0  # one statement, client side; the pool's acquire waits as long
MIGRATION_TIMEOUT_SECONDS = 300.0  # a migration statement, and the wait for another replica's
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000  # a stalled client cannot hold a session's lock forever
CLOSE_TIMEOUT_SECONDS = 10.0
DEFAULT_POOL_MIN_SIZE = 0  # no floor: asyncpg's floor upkeep logs a traceback per failed try
DEFAULT_POOL_MAX_SIZE = 10
# pg_advisory_xact_lock key for migrations: b"ctxproxy" as a big-endian signed 64-bit integer.
MIGRATION_LOCK_KEY = int.from_bytes(b"ctxproxy", "big", signed=True)

# Everything that means "the database could not do it" (server errors not handled where they
# happen, a lost or refused connection, a closed pool, a timeout).
_BUSY = (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError)  # it answered: a lock
UNAVAILABLE = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def describe_error(exc: BaseException) -> str:
    """The error's class and SQLSTATE: never its message (it may name a host, a key or data)."""
    sqlstate = getattr(exc, "sqlstate", None)
    name = type(exc).__name__
    return f"{name} {sqlstate}" if isinstance(sqlstate, str) and sqlstate else name


class PgTx:
    """:class:`proxy.store.sql.Tx` on an asyncpg connection (``timeout``: per statement)."""

    dialect = POSTGRES

    def __init__(self, conn: Any, timeout: float | None = None) -> None:
        self.conn = conn
        self.timeout = timeout

    async def rows(self, sql: str, *params: object) -> list[Row]:
        rows: list[Row] = await self.conn.fetch(POSTGRES.sql(sql), *params, timeout=self.timeout)
        return rows

    async def row(self, sql: str, *params: object) -> Row | None:
        row: Row | None = await self.conn.fetchrow(
            POSTGRES.sql(sql), *params, timeout=self.timeout
        )
        return row

    async def value(self, sql: str, *params: object) -> Any:
        return await self.conn.fetchval(POSTGRES.sql(sql), *params, timeout=self.timeout)

    async def execute(self, sql: str, *params: object) -> int:
        status = await self.conn.execute(POSTGRES.sql(sql), *params, timeout=self.timeout)
        count = str(status).rsplit(" ", 1)[-1]
        return int(count) if count.isdigit() else 0

    async def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        await self.conn.executemany(POSTGRES.sql(sql), rows, timeout=self.timeout)

    def transaction(self) -> Any:
        return self.conn.transaction()


async def _migration_lock(tx: Tx) -> None:
    """Replicas starting together migrate once: the others wait here, then find nothing to do."""
    # Waiting for another replica's migration is part of opening: allow it time.
    await tx.execute(f"SET LOCAL lock_timeout = {int(MIGRATION_TIMEOUT_SECONDS * 1000)}")
    await tx.execute("SELECT pg_advisory_xact_lock(?)", MIGRATION_LOCK_KEY)


async def create_pool(url: str, settings: dict[str, str], min_size: int, max_size: int) -> Any:
    """A pool on ``url``; ``ValueError`` for a URL asyncpg cannot use, ``StoreUnavailable``
    when the server cannot be reached (no message repeats the URL)."""
    try:
        return await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_SECONDS,
            command_timeout=COMMAND_TIMEOUT_SECONDS,
            server_settings=settings,
        )
    except ValueError:  # asyncpg's ClientConfigurationError is one too
        raise ValueError("asyncpg cannot use this PostgreSQL store URL") from None
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"cannot open the store ({describe_error(exc)})") from None


class PostgresStore(SQLStore):
    """A :class:`proxy.store.base.Store` on a PostgreSQL database. Make one with :meth:`open`."""

    def __init__(self, pool: Any) -> None:
        super().__init__()
        self.dialect = POSTGRES
        self._pool = pool
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        min_size: int = DEFAULT_POOL_MIN_SIZE,
        max_size: int = DEFAULT_POOL_MAX_SIZE,
    ) -> PostgresStore:
        """Connect (a pool of ``min_size``..``max_size`` connections) and migrate.

        ``ValueError`` when asyncpg cannot use the URL, ``StoreUnavailable`` when the server
        cannot be reached or refuses the connection, ``SchemaTooNew``. No message repeats the URL.
        """
        settings = {
            "application_name": "context-proxy",
            "lock_timeout": str(int(lock_timeout_ms)),
            "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
        }
        pool = await create_pool(url, settings, min_size, max_size)
        try:
            async with pool.acquire(timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                synchronous_commit = await conn.fetchval("SHOW synchronous_commit")
            if synchronous_commit == "off":
                # Set for the database or role: override it for this store's connections (a
                # startup setting survives the RESET ALL of a connection returned to the pool).
                await pool.close()
                pool = await create_pool(
                    url, {**settings, "synchronous_commit": "on"}, min_size, max_size
                )
            async with pool.acquire(timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                tx = PgTx(conn, MIGRATION_TIMEOUT_SECONDS)
                await migrate(tx, clock.now_iso, _migration_lock)
        except UNAVAILABLE as exc:
            pool.terminate()
            raise StoreUnavailable(f"cannot open the store ({describe_error(exc)})") from None
        except BaseException:
            pool.terminate()
            raise
        return cls(pool)

    @staticmethod
    async def status(url: str) -> SchemaStatus:
        """What the database records and what opening it would apply; changes nothing."""
        try:
            conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_SECONDS)
        except ValueError:
            raise ValueError("asyncpg cannot use this PostgreSQL store URL") from None
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"cannot open the store ({describe_error(exc)})") from None
        try:
            return await schema_status(PgTx(conn, COMMAND_TIMEOUT_SECONDS))
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"cannot read the store ({describe_error(exc)})") from None
        finally:
            await conn.close()

    # -- the lanes (one pool) -------------------------------------------------------------------

    async def _run(self, job: Job[T], kind: Kind = "writes") -> T:
        """Run ``job`` on a pooled connection; database failures become ``StoreUnavailable``
        (``StoreBusy``: a lock wait timed out), and the outcome goes to ``health``."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        started = self.health.begin()
        try:
            async with self._pool.acquire(timeout=COMMAND_TIMEOUT_SECONDS) as conn:
                result = await job(PgTx(conn))
        except _BUSY as exc:
            self.health.ended(kind, started, None)  # the database answered
            raise StoreBusy(f"the store is busy ({describe_error(exc)})") from exc
        except UNAVAILABLE as exc:
            if self._closed:
                raise StoreUnavailable("the store is closed") from None
            error = StoreUnavailable(f"the store failed ({describe_error(exc)})")
            self.health.ended(kind, started, error)
            raise error from exc
        except (StoreError, ValueError):  # about the data (a conflict, an invalid write)
            self.health.ended(kind, started, None)
            raise
        self.health.ended(kind, started, None)
        return result

    async def _read(self, job: Job[T], kind: Kind = "reads") -> T:
        return await self._run(job, kind)

    async def _counters(self, job: Job[T], kind: Kind = "writes") -> T:
        return await self._run(job, kind)

    async def close(self) -> None:
        """Wait (up to ``CLOSE_TIMEOUT_SECONDS``) for calls in flight, then close the pool."""
        if self._closed:
            return
        self._closed = True
        self._forget_states()
        self.health.closed()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                await self._pool.close()
        except BaseException as exc:
            self._pool.terminate()
            if not isinstance(exc, UNAVAILABLE):
                raise

