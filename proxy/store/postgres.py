"""The PostgreSQL backend: a pool of asyncpg connections, one short transaction per write.

Behaviour mirrors :mod:`proxy.store.sqlite` (the reference); what differs is how it is achieved:

* **Locking.** Every read-then-write takes a row lock before its read: the first statement of the
  transaction upserts the ``sessions`` row of ``(tenant, session)``
  (``INSERT ... ON CONFLICT DO UPDATE``), which locks that row until commit, so it is the
  per-session head lock for the durable history and the transcript alike. Everything the
  transaction reads after it (``READ COMMITTED``: each statement sees what was committed before
  it started) is what the previous holder committed, so concurrent appenders in any number of
  processes get contiguous sequence numbers, with no gap and no duplicate. Each write transaction
  locks one session row only, so there is no lock cycle. A writer waits at most ``lock_timeout``
  (the ``busy_timeout_ms`` of :func:`proxy.store.open_store`) for it, then gets
  :class:`StoreUnavailable`, as SQLite does after its busy timeout.
* **Durability.** A method returns after ``COMMIT`` returned. ``synchronous_commit`` is left at
  the server's setting unless that is ``off``: then the store's connections set it to ``on``.
* **Schema.** The migrations of :mod:`proxy.store.migrations` (the same versions and names,
  recorded in the same ``schema_migrations`` table) with PostgreSQL DDL, applied at open in one
  transaction under a transaction-scoped advisory lock, so replicas starting together migrate
  once; a database migrated by a newer proxy is refused (:class:`SchemaTooNew`). Tables go in the
  first schema of the connection's ``search_path`` (a URL query parameter such as
  ``?search_path=cp`` is passed to the server as a setting). Text keys use the ``"C"`` collation
  so ``list_sessions`` sorts by code point, as SQLite's ``BINARY`` does; JSON is stored as the
  exact text the store wrote (``TEXT``, not ``jsonb``), timestamps as the caller's ISO 8601 text.
* **Errors.** asyncpg, socket and timeout errors become :class:`StoreUnavailable` in one place
  (:meth:`PostgresStore._run`), a lock wait past ``lock_timeout`` (or a deadlock) becomes
  :class:`StoreBusy`; messages name the error class and SQLSTATE, never the URL (it may hold a
  password) or content. Every outcome goes to ``health`` (:mod:`proxy.store.health`): reads
  through :meth:`PostgresStore._read` (as SQLite's), the rest through ``_run``.
* **Connections.** The pool keeps no floor (``min_size`` 0): asyncpg restores a floor in the
  background, and logs a traceback for every failed attempt while the server is down (with
  backoff, up to a minute apart, long after an outage). Connections are made when an operation
  needs one, so a failure surfaces once, in that operation, as ``StoreUnavailable``; an idle
  connection is closed after asyncpg's 300 s, and the next operation pays one connect. PostgreSQL cannot store a NUL character in text, so an event id,
  role, prefix hash or compaction id holding one is refused with ``InvalidWrite`` (SQLite would
  store it).
* Durable state is folded from the history and cached per session, reading only the rows after
  the last ``seq`` folded, as in SQLite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import orjson

from proxy.core.durable import (
    Change,
    ChangeEvent,
    DurableState,
    FieldError,
    InvalidWrite,
    apply,
    prepare_changes,
)
from proxy.store import agents, retention, source_schema, transcript_keys
from proxy.store.agents import AgentRecord, pg_agents, pg_note_agent
from proxy.store.base import (
    DEFAULT_EVENT_LIMIT,
    DEFAULT_PLAN_LIMIT,
    EMPTY_PREFIX,
    AppliedMigration,
    DuplicateEvent,
    HistoryEntry,
    ManifestConflict,
    Prefix,
    PrefixConflict,
    RecordedEvent,
    StoreBusy,
    StoredManifest,
    StoreError,
    StoreUnavailable,
    SummaryClaim,
    SummaryRow,
    TranscriptEvent,
    check_calibration,
    check_keys,
    check_plan_limit,
    check_prefix,
    check_settle,
    check_summary_claim,
    decide_claim,
    decide_settle,
    encode_events,
    encode_manifest,
    encode_plan,
)
from proxy.store.folding import StateCache, change_rows, decode_change, now_iso
from proxy.store.health import Kind, StoreHealth
from proxy.store.migrations import MIGRATIONS, SchemaTooNew
from proxy.store.quota import MIGRATION as QUOTA_MIGRATION
from proxy.store.quota import PG_STATEMENTS as QUOTA_PG
from proxy.store.quota import PostgresQuota
from proxy.store.sqlite import DEFAULT_BUSY_TIMEOUT_MS, MAX_EVENT_LIMIT
from proxy.store.transcript_keys import (
    KeyedEvent,
    Recorded,
    check_keys_list,
    pg_existing,
    pg_record,
    pg_seqs,
)
from proxy.store.usage import PG_STATEMENTS as USAGE_PG
from proxy.store.usage import USAGE_MIGRATION, PostgresUsage
from proxy.store.usage_schema import PROVIDER_MIGRATION, PROVIDER_PG_STATEMENTS

__all__ = [
    "PG_MIGRATIONS",
    "PgMigration",
    "PostgresStore",
]

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 10.0
COMMAND_TIMEOUT_SECONDS = 30.0  # one statement, client side; the pool's acquire waits as long
MIGRATION_TIMEOUT_SECONDS = 300.0  # a migration statement, and the wait for another replica's
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000  # a stalled client cannot hold a session's lock forever
PING_TIMEOUT_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 10.0
DEFAULT_POOL_MIN_SIZE = 0  # no floor: asyncpg's floor upkeep logs a traceback per failed try
DEFAULT_POOL_MAX_SIZE = 10
MAX_BIGINT = 2**63 - 1
# pg_advisory_xact_lock key for migrations: b"ctxproxy" as a big-endian signed 64-bit integer.
MIGRATION_LOCK_KEY = int.from_bytes(b"ctxproxy", "big", signed=True)
_EVENT_ID_KEY = "transcript_events_event_id_key"

# Everything that means "the database could not do it" (server errors not handled where they
# happen, a lost or refused connection, a closed pool, a timeout).
_BUSY = (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError)  # it answered: a lock
_UNAVAILABLE = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class PgMigration:
    version: int
    name: str
    statements: tuple[str, ...]


# The PostgreSQL DDL of each migration in ``proxy.store.migrations.MIGRATIONS``, by version. A new
# migration there needs its PostgreSQL statements here (the module refuses to import otherwise).
_PG_STATEMENTS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE sessions (
            tenant TEXT COLLATE "C" NOT NULL,
            session TEXT COLLATE "C" NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (tenant, session)
        )""",
        """CREATE TABLE durable_changes (
            tenant TEXT COLLATE "C" NOT NULL,
            session TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL CHECK (seq >= 1),
            kind TEXT COLLATE "C" NOT NULL CHECK (kind IN ('fact', 'pending', 'evidence')),
            item_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL CHECK (version >= 1),
            op TEXT NOT NULL CHECK (op IN ('create', 'update', 'retire')),
            body TEXT NOT NULL,
            recorded_at TEXT NOT NULL,
            PRIMARY KEY (tenant, session, seq),
            UNIQUE (tenant, session, kind, item_id, version)
        )""",
        """CREATE TABLE transcript_heads (
            tenant TEXT COLLATE "C" NOT NULL,
            session TEXT COLLATE "C" NOT NULL,
            last_seq BIGINT NOT NULL CHECK (last_seq >= 0),
            prefix_count BIGINT NOT NULL CHECK (prefix_count >= 0),
            prefix_hash TEXT NOT NULL,
            PRIMARY KEY (tenant, session)
        )""",
        """CREATE TABLE transcript_events (
            tenant TEXT COLLATE "C" NOT NULL,
            session TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL CHECK (seq >= 1),
            event_id TEXT COLLATE "C" NOT NULL,
            recorded_at TEXT NOT NULL,
            type TEXT NOT NULL CHECK (type IN ('message', 'answer')),
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            complete BOOLEAN NOT NULL,
            prefix_count BIGINT NOT NULL,
            prefix_hash TEXT NOT NULL,
            PRIMARY KEY (tenant, session, seq),
            CONSTRAINT transcript_events_event_id_key UNIQUE (tenant, session, event_id)
        )""",
        """CREATE TABLE manifests (
            tenant TEXT COLLATE "C" NOT NULL,
            compaction_id TEXT COLLATE "C" NOT NULL,
            session TEXT COLLATE "C" NOT NULL,
            manifest TEXT NOT NULL,
            stored_at TEXT NOT NULL,
            PRIMARY KEY (tenant, compaction_id)
        )""",
        "CREATE INDEX manifests_by_session ON manifests (tenant, session)",
    ),
    2: (
        """CREATE TABLE plans (
            tenant TEXT COLLATE "C" NOT NULL,
            prefix_hash TEXT COLLATE "C" NOT NULL,
            anchor TEXT COLLATE "C" NOT NULL,
            prefix_len BIGINT NOT NULL CHECK (prefix_len >= 1),
            plan_json TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (tenant, prefix_hash)
        )""",
        "CREATE INDEX plans_by_anchor ON plans (tenant, anchor, prefix_len)",
    ),
    3: (
        """CREATE TABLE summaries (
            tenant TEXT COLLATE "C" NOT NULL,
            summary_key TEXT COLLATE "C" NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'ok', 'failed')),
            holder TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            summary TEXT,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (tenant, summary_key)
        )""",
        """CREATE TABLE calibration (
            tenant TEXT COLLATE "C" NOT NULL,
            model TEXT COLLATE "C" NOT NULL,
            ratio DOUBLE PRECISION NOT NULL CHECK (ratio > 0),
            updated_at TEXT NOT NULL,
            PRIMARY KEY (tenant, model)
        )""",
    ),
    4: transcript_keys.PG_STATEMENTS,
    USAGE_MIGRATION[0]: USAGE_PG,
    source_schema.VERSION: source_schema.PG_STATEMENTS,
    7: retention.PG_MIGRATION_STATEMENTS,
    agents.VERSION: agents.PG_STATEMENTS,
    PROVIDER_MIGRATION[0]: PROVIDER_PG_STATEMENTS,
    QUOTA_MIGRATION[0]: QUOTA_PG,
}


