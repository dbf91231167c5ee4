"""Artifact manifest entries and the source-check audit trail, on either store backend.

Kept out of the two backend modules (their tables are migration 6, ``source_schema``): each
function sends one small job through the backend's own runner (the SQLite worker thread, or a
pooled PostgreSQL connection), so errors become ``StoreUnavailable`` exactly as elsewhere.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.sources.manifests import ManifestEntry
from proxy.store.base import Store, StoreError, check_keys
from proxy.store.postgres import PostgresStore
from proxy.store.sqlite import SQLiteStore

__all__ = [
    "MAX_AUDIT_LIMIT",
    "AuditQuery",
    "AuditRow",
    "append_audit",
    "delete_audit_before",
    "get_artifact_manifest",
    "list_audit",
    "put_artifact_manifest",
]

MAX_AUDIT_LIMIT = 1000

_MANIFEST_COLUMNS = "tenant, session, name, size, sha256, written_at, key_id, signature"
_AUDIT_COLUMNS = (
    "tenant, session, pointer, status, digest, backend, detail, duration_ms, asked_by, checked_at"
)


@dataclass(frozen=True, slots=True)
class AuditRow:
    tenant: str
    session: str
    pointer: str
    status: str
    digest: str | None
    backend: str  # "local", "s3", or "none" (refused before any lookup)
    detail: str  # "", or why: "policy", "redirect", "unavailable", "signature", ...
    duration_ms: float
    asked_by: str  # "request:<id>" or "admin:<request-id>"
    checked_at: str  # ISO 8601 UTC, microseconds
    id: int = 0  # assigned by the store

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session": self.session,
            "pointer": self.pointer,
            "status": self.status,
            "digest": self.digest,
            "backend": self.backend,
            "detail": self.detail,
            "duration_ms": round(self.duration_ms, 3),
            "asked_by": self.asked_by,
            "checked_at": self.checked_at,
        }


@dataclass(frozen=True, slots=True)
class AuditQuery:
    tenant: str
    session: str | None = None
    status: str | None = None
    since: str | None = None  # checked_at >= since
    until: str | None = None  # checked_at < until
    after: int = 0  # id > after (the cursor)
    limit: int = 100


def _backend(store: Store) -> SQLiteStore | PostgresStore:
    if isinstance(store, SQLiteStore | PostgresStore):
        return store
    raise StoreError("this store has no source records")


def _clean(value: str) -> str:
    """Text PostgreSQL can hold (no NUL, valid UTF-8); pointers are recorded as they were."""
    return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


# -- manifests ------------------------------------------------------------------------------------


async def put_artifact_manifest(store: Store, entry: ManifestEntry) -> None:
    check_keys(entry.tenant, entry.session)
    values = (
        entry.tenant, entry.session, entry.name, entry.size, entry.sha256, entry.written_at,
        entry.key_id, entry.signature,
    )
    update = (
        " ON CONFLICT (tenant, session, name) DO UPDATE SET size = excluded.size,"
        " sha256 = excluded.sha256, written_at = excluded.written_at,"
        " key_id = excluded.key_id, signature = excluded.signature"
    )
    backend = _backend(store)
    if isinstance(backend, SQLiteStore):

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO artifact_manifests ({_MANIFEST_COLUMNS})"
                f" VALUES (?, ?, ?, ?, ?, ?, ?, ?){update}",
                values,
            )

        await backend._run(job)
        return

    async def pg_job(conn: Any) -> None:
        await conn.execute(
            f"INSERT INTO artifact_manifests ({_MANIFEST_COLUMNS})"
            f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8){update}",
            *values,
        )

    await backend._run(pg_job)


def _entry(row: Sequence[Any]) -> ManifestEntry:
    return ManifestEntry(
        str(row[0]), str(row[1]), str(row[2]), int(row[3]), str(row[4]), str(row[5]),
        str(row[6]), str(row[7]),
    )


async def get_artifact_manifest(
    store: Store, tenant: str, session: str, name: str
) -> ManifestEntry | None:
    check_keys(tenant, session)
    where = "tenant = {} AND session = {} AND name = {}"
    backend = _backend(store)
    if isinstance(backend, SQLiteStore):

        def job(conn: sqlite3.Connection) -> ManifestEntry | None:
            row = conn.execute(
                f"SELECT {_MANIFEST_COLUMNS} FROM artifact_manifests WHERE "
                + where.format("?", "?", "?"),
                (tenant, session, name),
            ).fetchone()
            return None if row is None else _entry(row)

        return await backend._run(job)

    async def pg_job(conn: Any) -> ManifestEntry | None:
        row = await conn.fetchrow(
            f"SELECT {_MANIFEST_COLUMNS} FROM artifact_manifests WHERE "
            + where.format("$1", "$2", "$3"),
            tenant,
            session,
            name,
        )
        return None if row is None else _entry(tuple(row.values()))

    return await backend._run(pg_job)


# -- audit ----------------------------------------------------------------------------------------


def _audit_values(row: AuditRow) -> tuple[Any, ...]:
    return (
        row.tenant, _clean(row.session), _clean(row.pointer), row.status, row.digest,
        row.backend, _clean(row.detail), float(row.duration_ms), _clean(row.asked_by),
        row.checked_at,
    )


async def append_audit(store: Store, rows: Sequence[AuditRow]) -> None:
    """Insert ``rows`` in one transaction (the audit writer batches them)."""
    if not rows:
        return
    values = [_audit_values(r) for r in rows]
    backend = _backend(store)
    if isinstance(backend, SQLiteStore):

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    f"INSERT INTO source_audit ({_AUDIT_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    values,
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        await backend._run(job)
        return

    async def pg_job(conn: Any) -> None:
        await conn.executemany(
            f"INSERT INTO source_audit ({_AUDIT_COLUMNS})"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            values,
        )

    await backend._run(pg_job)


def _audit_row(row: Sequence[Any]) -> AuditRow:
    return AuditRow(
        tenant=str(row[1]),
        session=str(row[2]),
        pointer=str(row[3]),
        status=str(row[4]),
        digest=None if row[5] is None else str(row[5]),
        backend=str(row[6]),
        detail=str(row[7]),
        duration_ms=float(row[8]),
        asked_by=str(row[9]),
        checked_at=str(row[10]),
        id=int(row[0]),
    )


async def list_audit(store: Store, query: AuditQuery) -> tuple[AuditRow, ...]:
    """The tenant's rows matching ``query``, oldest first (by id), at most ``query.limit``."""
    check_keys(query.tenant)
    limit = max(1, min(int(query.limit), MAX_AUDIT_LIMIT))
    clauses = ["tenant = {}", "id > {}"]
    args: list[Any] = [query.tenant, int(query.after)]
    for column, op, value in (
        ("session", "=", query.session),
        ("status", "=", query.status),
        ("checked_at", ">=", query.since),
        ("checked_at", "<", query.until),
    ):
        if value is not None:
            clauses.append(f"{column} {op} {{}}")
            args.append(value)
    sql = f"SELECT id, {_AUDIT_COLUMNS} FROM source_audit WHERE " + " AND ".join(clauses)
    sql += " ORDER BY id LIMIT {}"
    args.append(limit)
    backend = _backend(store)
    if isinstance(backend, SQLiteStore):
        sqlite_sql = sql.format(*(["?"] * len(args)))

        def job(conn: sqlite3.Connection) -> tuple[AuditRow, ...]:
            return tuple(_audit_row(r) for r in conn.execute(sqlite_sql, args).fetchall())

        return await backend._run(job)
    pg_sql = sql.format(*(f"${i + 1}" for i in range(len(args))))

    async def pg_job(conn: Any) -> tuple[AuditRow, ...]:
        rows = await conn.fetch(pg_sql, *args)
        return tuple(_audit_row(tuple(r.values())) for r in rows)

    return await backend._run(pg_job)


async def delete_audit_before(store: Store, cutoff: str) -> int:
    """Delete every audit row (all tenants) checked before ``cutoff`` (ISO 8601 UTC, the same
    format as ``checked_at``); return how many. The retention GC calls this."""
    if not isinstance(cutoff, str) or not cutoff:
        raise ValueError("cutoff must be an ISO 8601 timestamp")
    backend = _backend(store)
    if isinstance(backend, SQLiteStore):

        def job(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM source_audit WHERE checked_at < ?", (cutoff,)).rowcount

        return await backend._run(job)

    async def pg_job(conn: Any) -> int:
        status = await conn.execute("DELETE FROM source_audit WHERE checked_at < $1", cutoff)
        return int(str(status).rsplit(" ", 1)[-1])

    return await backend._run(pg_job)
