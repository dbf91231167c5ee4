"""``record_transcript``: events keyed once per session, appended in order, on both backends."""

from __future__ import annotations

import asyncio

import pytest

from proxy.core.durable import InvalidWrite
from proxy.store import Store, TranscriptEvent, open_store
from proxy.store.base import Prefix
from proxy.store.values import KeyedEvent

T0 = "2026-12-01T10:00:00+00:00"


def _keyed(key: str, text: str | None = None) -> KeyedEvent:
    return KeyedEvent(key, TranscriptEvent(f"evt-{key}", T0, "message", "user", text or key, True))


async def test_held_keys_are_skipped_and_the_rest_numbered_in_order(store: Store) -> None:
    first = await store.record_transcript("t1", "s1", [_keyed("a"), _keyed("b")], Prefix(2, "h2"))
    assert first.seqs == (1, 2) and first.last_seq == 2
    again = await store.record_transcript(
        "t1", "s1", [KeyedEvent("a", _keyed("x").event), _keyed("c"), _keyed("d")], Prefix(4, "h4")
    )
    assert again.seqs == (3, 4) and again.last_seq == 4
    events = await store.transcript_events("t1", "s1")
    assert [(e.seq, e.event.content) for e in events] == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert await store.recorded_prefix("t1", "s1") == Prefix(4, "h4")
    assert await store.transcript_keys_held("t1", "s1", ["a", "d", "zz"]) == frozenset({"a", "d"})
    # keys are per tenant and session
    assert await store.transcript_keys_held("t2", "s1", ["a"]) == frozenset()
    other = await store.record_transcript("t1", "s2", [_keyed("a")], Prefix(1, "x"))
    assert other.seqs == (1,)
    # a batch with nothing new still moves the prefix, and writes no event
    none = await store.record_transcript("t1", "s1", [_keyed("b")], Prefix(9, "h9"))
    assert none.seqs == () and none.last_seq == 4
    assert await store.recorded_prefix("t1", "s1") == Prefix(9, "h9")


async def test_bad_keys_are_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(InvalidWrite) as caught:
        await store.record_transcript("t1", "s1", [_keyed("ok"), _keyed("bad key\n")], Prefix(1, "h"))
    assert [e.field for e in caught.value.errors] == ["events[1].key"]
    assert await store.transcript_events("t1", "s1") == ()


async def test_concurrent_writers_in_two_connections_store_each_key_once(store_url: str, store: Store) -> None:
    """Two store instances (as two replicas) race 40 overlapping batches: every key once,
    sequence numbers contiguous, and each batch's events in batch order."""
    other = await open_store(store_url)
    try:
        batches = [[_keyed(f"k{j}") for j in range(i, i + 5)] for i in range(40)]
        await asyncio.gather(
            *[
                (store if i % 2 else other).record_transcript("t1", "race", batch, Prefix(i + 5, f"h{i}"))
                for i, batch in enumerate(batches)
            ]
        )
    finally:
        await other.close()
    events = await store.transcript_events("t1", "race")
    contents = [e.event.content for e in events]
    assert sorted(contents, key=lambda k: int(str(k)[1:])) == [f"k{j}" for j in range(44)]
    assert len(set(contents)) == len(contents) == 44
    assert [e.seq for e in events] == list(range(1, 45))