def _pg_migrations() -> tuple[PgMigration, ...]:
    if sorted(_PG_STATEMENTS) != [m.version for m in MIGRATIONS]:
        raise RuntimeError("every migration in proxy.store.migrations needs PostgreSQL statements")
    return tuple(PgMigration(m.version, m.name, _PG_STATEMENTS[m.version]) for m in MIGRATIONS)


PG_MIGRATIONS = _pg_migrations()


def _describe(exc: BaseException) -> str:
    """The error's class and SQLSTATE: never its message (it may name a host, a key or data)."""
    sqlstate = getattr(exc, "sqlstate", None)
    name = type(exc).__name__
    return f"{name} {sqlstate}" if isinstance(sqlstate, str) and sqlstate else name


def _unstorable(value: str) -> bool:
    """PostgreSQL text holds no NUL character and only valid UTF-8 (no lone surrogates)."""
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_storable(fields: Sequence[tuple[str, object]]) -> None:
    errors = [
        FieldError(name, "contains a NUL character or invalid Unicode")
        for name, value in fields
        if isinstance(value, str) and _unstorable(value)
    ]
    if errors:
        raise InvalidWrite(errors)


async def _locked_summary(conn: Any, tenant: str, key: str) -> tuple[SummaryRow | None, float]:
    """The summary row, locked until the transaction ends (created as an expired pending row
    first, so two claimers of a new key queue on the same row), and the database's clock."""
    await conn.execute(
        "INSERT INTO summaries (tenant, summary_key, state, holder, expires_at, summary,"
        " updated_at) VALUES ($1, $2, 'pending', '', 0, NULL, $3)"
        " ON CONFLICT (tenant, summary_key) DO NOTHING",
        tenant,
        key,
        now_iso(),
    )
    row = await conn.fetchrow(
        "SELECT state, holder, expires_at, summary, extract(epoch FROM clock_timestamp()) AS now"
        " FROM summaries WHERE tenant = $1 AND summary_key = $2 FOR UPDATE",
        tenant,
        key,
    )
    stored = SummaryRow(
        str(row["state"]),  # type: ignore[arg-type]
        str(row["holder"]),
        float(row["expires_at"]),
        None if row["summary"] is None else str(row["summary"]),
    )
    return stored, float(row["now"])


