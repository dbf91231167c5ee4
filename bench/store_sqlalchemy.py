"""A SQLAlchemy Core prototype of the store's hottest paths, for ``bench/bench_store.py`` only.

What the proxy does on every request with a session (``current_state``), on every admission with
budgets (``quota_add``) and in its transcript recorder (``recorded_prefix``,
``transcript_keys_held``, ``record_transcript``), with the same statements, transactions and
locks as ``proxy/store`` (SQLite: ``BEGIN IMMEDIATE``, ``synchronous = FULL``, WAL; PostgreSQL: the
session row's upsert first), but through SQLAlchemy 2 Core on its asyncio extension: the
``aiosqlite`` and ``asyncpg`` drivers, ``Table`` objects, the dialects' ``insert().on_conflict_*``.
It opens a store that ``proxy.store.open_store`` made (the schema is the migrations'), and writes
rows ``proxy.store`` reads back the same (tested in ``tests/test_bench_store.py``).

Needs the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import orjson
from sqlalchemy import BigInteger, Boolean, Column, MetaData, Table, Text, event, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from proxy.core.durable import DurableState
from proxy.core.quota import Counter
from proxy.store.clock import now_iso
from proxy.store.folding import StateCache, decode_change
from proxy.store.values import EMPTY_PREFIX, KeyedEvent, Prefix, Recorded

META = MetaData()
sessions = Table(
    "sessions", META,
    Column("tenant", Text, primary_key=True), Column("session", Text, primary_key=True),
    Column("created_at", Text), Column("updated_at", Text),
)  # fmt: skip
durable_changes = Table(
    "durable_changes", META,
    Column("tenant", Text, primary_key=True), Column("session", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True), Column("recorded_at", Text),
    Column("version", BigInteger), Column("body", Text),
)  # fmt: skip
heads = Table(
    "transcript_heads", META,
    Column("tenant", Text, primary_key=True), Column("session", Text, primary_key=True),
    Column("agent", Text, primary_key=True), Column("last_seq", BigInteger),
    Column("prefix_count", BigInteger), Column("prefix_hash", Text),
)  # fmt: skip
events = Table(
    "transcript_events", META,
    Column("tenant", Text, primary_key=True), Column("session", Text, primary_key=True),
    Column("agent", Text, primary_key=True), Column("seq", BigInteger, primary_key=True),
    Column("event_id", Text), Column("recorded_at", Text), Column("type", Text),
    Column("role", Text), Column("content", Text), Column("complete", Boolean),
    Column("prefix_count", BigInteger), Column("prefix_hash", Text), Column("event_key", Text),
)  # fmt: skip
agents = Table(
    "session_agents", META,
    Column("tenant", Text, primary_key=True), Column("session", Text, primary_key=True),
    Column("agent", Text, primary_key=True), Column("parent", Text),
    Column("first_seen", Text), Column("last_seen", Text),
)  # fmt: skip
counters = Table(
    "quota_counters", META,
    Column("tenant", Text, primary_key=True), Column("scope", Text, primary_key=True),
    Column("metric", Text, primary_key=True), Column("window_start_ms", BigInteger, primary_key=True),
    Column("window_end_ms", BigInteger), Column("value", BigInteger),
)  # fmt: skip


def _engine(url: str, busy_timeout_ms: int, synchronous: str = "FULL") -> AsyncEngine:
    if url.startswith("sqlite:///"):
        engine = create_async_engine(
            "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///"),
            connect_args={"timeout": busy_timeout_ms / 1000},
        )

        # SQLAlchemy's recipe for SQLite transactions it does not begin itself: autocommit at the
        # driver, BEGIN emitted by SQLAlchemy (here IMMEDIATE: the write lock first, as proxy/store)
        @event.listens_for(engine.sync_engine, "connect")
        def connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def begin(conn: Any) -> None:
            if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    parts = urlsplit(url)
    settings = dict(parse_qsl(parts.query))
    settings.setdefault("lock_timeout", str(busy_timeout_ms))
    bare = urlunsplit(parts._replace(scheme="postgresql+asyncpg", query=""))
    return create_async_engine(
        bare, pool_size=10, max_overflow=0, connect_args={"server_settings": settings}
    )


class SQLAlchemyStore:
    """``current_state``, ``quota_add``, ``recorded_prefix``, ``transcript_keys_held`` and
    ``record_transcript`` of ``proxy.store``, on SQLAlchemy Core."""

    def __init__(self, url: str, busy_timeout_ms: int = 5000) -> None:
        self.engine = _engine(url, busy_timeout_ms)
        # reads: no transaction (one statement each, as proxy/store's)
        self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        # the counters: SQLite, an engine of their own with synchronous = NORMAL (proxy/store's lane)
        self.counters = (
            _engine(url, busy_timeout_ms, "NORMAL") if url.startswith("sqlite") else self.engine
        )
        self.insert = sqlite_insert if url.startswith("sqlite") else pg_insert
        self._states = StateCache()
        self._lock = threading.Lock()

    async def close(self) -> None:
        await self.engine.dispose()
        await self.counters.dispose()

    async def _touch(self, conn: AsyncConnection, tenant: str, session: str, now: str) -> None:
        stmt = self.insert(sessions).values(tenant=tenant, session=session, created_at=now, updated_at=now)
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["tenant", "session"], set_={"updated_at": stmt.excluded.updated_at}
            )
        )

    async def current_state(self, tenant: str, session: str) -> DurableState:
        with self._lock:
            base = self._states.get(tenant, session)
        async with self.reader.connect() as conn:
            result = await conn.execute(
                select(durable_changes.c.seq, durable_changes.c.recorded_at,
                       durable_changes.c.version, durable_changes.c.body)
                .where(durable_changes.c.tenant == tenant, durable_changes.c.session == session,
                       durable_changes.c.seq > base[0])
                .order_by(durable_changes.c.seq)
            )  # fmt: skip
            rows = [(int(s), str(at), decode_change(v, b)) for s, at, v, b in result.all()]
        with self._lock:
            return self._states.fold(tenant, session, base, rows)[1]

    async def quota_add(self, tenant: str, items: Sequence[Counter]) -> dict[tuple[str, str, int], int]:
        rows = [
            {"tenant": tenant, "scope": c.scope, "metric": c.metric, "window_start_ms": c.start_ms,
             "window_end_ms": c.end_ms, "value": c.delta}
            for c in items
        ]  # fmt: skip
        stmt = self.insert(counters).values(rows)
        stmt = stmt.on_conflict_do_update(
            index_elements=["tenant", "scope", "metric", "window_start_ms"],
            set_={"value": counters.c.value + stmt.excluded.value},
        ).returning(counters.c.scope, counters.c.metric, counters.c.window_start_ms, counters.c.value)
        # one autocommitted statement, as proxy/store's (no BEGIN / COMMIT around it)
        async with self.counters.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            found = (await conn.execute(stmt)).all()
        return {(str(r[0]), str(r[1]), int(r[2])): int(r[3]) for r in found}

    async def recorded_prefix(self, tenant: str, session: str, *, agent: str = "") -> Prefix:
        async with self.reader.connect() as conn:
            row = (
                await conn.execute(
                    select(heads.c.prefix_count, heads.c.prefix_hash).where(
                        heads.c.tenant == tenant, heads.c.session == session, heads.c.agent == agent
                    )
                )
            ).first()
        return EMPTY_PREFIX if row is None else Prefix(int(row[0]), str(row[1]))

    async def _keys(
        self, conn: AsyncConnection, tenant: str, session: str, agent: str, keys: Sequence[str]
    ) -> dict[str, int]:
        result = await conn.execute(
            select(events.c.event_key, events.c.seq).where(
                events.c.tenant == tenant, events.c.session == session, events.c.agent == agent,
                events.c.event_key.in_(list(dict.fromkeys(keys))),
            )
        )  # fmt: skip
        return {str(k): int(s) for k, s in result.all()}

    async def transcript_keys_held(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> frozenset[str]:
        async with self.reader.connect() as conn:
            return frozenset(await self._keys(conn, tenant, session, agent, keys))

    async def transcript_events(
        self, tenant: str, session: str, after_seq: int = 0, limit: int = 1000, *, agent: str = ""
    ) -> list[Any]:
        async with self.reader.connect() as conn:
            result = await conn.execute(
                select(events).where(
                    events.c.tenant == tenant, events.c.session == session, events.c.agent == agent,
                    events.c.seq > after_seq,
                ).order_by(events.c.seq).limit(limit)
            )  # fmt: skip
            return [(r, orjson.loads(r.content)) for r in result.all()]

    async def record_transcript(
        self,
        tenant: str,
        session: str,
        batch: Sequence[KeyedEvent],
        prefix: Prefix,
        *,
        agent: str = "",
        parent: str = "",
    ) -> Recorded:
        now = now_iso()
        contents = [orjson.dumps(k.event.content).decode() for k in batch]
        async with self.engine.begin() as conn:
            await self._touch(conn, tenant, session, now)
            head = (
                await conn.execute(
                    select(heads.c.last_seq).where(
                        heads.c.tenant == tenant, heads.c.session == session, heads.c.agent == agent
                    )
                )
            ).first()
            last_seq = 0 if head is None else int(head[0])
            seen = set(await self._keys(conn, tenant, session, agent, [k.key for k in batch]))
            rows = []
            for keyed, content in zip(batch, contents, strict=True):
                if keyed.key in seen:
                    continue
                seen.add(keyed.key)
                e = keyed.event
                rows.append({
                    "tenant": tenant, "session": session, "agent": agent,
                    "seq": last_seq + len(rows) + 1, "event_id": e.event_id,
                    "recorded_at": e.recorded_at, "type": e.type, "role": e.role,
                    "content": content, "complete": e.complete, "prefix_count": prefix.count,
                    "prefix_hash": prefix.hash, "event_key": keyed.key,
                })  # fmt: skip
            if rows:
                await conn.execute(events.insert(), rows)
            last = last_seq + len(rows)
            stmt = self.insert(heads).values(
                tenant=tenant, session=session, agent=agent, last_seq=last,
                prefix_count=prefix.count, prefix_hash=prefix.hash,
            )  # fmt: skip
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["tenant", "session", "agent"],
                    set_={"last_seq": stmt.excluded.last_seq,
                          "prefix_count": stmt.excluded.prefix_count,
                          "prefix_hash": stmt.excluded.prefix_hash},
                )
            )  # fmt: skip
            if agent:
                note = self.insert(agents).values(
                    tenant=tenant, session=session, agent=agent, parent=parent,
                    first_seen=now, last_seen=now,
                )  # fmt: skip
                await conn.execute(
                    note.on_conflict_do_update(
                        index_elements=["tenant", "session", "agent"],
                        set_={"last_seen": note.excluded.last_seen},
                    )
                )
        return Recorded(tuple(range(last_seq + 1, last + 1)), last)
