"""The session store: durable state, transcripts and compaction manifests, keyed by tenant.

``await open_store(config.store_url)`` gives a :class:`Store`. URLs:

* ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (three slashes, then the
  path, as ``Config.store_url`` builds it from ``state_dir``): the embedded SQLite backend;
* ``postgresql://user:password@host:port/database`` (or ``postgres://``; asyncpg's URL syntax,
  whose other query parameters, e.g. ``?search_path=cp``, are passed to the server as settings):
  the PostgreSQL backend, for several replicas sharing one database.

``busy_timeout_ms`` is how long a writer waits for another writer's lock before the store is
unavailable: SQLite's busy timeout, PostgreSQL's ``lock_timeout``.
"""

from __future__ import annotations

import asyncio

from proxy.store.base import (
    EMPTY_PREFIX,
    AppliedMigration,
    DuplicateEvent,
    HistoryEntry,
    KeyedEvent,
    ManifestConflict,
    Prefix,
    PrefixConflict,
    Recorded,
    RecordedEvent,
    SchemaTooNew,
    Store,
    StoreBusy,
    StoredManifest,
    StoreError,
    StoreUnavailable,
    SummaryClaim,
    TranscriptEvent,
)
from proxy.store.migrations import SchemaStatus
from proxy.store.postgres import PostgresStore
from proxy.store.sqlite import DEFAULT_BUSY_TIMEOUT_MS, SQLiteStore

__all__ = [
    "EMPTY_PREFIX",
    "AppliedMigration",
    "DuplicateEvent",
    "HistoryEntry",
    "KeyedEvent",
    "ManifestConflict",
    "PostgresStore",
    "Prefix",
    "PrefixConflict",
    "Recorded",
    "RecordedEvent",
    "SQLiteStore",
    "SchemaStatus",
    "SchemaTooNew",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredManifest",
    "SummaryClaim",
    "TranscriptEvent",
    "open_store",
    "schema_status",
    "sqlite_path",
]

_SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL; ``ValueError`` for anything else."""
    if not url.startswith(_SQLITE_PREFIX):
        raise ValueError("expected a store URL like sqlite:///path/to/file.db")
    path = url[len(_SQLITE_PREFIX) :]
    if not path or path == ":memory:" or path.endswith("/"):
        raise ValueError("a sqlite store URL needs a file path (sqlite:///path/to/file.db)")
    return path


async def open_store(url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Store:
    """Open the store at ``url``, creating and migrating it as needed.

    Raises ``ValueError`` for a URL this proxy cannot use (the message never repeats the URL: a
    PostgreSQL URL may carry a password), ``StoreUnavailable`` when the database cannot be
    opened, and ``SchemaTooNew`` when a newer release migrated it (nothing is changed then).
    """
    scheme = url.split(":", 1)[0]
    if scheme == "sqlite":
        return await SQLiteStore.open(sqlite_path(url), busy_timeout_ms=busy_timeout_ms)
    if scheme in ("postgresql", "postgres"):
        return await PostgresStore.open(url, lock_timeout_ms=busy_timeout_ms)
    raise ValueError("expected a store URL: sqlite:///path/to/file.db or postgresql://...")


async def schema_status(url: str) -> SchemaStatus:
    """What the store at ``url`` records and what opening it would apply, without changing
    anything (``context-proxy migrate --check``). Errors as :func:`open_store`'s."""
    scheme = url.split(":", 1)[0]
    if scheme == "sqlite":
        return await asyncio.to_thread(SQLiteStore.status, sqlite_path(url))
    if scheme in ("postgresql", "postgres"):
        return await PostgresStore.status(url)
    raise ValueError("expected a store URL: sqlite:///path/to/file.db or postgresql://...")