async def _write_summary(conn: Any, tenant: str, key: str, row: SummaryRow) -> None:
    await conn.execute(
        "UPDATE summaries SET state = $3, holder = $4, expires_at = $5, summary = $6,"
        " updated_at = $7 WHERE tenant = $1 AND summary_key = $2",
        tenant,
        key,
        row.state,
        row.holder,
        row.expires_at,
        row.text,
        now_iso(),
    )


async def _touch_session(conn: Any, tenant: str, session: str, now: str) -> None:
    """Create or update the session's row, which locks it until the transaction ends."""
    await conn.execute(
        "INSERT INTO sessions (tenant, session, created_at, updated_at) VALUES ($1, $2, $3, $3)"
        " ON CONFLICT (tenant, session) DO UPDATE SET updated_at = excluded.updated_at",
        tenant,
        session,
        now,
    )


async def _history_rows(
    conn: Any, tenant: str, session: str, after_seq: int
) -> list[tuple[int, str, ChangeEvent]]:
    rows = await conn.fetch(
        "SELECT seq, recorded_at, version, body FROM durable_changes"
        " WHERE tenant = $1 AND session = $2 AND seq > $3 ORDER BY seq",
        tenant,
        session,
        after_seq,
    )
    return [
        (int(row["seq"]), str(row["recorded_at"]), decode_change(row["version"], row["body"]))
        for row in rows
    ]


