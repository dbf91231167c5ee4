"""The schema, as an ordered list of migrations, each written once for both databases.

A statement is a template of :meth:`proxy.store.sql.Dialect.ddl` (``{key}``: a text key, sorted by
code point; ``{int}``: a 64-bit integer; ``{real}``; ``{bool}``; ``{id}``: an increasing id;
``{keyed}``: a table stored in key order); where a database needs other statements (SQLite cannot
alter a primary key), the migration states both. A migration is never edited once released: add
a new one at the end (``proxy.store.migrations`` applies them, and refuses a database that has one
it does not know). Every table is keyed by tenant first.

Every migration is one-way: none has a way back, and a release refuses a schema newer than its
own (docs/operations/upgrading.md). What each does to existing rows is said beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store.sql import Dialect

__all__ = ["LEDGER_COLUMNS", "MIGRATIONS", "MIGRATIONS_TABLE", "Migration"]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]  # DDL templates for both (run one by one, in one transaction)
    sqlite: tuple[str, ...] = ()  # instead of ``statements`` on SQLite, where they differ
    postgres: tuple[str, ...] = ()  # ... and on PostgreSQL
    rewrites: str = ""  # what it does to existing rows ("": adds tables, columns or indexes only)

    def statements_for(self, dialect: Dialect) -> tuple[str, ...]:
        own = self.sqlite if dialect.name == "sqlite" else self.postgres
        return tuple(dialect.ddl(s) for s in own or self.statements)


MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)"""

# -- 1-3: sessions, durable history, transcripts, manifests, plans, summaries, calibration -------

_V1 = (
    """CREATE TABLE sessions (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, session)
){keyed}""",
    """CREATE TABLE durable_changes (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    seq {int} NOT NULL CHECK (seq >= 1),
    kind {key} NOT NULL CHECK (kind IN ('fact', 'pending', 'evidence')),
    item_id {key} NOT NULL,
    version {int} NOT NULL CHECK (version >= 1),
    op TEXT NOT NULL CHECK (op IN ('create', 'update', 'retire')),
    body TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (tenant, session, seq),
    UNIQUE (tenant, session, kind, item_id, version)
){keyed}""",
    """CREATE TABLE transcript_heads (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    last_seq {int} NOT NULL CHECK (last_seq >= 0),
    prefix_count {int} NOT NULL CHECK (prefix_count >= 0),
    prefix_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, session)
){keyed}""",
    """CREATE TABLE transcript_events (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    seq {int} NOT NULL CHECK (seq >= 1),
    event_id {key} NOT NULL,
    recorded_at TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('message', 'answer')),
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    complete {bool} NOT NULL,
    prefix_count {int} NOT NULL,
    prefix_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, session, seq),
    CONSTRAINT transcript_events_event_id_key UNIQUE (tenant, session, event_id)
){keyed}""",
    """CREATE TABLE manifests (
    tenant {key} NOT NULL,
    compaction_id {key} NOT NULL,
    session {key} NOT NULL,
    manifest TEXT NOT NULL,
    stored_at TEXT NOT NULL,
    PRIMARY KEY (tenant, compaction_id)
){keyed}""",
    "CREATE INDEX manifests_by_session ON manifests (tenant, session)",
)

_V2 = (
    """CREATE TABLE plans (
    tenant {key} NOT NULL,
    prefix_hash {key} NOT NULL,
    anchor {key} NOT NULL,
    prefix_len {int} NOT NULL CHECK (prefix_len >= 1),
    plan_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, prefix_hash)
){keyed}""",
    "CREATE INDEX plans_by_anchor ON plans (tenant, anchor, prefix_len)",
)

_V3 = (
    """CREATE TABLE summaries (
    tenant {key} NOT NULL,
    summary_key {key} NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'ok', 'failed')),
    holder TEXT NOT NULL,
    expires_at {real} NOT NULL,
    summary TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, summary_key)
){keyed}""",
    """CREATE TABLE calibration (
    tenant {key} NOT NULL,
    model {key} NOT NULL,
    ratio {real} NOT NULL CHECK (ratio > 0),
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, model)
){keyed}""",
)

