"""The SQLite schema, as an ordered list of migrations recorded in ``schema_migrations``.

:func:`migrate` runs at every open, inside one ``BEGIN IMMEDIATE`` transaction (SQLite DDL is
transactional), so two processes opening the same new file at once migrate it exactly once, and a
crash half-way leaves the previous version. A migration is never edited once released: add a new
one at the end. A database recorded with a migration this code does not know (a newer proxy wrote
it) is refused rather than used.

Every table is keyed by tenant first; composite keys use ``WITHOUT ROWID`` so rows are stored in
key order (a session's history or transcript is one contiguous range).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from proxy.store import agents, quota, retention, source_schema, transcript_keys
from proxy.store.base import StoreError
from proxy.store.usage import SQLITE_STATEMENTS as USAGE_SQLITE
from proxy.store.usage import USAGE_MIGRATION
from proxy.store.usage_schema import PROVIDER_MIGRATION, PROVIDER_SQLITE_STATEMENTS

__all__ = ["MIGRATIONS", "Migration", "SchemaTooNew", "migrate"]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]  # run one by one (executescript would commit mid-transaction)


class SchemaTooNew(StoreError):
    """The database was migrated by a newer proxy; this one refuses to use it."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "sessions, durable history, transcripts, manifests",
        (
            """CREATE TABLE sessions (
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (tenant, session)
            ) WITHOUT ROWID""",
            """CREATE TABLE durable_changes (
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                kind TEXT NOT NULL CHECK (kind IN ('fact', 'pending', 'evidence')),
                item_id TEXT NOT NULL,
                version INTEGER NOT NULL CHECK (version >= 1),
                op TEXT NOT NULL CHECK (op IN ('create', 'update', 'retire')),
                body TEXT NOT NULL,
                recorded_at TEXT NOT NULL,
                PRIMARY KEY (tenant, session, seq),
                UNIQUE (tenant, session, kind, item_id, version)
            ) WITHOUT ROWID""",
            """CREATE TABLE transcript_heads (
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                last_seq INTEGER NOT NULL CHECK (last_seq >= 0),
                prefix_count INTEGER NOT NULL CHECK (prefix_count >= 0),
                prefix_hash TEXT NOT NULL,
                PRIMARY KEY (tenant, session)
            ) WITHOUT ROWID""",
            """CREATE TABLE transcript_events (
                tenant TEXT NOT NULL,
                session TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                event_id TEXT NOT NULL,
                recorded_at TEXT NOT NULL,
                type TEXT NOT NULL CHECK (type IN ('message', 'answer')),
                role TEXT NOT NULL,
                content TEXT NOT NULL,
                complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
                prefix_count INTEGER NOT NULL,
                prefix_hash TEXT NOT NULL,
                PRIMARY KEY (tenant, session, seq),
                UNIQUE (tenant, session, event_id)
            ) WITHOUT ROWID""",
            """CREATE TABLE manifests (
                tenant TEXT NOT NULL,
                compaction_id TEXT NOT NULL,
                session TEXT NOT NULL,
                manifest TEXT NOT NULL,
                stored_at TEXT NOT NULL,
                PRIMARY KEY (tenant, compaction_id)
            ) WITHOUT ROWID""",
            "CREATE INDEX manifests_by_session ON manifests (tenant, session)",
        ),
    ),
    Migration(
        2,
        "compaction plans",
        (
            """CREATE TABLE plans (
                tenant TEXT NOT NULL,
                prefix_hash TEXT NOT NULL,
                anchor TEXT NOT NULL,
                prefix_len INTEGER NOT NULL CHECK (prefix_len >= 1),
                plan_json TEXT NOT NULL,
                created_at TEXT NOT NULL,
                PRIMARY KEY (tenant, prefix_hash)
            ) WITHOUT ROWID""",
            "CREATE INDEX plans_by_anchor ON plans (tenant, anchor, prefix_len)",
        ),
    ),
    Migration(
        3,
        "summary leases and calibration",
        (
            """CREATE TABLE summaries (
                tenant TEXT NOT NULL,
                summary_key TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('pending', 'ok', 'failed')),
                holder TEXT NOT NULL,
                expires_at REAL NOT NULL,
                summary TEXT,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (tenant, summary_key)
            ) WITHOUT ROWID""",
            """CREATE TABLE calibration (
                tenant TEXT NOT NULL,
                model TEXT NOT NULL,
                ratio REAL NOT NULL CHECK (ratio > 0),
                updated_at TEXT NOT NULL,
                PRIMARY KEY (tenant, model)
            ) WITHOUT ROWID""",
        ),
    ),
    Migration(4, transcript_keys.MIGRATION_NAME, transcript_keys.SQLITE_STATEMENTS),
    Migration(*USAGE_MIGRATION, USAGE_SQLITE),
    Migration(source_schema.VERSION, source_schema.MIGRATION_NAME, source_schema.SQLITE_STATEMENTS),
    Migration(7, retention.MIGRATION_NAME, retention.SQLITE_MIGRATION_STATEMENTS),
    Migration(agents.VERSION, agents.MIGRATION_NAME, agents.SQLITE_STATEMENTS),
    Migration(*PROVIDER_MIGRATION, PROVIDER_SQLITE_STATEMENTS),
    Migration(*quota.MIGRATION, quota.SQLITE_STATEMENTS),
)


def migrate(conn: sqlite3.Connection, now: Callable[[], str]) -> list[int]:
    """Apply the missing migrations in order; return the versions applied by this call.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                version INTEGER PRIMARY KEY,
                name TEXT NOT NULL,
                applied_at TEXT NOT NULL
            )"""
        )
        recorded = dict(conn.execute("SELECT version, name FROM schema_migrations").fetchall())
        known = {m.version: m.name for m in MIGRATIONS}
        unknown = sorted(v for v in recorded if known.get(v) != recorded[v])
        if unknown:
            raise SchemaTooNew(
                f"the database has schema migrations this proxy does not know: {unknown}"
            )
        applied: list[int] = []
        for migration in MIGRATIONS:
            if migration.version in recorded:
                continue
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now()),
            )
            applied.append(migration.version)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return applied