def _event_from_row(session: str, row: Any, agent: str = "") -> RecordedEvent:
    event = TranscriptEvent(
        str(row["event_id"]),
        str(row["recorded_at"]),
        row["type"],
        str(row["role"]),
        orjson.loads(row["content"]),
        bool(row["complete"]),
    )
    return RecordedEvent(
        session, int(row["seq"]), event, int(row["prefix_count"]), str(row["prefix_hash"]), agent
    )


async def _create_pool(url: str, settings: dict[str, str], min_size: int, max_size: int) -> Any:
    try:
        return await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_SECONDS,
            command_timeout=COMMAND_TIMEOUT_SECONDS,
            server_settings=settings,
        )
    except ValueError:  # asyncpg's ClientConfigurationError is one too
        raise ValueError("asyncpg cannot use this PostgreSQL store URL") from None
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"cannot open the store ({_describe(exc)})") from None


async def _migrate(conn: Any, now: Callable[[], str]) -> list[int]:
    """Apply the missing migrations in order, in one transaction; return the versions applied."""
    async with conn.transaction():
        # Waiting for another replica's migration is part of opening: allow it time.
        await conn.execute(f"SET LOCAL lock_timeout = {int(MIGRATION_TIMEOUT_SECONDS * 1000)}")
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1)",
            MIGRATION_LOCK_KEY,
            timeout=MIGRATION_TIMEOUT_SECONDS,
        )
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        if not exists:
            await conn.execute(
                """CREATE TABLE schema_migrations (
                    version INTEGER PRIMARY KEY,
                    name TEXT NOT NULL,
                    applied_at TEXT NOT NULL
                )"""
            )
        rows = await conn.fetch("SELECT version, name FROM schema_migrations")
        recorded = {int(row["version"]): str(row["name"]) for row in rows}
        known = {m.version: m.name for m in PG_MIGRATIONS}
        unknown = sorted(v for v in recorded if known.get(v) != recorded[v])
        if unknown:
            raise SchemaTooNew(
                f"the database has schema migrations this proxy does not know: {unknown}"
            )
        applied: list[int] = []
        for migration in PG_MIGRATIONS:
            if migration.version in recorded:
                continue
            for statement in migration.statements:
                await conn.execute(statement, timeout=MIGRATION_TIMEOUT_SECONDS)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                now(),
            )
            applied.append(migration.version)
    return applied