# -- 4: transcript event keys (exactly once; proxy.store.transcripts) ----------------------------

_V4 = (
    "ALTER TABLE transcript_events ADD COLUMN event_key {key}",
    "CREATE UNIQUE INDEX transcript_events_by_key ON transcript_events (tenant, session, event_key)",
)

# -- 5 and 9: the usage ledger (proxy.store.usage) ----------------------------------------------

_V5 = (
    """CREATE TABLE usage_ledger (
    id {id},
    tenant {key} NOT NULL,
    at TEXT NOT NULL,
    at_ms {int} NOT NULL,
    session {key},
    model {key} NOT NULL,
    route TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('client', 'summary', 'retrieval')),
    status INTEGER NOT NULL,
    latency_ms {real} NOT NULL,
    request_id TEXT,
    tokens_before {int},
    tokens_after {int},
    layers TEXT,
    plan TEXT,
    summary TEXT,
    compaction_id TEXT,
    input_tokens {int},
    cache_creation_input_tokens {int},
    cache_creation_5m {int},
    cache_creation_1h {int},
    cache_read_input_tokens {int},
    output_tokens {int},
    usage_json TEXT
)""",
    "CREATE INDEX usage_ledger_by_time ON usage_ledger (tenant, at_ms)",
    "CREATE INDEX usage_ledger_by_session ON usage_ledger (tenant, session, at_ms)",
    "CREATE INDEX usage_ledger_age ON usage_ledger (at_ms)",
)

# Migration 9 adds the provider's own figures and notes and the agent:
#
# * ``provider_compactions``: how many ``usage.iterations`` entries of type ``compaction`` the call
#   had, and their summed figures (``provider_compaction_input_tokens``, ..._cache_creation_...,
#   ``_5m`` / ``_1h``, ..._cache_read_..., ..._output_tokens). From this migration on, the usage
#   columns hold the figures the call is billed for (``proxy.core.provider_usage``: the iterations
#   summed when present); rows written before it hold the top-level figures, as the ledger billed
#   them then, and ``provider_compactions`` is NULL there;
# * ``provider_notes``: JSON, ``{"applied_edits": [...], "input_transformations": [...]}`` bounded
#   (``proxy.core.provider_notes``), NULL when the answer had neither;
#   ``thinking_blocks_dropped``: how many of the input transformations were ``thinking_dropped``;
# * ``agent``: the agent of the client that made the call (NULL: not known, or the main agent).
#
# The columns are added without a default (PostgreSQL adds them without rewriting the table).
_PROVIDER_COLUMNS = (
    ("provider_compactions", "{int}"),
    ("provider_compaction_input_tokens", "{int}"),
    ("provider_compaction_cache_creation_input_tokens", "{int}"),
    ("provider_compaction_cache_creation_5m", "{int}"),
    ("provider_compaction_cache_creation_1h", "{int}"),
    ("provider_compaction_cache_read_input_tokens", "{int}"),
    ("provider_compaction_output_tokens", "{int}"),
    ("provider_notes", "TEXT"),
    ("thinking_blocks_dropped", "{int}"),
    ("agent", "{key}"),
)
_V9 = tuple(f"ALTER TABLE usage_ledger ADD COLUMN {name} {type_}" for name, type_ in _PROVIDER_COLUMNS)
# PostgreSQL: one statement (one lock of the table)
_V9_PG = ", ".join(f"ADD COLUMN {name} {type_}" for name, type_ in _PROVIDER_COLUMNS)

