"""Compaction plans in the store, run against every backend (see ``conftest.BACKENDS``)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from proxy.core.durable import InvalidWrite
from proxy.store import Store, open_store

ANCHOR = "a1" * 8
OTHER_ANCHOR = "b2" * 8


def plan_json(prefix_hash: str, prefix_len: int, note: str = "x") -> str:
    return orjson.dumps(
        {"v": 1, "anchor": ANCHOR, "prefix_hash": prefix_hash, "prefix_len": prefix_len, "note": note}
    ).decode()


async def test_put_then_read_back(store: Store) -> None:
    assert await store.plans_for("t", ANCHOR) == ()
    text = plan_json("h5", 5)
    assert await store.put_plan("t", ANCHOR, "h5", 5, text) == text
    assert await store.plans_for("t", ANCHOR) == (text,)
    assert await store.plans_for("t", OTHER_ANCHOR) == ()


async def test_put_is_idempotent_and_keeps_the_first(store: Store) -> None:
    first = plan_json("h5", 5, "first")
    assert await store.put_plan("t", ANCHOR, "h5", 5, first) == first
    assert await store.put_plan("t", ANCHOR, "h5", 5, first) == first
    second = plan_json("h5", 5, "second")
    assert await store.put_plan("t", ANCHOR, "h5", 5, second) == first
    assert await store.plans_for("t", ANCHOR) == (first,)


async def test_concurrent_puts_of_one_key_agree(store: Store) -> None:
    texts = [plan_json("h9", 9, f"replica {i}") for i in range(8)]
    results = await asyncio.gather(*(store.put_plan("t", ANCHOR, "h9", 9, t) for t in texts))
    assert len(set(results)) == 1 and results[0] in texts
    assert await store.plans_for("t", ANCHOR) == (results[0],)


async def test_tenants_are_isolated(store: Store) -> None:
    acme = plan_json("h5", 5, "acme")
    globex = plan_json("h5", 5, "globex")
    assert await store.put_plan("acme", ANCHOR, "h5", 5, acme) == acme
    assert await store.put_plan("globex", ANCHOR, "h5", 5, globex) == globex  # same key, own row
    assert await store.plans_for("acme", ANCHOR) == (acme,)
    assert await store.plans_for("globex", ANCHOR) == (globex,)
    assert await store.plans_for("initech", ANCHOR) == ()


async def test_longest_prefix_first_and_limited(store: Store) -> None:
    texts = {n: plan_json(f"h{n}", n) for n in (3, 12, 7, 40, 20)}
    for n, text in texts.items():
        await store.put_plan("t", ANCHOR, f"h{n}", n, text)
    await store.put_plan("t", OTHER_ANCHOR, "other", 99, plan_json("other", 99))
    assert await store.plans_for("t", ANCHOR, limit=10) == tuple(texts[n] for n in (40, 20, 12, 7, 3))
    assert await store.plans_for("t", ANCHOR, limit=2) == (texts[40], texts[20])
    assert len(await store.plans_for("t", ANCHOR)) == 4  # the default limit


async def test_plans_survive_reopening(store_url: str) -> None:
    first = await open_store(store_url)
    text = plan_json("h5", 5)
    await first.put_plan("t", ANCHOR, "h5", 5, text)
    await first.close()
    again = await open_store(store_url)
    try:
        assert await again.plans_for("t", ANCHOR) == (text,)
    finally:
        await again.close()


@pytest.mark.parametrize(
    ("tenant", "anchor", "prefix_hash", "prefix_len", "text"),
    [
        ("", ANCHOR, "h", 1, "{}"),
        ("t", "", "h", 1, "{}"),
        ("t", ANCHOR, "", 1, "{}"),
        ("t", ANCHOR, "h", 0, "{}"),
        ("t", ANCHOR, "h", 1, "not json"),
        ("t", ANCHOR, "h", 1, "[1]"),
    ],
)
async def test_invalid_puts_write_nothing(
    store: Store, tenant: str, anchor: str, prefix_hash: str, prefix_len: int, text: str
) -> None:
    with pytest.raises(InvalidWrite):
        await store.put_plan(tenant, anchor, prefix_hash, prefix_len, text)
    assert await store.plans_for("t", ANCHOR) == ()
