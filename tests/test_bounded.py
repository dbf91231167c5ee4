"""``proxy.core.bounded.Bounded``: the one LRU every per-session structure uses. Its contents
always equal a reference model's (a plain list in use order), and no bound is ever passed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.bounded import Bounded


def test_the_least_recently_used_entry_goes_first_and_is_counted() -> None:
    evicted: list[tuple[str, int]] = []
    cache: Bounded[str, int] = Bounded("t", 2, entry_bytes=10, on_evict=lambda k, v: evicted.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert evicted == [("b", 2)]
    assert cache.items() == [("a", 1), ("c", 3)]
    assert cache.evictions == 1
    assert cache.peek("a") == 1 and cache.oldest() == ("a", 1)  # peek leaves the order alone


def test_the_weight_bound_pushes_out_entries_and_an_entry_heavier_than_it_is_not_kept() -> None:
    cache: Bounded[str, str] = Bounded("t", 10, entry_bytes=10, max_weight=100, weight_factor=2.0)
    cache.put("a", "x", 60)
    cache.put("b", "y", 30)
    cache.put("c", "z", 30)  # 120 > 100: "a" goes
    assert [k for k, _ in cache.items()] == ["b", "c"] and cache.weight == 60
    cache.put("d", "w", 101)  # alone over the bound: it goes too, after the others
    assert cache.items() == [] and cache.weight == 0
    assert cache.evictions == 4
    assert cache.bound_bytes == 10 * 10 + 100 * 2


def test_zero_keeps_nothing_and_the_documented_memory_is_zero() -> None:
    cache: Bounded[int, int] = Bounded("t", 0, entry_bytes=100)
    cache.put(1, 1)
    assert len(cache) == 0 and cache.get(1) is None and cache.bound_bytes == 0


def test_spare_newest_keeps_the_entry_in_use_whatever_its_weight() -> None:
    cache: Bounded[str, int] = Bounded("t", 4, entry_bytes=1, max_weight=10, spare_newest=True)
    cache.put("a", 1, 4)
    cache.put("b", 2, 30)  # alone over the bound: kept, the others go
    assert cache.items() == [("b", 2)] and cache.weight == 30
    cache.put("c", 3, 1)  # now "b" is not the newest: it goes
    assert cache.items() == [("c", 3)] and cache.evictions == 2


def test_update_keeps_the_place_and_resize_evicts_at_once() -> None:
    cache: Bounded[str, int] = Bounded("t", 3, entry_bytes=1, max_weight=10)
    for key in "abc":
        cache.put(key, 0, 3)
    cache.update("a", 7, 1)
    cache.update("zz", 1, 1)  # absent: nothing
    assert cache.items() == [("a", 7), ("b", 0), ("c", 0)] and cache.weight == 7
    cache.resize(1)
    assert cache.items() == [("c", 0)] and cache.evictions == 2
    with pytest.raises(ValueError):
        cache.resize(-1)
    with pytest.raises(ValueError):
        Bounded("t", -1, entry_bytes=1)


def test_get_many_touches_only_what_it_found() -> None:
    cache: Bounded[int, int] = Bounded("t", 3, entry_bytes=1)
    for k in (1, 2, 3):
        cache.put(k, k * 10)
    assert cache.get_many([1, 9, 2]) == [10, None, 20]
    assert [k for k, _ in cache.items()] == [3, 1, 2]
    assert cache.peek_many([3, 9]) == [30, None] and [k for k, _ in cache.items()] == [3, 1, 2]


Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(st.sampled_from(["put", "get", "pop", "touch", "update", "get_many"]),
              st.integers(0, 12), st.integers(0, 40)),
    max_size=200,
)


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(0, 6), st.one_of(st.none(), st.integers(0, 80)), st.booleans())
def test_any_sequence_of_operations_matches_a_reference_lru_within_its_bounds(
    sequence: list[Op], max_entries: int, max_weight: int | None, spare_newest: bool
) -> None:
    evicted: list[int] = []
    cache: Bounded[int, int] = Bounded("t", max_entries, entry_bytes=1, max_weight=max_weight,
                                       on_evict=lambda k, _v: evicted.append(k),
                                       spare_newest=spare_newest)
    floor = 1 if spare_newest else 0
    model: list[tuple[int, int, int]] = []  # (key, value, weight), least recently used first
    expected_evictions: list[int] = []

    def find(key: int) -> int | None:
        return next((i for i, (k, _v, _w) in enumerate(model) if k == key), None)

    def trim() -> None:
        while len(model) > floor and (len(model) > max_entries or (
                max_weight is not None and sum(w for _k, _v, w in model) > max_weight)):
            expected_evictions.append(model.pop(0)[0])

    actions: dict[str, Callable[[int, int], Any]] = {}

    def put(key: int, value: int) -> None:
        cache.put(key, value, value)
        if max_entries == 0 and not spare_newest:
            return
        i = find(key)
        if i is not None:
            model.pop(i)
        model.append((key, value, value if max_weight is not None else 0))
        trim()

    def get(key: int, _value: int) -> None:
        i = find(key)
        assert cache.get(key) == (None if i is None else model[i][1])
        if i is not None:
            model.append(model.pop(i))

    def get_many(key: int, value: int) -> None:
        keys = [key, value % 13]
        found = cache.get_many(keys)
        for k, got in zip(keys, found, strict=True):
            i = find(k)
            assert got == (None if i is None else model[i][1])
            if i is not None:
                model.append(model.pop(i))

    def pop(key: int, _value: int) -> None:
        i = find(key)
        assert cache.pop(key) == (None if i is None else model.pop(i)[1])

    def touch(key: int, _value: int) -> None:
        cache.touch(key)
        i = find(key)
        if i is not None:
            model.append(model.pop(i))

    def update(key: int, value: int) -> None:
        cache.update(key, value, 0)
        i = find(key)
        if i is not None:
            model[i] = (key, value, 0)

    actions.update(put=put, get=get, pop=pop, touch=touch, update=update, get_many=get_many)
    for name, key, value in sequence:
        actions[name](key, value)
        assert cache.items() == [(k, v) for k, v, _w in model]
        assert len(cache) <= max(max_entries, floor)
        if max_weight is not None:
            assert cache.weight == sum(w for _k, _v, w in model)
            assert cache.weight <= max_weight or (spare_newest and len(cache) == 1)
    assert evicted == expected_evictions and cache.evictions == len(expected_evictions)