LEDGER_COLUMNS = (
    "tenant", "at", "at_ms", "session", "model", "route", "kind", "status", "latency_ms",
    "request_id", "tokens_before", "tokens_after", "layers", "plan", "summary", "compaction_id",
    "input_tokens", "cache_creation_input_tokens", "cache_creation_5m", "cache_creation_1h",
    "cache_read_input_tokens", "output_tokens", "usage_json",
    *(name for name, _ in _PROVIDER_COLUMNS),
)  # fmt: skip

# -- 6: signed artifact manifests and the source-check audit trail (proxy.store.source_records) --

_STATUS_CHECK = "CHECK (status IN ('available', 'missing', 'denied', 'corrupt', 'unsupported'))"
_V6 = (
    """CREATE TABLE artifact_manifests (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    name {key} NOT NULL,
    size {int} NOT NULL CHECK (size >= 0),
    sha256 TEXT NOT NULL,
    written_at TEXT NOT NULL,
    key_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (tenant, session, name)
){keyed}""",
    f"""CREATE TABLE source_audit (
    id {{id}},
    tenant {{key}} NOT NULL,
    session {{key}} NOT NULL,
    pointer {{key}} NOT NULL,
    status TEXT NOT NULL {_STATUS_CHECK},
    digest TEXT,
    backend TEXT NOT NULL,
    detail TEXT NOT NULL,
    duration_ms {{real}} NOT NULL,
    asked_by TEXT NOT NULL,
    checked_at {{key}} NOT NULL
)""",
    "CREATE INDEX source_audit_by_tenant ON source_audit (tenant, id)",
    "CREATE INDEX source_audit_by_time ON source_audit (checked_at)",
)

# -- 7: the garbage collector's leases and time indexes (proxy.store.retention) -----------------

# The collector reads each tenant's rows oldest first: an index per collected table on
# (tenant, time) keeps that a range scan, not a sort of the tenant's whole table.
_V7 = (
    """CREATE TABLE gc_leases (
    name {key} NOT NULL PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at {real} NOT NULL
){keyed}""",
    "CREATE INDEX plans_by_time ON plans (tenant, created_at)",
    "CREATE INDEX summaries_by_time ON summaries (tenant, updated_at)",
    "CREATE INDEX manifests_by_time ON manifests (tenant, stored_at)",
    "CREATE INDEX transcript_events_by_time ON transcript_events (tenant, recorded_at)",
)

# -- 8: conversations per agent (proxy.store.agents) ---------------------------------------------

