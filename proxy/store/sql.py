"""The one query layer of both backends: each query is written once, as an ``async`` function of a
transaction (:class:`Tx`), and run by either backend (a *job*).

* **SQLite** (``proxy.store.sqlite``) runs a whole job on its worker thread with :func:`run_sync`:
  its ``Tx`` answers every call at once, without suspending, so the coroutine completes in one
  step. One hop to the thread per operation, as a plain function would take; the event loop never
  touches the connection.
* **PostgreSQL** (``proxy.store.postgres``) awaits the job on the loop, each call one round trip
  on a pooled asyncpg connection.

SQL is written with ``?`` placeholders. What differs between the two databases is stated once, in
the two :class:`Dialect` values below (one field per difference), or in the backend module where it
is how the database is driven:

======================  ========================================  ==============================
difference              SQLite                                    PostgreSQL
======================  ========================================  ==============================
placeholders            ``?``                                     ``$1``, ``$2``... (``sql``)
DDL types               ``TEXT``, ``INTEGER``, ``REAL``,          ``TEXT COLLATE "C"``, ``BIGINT``,
                        ``WITHOUT ROWID``, ``AUTOINCREMENT``      ``DOUBLE PRECISION``, identity
                                                                  (``ddl``: ``{key}``, ``{int}``...)
a row lock              none (the transaction holds the file's    ``FOR UPDATE`` (``for_update``)
                        write lock)
the leases' clock       the host's (``julianday('now')``)         the server's (``clock_timestamp``)
a list parameter        ``IN (?, ?, ...)``                        ``= ANY(?::text[])`` (``any_of``)
whether a table exists  ``sqlite_master``                         ``to_regclass`` (``has_table``)
a write transaction     ``BEGIN IMMEDIATE``: the write lock       ``READ COMMITTED``; the first
                        first (``sqlite.SQLiteTx``)               statement locks the session's
                                                                  row (``durable.lock_session``)
migrations' lock        the same ``BEGIN IMMEDIATE``              an advisory lock
                                                                  (``postgres.PgTx``)
rows changed, errors    the cursor, ``sqlite3.Error``             the status, asyncpg's errors
======================  ========================================  ==============================

The same on both, by choice: upserts (``INSERT ... ON CONFLICT ... DO UPDATE SET x = excluded.x``,
``DO NOTHING``) and ``RETURNING`` (SQLite 3.35 and later); JSON is stored as the exact text the
store wrote (``TEXT``, not ``jsonb``); booleans are bound as Python ``bool`` (SQLite stores 0/1)
and read with ``bool()``; text and integers either database cannot hold are refused before any
query (``proxy.store.checks``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from proxy.store.health import Kind, StoreHealth

__all__ = ["POSTGRES", "SQLITE", "Dialect", "Job", "Jobs", "Row", "Tx", "run_sync"]

T = TypeVar("T")
Row = Sequence[Any]  # a result row: a tuple (SQLite) or an asyncpg Record, indexed by position

_PLACEHOLDER = re.compile(r"\?")


@functools.lru_cache(maxsize=2048)
def _numbered(sql: str) -> str:
    counter = iter(range(1, 100_000))
    return _PLACEHOLDER.sub(lambda _m: f"${next(counter)}", sql)


@dataclass(frozen=True, slots=True)
class Dialect:
    """What one database spells differently (see the module's table)."""

    name: Literal["sqlite", "postgresql"]
    numbered: bool  # placeholders ``$n``
    types: Mapping[str, str]  # the DDL's ``{key}``, ``{int}``, ``{real}``, ``{bool}``...
    for_update: str  # appended to a SELECT that locks its rows until the transaction ends
    epoch_now: str  # the clock summary leases are measured by, in epoch seconds
    has_table: str  # one row when the table named by the parameter exists

    def sql(self, text: str) -> str:
        """``text`` with this database's placeholders (``text`` holds no ``?`` but them)."""
        return _numbered(text) if self.numbered else text

    def ddl(self, text: str) -> str:
        """A DDL statement with this database's types."""
        return text.format_map(self.types)

    def any_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """``column`` equal to one of ``values``: the SQL and its parameters."""
        if self.numbered:
            return f"{column} = ANY(?::text[])", [list(values)]
        return f"{column} IN ({', '.join('?' * len(values))})", list(values)


SQLITE = Dialect(
    name="sqlite",
    numbered=False,
    types={
        "key": "TEXT",
        "int": "INTEGER",
        "real": "REAL",
        "bool": "INTEGER",
        "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "keyed": " WITHOUT ROWID",  # composite keys: rows stored in key order
    },
    for_update="",
    epoch_now="(julianday('now') - 2440587.5) * 86400.0",
    has_table="SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
)

POSTGRES = Dialect(
    name="postgresql",
    numbered=True,
    types={
        "key": 'TEXT COLLATE "C"',  # sorted by code point, as SQLite's BINARY
        "int": "BIGINT",
        "real": "DOUBLE PRECISION",
        "bool": "BOOLEAN",
        "id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "keyed": "",
    },
    for_update=" FOR UPDATE",
    epoch_now="extract(epoch FROM clock_timestamp())",
    has_table="SELECT 1 WHERE to_regclass(?) IS NOT NULL",
)


class Tx(Protocol):
    """A connection as the jobs see it. Statements take ``?`` placeholders."""

    dialect: Dialect

    async def rows(self, sql: str, *params: object) -> list[Row]: ...

    async def row(self, sql: str, *params: object) -> Row | None: ...

    async def value(self, sql: str, *params: object) -> Any:
        """The first column of the first row (``None`` without a row)."""
        ...

    async def execute(self, sql: str, *params: object) -> int:
        """Run one statement; how many rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A write transaction: committed on success, rolled back on any exception."""
        ...


Job = Callable[[Tx], Coroutine[Any, Any, T]]


def run_sync(job: Coroutine[Any, Any, T]) -> T:
    """Run a job whose awaits never suspend (a SQLite ``Tx``'s) to its end, in this thread."""
    try:
        job.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    job.close()
    raise RuntimeError("a store job awaited something that suspends")


class Jobs:
    """What the table families (``durable``, ``transcripts``, ``agents``, ``plans``, ``usage``,
    ``quota``...) run their jobs through; a backend supplies the three lanes."""

    dialect: Dialect
    health: StoreHealth

    async def _run(self, job: Job[T], kind: Kind = "writes") -> T:
        """A job that writes (SQLite: on the write connection, after the writes queued before)."""
        raise NotImplementedError

    async def _read(self, job: Job[T], kind: Kind = "reads") -> T:
        """A job that only reads (SQLite: on the read connection, never behind a queued write)."""
        raise NotImplementedError

    async def _counters(self, job: Job[T], kind: Kind = "writes") -> T:
        """A quota counters job (SQLite: their own connection and thread, ``proxy.store.quota``)."""
        raise NotImplementedError
