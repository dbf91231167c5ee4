"""Migration 6: signed artifact manifests and the source-check audit trail, for both backends.

``artifact_manifests``: one signed entry per (tenant, session, artifact name); a rewrite of the
name replaces it (the signature covers every field, see ``proxy.sources.manifests``).
``source_audit``: one row per source check, append-only, ``id`` increasing (the admin API's
``after`` cursor); retention deletes by ``checked_at`` (``delete_audit_before``).
"""

from __future__ import annotations

__all__ = ["MIGRATION_NAME", "PG_STATEMENTS", "SQLITE_STATEMENTS", "VERSION"]

VERSION = 6
MIGRATION_NAME = "signed artifact manifests and source audit"

_STATUS_CHECK = "CHECK (status IN ('available', 'missing', 'denied', 'corrupt', 'unsupported'))"

SQLITE_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE artifact_manifests (
        tenant TEXT NOT NULL,
        session TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL CHECK (size >= 0),
        sha256 TEXT NOT NULL,
        written_at TEXT NOT NULL,
        key_id TEXT NOT NULL,
        signature TEXT NOT NULL,
        PRIMARY KEY (tenant, session, name)
    ) WITHOUT ROWID""",
    f"""CREATE TABLE source_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant TEXT NOT NULL,
        session TEXT NOT NULL,
        pointer TEXT NOT NULL,
        status TEXT NOT NULL {_STATUS_CHECK},
        digest TEXT,
        backend TEXT NOT NULL,
        detail TEXT NOT NULL,
        duration_ms REAL NOT NULL,
        asked_by TEXT NOT NULL,
        checked_at TEXT NOT NULL
    )""",
    "CREATE INDEX source_audit_by_tenant ON source_audit (tenant, id)",
    "CREATE INDEX source_audit_by_time ON source_audit (checked_at)",
)

PG_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE artifact_manifests (
        tenant TEXT COLLATE "C" NOT NULL,
        session TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        size BIGINT NOT NULL CHECK (size >= 0),
        sha256 TEXT NOT NULL,
        written_at TEXT NOT NULL,
        key_id TEXT NOT NULL,
        signature TEXT NOT NULL,
        PRIMARY KEY (tenant, session, name)
    )""",
    f"""CREATE TABLE source_audit (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant TEXT COLLATE "C" NOT NULL,
        session TEXT COLLATE "C" NOT NULL,
        pointer TEXT COLLATE "C" NOT NULL,
        status TEXT NOT NULL {_STATUS_CHECK},
        digest TEXT,
        backend TEXT NOT NULL,
        detail TEXT NOT NULL,
        duration_ms DOUBLE PRECISION NOT NULL,
        asked_by TEXT NOT NULL,
        checked_at TEXT COLLATE "C" NOT NULL
    )""",
    "CREATE INDEX source_audit_by_tenant ON source_audit (tenant, id)",
    "CREATE INDEX source_audit_by_time ON source_audit (checked_at)",
)
