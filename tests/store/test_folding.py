"""The folded-state cache both backends share (pure): a fold starts from the base read before
the history rows, even when another call cached a newer fold in between."""

from __future__ import annotations

from proxy.core.durable import EMPTY_STATE, ChangeEvent, Create, Fact, apply
from proxy.store.folding import StateCache, change_rows, decode_change

T0 = "2026-12-01T10:00:00+00:00"


def _event(n: int) -> ChangeEvent:
    return ChangeEvent(1, Create(Fact(f"f-{n}", f"fact {n}", "transcript:s:1", T0)))


def test_a_fold_uses_its_own_base_not_a_newer_one_cached_meanwhile() -> None:
    cache = StateCache()
    rows = [(n, T0, _event(n)) for n in (1, 2, 3)]
    base = cache.get("t", "s")
    assert base == (0, EMPTY_STATE)
    # another call (a task of the same store) folds everything first
    newer = cache.fold("t", "s", cache.get("t", "s"), rows)
    assert newer == (3, apply(e for _, _, e in rows))
    # this call read rows 1..3 after its (older) base: folding them onto the newer cached state
    # would apply them twice
    assert cache.fold("t", "s", base, rows) == newer
    assert cache.get("t", "s") == newer
    # an older fold never replaces a newer one
    cache.remember("t", "s", 1, apply([rows[0][2]]))
    assert cache.get("t", "s") == newer


def test_the_cache_is_bounded_and_keeps_the_recently_used() -> None:
    cache = StateCache(sessions=2)
    for session in ("a", "b", "c"):
        cache.fold("t", session, cache.get("t", session), [(1, T0, _event(1))])
    assert cache.get("t", "a") == (0, EMPTY_STATE)
    assert cache.get("t", "c")[0] == 1


def test_rows_round_trip() -> None:
    events = [_event(1), _event(2)]
    rows = change_rows("t", "s", 4, events, T0)
    assert [r[2] for r in rows] == [5, 6] and rows[0][:2] == ("t", "s") and rows[0][8] == T0
    assert [decode_change(r[5], r[7]) for r in rows] == events
