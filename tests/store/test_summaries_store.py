"""Summary leases and calibration figures in the store, run against every backend (see
``conftest.BACKENDS``): one summary per key across replicas, a crashed holder's lease expires."""

from __future__ import annotations

import asyncio
import math

import pytest

from proxy.core.durable import InvalidWrite
from proxy.store import Store, open_store
from proxy.store.plans import decide_claim, decide_settle
from proxy.store.values import SummaryRow

KEY = "sum-" + "ab" * 16


async def test_the_first_claimer_acquires_the_others_wait(store: Store) -> None:
    first = await store.claim_summary("t", KEY, "replica-a:1", 30)
    assert first.state == "acquired" and first.wait_seconds == 30
    second = await store.claim_summary("t", KEY, "replica-b:1", 30)
    assert second.state == "held" and 25 < second.wait_seconds <= 30
    # the holder renews its own lease
    assert (await store.claim_summary("t", KEY, "replica-a:1", 30)).state == "acquired"


async def test_a_stored_summary_is_answered_to_everyone_after(store: Store) -> None:
    await store.claim_summary("t", KEY, "a", 30)
    await store.settle_summary("t", KEY, "a", "SUMMARY: the goal", 5)
    for holder in ("a", "b", "c"):
        claim = await store.claim_summary("t", KEY, holder, 30)
        assert (claim.state, claim.text) == ("ok", "SUMMARY: the goal")


async def test_concurrent_claims_make_exactly_one_holder(store_url: str, store: Store) -> None:
    others = [await open_store(store_url) for _ in range(3)]  # other "replicas" on the database
    try:
        stores = [store, *others]
        claims = await asyncio.gather(
            *(stores[i % 4].claim_summary("t", KEY, f"holder-{i}", 30) for i in range(12))
        )
    finally:
        for other in others:
            await other.close()
    assert [c.state for c in claims].count("acquired") == 1
    assert {c.state for c in claims} == {"acquired", "held"}


async def test_an_expired_lease_is_taken_over(store: Store) -> None:
    assert (await store.claim_summary("t", KEY, "crashed", 0.2)).state == "acquired"
    assert (await store.claim_summary("t", KEY, "b", 30)).state == "held"
    await asyncio.sleep(0.35)
    assert (await store.claim_summary("t", KEY, "b", 30)).state == "acquired"
    # the crashed holder coming back cannot settle over the new holder
    await store.settle_summary("t", KEY, "crashed", "stale", 5)
    assert (await store.claim_summary("t", KEY, "c", 30)).state == "held"
    await store.settle_summary("t", KEY, "b", "fresh", 5)
    assert (await store.claim_summary("t", KEY, "c", 30)).text == "fresh"


async def test_a_failure_is_shared_for_a_moment_then_retried(store: Store) -> None:
    await store.claim_summary("t", KEY, "a", 30)
    await store.settle_summary("t", KEY, "a", None, 0.3)
    assert (await store.claim_summary("t", KEY, "b", 30)).state == "failed"
    await asyncio.sleep(0.45)
    assert (await store.claim_summary("t", KEY, "b", 30)).state == "acquired"


async def test_summaries_and_calibration_are_per_tenant(store: Store) -> None:
    await store.claim_summary("acme", KEY, "a", 30)
    await store.settle_summary("acme", KEY, "a", "acme's summary", 5)
    globex = await store.claim_summary("globex", KEY, "g", 30)
    assert globex.state == "acquired" and globex.text is None
    await store.put_calibration("acme", "claude-x", 1.25)
    assert await store.get_calibration("acme", "claude-x") == 1.25
    assert await store.get_calibration("globex", "claude-x") is None
    assert await store.get_calibration("acme", "claude-y") is None
    await store.put_calibration("acme", "claude-x", 1.5)  # last writer wins
    assert await store.get_calibration("acme", "claude-x") == 1.5


@pytest.mark.parametrize(
    ("key", "holder", "seconds", "fields"),
    [
        ("", "h", 1, {"key"}),
        ("k" * 201, "h", 1, {"key"}),
        ("k", " ", 1, {"holder"}),
        ("k", "h", 0, {"lease_seconds"}),
        ("k", "h", math.inf, {"lease_seconds"}),
        ("k", "h", True, {"lease_seconds"}),
        (None, None, -1, {"key", "holder", "lease_seconds"}),
    ],
)
async def test_bad_claims_name_every_field_and_write_nothing(
    store: Store, key: object, holder: object, seconds: object, fields: set[str]
) -> None:
    with pytest.raises(InvalidWrite) as caught:
        await store.claim_summary("t", key, holder, seconds)  # type: ignore[arg-type]
    assert {e.field for e in caught.value.errors} == fields
    assert (await store.claim_summary("t", "k", "h", 1)).state == "acquired"


@pytest.mark.parametrize("ratio", [0, -1.0, math.nan, math.inf, "1.2", None])
async def test_bad_calibration_is_refused(store: Store, ratio: object) -> None:
    with pytest.raises(InvalidWrite):
        await store.put_calibration("t", "m", ratio)  # type: ignore[arg-type]
    assert await store.get_calibration("t", "m") is None


def test_decisions_are_pure_and_total() -> None:
    now = 1000.0
    assert decide_claim(None, "a", now, 10)[1] == SummaryRow("pending", "a", 1010.0, None)
    ok = SummaryRow("ok", "a", 0.0, "text")
    assert decide_claim(ok, "b", now, 10) == (decide_claim(ok, "b", now, 10)[0], None)
    failed_old = SummaryRow("failed", "a", now - 1, None)
    assert decide_claim(failed_old, "b", now, 10)[0].state == "acquired"
    pending = SummaryRow("pending", "a", now + 5, None)
    assert decide_settle(pending, "b", "x", now, 5) is None
    assert decide_settle(pending, "a", "x", now, 5) == SummaryRow("ok", "a", now, "x")
    assert decide_settle(ok, "a", "y", now, 5) is None  # settled once


async def test_a_bad_settle_names_its_fields_and_changes_nothing(store: Store) -> None:
    await store.claim_summary("t", KEY, "a", 30)
    with pytest.raises(InvalidWrite) as caught:
        await store.settle_summary("t", KEY, "a", 123, 0)  # type: ignore[arg-type]
    assert {e.field for e in caught.value.errors} == {"retry_seconds"}
    with pytest.raises(InvalidWrite) as caught:
        await store.settle_summary("t", KEY, "a", 123, 5)  # type: ignore[arg-type]
    assert {e.field for e in caught.value.errors} == {"text"}
    assert (await store.claim_summary("t", KEY, "b", 30)).state == "held"  # still a's lease
