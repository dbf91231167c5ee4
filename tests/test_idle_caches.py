"""What is kept per conversation is forgotten once that conversation has gone idle
(``limits.cache_idle_seconds``; issue 28: memory follows the conversations still going).

``Bounded.forget_idle`` matches a reference model for any sequence of uses and sweeps; each owner
(the body memo, the plan cache, the store's durable states, the export marks) forgets under its own
bookkeeping; what the sweeps forgot makes the next quiet moment a memory release; and through the real
server, with the official SDK: every per-conversation cache empties while the conversations pause,
``/metrics`` counts what expired, and when they come back the upstream receives byte for byte
what it receives from a proxy that forgot nothing (plans come back from the store)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.schema import ConfigError
from proxy.core.bounded import Bounded
from proxy.core.compaction import Plan, PlanCache
from proxy.core.compaction.view import FromClient
from proxy.core.durable import Create, Fact
from proxy.core.reparse import BodyMemo
from proxy.server.appkeys import STATE, STORE
from proxy.server.maintenance.idle_caches import forget_when_idle, sweep_interval
from proxy.server.maintenance.idle_trim import FORGOTTEN, TrimSchedule
from proxy.sources.transcript_files import ExportMarks
from proxy.store.sqlite import SQLiteStore
from proxy.tenancy.tenants import DEFAULT_TENANT
from tests.harness import LoopThread, ProxyServer, cache_figures, proxy_config
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

# --- the cache --------------------------------------------------------------------------------


def test_entries_unused_for_the_idle_time_are_forgotten_and_counted_apart_from_evictions() -> None:
    gone: list[str] = []
    cache: Bounded[str, int] = Bounded("t", 10, entry_bytes=1, max_weight=100, idle_forget=True,
                                       on_evict=lambda k, _v: gone.append(k))
    cache.put("before", 0, 5)
    assert cache.forget_idle(1000.0, 60) == 0  # the first sweep only sets the clock
    cache.put("a", 1, 10)
    cache.put("b", 2, 20)
    assert cache.forget_idle(1030.0, 60) == 0  # 30 s: nothing idle yet
    assert cache.get("a") == 1  # used: stamped 1030
    cache.put("c", 3, 30)
    assert cache.forget_idle(1065.0, 60) == 2  # "before" and "b" last used at 1000
    assert gone == ["before", "b"] and cache.items() == [("a", 1), ("c", 3)]
    assert cache.weight == 40 and cache.expired == 2 and cache.evictions == 0
    assert cache.forget_idle(1200.0, 60) == 2 and len(cache) == 0 and cache.weight == 0


def test_a_cache_without_idle_forget_keeps_everything() -> None:
    cache: Bounded[str, int] = Bounded("t", 10, entry_bytes=1)
    cache.put("a", 1)
    cache.forget_idle(1.0, 1)
    assert cache.forget_idle(10_000.0, 1) == 0 and cache.items() == [("a", 1)]


Use = tuple[str, int, int]
uses = st.lists(
    st.tuples(st.sampled_from(["put", "put", "get", "get_many", "touch", "pop", "update",
                               "sweep", "sweep", "sweep"]),
              st.integers(0, 3), st.integers(0, 50)),
    max_size=60,
)


@settings(max_examples=1000, deadline=None)
@given(uses, st.integers(0, 6), st.integers(1, 60))
def test_any_uses_and_sweeps_match_a_reference_model(sequence: list[Use], max_entries: int, idle: int) -> None:
    """The model: (key, value, stamp) in use order; a sweep drops every entry stamped before
    ``now - idle`` (the first only sets the clock) and stamps later uses with its ``now``."""
    cache: Bounded[int, int] = Bounded("t", max_entries, entry_bytes=1, idle_forget=True)
    model: list[tuple[int, int, float]] = []
    clock, now, expired = 0.0, 100.0, 0

    def find(key: int) -> int | None:
        return next((i for i, (k, _v, _s) in enumerate(model) if k == key), None)

    def use(key: int) -> None:
        i = find(key)
        if i is not None:
            k, v, _s = model.pop(i)
            model.append((k, v, clock))

    for name, key, value in sequence:
        if name == "put":
            cache.put(key, value)
            if max_entries:
                i = find(key)
                if i is not None:
                    model.pop(i)
                model.append((key, value, clock))
                del model[: max(0, len(model) - max_entries)]
        elif name == "get":
            i = find(key)
            assert cache.get(key) == (None if i is None else model[i][1])
            use(key)
        elif name == "get_many":
            keys = [key, value % 4]
            found = cache.get_many(keys)
            for k, got in zip(keys, found, strict=True):
                i = find(k)
                assert got == (None if i is None else model[i][1])
                use(k)
        elif name == "touch":
            cache.touch(key)
            use(key)
        elif name == "pop":
            i = find(key)
            assert cache.pop(key) == (None if i is None else model.pop(i)[1])
        elif name == "update":
            cache.update(key, value)
            i = find(key)
            if i is not None:
                model[i] = (key, value, model[i][2])
        else:  # time passes by none, half or all of the idle time: the boundaries come up often
            now += idle * (value % 3) / 2
            first = clock == 0.0
            kept = model if first else [(k, v, s) for k, v, s in model if s >= now - idle]
            dropped = 0 if first else len(model) - len(kept)
            assert cache.forget_idle(now, idle) == dropped
            expired += dropped
            model = [(k, v, now) for k, v, _s in kept] if first else kept
            clock = now
        assert cache.items() == [(k, v) for k, v, _s in model]
    assert cache.expired == expired


# --- the owners --------------------------------------------------------------------------------


def _body(n: int, tag: str = "a") -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"{tag} message {i} " + "x" * 4000} for i in range(n)]
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": messages})


def test_the_body_memo_forgets_idle_conversations_and_parses_their_next_turn_whole() -> None:
    memo = BodyMemo(max_bytes=1 << 20, min_bytes=1024)
    memo.forget_idle(0.5, 60)
    memo.parse("tenant", _body(5)).remember()
    assert len(memo) == 1 and memo.size > 0
    assert memo.forget_idle(100.0, 60) == 1
    assert len(memo) == 0 and memo.size == 0 and memo._by_probe == {}  # the index too
    misses = memo.misses
    got = memo.parse("tenant", _body(7))  # the next turn: a whole parse, the same objects
    assert got.body == orjson.loads(_body(7)) and got.reused == 0 and memo.misses == misses + 1


def _plan(scope: str, anchor: str, length: int) -> Plan:
    return Plan(tenant=scope, anchor=anchor, prefix_len=length, prefix_hash=f"h{length}",
                items=tuple(FromClient(i) for i in range(length)), layers=("prune",), manifest=(),
                bridge=None, summary_status="skipped")


def test_the_plan_cache_counts_forgotten_plans_as_expired_not_evicted() -> None:
    cache = PlanCache(max_plans=10)
    cache.forget_idle(1.0, 60)
    cache.put(_plan("t", "anchor-1", 4))
    cache.put(_plan("t", "anchor-1", 6))
    cache.put(_plan("t", "anchor-2", 4))
    assert len(cache) == 3
    assert cache.forget_idle(30.0, 60) == 0
    cache.match("t", "anchor-2", ["h"] * 10, 10)  # a lookup is a use, found or not
    assert cache.forget_idle(80.0, 60) == 2  # anchor-1's two plans
    assert len(cache) == 1 and cache.expired == 2 and cache.evictions == 0


def test_the_store_forgets_idle_sessions_folded_states_and_refolds_them_right(tmp_path: Path) -> None:
    async def run() -> None:
        store = await SQLiteStore.open(str(tmp_path / "s.db"))
        try:
            store.forget_idle_states(1.0, 60)
            for i in range(3):
                fact = Fact(f"f{i}", f"fact {i}", f"transcript:s{i}:1", "2026-12-01T00:00:00Z")
                await store.write_changes(DEFAULT_TENANT, f"s{i}", [Create(fact)])
            assert len(store.states.cache) == 3
            await store.current_state(DEFAULT_TENANT, "s0")
            store.forget_idle_states(50.0, 60)
            await store.current_state(DEFAULT_TENANT, "s0")  # read: stamped 50
            assert store.forget_idle_states(100.0, 60) == 2
            assert [k for k, _ in store.states.cache.items()] == [(DEFAULT_TENANT, "s0")]
            state = await store.current_state(DEFAULT_TENANT, "s2")  # folded again from the rows
            assert [f.id for f in state.facts] == ["f2"]
        finally:
            await store.close()

    asyncio.run(run())


def test_export_marks_forget_files_not_exported_to() -> None:
    marks = ExportMarks(10)
    marks.forget_idle(1.0, 60)
    marks.put(("root", "a"), (1, 2, 3, 4))
    marks.put(("root", "b"), (1, 2, 3, 4))
    marks.forget_idle(40.0, 60)
    assert marks.get(("root", "a")) is not None
    assert marks.forget_idle(90.0, 60) == 1
    assert marks.get(("root", "b")) is None and marks.get(("root", "a")) is not None


# --- the sweeping task -------------------------------------------------------------------------


class _State:
    inflight = 0
    forgotten = 0


def test_the_sweep_interval_is_a_tenth_of_the_idle_time_between_a_second_and_a_minute() -> None:
    assert sweep_interval(600) == 60 and sweep_interval(30) == 3 and sweep_interval(2) == 1
    assert sweep_interval(3600) == 60


def test_what_a_sweep_forgot_is_counted_for_the_memory_release() -> None:
    calls: list[tuple[float, float]] = []
    state = _State()
    times = iter([10.0, 20.0, 30.0, 40.0])

    async def run() -> None:
        three = asyncio.Event()

        def forget(now: float, idle: float) -> int:
            calls.append((now, idle))
            if len(calls) == 3:
                three.set()
            return 70 if len(calls) == 2 else 0

        task = asyncio.create_task(forget_when_idle(
            [forget, lambda _now, _idle: 5], 5.0, state,  # type: ignore[arg-type]
            clock=lambda: next(times), interval=0.001))
        await asyncio.wait_for(three.wait(), 5)
        task.cancel()

    asyncio.run(run())
    assert calls[:3] == [(10.0, 5.0), (20.0, 5.0), (30.0, 5.0)]
    assert state.forgotten >= 5 + 75 + 5


@pytest.mark.parametrize(("forgotten", "released"), [(FORGOTTEN, True), (FORGOTTEN - 1, False)])
def test_many_forgotten_entries_make_the_next_quiet_moment_a_release(forgotten: int, released: bool) -> None:
    """The release waits for the proxy to be quiet (two polls with nothing in flight), as after
    a burst: never at one instant of a load with nothing in flight."""
    schedule = TrimSchedule()
    assert schedule.tick(1, forgotten) is False  # a request in flight: not now
    assert schedule.tick(0) is False  # one quiet poll: not yet
    assert schedule.tick(0) is released
    assert schedule.tick(0) is False  # once


def test_zero_idle_seconds_forgets_nothing() -> None:
    called: list[int] = []

    def forget(_now: float, _idle: float) -> int:
        called.append(1)
        return 0

    asyncio.run(forget_when_idle([forget], 0, _State()))  # type: ignore[arg-type]
    assert called == []


def test_a_negative_idle_time_is_refused_with_the_key_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cache_idle_seconds"):
        proxy_config("http://127.0.0.1:1", str(tmp_path), limits={"cache_idle_seconds": -1})


# --- through the real server ---------------------------------------------------------------------

KEY = "sk-ant-idle-caches-test-0028"
PER_CONVERSATION = ("body_memo", "compaction_plans", "durable_states", "transcript_exports")
SESSIONS = 4
TURNS = 4


def _wait(check: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the idle conversations were not forgotten"
        time.sleep(0.1)


def _turns(proxy: ProxyServer, loop_thread: LoopThread, pause: Callable[[], None]) -> list[str]:
    """Four conversations, turn by turn, with ``pause()`` between the rounds; large turns, so
    that compaction plans them and the body memo keeps them (from the third turn: over 64 KiB);
    a durable fact in each session. The answers and reports."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    for i in range(SESSIONS):
        fact = Fact(f"fact-{i}", f"Session {i} fixes the parser.", f"transcript:other-{i}:1",
                    "2026-12-01T00:00:00Z")
        loop_thread.run(proxy.app[STORE].write_changes(DEFAULT_TENANT, f"idle-{i}", [Create(fact)]))
    histories: dict[int, list[dict[str, Any]]] = {}
    seen: list[str] = []
    for turn in range(TURNS):
        if turn:
            pause()
        for i in range(SESSIONS):
            history = histories.setdefault(i, [{"role": "user", "content": f"task {i}: " + "y" * 2000}])
            if turn:
                history.append({"role": "assistant", "content": f"Step {turn} of {i}."})
                history.append({"role": "user", "content": f"turn {turn} of {i}: " + "z" * 40_000})
            raw = client.messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=64, messages=history,  # type: ignore[arg-type]
                extra_headers={"x-session-id": f"idle-{i}"},
            )
            report = sorted((k, v) for k, v in raw.headers.items()
                            if k.startswith("x-compaction-") and k != "x-compaction-ms")
            seen.append(orjson.dumps([raw.parse().content[0].model_dump(), report]).decode())
    return seen


