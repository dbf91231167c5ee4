"""The SQLite backend: one file, WAL mode, the families' jobs run on worker threads.

* The stdlib ``sqlite3`` write connection lives in a dedicated thread (a one-worker executor):
  every write sends its job there (``proxy.store.sql.run_sync``: the whole job runs in the thread,
  each of its statements answered at once) and awaits the result, so the event loop never blocks
  on disk and the connection is only ever used by the thread that opened it. Writes of one store
  run one at a time, in order.
* Reads run on a second, read-only connection in a thread of its own. WAL lets a reader go on
  while another connection (this store's writer, another process) holds the write lock, so an
  admin read or a readiness ping never queues behind writes waiting for that lock (issue 11 #4:
  reads used to wait ~10 s behind queued background writes). A read sees every write the store
  acknowledged before the read was called (each read statement starts from the latest commit).
* The quota counters have a third connection and thread (``_Lane``, opened at first use), with
  ``synchronous = NORMAL`` (``proxy.store.quota``).
* ``journal_mode=WAL`` (readers never block the writer), ``synchronous=FULL`` (a commit that
  returned survives power loss, not only a process crash: every write a method acknowledges is one
  the proxy may have told a client about), ``busy_timeout`` (several processes or stores may share
  the file; a writer waits for the lock instead of failing at once).
* Every write transaction is ``BEGIN IMMEDIATE``: the write lock is taken before the first read,
  so two appenders cannot both see ``last_seq = 7`` and both write 8.
* sqlite3 errors become :class:`StoreUnavailable` in one place (:func:`_mapped`; ``StoreBusy`` for a
  lock wait past the busy timeout); every outcome goes to ``health`` (:mod:`proxy.store.health`),
  reported from the loop in :meth:`SQLiteStore._submit`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import proxy.store.clock as clock
from proxy.store.backend import SQLStore
from proxy.store.errors import StoreBusy, StoreError, StoreUnavailable
from proxy.store.health import Kind
from proxy.store.migrations import EMPTY, SchemaStatus, migrate, schema_status
from proxy.store.sql import SQLITE, Job, Row, run_sync

__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "SQLiteStore", "SQLiteTx"]

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 5000
_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")  # error names (and their extended codes) of a lock wait


class SQLiteTx:
    """:class:`proxy.store.sql.Tx` on a ``sqlite3`` connection (autocommit mode): every call
    answers at once, in the calling thread."""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def rows(self, sql: str, *params: object) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    async def row(self, sql: str, *params: object) -> Row | None:
        row: Row | None = self.conn.execute(sql, params).fetchone()
        return row

    async def value(self, sql: str, *params: object) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    async def execute(self, sql: str, *params: object) -> int:
        return self.conn.execute(sql, params).rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """``BEGIN IMMEDIATE``: the write lock first; committed on success, rolled back on any
        exception."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                # The original error is what matters; a failed rollback (connection broken) adds
                # nothing, and SQLite rolls back an open transaction when the connection closes.
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise


