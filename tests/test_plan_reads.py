"""Plans read through to the store: a conversation whose store had no plan is not read again on
every request (for ``ABSENT_SECONDS``), and a plan another replica made is still adopted before
this one compacts anew."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.compaction import Plan, PlanCache, prefix_hashes
from proxy.core.compaction.digest import Resent, digests
from proxy.core.compaction.view import FromClient
from proxy.server.appkeys import COMPACTION, STORE
from proxy.server.compaction.plan_reads import AbsentPlans, PlanReads, anchor_of
from proxy.store import StoreUnavailable, open_store
from proxy.tenancy.tenants import DEFAULT_TENANT
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-plan-reads-test-000222"
SUMMARY_MODEL = "claude-summary-test"
SMALL = {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- AbsentPlans ------------------------------------------------------------------------------


def test_an_absence_is_trusted_for_its_ttl_then_expires() -> None:
    clock = Clock()
    absent = AbsentPlans(ttl=30, clock=clock)
    assert not absent.fresh("t", "a")
    absent.note("t", "a")
    assert absent.fresh("t", "a")
    assert not absent.fresh("t", "b") and not absent.fresh("u", "a")
    clock.now += 29.9
    assert absent.fresh("t", "a")
    clock.now += 0.1
    assert not absent.fresh("t", "a")
    assert len(absent) == 0  # an expired entry goes
    absent.note("t", "a")  # noted again: trusted again from now
    assert absent.fresh("t", "a")


def test_an_absence_is_forgotten_and_the_map_is_bounded() -> None:
    absent = AbsentPlans(max_entries=2, clock=Clock())
    absent.note("t", "a")
    absent.forget("t", "a")
    assert not absent.fresh("t", "a")
    absent.forget("t", "never")  # nothing to forget: no error
    for anchor in ("a", "b", "c"):
        absent.note("t", anchor)
    assert len(absent) == 2
    assert not absent.fresh("t", "a")  # the least recently noted went first
    assert absent.fresh("t", "b") and absent.fresh("t", "c")


def test_expired_absences_leave_as_new_ones_are_noted() -> None:
    """Absences of conversations that never came back are not kept until the bound pushes them
    out: the map holds about the conversations seen in the last ``ttl`` seconds."""
    clock = Clock()
    absent = AbsentPlans(ttl=30, max_entries=1000, clock=clock)
    for anchor in ("a", "b", "c"):
        absent.note("t", anchor)
    clock.now += 20
    absent.note("t", "d")
    clock.now += 10  # a, b and c are 30 s old: expired; d is 10 s old
    absent.note("t", "e")
    assert len(absent) == 2 and absent.fresh("t", "d") and absent.fresh("t", "e")
    assert absent.cache.evictions == 0  # expiry is not the bound's doing


@pytest.mark.parametrize("ttl, size", [(-1, 10), (1, 0)])
def test_absent_plans_refuses_bad_bounds(ttl: float, size: int) -> None:
    with pytest.raises(ValueError):
        AbsentPlans(ttl=ttl, max_entries=size)


# --- anchor_of --------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    {"role": "user", "content": "again"},
]


def test_the_anchor_is_the_hash_of_the_first_message() -> None:
    assert anchor_of(CONVERSATION) == prefix_hashes(CONVERSATION[:1])[1]
    assert anchor_of(CONVERSATION[:1]) is None  # one message: nothing to plan
    assert anchor_of({"role": "user"}) is None
    assert anchor_of([{"role": "user", "content": {1, 2}}, CONVERSATION[1]]) is None  # not JSON


def test_a_resent_history_takes_the_anchor_from_its_digests() -> None:
    earlier = digests(CONVERSATION)
    marked = earlier.hashes[1]
    # The digests are what ``anchor_of`` reads when the first message is the same object: a
    # (deliberately wrong) hash there shows it was not computed again.
    forged = type(earlier)(
        earlier.messages, earlier.own, earlier.keys, earlier.marked, earlier.compaction,
        (earlier.hashes[0], "f" * 16, *earlier.hashes[2:]),
    )
    resent = Resent([*CONVERSATION, {"role": "assistant", "content": "x"}], forged)
    assert anchor_of(resent) == "f" * 16
    # An equal first message that is another object: hashed afresh.
    copied = Resent([dict(CONVERSATION[0]), *CONVERSATION[1:]], forged)
    assert anchor_of(copied) == marked
    assert anchor_of(Resent(CONVERSATION, None)) == marked


# --- PlanReads on a real store ----------------------------------------------------------------


def _plan(scope: str, anchor: str, length: int) -> Plan:
    return Plan(
        tenant=scope,
        anchor=anchor,
        prefix_len=length,
        prefix_hash=f"h{length}",
        items=tuple(FromClient(i) for i in range(length)),
        layers=("prune",),
        manifest=(),
        bridge=None,
        summary_status="skipped",
    )


class CountingStore:
    """A real store whose plan reads are counted (and may be made to fail)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.health = store.health  # where a failure is reported (one line per interval)
        self.reads = 0
        self.failing = False

    async def plans_for(self, tenant: str, anchor: str) -> tuple[str, ...]:
        self.reads += 1
        if self.failing:
            raise StoreUnavailable("the store is down")
        result: tuple[str, ...] = await self.store.plans_for(tenant, anchor)
        return result

    async def put_plan(self, *args: Any) -> str:
        result: str = await self.store.put_plan(*args)
        return result