# SQLite cannot alter a primary key: new tables, copy, drop, rename, in the migration's one
# transaction. Every event recorded before is the main conversation's (agent ''), under the same
# sequence number, so every pointer written before redeems the same event.
_EVENT_COLUMNS = (
    "tenant, session, seq, event_id, recorded_at, type, role, content, complete,"
    " prefix_count, prefix_hash, event_key"
)
_V8_SQLITE = (
    """CREATE TABLE transcript_events_v8 (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL DEFAULT '',
    seq INTEGER NOT NULL CHECK (seq >= 1),
    event_id TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('message', 'answer')),
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
    prefix_count INTEGER NOT NULL,
    prefix_hash TEXT NOT NULL,
    event_key TEXT,
    PRIMARY KEY (tenant, session, agent, seq),
    UNIQUE (tenant, session, agent, event_id)
) WITHOUT ROWID""",
    f"INSERT INTO transcript_events_v8 ({_EVENT_COLUMNS}, agent)"
    f" SELECT {_EVENT_COLUMNS}, '' FROM transcript_events",
    "DROP TABLE transcript_events",
    "ALTER TABLE transcript_events_v8 RENAME TO transcript_events",
    "CREATE UNIQUE INDEX transcript_events_by_key"
    " ON transcript_events (tenant, session, agent, event_key)",
    "CREATE INDEX transcript_events_by_time ON transcript_events (tenant, recorded_at)",
    """CREATE TABLE transcript_heads_v8 (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL DEFAULT '',
    last_seq INTEGER NOT NULL CHECK (last_seq >= 0),
    prefix_count INTEGER NOT NULL CHECK (prefix_count >= 0),
    prefix_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, session, agent)
) WITHOUT ROWID""",
    "INSERT INTO transcript_heads_v8 (tenant, session, agent, last_seq, prefix_count,"
    " prefix_hash) SELECT tenant, session, '', last_seq, prefix_count, prefix_hash"
    " FROM transcript_heads",
    "DROP TABLE transcript_heads",
    "ALTER TABLE transcript_heads_v8 RENAME TO transcript_heads",
)
_V8_PG = (
    """ALTER TABLE transcript_events ADD COLUMN agent TEXT COLLATE "C" NOT NULL DEFAULT ''""",
    "ALTER TABLE transcript_events DROP CONSTRAINT transcript_events_pkey",
    "ALTER TABLE transcript_events ADD CONSTRAINT transcript_events_pkey"
    " PRIMARY KEY (tenant, session, agent, seq)",
    "ALTER TABLE transcript_events DROP CONSTRAINT transcript_events_event_id_key",
    "ALTER TABLE transcript_events ADD CONSTRAINT transcript_events_event_id_key"
    " UNIQUE (tenant, session, agent, event_id)",
    "DROP INDEX transcript_events_by_key",
    "CREATE UNIQUE INDEX transcript_events_by_key"
    " ON transcript_events (tenant, session, agent, event_key)",
    """ALTER TABLE transcript_heads ADD COLUMN agent TEXT COLLATE "C" NOT NULL DEFAULT ''""",
    "ALTER TABLE transcript_heads DROP CONSTRAINT transcript_heads_pkey",
    "ALTER TABLE transcript_heads ADD CONSTRAINT transcript_heads_pkey"
    " PRIMARY KEY (tenant, session, agent)",
)
_SESSION_AGENTS = """CREATE TABLE session_agents (
    tenant {key} NOT NULL,
    session {key} NOT NULL,
    agent {key} NOT NULL,
    parent {key} NOT NULL DEFAULT '',
    first_seen TEXT NOT NULL,
    last_seen TEXT NOT NULL,
    PRIMARY KEY (tenant, session, agent)
){keyed}"""

# -- 10: budget and rate-limit counters (proxy.store.quota) --------------------------------------

_V10 = (
    """CREATE TABLE quota_counters (
    tenant {key} NOT NULL,
    scope {key} NOT NULL,
    metric {key} NOT NULL,
    window_start_ms {int} NOT NULL,
    window_end_ms {int} NOT NULL,
    value {int} NOT NULL,
    PRIMARY KEY (tenant, scope, metric, window_start_ms)
){keyed}""",
    "CREATE INDEX quota_counters_by_end ON quota_counters (window_end_ms)",
)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sessions, durable history, transcripts, manifests", _V1),
    Migration(2, "compaction plans", _V2),
    Migration(3, "summary leases and calibration", _V3),
    Migration(
        4,
        "transcript event keys (exactly once)",
        _V4,
        rewrites="none (a new column, NULL in every existing event; a unique index is built)",
    ),
    Migration(5, "usage ledger", _V5),
    Migration(6, "signed artifact manifests and source audit", _V6),
    Migration(7, "garbage collector leases and time indexes", _V7),
    Migration(
        8,
        "conversations per agent: transcripts keyed by agent, session_agents",
        (),
        sqlite=(*_V8_SQLITE, _SESSION_AGENTS),
        postgres=(*_V8_PG, _SESSION_AGENTS),
        rewrites="SQLite copies every transcript event and head into rebuilt tables (agent '');"
        " PostgreSQL adds the column and rebuilds the keys and indexes of both tables",
    ),
    Migration(
        9,
        "usage ledger: provider compaction and notes, agent",
        _V9,
        postgres=(f"ALTER TABLE usage_ledger {_V9_PG}",),
        rewrites="none (new columns, NULL in every existing row)",
    ),
    Migration(10, "quota counters", _V10),
)
