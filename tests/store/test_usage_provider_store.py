"""The ledger's provider columns (migration 9) on SQLite and PostgreSQL: rows with the provider's
compaction share, notes and agent round-trip; the SQL sums equal the core's for any iterations; a
database at version 7 is upgraded with every ledger row kept as it was."""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.catalogue import Catalogue
from proxy.core.ledger import LedgerEntry, Sums, Usage, billing, row_figures
from proxy.core.provider_notes import notes_from
from proxy.store import Store, open_store
from proxy.store.migrations import MIGRATIONS
from proxy.store.sql import POSTGRES, SQLITE
from proxy.store.usage import UsageQuery
from tests.store.test_usage_store import T0_MS, assert_same

SONNET = "claude-sonnet-4-5"
COMPACTION = {"type": "compaction", "input_tokens": 100, "cache_creation_input_tokens": 3000,
              "cache_read_input_tokens": 150000, "output_tokens": 2500,
              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 3000}}
MESSAGE = {"type": "message", "input_tokens": 5, "cache_creation_input_tokens": 2000,
           "cache_read_input_tokens": 40000, "output_tokens": 800}
PROVIDER_USAGE = {"input_tokens": 5, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 40000,
                  "output_tokens": 800, "iterations": [COMPACTION, MESSAGE]}
TRANSFORMATIONS = [{"type": "thinking_dropped", "path": f"messages.{i}.content.0", "reason": "prefix_binding_mismatch"}
                   for i in range(3)]


def entry(n: int = 0, raw: dict[str, Any] | None = None, **over: Any) -> LedgerEntry:
    at_ms = T0_MS + n * 1000
    base = LedgerEntry(
        at=datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        at_ms=at_ms, tenant="acme", session="s1", model=SONNET, route="messages", kind="client",
        status=200, latency_ms=3.5, request_id=f"req_{n}", tokens_before=2000, tokens_after=1000,
        layers="deferred", plan="none", summary="skipped",
    )  # fmt: skip
    return replace(base.with_usage(raw), **over)


async def test_provider_figures_notes_and_agent_round_trip(store: Store) -> None:
    notes = notes_from({"applied_edits": [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                                           "cleared_input_tokens": 900}]}, TRANSFORMATIONS)
    rows = [
        entry(0, PROVIDER_USAGE, provider_notes=notes, agent="agent-1"),
        entry(1, {"input_tokens": 7, "output_tokens": 1}),
        entry(2, None, status=529),
    ]
    await store.record_usage(rows)
    got = [r.entry for r in await store.usage_rows("acme", UsageQuery())]
    assert got == rows
    first = got[0]
    assert first.usage == Usage(105, 5000, 0, 3000, 190000, 3300)  # the compaction's split: 0 / 3000
    assert first.provider_compaction == Usage(100, 3000, 0, 3000, 150000, 2500)
    assert (first.provider_compactions, first.agent) == (1, "agent-1")
    assert first.provider_notes is not None and first.provider_notes.thinking_blocks_dropped == 3
    assert first.provider_usage == PROVIDER_USAGE
    (group,) = await store.usage_groups("acme", UsageQuery(), "session")
    assert (group.sums.provider_compactions, group.sums.thinking_blocks_dropped) == (1, 3)
    assert group.sums.cache_read_input_tokens == 190000
    assert group.sums.provider_compaction_cache_creation_1h_input_tokens == 3000


counts = st.integers(0, 10**7)


@st.composite
def usage_objects(draw: st.DrawFn) -> dict[str, Any]:
    def figures() -> dict[str, Any]:
        raw: dict[str, Any] = {k: draw(st.one_of(st.none(), counts)) for k in
                               ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")}
        if draw(st.booleans()):
            raw["cache_creation"] = {"ephemeral_5m_input_tokens": draw(st.one_of(st.none(), counts)),
                                     "ephemeral_1h_input_tokens": draw(st.one_of(st.none(), counts))}
        return raw

    raw = figures()
    if draw(st.booleans()):
        kinds = st.sampled_from(["compaction", "message", "advisor_message", "fallback_message"])
        raw["iterations"] = [{"type": draw(kinds), **figures()} for _ in range(draw(st.integers(0, 4)))]
    return raw


_TENANTS = itertools.count(1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(usage_objects(), st.integers(0, 10**6), st.integers(0, 10**6),
                          st.lists(st.sampled_from(["thinking_dropped", "thinking_mismatch_allowed"]), max_size=4)),
                min_size=1, max_size=5))  # fmt: skip
async def test_sql_sums_equal_the_core_definition_with_iterations(
    store: Store, rows: list[tuple[dict[str, Any], int, int, list[str]]]
) -> None:
    tenant = f"p{next(_TENANTS)}"
    entries = [
        entry(0, raw, tenant=tenant, tokens_before=before, tokens_after=after,
              provider_notes=notes_from(None, [{"type": t, "path": "messages.0.content.0"} for t in kinds]))
        for raw, before, after, kinds in rows
    ]  # fmt: skip
    await store.record_usage(entries)
    groups = await store.usage_groups(tenant, UsageQuery(), "session")
    assert_same(sum((g.sums for g in groups), Sums()), sum((e.sums() for e in entries), Sums()))
    stored = [r.entry for r in await store.usage_rows(tenant, UsageQuery())]
    assert [e.usage for e in stored] == [billing(raw).usage for raw, *_ in rows]