def test_a_store_without_plans_is_read_once_per_ttl(tmp_path: Path) -> None:
    async def run() -> None:
        store = await open_store(f"sqlite:///{tmp_path / 'plans.db'}")
        try:
            counting = CountingStore(store)
            clock = Clock()
            reads = PlanReads(PlanCache(), AbsentPlans(ttl=30, clock=clock))
            s: Any = counting
            for _ in range(5):
                assert not await reads.prefetch(s, "t", "a")
            assert counting.reads == 1
            # another replica stores a plan meanwhile: not seen until the absence expires ...
            other = _plan("t", "a", 3)
            await store.put_plan("t", "a", other.prefix_hash, 3, other.to_json().decode())
            assert not await reads.prefetch(s, "t", "a")
            assert counting.reads == 1
            # ... except by a read before compacting anew, which always reads
            assert await reads.prefetch(s, "t", "a", refresh=True)
            assert counting.reads == 2
            assert reads.plans.plans("t", "a") == (other,)
            assert len(reads.absent) == 0
            # a plan in the cache: no read (as before)
            assert not await reads.prefetch(s, "t", "a")
            assert counting.reads == 2
            # another conversation, after the ttl: read again, and the plan is found
            assert not await reads.prefetch(s, "t", "b")
            mine = _plan("t", "b", 4)
            await store.put_plan("t", "b", mine.prefix_hash, 4, mine.to_json().decode())
            assert not await reads.prefetch(s, "t", "b")
            clock.now += 30
            assert await reads.prefetch(s, "t", "b")
            assert counting.reads == 4
            assert reads.plans.plans("t", "b") == (mine,)
        finally:
            await store.close()

    asyncio.run(run())


def test_a_failing_store_is_read_again_on_the_next_request(tmp_path: Path) -> None:
    async def run() -> None:
        store = await open_store(f"sqlite:///{tmp_path / 'plans.db'}")
        try:
            counting = CountingStore(store)
            counting.failing = True
            reads = PlanReads(PlanCache(), AbsentPlans(clock=Clock()))
            s: Any = counting
            assert not await reads.prefetch(s, "t", "a")
            assert not await reads.prefetch(s, "t", "a")
            assert counting.reads == 2  # a failure says nothing about the store's plans
            assert len(reads.absent) == 0
            counting.failing = False
            assert not await reads.prefetch(s, "t", "a")
            assert not await reads.prefetch(s, "t", "a")
            assert counting.reads == 3
        finally:
            await store.close()

    asyncio.run(run())


def test_storing_a_plan_forgets_the_absence(tmp_path: Path) -> None:
    async def run() -> None:
        store = await open_store(f"sqlite:///{tmp_path / 'plans.db'}")
        try:
            counting = CountingStore(store)
            reads = PlanReads(PlanCache(max_plans=1), AbsentPlans(clock=Clock()))
            s: Any = counting
            assert not await reads.prefetch(s, "t", "a")
            plan = _plan("t", "a", 2)
            reads.plans.put(plan)
            await reads.persist(s, plan)
            assert not reads.absent.fresh("t", "a")
            # the cache drops it (another conversation's plan): the store is read, and has it
            reads.plans.put(_plan("t", "z", 2))
            assert reads.plans.plans("t", "a") == ()
            assert await reads.prefetch(s, "t", "a")
            assert reads.plans.plans("t", "a") == (plan,)
        finally:
            await store.close()

    asyncio.run(run())


def test_nothing_is_read_without_a_store_or_an_anchor() -> None:
    reads = PlanReads(PlanCache())

    async def run() -> None:
        assert not await reads.prefetch(None, "t", "a")
        assert not await reads.prefetch(None, "t", None, refresh=True)
        await reads.persist(None, _plan("t", "a", 2))

    asyncio.run(run())
    assert len(reads.absent) == 0


# --- through the proxy ------------------------------------------------------------------------


def _client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL]


def _summaries(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") == SUMMARY_MODEL]


def _count_reads(proxy: ProxyServer, monkeypatch: pytest.MonkeyPatch, failing: bool = False) -> list[str]:
    store = proxy.app[STORE]
    real = store.plans_for
    calls: list[str] = []

    async def plans_for(tenant: str, anchor: str, *args: Any) -> tuple[str, ...]:
        calls.append(anchor)
        if failing:
            raise StoreUnavailable("the store is down")
        result: tuple[str, ...] = await real(tenant, anchor, *args)
        return result

    monkeypatch.setattr(store, "plans_for", plans_for)
    return calls


def _small_turns(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "plan the release"}]
    for i in range(n):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"step {i} done"}]})
        messages.append({"role": "user", "content": f"and then step {i + 1}?"})
    return messages