def test_idle_conversations_are_forgotten_and_come_back_with_the_same_bytes_upstream(
    make_proxy: Any, upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    def reply(recorded: RecordedRequest) -> Reply:
        return Reply(message_json("Summary: the parser was fixed." if b"other-" not in recorded.body else "Done."))

    upstream.script(*([reply] * 500))
    compaction = {"threshold": 6000, "hard_limit": 150_000, "keep_recent": 2}
    # a proxy that forgets nothing (the shipped ten minutes: longer than this test)
    keeping = make_proxy(compaction=compaction)
    start = len(upstream.requests)
    kept_answers = _turns(keeping, loop_thread, lambda: None)
    kept_bytes = [(r.path, r.body) for r in upstream.requests[start:]]
    kept = cache_figures(keeping.url)
    assert all(kept[name]["expired"] == 0 for name in PER_CONVERSATION)

    # one that forgets a conversation idle for a second: every pause empties its caches
    forgetting = make_proxy(compaction=compaction, limits={"cache_idle_seconds": 1})
    emptied: list[dict[str, dict[str, float]]] = []

    def pause() -> None:
        _wait(lambda: all(cache_figures(forgetting.url)[n]["entries"] == 0 for n in PER_CONVERSATION))
        emptied.append(cache_figures(forgetting.url))

    start = len(upstream.requests)
    answers = _turns(forgetting, loop_thread, pause)
    forgot_bytes = [(r.path, r.body) for r in upstream.requests[start:]]
    assert len(emptied) == TURNS - 1
    # the last pause forgot what the turns before it had kept
    assert all(emptied[-1][n]["expired"] > 0 for n in PER_CONVERSATION), emptied[-1]
    assert answers == kept_answers and forgot_bytes == kept_bytes
    assert any("summarize" in a or "prune" in a for a in answers)  # compaction did run
    last = cache_figures(forgetting.url)
    for name in PER_CONVERSATION:
        assert last[name]["expired"] > 0, (name, last[name])
        assert last[name]["evictions"] == 0, (name, last[name])  # no bound pushed them
    assert loop_thread.run(_inflight(forgetting)) == 0


async def _inflight(proxy: ProxyServer) -> int:
    return proxy.app[STATE].inflight
