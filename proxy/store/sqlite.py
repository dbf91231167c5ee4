"""The SQLite backend: one file, WAL mode, driven from two worker threads per store.

* The stdlib ``sqlite3`` write connection lives in a dedicated thread (a one-worker executor):
  every write sends a small function there and awaits its result, so the event loop never blocks
  on disk and the connection is only ever used by the thread that opened it. Writes of one store
  run one at a time, in order.
* Reads run on a second, read-only connection in a thread of its own. WAL lets a reader go on
  while another connection (this store's writer, another process) holds the write lock, so an
  admin read or a readiness ping never queues behind writes waiting for that lock (issue 11 #4:
  reads used to wait ~10 s behind queued background writes). A read sees every write the store
  acknowledged before the read was called (each read statement starts from the latest commit).
* ``journal_mode=WAL`` (readers never block the writer), ``synchronous=FULL`` (a commit that
  returned survives power loss, not only a process crash: every write a method acknowledges is one
  the proxy may have told a client about), ``busy_timeout`` (several processes or stores may share
  the file; a writer waits for the lock instead of failing at once).
* Every read-then-write runs in ``BEGIN IMMEDIATE``: the write lock is taken before the read, so
  two appenders cannot both see ``last_seq = 7`` and both write 8.
* Durable state is derived by folding the session's history (``proxy.core.durable.apply``). The
  history is append-only with a gap-free ``seq`` per session, so the store keeps the folded view
  of recently used sessions in memory and reads only the rows after the last ``seq`` it folded.
* sqlite3 errors become :class:`StoreUnavailable` in one place (:meth:`SQLiteStore._call`;
  ``StoreBusy`` for a lock wait past the busy timeout); every outcome goes to ``health``
  (:mod:`proxy.store.health`), reported from the loop in :meth:`SQLiteStore._submit`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

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
from proxy.store.agents import AgentRecord, sqlite_agents, sqlite_note_agent
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
from proxy.store.migrations import migrate
from proxy.store.quota import SQLiteQuota
from proxy.store.transcript_keys import (
    KeyedEvent,
    Recorded,
    check_keys_list,
    sqlite_existing,
    sqlite_record,
    sqlite_seqs,
)
from proxy.store.usage import SQLiteUsage

__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "SQLiteStore"]

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 5000
MAX_EVENT_LIMIT = 10_000
PING_TIMEOUT_SECONDS = 5.0
_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")  # error names (and their extended codes) of a lock wait


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            # The original error is what matters; a failed rollback (connection broken) adds
            # nothing, and SQLite rolls back an open transaction when the connection closes.
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _touch_session(conn: sqlite3.Connection, tenant: str, session: str, now: str) -> None:
    conn.execute(
        "INSERT INTO sessions (tenant, session, created_at, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant, session) DO UPDATE SET updated_at = excluded.updated_at",
        (tenant, session, now, now),
    )


def _summary_row(conn: sqlite3.Connection, tenant: str, key: str) -> SummaryRow | None:
    row = conn.execute(
        "SELECT state, holder, expires_at, summary FROM summaries"
        " WHERE tenant = ? AND summary_key = ?",
        (tenant, key),
    ).fetchone()
    return None if row is None else SummaryRow(row[0], row[1], float(row[2]), row[3])


def _write_summary(conn: sqlite3.Connection, tenant: str, key: str, row: SummaryRow) -> None:
    conn.execute(
        "INSERT INTO summaries (tenant, summary_key, state, holder, expires_at, summary,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, summary_key) DO UPDATE"
        " SET state = excluded.state, holder = excluded.holder,"
        " expires_at = excluded.expires_at, summary = excluded.summary,"
        " updated_at = excluded.updated_at",
        (tenant, key, row.state, row.holder, row.expires_at, row.text, now_iso()),
    )


def _history_rows(
    conn: sqlite3.Connection, tenant: str, session: str, after_seq: int
) -> list[tuple[int, str, ChangeEvent]]:
    rows = conn.execute(
        "SELECT seq, recorded_at, version, body FROM durable_changes"
        " WHERE tenant = ? AND session = ? AND seq > ? ORDER BY seq",
        (tenant, session, after_seq),
    ).fetchall()
    return [(seq, at, decode_change(version, body)) for seq, at, version, body in rows]


def _event_from_row(session: str, row: tuple[Any, ...], agent: str = "") -> RecordedEvent:
    seq, event_id, recorded_at, type_, role, content, complete, prefix_count, prefix_hash = row
    event = TranscriptEvent(
        event_id, recorded_at, type_, role, orjson.loads(content), bool(complete)
    )
    return RecordedEvent(session, seq, event, prefix_count, prefix_hash, agent)


class SQLiteStore(SQLiteUsage, SQLiteQuota):
    """A :class:`proxy.store.base.Store` on one SQLite file. Make one with :meth:`open`."""

    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sqlite")
        self._read_executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="store-sqlite-read"
        )
        self._conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._closed = False
        self.health = StoreHealth()
        # (tenant, session) -> (last folded seq, state); shared by the two worker threads.
        self._states = StateCache()
        self._states_lock = threading.Lock()

    @classmethod
    async def open(
        cls, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> SQLiteStore:
        """Open (creating the file and its folder if needed) and migrate to the latest schema."""
        store = cls(Path(path), busy_timeout_ms)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(store._executor, store._connect)
            await loop.run_in_executor(store._read_executor, store._connect_reader)
        except BaseException:
            store._closed = True
            await loop.run_in_executor(store._executor, store._disconnect)
            store._executor.shutdown(wait=False)
            store._read_executor.shutdown(wait=False)
            raise
        return store

    # -- the worker thread ----------------------------------------------------------------------

    def _connect(self) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            raise StoreUnavailable("cannot create the store's folder") from None
        try:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout_ms / 1000, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            # Switching a new file to WAL answers SQLITE_BUSY at once, without waiting, while
            # another process does the same (several replicas starting on one new file): retry
            # for as long as the busy timeout. Migrating is one transaction, so retrying is safe.
            deadline = time.monotonic() + self._busy_timeout_ms / 1000
            pause = 0.005
            while True:
                try:
                    self._prepare(conn)
                    break
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() >= deadline:
                        raise
                    time.sleep(pause)
                    pause = min(pause * 2, 0.1)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _connect_reader(self) -> None:
        """The read-only connection (after :meth:`_connect`: the file exists, in WAL mode)."""
        try:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout_ms / 1000, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot open the store ({exc.sqlite_errorname})") from None
        self._read_conn = conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _disconnect_reader(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> None:
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            raise StoreUnavailable("the store's file system does not support WAL mode")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, now_iso)

    def _call(self, fn: Callable[[sqlite3.Connection], T], *, read: bool = False) -> T:
        conn = self._read_conn if read else self._conn
        if conn is None:
            raise StoreUnavailable("the store is closed")
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            name = getattr(exc, "sqlite_errorname", type(exc).__name__)
            if name.startswith(_BUSY):  # another writer's lock, past the busy timeout
                raise StoreBusy(f"the store is busy ({name})") from exc
            raise StoreUnavailable(f"the store failed ({name})") from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the write connection, after the writes queued before it."""
        return await self._submit(self._executor, fn, read=False, kind="writes")

    async def _read(self, fn: Callable[[sqlite3.Connection], T], kind: Kind = "reads") -> T:
        """Run the read-only ``fn`` on the read connection: never behind a queued write."""
        return await self._submit(self._read_executor, fn, read=True, kind=kind)

    async def _submit(
        self,
        executor: ThreadPoolExecutor,
        fn: Callable[[sqlite3.Connection], T],
        *,
        read: bool,
        kind: Kind,
    ) -> T:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(executor, partial(self._call, fn, read=read))
        except RuntimeError:  # the executor was shut down by a concurrent close()
            raise StoreUnavailable("the store is closed") from None
        # The outcome is reported here, on the loop (``health`` is not thread-safe).
        started = self.health.begin()
        try:
            result = await future
        except StoreBusy:
            self.health.ended(kind, started, None)  # the database answered
            raise
        except StoreUnavailable as exc:
            if not self._closed:
                self.health.ended(kind, started, exc)
            raise
        except (StoreError, ValueError):  # about the data (a conflict, an invalid write)
            self.health.ended(kind, started, None)
            raise
        self.health.ended(kind, started, None)
        return result

    def _state(
        self, conn: sqlite3.Connection, tenant: str, session: str
    ) -> tuple[int, DurableState]:
        """The session's folded state and the last ``seq`` folded into it (either worker)."""
        with self._states_lock:
            base = self._states.get(tenant, session)
        rows = _history_rows(conn, tenant, session, base[0])
        with self._states_lock:
            return self._states.fold(tenant, session, base, rows)

    # -- durable state ----------------------------------------------------------------------------

    async def write_changes(
        self, tenant: str, session: str, changes: Sequence[Change]
    ) -> tuple[int, ...]:
        check_keys(tenant, session)
        changes = tuple(changes)

        def job(conn: sqlite3.Connection) -> tuple[int, ...]:
            with _immediate(conn):
                seq, state = self._state(conn, tenant, session)
                events = prepare_changes(state, changes)
                now = now_iso()
                conn.executemany(
                    "INSERT INTO durable_changes (tenant, session, seq, kind, item_id, version,"
                    " op, body, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    change_rows(tenant, session, seq, events, now),
                )
                _touch_session(conn, tenant, session, now)
            with self._states_lock:
                self._states.remember(tenant, session, seq + len(events), apply(events, state))
            return tuple(e.version for e in events)

        return await self._run(job)

    async def current_state(self, tenant: str, session: str) -> DurableState:
        check_keys(tenant, session)
        return await self._read(
            lambda conn: self._state(conn, tenant, session)[1], "session reads"
        )

    async def history(self, tenant: str, session: str) -> tuple[HistoryEntry, ...]:
        check_keys(tenant, session)

        def job(conn: sqlite3.Connection) -> tuple[HistoryEntry, ...]:
            rows = _history_rows(conn, tenant, session, 0)
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
        events = tuple(events)
        contents = encode_events(events)

        def job(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                head = conn.execute(
                    "SELECT last_seq, prefix_count, prefix_hash FROM transcript_heads"
                    " WHERE tenant = ? AND session = ? AND agent = ''",
                    (tenant, session),
                ).fetchone()
                last_seq, current = (
                    (0, EMPTY_PREFIX) if head is None else (head[0], Prefix(*head[1:]))
                )
                if expected_prefix is not None and expected_prefix != current:
                    raise PrefixConflict(current)
                try:
                    conn.executemany(
                        "INSERT INTO transcript_events (tenant, session, seq, event_id,"
                        " recorded_at, type, role, content, complete, prefix_count, prefix_hash)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                                int(e.complete),
                                prefix_count,
                                prefix_hash,
                            )
                            for n, (e, content) in enumerate(zip(events, contents, strict=True), 1)
                        ],
                    )
                except sqlite3.IntegrityError:
                    raise DuplicateEvent(
                        "an event id is already recorded in this session"
                    ) from None
                conn.execute(
                    "INSERT INTO transcript_heads (tenant, session, agent, last_seq, prefix_count,"
                    " prefix_hash) VALUES (?, ?, '', ?, ?, ?) ON CONFLICT (tenant, session, agent)"
                    " DO UPDATE SET last_seq = excluded.last_seq,"
                    " prefix_count = excluded.prefix_count, prefix_hash = excluded.prefix_hash",
                    (tenant, session, last_seq + len(events), prefix_count, prefix_hash),
                )
                _touch_session(conn, tenant, session, now_iso())
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
        events = tuple(events)
        check_keys_list(k.key for k in events)
        contents = encode_events([k.event for k in events])

        def job(conn: sqlite3.Connection) -> Recorded:
            with _immediate(conn):
                recorded = sqlite_record(conn, tenant, session, events, contents, prefix, agent)
                now = now_iso()
                _touch_session(conn, tenant, session, now)
                if agent:
                    sqlite_note_agent(conn, tenant, session, agent, parent, now)
            return recorded

        return await self._run(job)

    async def transcript_keys_held(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> frozenset[str]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)

        def job(conn: sqlite3.Connection) -> frozenset[str]:
            return frozenset(sqlite_existing(conn, tenant, session, agent, keys))

        return await self._run(job)

    async def transcript_seqs(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> dict[str, int]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)
        return await self._read(lambda conn: sqlite_seqs(conn, tenant, session, agent, keys))

    async def session_agents(self, tenant: str, session: str) -> tuple[AgentRecord, ...]:
        check_keys(tenant, session)
        return await self._read(lambda conn: sqlite_agents(conn, tenant, session))

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

        def job(conn: sqlite3.Connection) -> tuple[RecordedEvent, ...]:
            rows = conn.execute(
                "SELECT seq, event_id, recorded_at, type, role, content, complete, prefix_count,"
                " prefix_hash FROM transcript_events WHERE tenant = ? AND session = ?"
                " AND agent = ? AND seq > ? ORDER BY seq LIMIT ?",
                (tenant, session, agent, after_seq, limit),
            ).fetchall()
            return tuple(_event_from_row(session, row, agent) for row in rows)

        return await self._read(job)

    async def recorded_prefix(self, tenant: str, session: str, *, agent: str = "") -> Prefix:
        check_keys(tenant, session, agent)

        def job(conn: sqlite3.Connection) -> Prefix:
            row = conn.execute(
                "SELECT prefix_count, prefix_hash FROM transcript_heads"
                " WHERE tenant = ? AND session = ? AND agent = ?",
                (tenant, session, agent),
            ).fetchone()
            return EMPTY_PREFIX if row is None else Prefix(*row)

        return await self._read(job)

    # -- manifests --------------------------------------------------------------------------------

    async def put_manifest(
        self, tenant: str, compaction_id: str, session: str, manifest_json: str
    ) -> None:
        check_keys(tenant, session)
        text = encode_manifest(compaction_id, manifest_json)

        def job(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                row = conn.execute(
                    "SELECT session, manifest FROM manifests WHERE tenant = ? AND compaction_id = ?",
                    (tenant, compaction_id),
                ).fetchone()
                if row is not None:
                    if tuple(row) != (session, text):
                        raise ManifestConflict(
                            "another manifest is stored under this compaction id"
                        )
                    return
                now = now_iso()
                conn.execute(
                    "INSERT INTO manifests (tenant, compaction_id, session, manifest, stored_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (tenant, compaction_id, session, text, now),
                )
                _touch_session(conn, tenant, session, now)

        await self._run(job)

    async def get_manifest(self, tenant: str, compaction_id: str) -> StoredManifest | None:
        check_keys(tenant)

        def job(conn: sqlite3.Connection) -> StoredManifest | None:
            row = conn.execute(
                "SELECT session, manifest, stored_at FROM manifests"
                " WHERE tenant = ? AND compaction_id = ?",
                (tenant, compaction_id),
            ).fetchone()
            return None if row is None else StoredManifest(compaction_id, *row)

        return await self._read(job)

    # -- compaction plans -------------------------------------------------------------------------

    async def put_plan(
        self, tenant: str, anchor: str, prefix_hash: str, prefix_len: int, plan_json: str
    ) -> str:
        check_keys(tenant)
        text = encode_plan(anchor, prefix_hash, prefix_len, plan_json)

        def job(conn: sqlite3.Connection) -> str:
            with _immediate(conn):
                conn.execute(
                    "INSERT OR IGNORE INTO plans (tenant, prefix_hash, anchor, prefix_len,"
                    " plan_json, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (tenant, prefix_hash, anchor, prefix_len, text, now_iso()),
                )
                row = conn.execute(
                    "SELECT plan_json FROM plans WHERE tenant = ? AND prefix_hash = ?",
                    (tenant, prefix_hash),
                ).fetchone()
                return text if row is None else str(row[0])

        return await self._run(job)

    async def plans_for(
        self, tenant: str, anchor: str, limit: int = DEFAULT_PLAN_LIMIT
    ) -> tuple[str, ...]:
        check_keys(tenant)
        limit = check_plan_limit(limit)

        def job(conn: sqlite3.Connection) -> tuple[str, ...]:
            rows = conn.execute(
                "SELECT plan_json FROM plans WHERE tenant = ? AND anchor = ?"
                " ORDER BY prefix_len DESC, prefix_hash LIMIT ?",
                (tenant, anchor, limit),
            ).fetchall()
            return tuple(str(text) for (text,) in rows)

        return await self._read(job)

    # -- summary leases, calibration --------------------------------------------------------------

    async def claim_summary(
        self, tenant: str, key: str, holder: str, lease_seconds: float
    ) -> SummaryClaim:
        check_keys(tenant)
        check_summary_claim(key, holder, lease_seconds, "lease_seconds")

        def job(conn: sqlite3.Connection) -> SummaryClaim:
            with _immediate(conn):
                claim, write = decide_claim(
                    _summary_row(conn, tenant, key), holder, time.time(), lease_seconds
                )
                if write is not None:
                    _write_summary(conn, tenant, key, write)
                return claim

        return await self._run(job)

    async def settle_summary(
        self, tenant: str, key: str, holder: str, text: str | None, retry_seconds: float
    ) -> None:
        check_keys(tenant)
        check_settle(key, holder, text, retry_seconds)

        def job(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                row = _summary_row(conn, tenant, key)
                write = decide_settle(row, holder, text, time.time(), retry_seconds)
                if write is not None:
                    _write_summary(conn, tenant, key, write)

        await self._run(job)

    async def put_calibration(self, tenant: str, model: str, ratio: float) -> None:
        check_keys(tenant)
        check_calibration(model, ratio, with_ratio=True)

        def job(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    "INSERT INTO calibration (tenant, model, ratio, updated_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (tenant, model) DO UPDATE"
                    " SET ratio = excluded.ratio, updated_at = excluded.updated_at",
                    (tenant, model, float(ratio), now_iso()),
                )

        await self._run(job)

    async def get_calibration(self, tenant: str, model: str) -> float | None:
        check_keys(tenant)
        check_calibration(model, with_ratio=False)

        def job(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(
                "SELECT ratio FROM calibration WHERE tenant = ? AND model = ?", (tenant, model)
            ).fetchone()
            return None if row is None else float(row[0])

        return await self._read(job)

    # -- the rest ---------------------------------------------------------------------------------

    async def list_sessions(self, tenant: str) -> tuple[str, ...]:
        check_keys(tenant)

        def job(conn: sqlite3.Connection) -> tuple[str, ...]:
            rows = conn.execute(
                "SELECT session FROM sessions WHERE tenant = ? ORDER BY session", (tenant,)
            ).fetchall()
            return tuple(session for (session,) in rows)

        return await self._read(job)

    async def applied_migrations(self) -> tuple[AppliedMigration, ...]:
        def job(conn: sqlite3.Connection) -> tuple[AppliedMigration, ...]:
            rows = conn.execute(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
            ).fetchall()
            return tuple(AppliedMigration(*row) for row in rows)

        return await self._read(job)

    async def ping(self) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            conn.execute("SELECT count(*) FROM (SELECT 1 FROM durable_changes LIMIT 1) AS one").fetchone()
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
        if self._closed:
            return
        self._closed = True
        self.health.closed()

        def job() -> None:
            self._disconnect()
            with self._states_lock:
                self._states.clear()

        loop = asyncio.get_running_loop()
        try:
            await self._close_quota()
            await loop.run_in_executor(self._read_executor, self._disconnect_reader)
            await loop.run_in_executor(self._executor, job)
        finally:
            self._read_executor.shutdown(wait=False)
            self._executor.shutdown(wait=False)