def test_an_in_order_conversation_under_the_threshold_reads_the_store_once(
    upstream: FakeUpstream, make_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = make_proxy()
    clock = Clock()
    proxy.app[COMPACTION].plan_reads.absent.clock = clock
    calls = _count_reads(proxy, monkeypatch)
    upstream.script(*[Reply(message_json("ok"))] * 20)
    messages = _small_turns(8)
    sent: list[bytes] = []
    for k in range(3, len(messages) + 1, 2):
        r = _client(proxy).messages.with_raw_response.create(model="claude-fake-1", max_tokens=10, messages=messages[:k])
        assert r.headers["x-compaction-plan"] == "none"
        assert r.headers["x-compaction-layers"] == "none"
        sent.append(_main(upstream)[-1].body)
    anchor = prefix_hashes(messages[:1])[1]
    assert calls == [anchor]  # one read for 8 requests
    # forwarded as sent (the bodies the SDK wrote)
    assert [orjson.loads(b)["messages"] for b in sent] == [messages[:k] for k in range(3, len(messages) + 1, 2)]
    clock.now += 30  # the absence expires: the next request reads again
    r = _client(proxy).messages.with_raw_response.create(model="claude-fake-1", max_tokens=10, messages=messages)
    assert r.headers["x-compaction-plan"] == "none"
    assert calls == [anchor, anchor]


def test_a_failing_store_is_tried_on_every_request_and_costs_only_the_reuse(
    upstream: FakeUpstream, make_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = make_proxy()
    calls = _count_reads(proxy, monkeypatch, failing=True)
    upstream.script(*[Reply(message_json("ok"))] * 5)
    messages = _small_turns(3)
    for k in (3, 5, 7):
        r = _client(proxy).messages.with_raw_response.create(model="claude-fake-1", max_tokens=10, messages=messages[:k])
        assert r.status_code == 200 and r.headers["x-compaction-plan"] == "none"
    assert len(calls) == 3


def _turns(transcript: dict[str, Any], at_least: int) -> tuple[int, int]:
    messages = transcript["messages"]
    ends = [k for k in range(at_least, len(messages) + 1) if messages[k - 1]["role"] == "user"]
    return ends[0], ends[1]


def test_a_replica_that_found_no_plan_still_adopts_the_one_another_replica_made(
    upstream: FakeUpstream,
    make_proxy: Any,
    transcript: dict[str, Any],
    tmp_path: Path,
    loop_thread: LoopThread,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B saw the conversation while it was small (the store had no plan: remembered). A then
    compacts it and stores the plan. B's next turn is over the threshold: B reads the store
    before compacting anew, and forwards A's view (no second summary call)."""
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    a = make_proxy(compaction=SMALL, store=shared)
    b = make_proxy(compaction=SMALL, store=shared)
    upstream.script(
        lambda req: Reply(message_json("SUMMARY: goal was X" if req.json()["model"] == SUMMARY_MODEL else "ok"))
    )
    calls = _count_reads(b, monkeypatch)
    messages = transcript["messages"]
    k0 = next(k for k in range(3, len(messages)) if messages[k - 1]["role"] == "user")
    k1, k2 = _turns(transcript, 90)
    anchor = prefix_hashes(messages[:1])[1]

    def create(proxy: ProxyServer, k: int) -> Any:
        return _client(proxy).messages.with_raw_response.create(
            model="claude-fake-1", max_tokens=100, messages=messages[:k], tools=transcript["tools"]
        )

    early = create(b, k0)
    assert early.headers["x-compaction-plan"] == "none"
    assert b.app[COMPACTION].plan_reads.absent.fresh(DEFAULT_TENANT, anchor)
    first = create(a, k1)
    assert first.headers["x-compaction-plan"] == "new"
    assert len(_summaries(upstream)) == 1
    assert len(loop_thread.run(a.app[STORE].plans_for(DEFAULT_TENANT, anchor))) == 1

    second = create(b, k2)
    assert second.headers["x-compaction-plan"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(_summaries(upstream)) == 1  # B made no summary call of its own
    assert not b.app[COMPACTION].plan_reads.absent.fresh(DEFAULT_TENANT, anchor)
    assert calls == [anchor, anchor]  # the first look, then the read before compacting anew
    view_a = orjson.loads(_main(upstream)[-2].body)["messages"]
    view_b = orjson.loads(_main(upstream)[-1].body)["messages"]
    assert view_b[: len(view_a) - 1] == view_a[:-1]
