"""What the garbage collector needs from the store, on both backends (issue 11 #5).

* **One runner at a time.** ``gc_leases`` holds one row per job (``retention``): a replica runs the
  collector only while it holds that row's lease, renewed between batches and released at the
  end; a crashed holder's lease expires after ``retention.lease_seconds``. Taking it is one
  upsert that succeeds only when the row is absent, expired, or already ours, so two replicas can
  never both hold it.
* **Small statements.** The collector reads candidates (``query``) and deletes them by primary key
  (``delete``), a batch per transaction; each delete re-checks its row's timestamp and liveness
  in its ``WHERE``, so a row that changed since it was read (a summary claimed again, a
  calibration figure refreshed) is kept.
* SQL is written with ``?`` placeholders (``proxy.store.sql``); reads run in the store's read lane,
  the lease and the deletes in its write lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from proxy.store.sql import Jobs, Tx

__all__ = ["RetentionBackend", "backend_for"]

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


class _Retention:
    def __init__(self, store: Jobs) -> None:
        self._store = store

    async def take_lease(self, name: str, holder: str, now: float, seconds: float) -> bool:
        async def job(tx: Tx) -> bool:
            async with tx.transaction():
                return await tx.row(_TAKE_LEASE, name, holder, now + seconds, now) is not None

        return await self._store._run(job)

    async def release_lease(self, name: str, holder: str) -> None:
        async def job(tx: Tx) -> None:
            await tx.execute(_RELEASE_LEASE, name, holder)

        await self._store._run(job)

    async def has_table(self, table: str) -> bool:
        async def job(tx: Tx) -> bool:
            return await tx.row(tx.dialect.has_table, table) is not None

        return await self._store._read(job)

    async def query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        async def job(tx: Tx) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await tx.rows(sql, *params)]

        return await self._store._read(job)

    async def delete(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        async def job(tx: Tx) -> int:
            deleted = 0
            async with tx.transaction():
                for row in rows:
                    deleted += await tx.execute(sql, *row)
            return deleted

        return await self._store._run(job)


def backend_for(store: object) -> RetentionBackend | None:
    """The retention operations of ``store`` (None for a store that runs no SQL)."""
    return _Retention(store) if isinstance(store, Jobs) else None
