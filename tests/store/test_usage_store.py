"""The usage ledger in the store, on SQLite and PostgreSQL: rows, paging, ranges, sums, deletes."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.durable import InvalidWrite
from proxy.core.ledger import LedgerEntry, Sums, usage_from
from proxy.store import Store
from proxy.store.usage import UsageQuery

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def entry(n: int = 0, **over: object) -> LedgerEntry:
    at_ms = T0_MS + n * 1000
    usage = {
        "input_tokens": 10 + n,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1000,
        "cache_creation": {"ephemeral_5m_input_tokens": 60, "ephemeral_1h_input_tokens": 40},
        "output_tokens": 5,
        "service_tier": "standard",
    }
    base = LedgerEntry(
        at=datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        at_ms=at_ms,
        tenant="acme",
        session="s1",
        model="claude-sonnet-4-5",
        route="messages",
        kind="client",
        status=200,
        latency_ms=12.5,
        request_id=f"req_{n}",
        tokens_before=2000,
        tokens_after=1000,
        layers="prune,summarize",
        plan="new",
        summary="ok",
        compaction_id=f"cmp-{n}",
        usage=usage_from(usage),
        provider_usage=usage,
    )
    return replace(base, **over)  # type: ignore[arg-type]


async def test_rows_round_trip_exactly_with_increasing_ids(store: Store) -> None:
    rows = [entry(0), entry(1, usage=None, provider_usage=None, status=529, session=None)]
    await store.record_usage(rows)
    got = await store.usage_rows("acme", UsageQuery())
    assert [r.entry for r in got] == rows
    assert got[0].id < got[1].id
    assert got[0].entry.provider_usage == rows[0].provider_usage  # the provider's object, whole


async def test_tenants_never_see_each_others_rows(store: Store) -> None:
    await store.record_usage([entry(0), entry(1, tenant="globex"), entry(2)])
    assert [r.entry.request_id for r in await store.usage_rows("acme", UsageQuery())] == [
        "req_0",
        "req_2",
    ]
    assert [r.entry.tenant for r in await store.usage_rows("globex", UsageQuery())] == ["globex"]
    assert await store.usage_rows("initech", UsageQuery()) == ()
    groups = await store.usage_groups("globex", UsageQuery(), "session")
    assert [g.sums.calls for g in groups] == [1]


async def test_paging_filters_and_time_ranges(store: Store) -> None:
    await store.record_usage(
        [entry(n, session="s1" if n % 2 else "s2", kind="summary" if n == 3 else "client")
         for n in range(10)]
    )
    page1 = await store.usage_rows("acme", UsageQuery(limit=4))
    page2 = await store.usage_rows("acme", UsageQuery(limit=4, after=page1[-1].id))
    page3 = await store.usage_rows("acme", UsageQuery(limit=4, after=page2[-1].id))
    assert [len(p) for p in (page1, page2, page3)] == [4, 4, 2]
    assert [r.entry.request_id for r in page1 + page2 + page3] == [f"req_{n}" for n in range(10)]
    ranged = await store.usage_rows(
        "acme", UsageQuery(since_ms=T0_MS + 2000, until_ms=T0_MS + 5000)
    )
    assert [r.entry.request_id for r in ranged] == ["req_2", "req_3", "req_4"]  # until exclusive
    s1 = await store.usage_rows("acme", UsageQuery(session="s1"))
    assert [r.entry.request_id for r in s1] == ["req_1", "req_3", "req_5", "req_7", "req_9"]
    summaries = await store.usage_rows("acme", UsageQuery(kind="summary"))
    assert [r.entry.request_id for r in summaries] == ["req_3"]
    assert await store.usage_rows("acme", UsageQuery(model="claude-other")) == ()


async def test_buckets_and_sessions_sum_what_the_rows_hold(store: Store) -> None:
    rows = [entry(n, session=f"s{n % 3}", model="claude-haiku-4-5" if n % 4 == 0 else "claude-sonnet-4-5")
            for n in range(12)]  # fmt: skip
    rows.append(entry(12, usage=None, provider_usage=None, status=500))
    await store.record_usage(rows)
    groups = await store.usage_groups(
        "acme", UsageQuery(since_ms=T0_MS, until_ms=T0_MS + 20_000), "bucket", 5000
    )
    for bucket in range(3):
        for model in ("claude-haiku-4-5", "claude-sonnet-4-5"):
            expected = _sum(
                r for r in rows
                if (r.at_ms - T0_MS) // 5000 == bucket and r.model == model
            )  # fmt: skip
            got = [g.sums for g in groups if g.key == bucket and g.model == model]
            assert_same(got[0] if got else Sums(), expected)
    sessions = await store.usage_groups("acme", UsageQuery(), "session")
    assert {g.key for g in sessions} == {"s0", "s1", "s2"}
    s0 = [g for g in sessions if g.key == "s0"]
    assert_same(sum((g.sums for g in s0), Sums()), _sum(r for r in rows if r.session == "s0"))
    assert min(g.first_ms for g in s0) == T0_MS


def assert_same(got: Sums, expected: Sums) -> None:
    """Equal counts; the float sums equal up to rounding (SQL adds in its own order)."""
    exact = {"removed_read": 0.0, "removed_uncached": 0.0}
    assert replace(got, **exact) == replace(expected, **exact)
    assert got.removed_read == pytest.approx(expected.removed_read, rel=1e-9, abs=1e-6)
    assert got.removed_uncached == pytest.approx(expected.removed_uncached, rel=1e-9, abs=1e-6)


def _sum(rows: object) -> Sums:
    total = Sums()
    for r in rows:  # type: ignore[attr-defined]
        total = total + r.sums()
    return total


async def test_delete_before_a_cutoff_per_tenant_or_all(store: Store) -> None:
    await store.record_usage([entry(n) for n in range(5)] + [entry(0, tenant="globex")])
    cutoff = datetime.fromtimestamp((T0_MS + 3000) / 1000, UTC)
    assert await store.delete_usage_before("acme", cutoff) == 3
    assert [r.entry.request_id for r in await store.usage_rows("acme", UsageQuery())] == [
        "req_3",
        "req_4",
    ]
    assert len(await store.usage_rows("globex", UsageQuery())) == 1
    assert await store.delete_usage_before(None, "2030-01-01T00:00:00+00:00") == 3
    assert await store.usage_rows("acme", UsageQuery()) == ()
    with pytest.raises(InvalidWrite):
        await store.delete_usage_before(None, "2030-01-01T00:00:00")  # no offset


async def test_bad_rows_are_refused_whole(store: Store) -> None:
    with pytest.raises(InvalidWrite) as caught:
        await store.record_usage([entry(0), entry(1, tenant=""), entry(2, kind="other")])
    fields = {e.field for e in caught.value.errors}
    assert fields == {"entries[1].tenant", "entries[2].kind"}
    assert await store.usage_rows("acme", UsageQuery()) == ()
    with pytest.raises(InvalidWrite):
        await store.record_usage([entry(0, model="nul\x00")])


_TENANTS = itertools.count(1)
counts = st.one_of(st.none(), st.integers(0, 10**7))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(counts, counts, counts, counts, counts, counts,
                  st.one_of(st.none(), st.integers(0, 10**6)), st.one_of(st.none(), st.integers(0, 10**6)),
                  st.sampled_from(["new", "reused", "none"]), st.sampled_from([200, 400, 529])),
        min_size=1, max_size=6,
    )
)  # fmt: skip
async def test_sql_sums_equal_the_core_definition(store: Store, rows: list[tuple]) -> None:  # type: ignore[type-arg]
    """The store's SQL aggregate is ``proxy.core.ledger.row_sums`` summed, for any figures."""
    tenant = f"t{next(_TENANTS)}"
    entries = []
    for inp, cc, c5, c1, read, out, before, after, plan, status in rows:
        raw: dict[str, object] = {"input_tokens": inp, "cache_creation_input_tokens": cc,
                                  "cache_read_input_tokens": read, "output_tokens": out}
        if c5 is not None or c1 is not None:
            raw["cache_creation"] = {"ephemeral_5m_input_tokens": c5, "ephemeral_1h_input_tokens": c1}
        usage = usage_from(raw)
        entries.append(entry(0, tenant=tenant, usage=usage, provider_usage=raw if usage else None,
                             tokens_before=before, tokens_after=after, plan=plan, status=status))  # fmt: skip
    await store.record_usage(entries)
    groups = await store.usage_groups(tenant, UsageQuery(), "session")
    assert_same(sum((g.sums for g in groups), Sums()), _sum(entries))  # row_sums, summed