def _connect(path: Path, busy_timeout_ms: int, *pragmas: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
    try:
        for pragma in (f"busy_timeout = {int(busy_timeout_ms)}", *pragmas):
            conn.execute(f"PRAGMA {pragma}")
    except sqlite3.Error as exc:
        conn.close()
        raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
    return conn


def _mapped(tx: SQLiteTx | None, job: Job[T]) -> T:
    """In a worker thread: ``job`` on the connection; sqlite3's errors as the store's."""
    if tx is None:  # the job is never called: no coroutine left unawaited
        raise StoreUnavailable("the store is closed")
    try:
        return run_sync(job(tx))
    except sqlite3.Error as exc:
        name = getattr(exc, "sqlite_errorname", type(exc).__name__)
        if name.startswith(_BUSY):  # another writer's lock, past the busy timeout
            raise StoreBusy(f"the store is busy ({name})") from exc
        raise StoreUnavailable(f"the store failed ({name})") from exc


class _Lane:
    """The quota counters' own connection, on its own thread (opened at first use)."""

    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sqlite-quota")
        self.tx: SQLiteTx | None = None
        self.closed = False

    def call(self, job: Job[T]) -> T:
        if not self.closed and self.tx is None:
            self.tx = SQLiteTx(_connect(self.path, self.busy_timeout_ms, "synchronous = NORMAL"))
        return _mapped(None if self.closed else self.tx, job)

    def close(self) -> None:
        self.closed = True
        if self.tx is not None:
            self.tx.conn.close()
            self.tx = None


class SQLiteStore(SQLStore):
    """A :class:`proxy.store.base.Store` on one SQLite file. Make one with :meth:`open`."""

    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        super().__init__()
        self.dialect = SQLITE
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sqlite")
        self._read_executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="store-sqlite-read"
        )
        self._tx: SQLiteTx | None = None
        self._read_tx: SQLiteTx | None = None
        self._lane: _Lane | None = None
        self._closed = False

    @property
    def _conn(self) -> sqlite3.Connection | None:
        """The write connection (tests hold its lock from the writer thread)."""
        return None if self._tx is None else self._tx.conn

    @classmethod
    async def open(
        cls, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> SQLiteStore:
        """Open (creating the file and its folder if needed) and migrate to the latest schema."""
        store = cls(Path(path), busy_timeout_ms)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(store._executor, store._open_writer)
            await loop.run_in_executor(store._read_executor, store._open_reader)
        except BaseException:
            store._closed = True
            await loop.run_in_executor(store._executor, store._close_writer)
            store._executor.shutdown(wait=False)
            store._read_executor.shutdown(wait=False)
            raise
        return store

    @staticmethod
    def status(path: str | Path) -> SchemaStatus:
        """What the file records and what opening it would apply; changes nothing (no file:
        every migration is pending). Blocking: call it from a thread."""
        if not Path(path).exists():
            return EMPTY
        try:
            conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        try:
            return _mapped(SQLiteTx(conn), schema_status)
        finally:
            conn.close()

    # -- the worker threads ---------------------------------------------------------------------

    def _open_writer(self) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            raise StoreUnavailable("cannot create the store's folder") from None
        conn = _connect(self._path, self._busy_timeout_ms)
        try:
            # Switching a new file to WAL answers SQLITE_BUSY at once, without waiting, while
            # another process does the same (several replicas starting on one new file): retry
            # for as long as the busy timeout. Migrating is one transaction, so retrying is safe.
            deadline = time.monotonic() + self._busy_timeout_ms / 1000
            pause = 0.005
            while True:
                try:
                    self._prepare(conn)
                    break
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() >= deadline:
                        raise
                    time.sleep(pause)
                    pause = min(pause * 2, 0.1)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        except BaseException:
            conn.close()
            raise
        self._tx = SQLiteTx(conn)

    def _open_reader(self) -> None:
        """The read-only connection (after the writer's: the file exists, in WAL mode)."""
        self._read_tx = SQLiteTx(_connect(self._path, self._busy_timeout_ms, "query_only = ON"))

    def _close_writer(self) -> None:
        if self._tx is not None:
            self._tx.conn.close()
            self._tx = None
        self._forget_states()

    def _close_reader(self) -> None:
        if self._read_tx is not None:
            self._read_tx.conn.close()
            self._read_tx = None

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> None:
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            raise StoreUnavailable("the store's file system does not support WAL mode")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        run_sync(migrate(SQLiteTx(conn), clock.now_iso))

    # -- the lanes ------------------------------------------------------------------------------

    async def _run(self, job: Job[T], kind: Kind = "writes") -> T:
        """``job`` on the write connection, after the writes queued before it."""
        return await self._submit(self._executor, lambda: _mapped(self._tx, job), kind)

    async def _read(self, job: Job[T], kind: Kind = "reads") -> T:
        """The read-only ``job`` on the read connection: never behind a queued write."""
        return await self._submit(self._read_executor, lambda: _mapped(self._read_tx, job), kind)

    async def _counters(self, job: Job[T], kind: Kind = "writes") -> T:
        lane = self._lane
        if lane is None and not self._closed:
            lane = self._lane = _Lane(self._path, self._busy_timeout_ms)
        if lane is None:
            raise StoreUnavailable("the store is closed")
        return await self._submit(lane.executor, partial(lane.call, job), kind)

    async def _submit(
        self, executor: ThreadPoolExecutor, call: Callable[[], T], kind: Kind
    ) -> T:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(executor, call)
        except RuntimeError:  # the executor was shut down by a concurrent close()
            raise StoreUnavailable("the store is closed") from None
        # The outcome is reported here, on the loop (``health`` is not thread-safe).
        started = self.health.begin()
        try:
            result = await future
        except StoreBusy:
            self.health.ended(kind, started, None)  # the database answered
            raise
        except StoreUnavailable as exc:
            if not self._closed:
                self.health.ended(kind, started, exc)
            raise
        except (StoreError, ValueError):  # about the data (a conflict, an invalid write)
            self.health.ended(kind, started, None)
            raise
        self.health.ended(kind, started, None)
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.health.closed()
        loop = asyncio.get_running_loop()
        lane, self._lane = self._lane, None
        try:
            if lane is not None:
                try:
                    await loop.run_in_executor(lane.executor, lane.close)
                finally:
                    lane.executor.shutdown(wait=False)
            await loop.run_in_executor(self._read_executor, self._close_reader)
            await loop.run_in_executor(self._executor, self._close_writer)
        finally:
            self._read_executor.shutdown(wait=False)
            self._executor.shutdown(wait=False)