class PostgresStore(PostgresUsage, PostgresQuota):
    """A :class:`proxy.store.base.Store` on a PostgreSQL database. Make one with :meth:`open`."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._closed = False
        self.health = StoreHealth()
        # (tenant, session) -> (last folded seq, state): the newest fold seen by this store.
        self._states = StateCache()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        lock_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        min_size: int = DEFAULT_POOL_MIN_SIZE,
        max_size: int = DEFAULT_POOL_MAX_SIZE,
    ) -> PostgresStore:
        """Connect (a pool of ``min_size``..``max_size`` connections) and migrate.

        ``ValueError`` when asyncpg cannot use the URL, ``StoreUnavailable`` when the server
        cannot be reached or refuses the connection, ``SchemaTooNew``. No message repeats the URL.
        """
        settings = {
            "application_name": "context-proxy",
            "lock_timeout": str(int(lock_timeout_ms)),
            "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
        }
        pool = await _create_pool(url, settings, min_size, max_size)
        try:
            async with pool.acquire(timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                synchronous_commit = await conn.fetchval("SHOW synchronous_commit")
            if synchronous_commit == "off":
                # Set for the database or role: override it for this store's connections (a
                # startup setting survives the RESET ALL of a connection returned to the pool).
                await pool.close()
                pool = await _create_pool(
                    url, {**settings, "synchronous_commit": "on"}, min_size, max_size
                )
            async with pool.acquire(timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                await _migrate(conn, now_iso)
        except _UNAVAILABLE as exc:
            pool.terminate()
            raise StoreUnavailable(f"cannot open the store ({_describe(exc)})") from None
        except BaseException:
            pool.terminate()
            raise
        return cls(pool)

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[Any], Awaitable[T]], kind: Kind = "writes") -> T:
        """Run ``fn`` on a pooled connection; database failures become ``StoreUnavailable``
        (``StoreBusy``: a lock wait timed out), and the outcome goes to ``health``."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        started = self.health.begin()
        try:
            async with self._pool.acquire(timeout=COMMAND_TIMEOUT_SECONDS) as conn:
                result = await fn(conn)
        except _BUSY as exc:
            self.health.ended(kind, started, None)  # the database answered
            raise StoreBusy(f"the store is busy ({_describe(exc)})") from exc
        except _UNAVAILABLE as exc:
            if self._closed:
                raise StoreUnavailable("the store is closed") from None
            error = StoreUnavailable(f"the store failed ({_describe(exc)})")
            self.health.ended(kind, started, error)
            raise error from exc
        except (StoreError, ValueError):  # about the data (a conflict, an invalid write)
            self.health.ended(kind, started, None)
            raise
        self.health.ended(kind, started, None)
        return result

    async def _read(self, fn: Callable[[Any], Awaitable[T]], kind: Kind = "reads") -> T:
        """:meth:`_run` for a read (``session reads``: what ``/readyz`` answers from)."""
        return await self._run(fn, kind)

    async def _state(self, conn: Any, tenant: str, session: str) -> tuple[int, DurableState]:
        """The session's folded state and the last ``seq`` folded into it."""
        base = self._states.get(tenant, session)
        rows = await _history_rows(conn, tenant, session, base[0])
        return self._states.fold(tenant, session, base, rows)

    # -- durable state ----------------------------------------------------------------------------

    async def write_changes(
        self, tenant: str, session: str, changes: Sequence[Change]
    ) -> tuple[int, ...]:
        check_keys(tenant, session)
        changes = tuple(changes)

        async def job(conn: Any) -> tuple[int, ...]:
            async with conn.transaction():
                now = now_iso()
                await _touch_session(conn, tenant, session, now)  # the session's lock
                seq, state = await self._state(conn, tenant, session)
                events = prepare_changes(state, changes)
                await conn.executemany(
                    "INSERT INTO durable_changes (tenant, session, seq, kind, item_id, version,"
                    " op, body, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    change_rows(tenant, session, seq, events, now),
                )
            self._states.remember(tenant, session, seq + len(events), apply(events, state))
            return tuple(e.version for e in events)

        return await self._run(job)

    async def current_state(self, tenant: str, session: str) -> DurableState:
        check_keys(tenant, session)

        async def job(conn: Any) -> DurableState:
            return (await self._state(conn, tenant, session))[1]

        return await self._read(job, "session reads")

    async def history(self, tenant: str, session: str) -> tuple[HistoryEntry, ...]:
        check_keys(tenant, session)

        async def job(conn: Any) -> tuple[HistoryEntry, ...]:
            rows = await _history_rows(conn, tenant, session, 0)
            return tuple(HistoryEntry(seq, at, event) for seq, at, event in rows)

        return await self._read(job, "session reads")

    # -- transcripts ------------------------------------------------------------------------------

    async def append_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[TranscriptEvent],
        prefix_count: int,
        prefix_hash: str,
        *,
        expected_prefix: Prefix | None = None,
    ) -> int:
        check_keys(tenant, session)
        check_prefix(prefix_count, prefix_hash)
        if prefix_count > MAX_BIGINT:
            raise InvalidWrite([FieldError("prefix_count", "too large")])
        events = tuple(events)
        contents = encode_events(events)
        _check_storable(
            [("prefix_hash", prefix_hash)]
            + [
                (f"events[{i}].{name}", value)
                for i, e in enumerate(events)
                for name, value in (("event_id", e.event_id), ("role", e.role))
            ]
        )

        async def job(conn: Any) -> int:
            async with conn.transaction():
                await _touch_session(conn, tenant, session, now_iso())  # the session's lock
                head = await conn.fetchrow(
                    "SELECT last_seq, prefix_count, prefix_hash FROM transcript_heads"
                    " WHERE tenant = $1 AND session = $2 AND agent = ''",
                    tenant,
                    session,
                )
                if head is None:
                    last_seq, current = 0, EMPTY_PREFIX
                else:
                    last_seq = int(head["last_seq"])
                    current = Prefix(int(head["prefix_count"]), str(head["prefix_hash"]))
                if expected_prefix is not None and expected_prefix != current:
                    raise PrefixConflict(current)
                try:
                    await conn.executemany(
                        "INSERT INTO transcript_events (tenant, session, seq, event_id,"
                        " recorded_at, type, role, content, complete, prefix_count, prefix_hash)"
                        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                        [
                            (
                                tenant,
                                session,
                                last_seq + n,
                                e.event_id,
                                e.recorded_at,
                                e.type,
                                e.role,
                                content.decode(),
                                e.complete,
                                prefix_count,
                                prefix_hash,
                            )
                            for n, (e, content) in enumerate(zip(events, contents, strict=True), 1)
                        ],
                    )
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name != _EVENT_ID_KEY:
                        raise  # a seq taken despite the lock: unavailable, not the caller's fault
                    raise DuplicateEvent(
                        "an event id is already recorded in this session"
                    ) from None
                await conn.execute(
                    "INSERT INTO transcript_heads (tenant, session, agent, last_seq, prefix_count,"
                    " prefix_hash) VALUES ($1, $2, '', $3, $4, $5)"
                    " ON CONFLICT (tenant, session, agent) DO UPDATE SET last_seq = excluded.last_seq,"
                    " prefix_count = excluded.prefix_count, prefix_hash = excluded.prefix_hash",
                    tenant,
                    session,
                    last_seq + len(events),
                    prefix_count,
                    prefix_hash,
                )
            return last_seq + 1

        return await self._run(job)

    async def record_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[KeyedEvent],
        prefix: Prefix,
        *,
        agent: str = "",
        parent: str = "",
    ) -> Recorded:
        check_keys(tenant, session, agent)
        check_keys(tenant, None, parent)
        check_prefix(prefix.count, prefix.hash)
        if prefix.count > MAX_BIGINT:
            raise InvalidWrite([FieldError("prefix_count", "too large")])
        events = tuple(events)
        check_keys_list(k.key for k in events)
        contents = encode_events([k.event for k in events])
        _check_storable(
            [("prefix_hash", prefix.hash)]
            + [
                (f"events[{i}].{name}", value)
                for i, k in enumerate(events)
                for name, value in (("event_id", k.event.event_id), ("role", k.event.role))
            ]
        )

        async def job(conn: Any) -> Recorded:
            async with conn.transaction():
                now = now_iso()
                await _touch_session(conn, tenant, session, now)  # the session's lock
                recorded = await pg_record(conn, tenant, session, events, contents, prefix, agent)
                if agent:
                    await pg_note_agent(conn, tenant, session, agent, parent, now)
                return recorded

        return await self._run(job)

    async def transcript_keys_held(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> frozenset[str]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)

        async def job(conn: Any) -> frozenset[str]:
            return frozenset(await pg_existing(conn, tenant, session, agent, keys))

        return await self._run(job)

    async def transcript_seqs(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> dict[str, int]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)

        async def job(conn: Any) -> dict[str, int]:
            return await pg_seqs(conn, tenant, session, agent, keys)

        return await self._run(job)

    async def session_agents(self, tenant: str, session: str) -> tuple[AgentRecord, ...]:
        check_keys(tenant, session)

        async def job(conn: Any) -> tuple[AgentRecord, ...]:
            return await pg_agents(conn, tenant, session)

        return await self._run(job)

    async def transcript_events(
        self,
        tenant: str,
        session: str,
        after_seq: int = 0,
        limit: int = DEFAULT_EVENT_LIMIT,
        *,
        agent: str = "",
    ) -> tuple[RecordedEvent, ...]:
        check_keys(tenant, session, agent)
        errors: list[FieldError] = []
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            errors.append(FieldError("after_seq", "expected an integer >= 0"))
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_EVENT_LIMIT
        ):
            errors.append(FieldError("limit", f"expected an integer from 1 to {MAX_EVENT_LIMIT}"))
        if errors:
            raise InvalidWrite(errors)
        if after_seq > MAX_BIGINT:
            return ()

        async def job(conn: Any) -> tuple[RecordedEvent, ...]:
            rows = await conn.fetch(
                "SELECT seq, event_id, recorded_at, type, role, content, complete, prefix_count,"
                " prefix_hash FROM transcript_events WHERE tenant = $1 AND session = $2"
                " AND agent = $3 AND seq > $4 ORDER BY seq LIMIT $5",
                tenant,
                session,
                agent,
                after_seq,
                limit,
            )
            return tuple(_event_from_row(session, row, agent) for row in rows)

        return await self._read(job)

    async def recorded_prefix(self, tenant: str, session: str, *, agent: str = "") -> Prefix:
        check_keys(tenant, session, agent)

        async def job(conn: Any) -> Prefix:
            row = await conn.fetchrow(
                "SELECT prefix_count, prefix_hash FROM transcript_heads"
                " WHERE tenant = $1 AND session = $2 AND agent = $3",
                tenant,
                session,
                agent,
            )
            if row is None:
                return EMPTY_PREFIX
            return Prefix(int(row["prefix_count"]), str(row["prefix_hash"]))

        return await self._read(job)

    # -- manifests --------------------------------------------------------------------------------

    async def put_manifest(
        self, tenant: str, compaction_id: str, session: str, manifest_json: str
    ) -> None:
        check_keys(tenant, session)
        text = encode_manifest(compaction_id, manifest_json)
        _check_storable([("compaction_id", compaction_id), ("manifest_json", text)])

        async def job(conn: Any) -> None:
            async with conn.transaction():
                now = now_iso()
                # Waits for a concurrent insert of the same id to commit or roll back.
                inserted = await conn.fetchval(
                    "INSERT INTO manifests (tenant, compaction_id, session, manifest, stored_at)"
                    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, compaction_id) DO NOTHING"
                    " RETURNING true",
                    tenant,
                    compaction_id,
                    session,
                    text,
                    now,
                )
                if inserted:
                    await _touch_session(conn, tenant, session, now)
                    return
                row = await conn.fetchrow(
                    "SELECT session, manifest FROM manifests"
                    " WHERE tenant = $1 AND compaction_id = $2",
                    tenant,
                    compaction_id,
                )
                if row is None or (row["session"], row["manifest"]) != (session, text):
                    raise ManifestConflict("another manifest is stored under this compaction id")

        await self._run(job)

    async def get_manifest(self, tenant: str, compaction_id: str) -> StoredManifest | None:
        check_keys(tenant)
        if not isinstance(compaction_id, str) or _unstorable(compaction_id):
            return None  # could never have been stored

        async def job(conn: Any) -> StoredManifest | None:
            row = await conn.fetchrow(
                "SELECT session, manifest, stored_at FROM manifests"
                " WHERE tenant = $1 AND compaction_id = $2",
                tenant,
                compaction_id,
            )
            if row is None:
                return None
            return StoredManifest(
                compaction_id, str(row["session"]), str(row["manifest"]), str(row["stored_at"])
            )

        return await self._read(job)

    # -- compaction plans -------------------------------------------------------------------------

    async def put_plan(
        self, tenant: str, anchor: str, prefix_hash: str, prefix_len: int, plan_json: str
    ) -> str:
        check_keys(tenant)
        text = encode_plan(anchor, prefix_hash, prefix_len, plan_json)
        _check_storable([("anchor", anchor), ("prefix_hash", prefix_hash), ("plan_json", text)])

        async def job(conn: Any) -> str:
            async with conn.transaction():
                # Waits for a concurrent insert of the same key to commit or roll back.
                await conn.execute(
                    "INSERT INTO plans (tenant, prefix_hash, anchor, prefix_len, plan_json,"
                    " created_at) VALUES ($1, $2, $3, $4, $5, $6)"
                    " ON CONFLICT (tenant, prefix_hash) DO NOTHING",
                    tenant,
                    prefix_hash,
                    anchor,
                    prefix_len,
                    text,
                    now_iso(),
                )
                stored = await conn.fetchval(
                    "SELECT plan_json FROM plans WHERE tenant = $1 AND prefix_hash = $2",
                    tenant,
                    prefix_hash,
                )
                return text if stored is None else str(stored)

        return await self._run(job)

    async def plans_for(
        self, tenant: str, anchor: str, limit: int = DEFAULT_PLAN_LIMIT
    ) -> tuple[str, ...]:
        check_keys(tenant)
        limit = check_plan_limit(limit)
        if not isinstance(anchor, str) or _unstorable(anchor):
            return ()  # could never have been stored

        async def job(conn: Any) -> tuple[str, ...]:
            rows = await conn.fetch(
                "SELECT plan_json FROM plans WHERE tenant = $1 AND anchor = $2"
                " ORDER BY prefix_len DESC, prefix_hash LIMIT $3",
                tenant,
                anchor,
                limit,
            )
            return tuple(str(row["plan_json"]) for row in rows)

        return await self._read(job)

    # -- summary leases, calibration --------------------------------------------------------------
    # Lease times come from the database's clock, so replicas on several hosts agree on them.

    async def claim_summary(
        self, tenant: str, key: str, holder: str, lease_seconds: float
    ) -> SummaryClaim:
        check_keys(tenant)
        check_summary_claim(key, holder, lease_seconds, "lease_seconds")
        _check_storable([("key", key), ("holder", holder)])

        async def job(conn: Any) -> SummaryClaim:
            async with conn.transaction():
                row, now = await _locked_summary(conn, tenant, key)
                claim, write = decide_claim(row, holder, now, lease_seconds)
                if write is not None:
                    await _write_summary(conn, tenant, key, write)
                return claim

        return await self._run(job)

    async def settle_summary(
        self, tenant: str, key: str, holder: str, text: str | None, retry_seconds: float
    ) -> None:
        check_keys(tenant)
        check_settle(key, holder, text, retry_seconds)
        _check_storable([("key", key), ("holder", holder), ("text", text)])

        async def job(conn: Any) -> None:
            async with conn.transaction():
                row, now = await _locked_summary(conn, tenant, key)
                write = decide_settle(row, holder, text, now, retry_seconds)
                if write is not None:
                    await _write_summary(conn, tenant, key, write)

        await self._run(job)

    async def put_calibration(self, tenant: str, model: str, ratio: float) -> None:
        check_keys(tenant)
        check_calibration(model, ratio, with_ratio=True)
        _check_storable([("model", model)])

        async def job(conn: Any) -> None:
            await conn.execute(
                "INSERT INTO calibration (tenant, model, ratio, updated_at) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (tenant, model) DO UPDATE"
                " SET ratio = excluded.ratio, updated_at = excluded.updated_at",
                tenant,
                model,
                float(ratio),
                now_iso(),
            )

        await self._run(job)

    async def get_calibration(self, tenant: str, model: str) -> float | None:
        check_keys(tenant)
        check_calibration(model, with_ratio=False)
        if _unstorable(model):
            return None  # could never have been stored

        async def job(conn: Any) -> float | None:
            ratio = await conn.fetchval(
                "SELECT ratio FROM calibration WHERE tenant = $1 AND model = $2", tenant, model
            )
            return None if ratio is None else float(ratio)

        return await self._read(job)

    # -- the rest ---------------------------------------------------------------------------------

    async def list_sessions(self, tenant: str) -> tuple[str, ...]:
        check_keys(tenant)

        async def job(conn: Any) -> tuple[str, ...]:
            rows = await conn.fetch(
                "SELECT session FROM sessions WHERE tenant = $1 ORDER BY session", tenant
            )
            return tuple(str(row["session"]) for row in rows)

        return await self._read(job)

    async def applied_migrations(self) -> tuple[AppliedMigration, ...]:
        async def job(conn: Any) -> tuple[AppliedMigration, ...]:
            rows = await conn.fetch(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
            )
            return tuple(
                AppliedMigration(int(row["version"]), str(row["name"]), str(row["applied_at"]))
                for row in rows
            )

        return await self._read(job)

    async def ping(self) -> bool:
        async def job(conn: Any) -> bool:
            await conn.fetchval("SELECT count(*) FROM (SELECT 1 FROM durable_changes LIMIT 1) AS one")
            return True

        started = self.health.begin()
        try:
            async with asyncio.timeout(PING_TIMEOUT_SECONDS):
                return await self._read(job, "session reads")
        except TimeoutError:  # the read was cancelled before it could report: reported here
            self.health.ended(
                "session reads", started, StoreUnavailable("the store did not answer in time")
            )
            return False
        except StoreError:
            return False

    async def close(self) -> None:
        """Wait (up to ``CLOSE_TIMEOUT_SECONDS``) for calls in flight, then close the pool."""
        if self._closed:
            return
        self._closed = True
        self._states.clear()
        self.health.closed()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                await self._pool.close()
        except BaseException as exc:
            self._pool.terminate()
            if not isinstance(exc, _UNAVAILABLE):
                raise
