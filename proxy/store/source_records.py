"""The sources family: signed artifact manifest entries and the source-check audit trail, on
both backends (``artifact_manifests``, ``source_audit``: migration 6).

``artifact_manifests``: one signed entry per (tenant, session, artifact name); a rewrite of the
name replaces it (the signature covers every field, see ``proxy.sources.manifests``).
``source_audit``: one row per source check, append-only, ``id`` increasing (the admin API's
``after`` cursor); retention deletes by ``checked_at`` (:func:`delete_audit_before`).

Not methods of the ``Store`` protocol: functions of a store, each one job through its write lane
(``proxy.store.sql.Jobs``; reads too: after the audit batches queued before them), so errors
become ``StoreUnavailable`` exactly as elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.sources.manifests import ManifestEntry
from proxy.store.base import Store
from proxy.store.checks import check_keys
from proxy.store.errors import StoreError
from proxy.store.sql import Jobs, Row, Tx

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


def _jobs(store: Store) -> Jobs:
    if isinstance(store, Jobs):
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
    )  # fmt: skip

    async def job(tx: Tx) -> None:
        await tx.execute(
            f"INSERT INTO artifact_manifests ({_MANIFEST_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session, name) DO UPDATE"
            " SET size = excluded.size, sha256 = excluded.sha256,"
            " written_at = excluded.written_at, key_id = excluded.key_id,"
            " signature = excluded.signature",
            *values,
        )

    await _jobs(store)._run(job)


def _entry(row: Row) -> ManifestEntry:
    return ManifestEntry(
        str(row[0]), str(row[1]), str(row[2]), int(row[3]), str(row[4]), str(row[5]),
        str(row[6]), str(row[7]),
    )  # fmt: skip


async def get_artifact_manifest(
    store: Store, tenant: str, session: str, name: str
) -> ManifestEntry | None:
    check_keys(tenant, session)

    async def job(tx: Tx) -> ManifestEntry | None:
        row = await tx.row(
            f"SELECT {_MANIFEST_COLUMNS} FROM artifact_manifests"
            " WHERE tenant = ? AND session = ? AND name = ?",
            tenant,
            session,
            name,
        )
        return None if row is None else _entry(row)

    return await _jobs(store)._run(job)


# -- audit ----------------------------------------------------------------------------------------


def _audit_values(row: AuditRow) -> tuple[Any, ...]:
    return (
        row.tenant, _clean(row.session), _clean(row.pointer), row.status, row.digest,
        row.backend, _clean(row.detail), float(row.duration_ms), _clean(row.asked_by),
        row.checked_at,
    )  # fmt: skip


async def append_audit(store: Store, rows: Sequence[AuditRow]) -> None:
    """Insert ``rows`` in one transaction (the audit writer batches them)."""
    if not rows:
        return
    values = [_audit_values(r) for r in rows]

    async def job(tx: Tx) -> None:
        async with tx.transaction():
            await tx.executemany(
                f"INSERT INTO source_audit ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )

    await _jobs(store)._run(job)


def _audit_row(row: Row) -> AuditRow:
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
    clauses = ["tenant = ?", "id > ?"]
    args: list[Any] = [query.tenant, int(query.after)]
    for column, op, value in (
        ("session", "=", query.session),
        ("status", "=", query.status),
        ("checked_at", ">=", query.since),
        ("checked_at", "<", query.until),
    ):
        if value is not None:
            clauses.append(f"{column} {op} ?")
            args.append(value)
    sql = f"SELECT id, {_AUDIT_COLUMNS} FROM source_audit WHERE {' AND '.join(clauses)}"
    sql += " ORDER BY id LIMIT ?"
    args.append(limit)

    async def job(tx: Tx) -> tuple[AuditRow, ...]:
        return tuple(_audit_row(r) for r in await tx.rows(sql, *args))

    return await _jobs(store)._run(job)


async def delete_audit_before(store: Store, cutoff: str) -> int:
    """Delete every audit row (all tenants) checked before ``cutoff`` (ISO 8601 UTC, the same
    format as ``checked_at``); return how many. The retention GC calls this."""
    if not isinstance(cutoff, str) or not cutoff:
        raise ValueError("cutoff must be an ISO 8601 timestamp")

    async def job(tx: Tx) -> int:
        return await tx.execute("DELETE FROM source_audit WHERE checked_at < ?", cutoff)

    return await _jobs(store)._run(job)
