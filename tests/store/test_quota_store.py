"""The quota counters in the store, both backends: one atomic statement per admission, exact under
concurrency, current windows, ended windows deleted."""

from __future__ import annotations

import asyncio

import pytest

from proxy.core.durable import InvalidWrite
from proxy.core.quota import Counter
from proxy.store import Store, open_store

START, END = 1_764_000_000_000, 1_764_000_060_000


def c(metric: str, delta: int, scope: str = "tenant", start: int = START, end: int = END) -> Counter:
    return Counter(scope, metric, "minute", start, end, 10, delta)  # type: ignore[arg-type]


async def test_add_increments_and_answers_the_values_after(store: Store) -> None:
    first = await store.quota_add("acme", [c("requests", 1), c("output_tokens", 300)])
    assert first == {("tenant", "requests", START): 1, ("tenant", "output_tokens", START): 300}
    second = await store.quota_add("acme", [c("requests", 1), c("output_tokens", -120)])
    assert second == {("tenant", "requests", START): 2, ("tenant", "output_tokens", START): 180}
    # another tenant, another key scope and another window are other rows
    assert await store.quota_add("globex", [c("requests", 1)]) == {("tenant", "requests", START): 1}
    assert await store.quota_add("acme", [c("requests", 1, "key:ab12")]) == {
        ("key:ab12", "requests", START): 1
    }
    assert await store.quota_add("acme", [c("requests", 1, start=END, end=END + 60_000)]) == {
        ("tenant", "requests", END): 1
    }
    assert await store.quota_add("acme", []) == {}


async def test_current_lists_the_windows_holding_now(store: Store) -> None:
    await store.quota_add("acme", [c("requests", 3), c("spend", 7, start=0, end=END * 2)])
    await store.quota_add("acme", [c("requests", 1, start=END, end=END + 60_000)])
    await store.quota_add("globex", [c("requests", 5)])
    assert await store.quota_current("acme", START + 1) == (
        ("tenant", "requests", START, END, 3),
        ("tenant", "spend", 0, END * 2, 7),
    )
    assert await store.quota_current("acme", END) == (
        ("tenant", "requests", END, END + 60_000, 1),
        ("tenant", "spend", 0, END * 2, 7),
    )


async def test_ended_windows_are_deleted(store: Store) -> None:
    await store.quota_add("acme", [c("requests", 1), c("requests", 1, start=END, end=END + 60_000)])
    assert await store.delete_quota_before(END + 1) == 1
    assert await store.quota_current("acme", START) == ()
    assert len(await store.quota_current("acme", END)) == 1


async def test_bad_counters_are_refused(store: Store) -> None:
    with pytest.raises(InvalidWrite):
        await store.quota_add("acme", [c("requests", 1, scope="key:NOT HEX")])
    with pytest.raises(InvalidWrite):
        await store.quota_add("acme", [c("bananas", 1)])
    with pytest.raises(InvalidWrite):
        await store.quota_add("", [c("requests", 1)])


async def test_concurrent_increments_from_two_connections_are_all_counted(store_url: str) -> None:
    """Two stores (two replicas' pools) incrementing the same rows at once: every increment is
    counted once and each statement sees a distinct value (the admission rule relies on it)."""
    one, two = await open_store(store_url), await open_store(store_url)
    try:
        rows = [c("input_tokens", 0), c("output_tokens", 5), c("requests", 1)]

        async def admit(store: Store) -> int:
            values = await store.quota_add("acme", rows)
            return values[("tenant", "requests", START)]

        seen = await asyncio.gather(*(admit(one if i % 2 else two) for i in range(40)))
        assert sorted(seen) == list(range(1, 41))
        final = await one.quota_current("acme", START)
        assert final == (
            ("tenant", "input_tokens", START, END, 0),
            ("tenant", "output_tokens", START, END, 200),
            ("tenant", "requests", START, END, 40),
        )
    finally:
        await one.close()
        await two.close()