# -- a database at version 7 ---------------------------------------------------------------------

_V5_COLUMNS = (
    "tenant", "at", "at_ms", "session", "model", "route", "kind", "status", "latency_ms",
    "request_id", "tokens_before", "tokens_after", "layers", "plan", "summary", "compaction_id",
    "input_tokens", "cache_creation_input_tokens", "cache_creation_5m", "cache_creation_1h",
    "cache_read_input_tokens", "output_tokens", "usage_json",
)  # fmt: skip
# rows as the ledger wrote them at version 7: the top-level figures in the columns, the whole
# usage object as JSON (one with iterations: the ledger did not read them then)
_OLD_ROWS = [
    ("acme", "2026-01-01T00:00:00.000+00:00", T0_MS, "s1", SONNET, "messages", "client", 200, 12.5,
     "req_old1", 2000, 1000, "prune", "new", "ok", "cmp-1", 12, 3000, 1000, 2000, 40000, 250,
     orjson.dumps({"input_tokens": 12, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 40000,
                   "output_tokens": 250, "cache_creation": {"ephemeral_5m_input_tokens": 1000,
                                                            "ephemeral_1h_input_tokens": 2000}}).decode()),
    ("acme", "2026-01-01T00:00:01.000+00:00", T0_MS + 1000, "s1", SONNET, "messages", "client", 200, 8.0,
     "req_old2", None, None, None, None, None, None, 5, 2000, None, None, 40000, 800,
     orjson.dumps(PROVIDER_USAGE).decode()),
    ("acme", "2026-01-01T00:00:02.000+00:00", T0_MS + 2000, None, SONNET, "messages", "client", 529, 3.0,
     None, None, None, None, None, None, None, None, None, None, None, None, None, None),
]  # fmt: skip


def _sqlite_at_version_7(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                     " applied_at TEXT NOT NULL)")
        for m in MIGRATIONS:
            if m.version <= 7:
                for statement in m.statements_for(SQLITE):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, '2026-01-01T00:00:00Z')", (m.version, m.name))
        conn.executemany(f"INSERT INTO usage_ledger ({', '.join(_V5_COLUMNS)}) VALUES"
                         f" ({', '.join('?' for _ in _V5_COLUMNS)})", _OLD_ROWS)
    finally:
        conn.close()


async def _postgres_at_version_7(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                           " applied_at TEXT NOT NULL)")
        for m in MIGRATIONS:
            if m.version <= 7:
                for statement in m.statements_for(POSTGRES):
                    await conn.execute(statement)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2, '2026-01-01T00:00:00Z')",
                                   m.version, m.name)
        placeholders = ", ".join(f"${i}" for i in range(1, len(_V5_COLUMNS) + 1))
        await conn.executemany(f"INSERT INTO usage_ledger ({', '.join(_V5_COLUMNS)}) VALUES ({placeholders})", _OLD_ROWS)
    finally:
        await conn.close()


async def test_a_version_7_database_keeps_every_ledger_row(store_url: str) -> None:
    if store_url.startswith("sqlite"):
        _sqlite_at_version_7(Path(store_url.removeprefix("sqlite:///")))
    else:
        await _postgres_at_version_7(store_url)
    store = await open_store(store_url)
    try:
        applied = [m.version for m in await store.applied_migrations()]
        assert applied == [m.version for m in MIGRATIONS] and 9 in applied
        rows = [r.entry for r in await store.usage_rows("acme", UsageQuery())]
        assert [e.request_id for e in rows] == ["req_old1", "req_old2", None]
        first, second, failed = rows
        # the figures the ledger billed then, unchanged (rows are not re-billed)
        assert first.usage == Usage(12, 3000, 1000, 2000, 40000, 250)
        assert second.usage == Usage(5, 2000, None, None, 40000, 800)
        assert second.provider_usage == PROVIDER_USAGE  # the object is kept whole
        assert failed.usage is None and failed.status == 529 and failed.provider_usage is None
        for e in rows:
            assert (e.provider_compaction, e.provider_compactions, e.provider_notes, e.agent) == (None, 0, None, None)
        assert (first.tokens_before, first.plan, first.compaction_id, first.latency_ms) == (2000, "new", "cmp-1", 12.5)
        figures = row_figures(first, Catalogue())
        assert figures.cost is not None  # Sonnet 4.5: $3 in, $3.75 / $6 writes, $0.30 read, $15 out
        assert figures.cost.total == pytest.approx((12 * 3 + 1000 * 3.75 + 2000 * 6 + 40000 * 0.30 + 250 * 15) / 1e6)
        (group,) = await store.usage_groups("acme", UsageQuery(), "session")
        assert (group.sums.calls, group.sums.input_tokens, group.sums.output_tokens) == (2, 17, 1050)
        assert (group.sums.provider_compactions, group.sums.thinking_blocks_dropped) == (0, 0)
        # and new rows go in beside them
        await store.record_usage([entry(9, PROVIDER_USAGE, agent="agent-2")])
        (new,) = await store.usage_rows("acme", UsageQuery(after=0, session="s1", since_ms=T0_MS + 9000))
        assert new.entry.usage == Usage(105, 5000, 0, 3000, 190000, 3300) and new.entry.agent == "agent-2"
    finally:
        await store.close()
