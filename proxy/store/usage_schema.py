"""The usage ledger's table, as migrations: its columns (migration 5) and the ones added since
(migration :data:`PROVIDER_MIGRATION`), DDL for both backends.

Migration 9 adds the provider's own figures and notes and the agent:

* ``provider_compactions``: how many ``usage.iterations`` entries of type ``compaction`` the call
  had, and their summed figures, ``provider_compaction_input_tokens``,
  ``provider_compaction_cache_creation_input_tokens`` (with ``provider_compaction_cache_creation_5m``
  / ``_1h``), ``provider_compaction_cache_read_input_tokens``,
  ``provider_compaction_output_tokens``. From this migration on, the usage columns hold the figures
  the call is billed for (:mod:`proxy.core.provider_usage`: the iterations summed when present;
  rows written before it hold the top-level figures, as the ledger billed them then, and
  ``provider_compactions`` is NULL there);
* ``provider_notes``: JSON, ``{"applied_edits": [...], "input_transformations": [...]}`` bounded
  (:mod:`proxy.core.provider_notes`), NULL when the answer had neither;
  ``thinking_blocks_dropped``: how many of the input transformations were ``thinking_dropped``;
* ``agent``: the agent of the client that made the call (NULL: not known, or the main agent).

The columns are added without a default (PostgreSQL adds them without rewriting the table) and
old rows are kept as they are.
"""

from __future__ import annotations

__all__ = [
    "COLUMNS",
    "PG_STATEMENTS",
    "PROVIDER_MIGRATION",
    "PROVIDER_PG_STATEMENTS",
    "PROVIDER_SQLITE_STATEMENTS",
    "SQLITE_STATEMENTS",
    "USAGE_MIGRATION",
]

USAGE_MIGRATION = (5, "usage ledger")
# The one place its version is written (8 is another branch's; renumber here alone if needed).
PROVIDER_MIGRATION = (9, "usage ledger: provider compaction and notes, agent")

SQLITE_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE usage_ledger (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant TEXT NOT NULL,
        at TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        session TEXT,
        model TEXT NOT NULL,
        route TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('client', 'summary', 'retrieval')),
        status INTEGER NOT NULL,
        latency_ms REAL NOT NULL,
        request_id TEXT,
        tokens_before INTEGER,
        tokens_after INTEGER,
        layers TEXT,
        plan TEXT,
        summary TEXT,
        compaction_id TEXT,
        input_tokens INTEGER,
        cache_creation_input_tokens INTEGER,
        cache_creation_5m INTEGER,
        cache_creation_1h INTEGER,
        cache_read_input_tokens INTEGER,
        output_tokens INTEGER,
        usage_json TEXT
    )""",
    "CREATE INDEX usage_ledger_by_time ON usage_ledger (tenant, at_ms)",
    "CREATE INDEX usage_ledger_by_session ON usage_ledger (tenant, session, at_ms)",
    "CREATE INDEX usage_ledger_age ON usage_ledger (at_ms)",
)

PG_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE usage_ledger (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant TEXT COLLATE "C" NOT NULL,
        at TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        session TEXT COLLATE "C",
        model TEXT COLLATE "C" NOT NULL,
        route TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('client', 'summary', 'retrieval')),
        status INTEGER NOT NULL,
        latency_ms DOUBLE PRECISION NOT NULL,
        request_id TEXT,
        tokens_before BIGINT,
        tokens_after BIGINT,
        layers TEXT,
        plan TEXT,
        summary TEXT,
        compaction_id TEXT,
        input_tokens BIGINT,
        cache_creation_input_tokens BIGINT,
        cache_creation_5m BIGINT,
        cache_creation_1h BIGINT,
        cache_read_input_tokens BIGINT,
        output_tokens BIGINT,
        usage_json TEXT
    )""",
    "CREATE INDEX usage_ledger_by_time ON usage_ledger (tenant, at_ms)",
    "CREATE INDEX usage_ledger_by_session ON usage_ledger (tenant, session, at_ms)",
    "CREATE INDEX usage_ledger_age ON usage_ledger (at_ms)",
)

# (name, SQLite type, PostgreSQL type), in the order the columns are added
_PROVIDER_COLUMNS = (
    ("provider_compactions", "INTEGER", "BIGINT"),
    ("provider_compaction_input_tokens", "INTEGER", "BIGINT"),
    ("provider_compaction_cache_creation_input_tokens", "INTEGER", "BIGINT"),
    ("provider_compaction_cache_creation_5m", "INTEGER", "BIGINT"),
    ("provider_compaction_cache_creation_1h", "INTEGER", "BIGINT"),
    ("provider_compaction_cache_read_input_tokens", "INTEGER", "BIGINT"),
    ("provider_compaction_output_tokens", "INTEGER", "BIGINT"),
    ("provider_notes", "TEXT", "TEXT"),
    ("thinking_blocks_dropped", "INTEGER", "BIGINT"),
    ("agent", "TEXT", 'TEXT COLLATE "C"'),
)
PROVIDER_SQLITE_STATEMENTS: tuple[str, ...] = tuple(
    f"ALTER TABLE usage_ledger ADD COLUMN {name} {sqlite_type}"
    for name, sqlite_type, _ in _PROVIDER_COLUMNS
)
PROVIDER_PG_STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE usage_ledger "
    + ", ".join(f"ADD COLUMN {name} {pg_type}" for name, _, pg_type in _PROVIDER_COLUMNS),
)

COLUMNS = (
    "tenant", "at", "at_ms", "session", "model", "route", "kind", "status", "latency_ms",
    "request_id", "tokens_before", "tokens_after", "layers", "plan", "summary", "compaction_id",
    "input_tokens", "cache_creation_input_tokens", "cache_creation_5m", "cache_creation_1h",
    "cache_read_input_tokens", "output_tokens", "usage_json",
    *(name for name, _, _ in _PROVIDER_COLUMNS),
)  # fmt: skip
