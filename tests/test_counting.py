"""A request that cannot reach the threshold is forwarded at once and counted meanwhile.

The bound (``proxy.core.compaction.bound``) must never be under the exact estimate, for any
conversation; and through the proxy, such a request's report must be exactly the one the pure
core gives when it counts first, on the 200 path and on the 502 path."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx2 as httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config.compaction import policy_from_config
from proxy.config.settings import CompactionConfig
from proxy.core.compaction import CompactionInput, Done, PlanCache, compact
from proxy.core.compaction.bound import tokens_at_most
from proxy.core.compaction.digest import digests
from proxy.core.tokens import TokenCounter
from proxy.server.compaction.service import result_headers
from tests.upstream import FakeUpstream

KEY = "sk-ant-counting-test-000111"
COUNTER = TokenCounter()  # shared: the memo answers messages seen in an earlier example

text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300
) | st.sampled_from(["", " ", "\n\n", "def f():\n    return 1\n", "é" * 40, "😀" * 20, "a" * 500])
json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | text
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
text_block = st.builds(lambda t: {"type": "text", "text": t}, text)
tool_use = st.builds(
    lambda i, n, v: {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": {"v": v}},
    st.integers(0, 10**6), text, json_value,
)
tool_result = st.builds(
    lambda i, c: {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": c},
    st.integers(0, 10**6), text | st.lists(text_block, max_size=3),
)
other_block = st.builds(lambda v: {"type": "server_tool_use_result", "data": v}, json_value)
content = text | st.lists(text_block | tool_use | tool_result | other_block, min_size=1, max_size=4)
message = st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant"]), content)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(message, min_size=1, max_size=6),
    system=st.none() | text,
    seen=st.integers(0, 6),
)
def test_the_bound_is_never_under_the_exact_count(
    messages: list[dict[str, Any]], system: str | None, seen: int
) -> None:
    COUNTER.count_request(None, None, messages[:seen])  # some messages known to the memo
    dg = digests(messages, hashed=len(messages) >= 2)
    bound = tokens_at_most(system, None, messages, dg, COUNTER)
    exact = TokenCounter().count_request(system, None, messages).total
    if bound is None:  # only ever for a message whose JSON shows a media word: no bound, counted
        shown = b"".join(orjson.dumps(m) for m in messages)
        assert b'"image"' in shown or b'"document"' in shown
        return
    assert bound.tokens >= exact


def test_media_and_unkeyable_messages_have_no_bound() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    for block in (image, document):
        messages = [{"role": "user", "content": [block]}]
        assert tokens_at_most(None, None, messages, digests(messages, hashed=False), TokenCounter()) is None
    odd: list[Any] = [{"role": "user", "content": "a"}, "not a message"]
    assert tokens_at_most(None, None, odd, digests(odd), TokenCounter()) is None


def _expected_headers(body: dict[str, Any]) -> dict[str, str]:
    """The report the pure core gives when it counts first (no plan, calibration 1)."""
    policy = policy_from_config(CompactionConfig())
    request = CompactionInput(
        system=body.get("system"), tools=body.get("tools"), messages=body["messages"],
        model=body["model"],
    )
    outcome = compact(request, policy, TokenCounter(), PlanCache(8), "default")
    assert isinstance(outcome, Done)
    return result_headers(outcome.result)


def _body(n: int, size: int = 20) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages.append({"role": "user", "content": f"Question {i}: what does module_{i}.py do? " * size})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"It does thing {i}. " * 30}]})
    messages.append({"role": "user", "content": "And now? é😀"})
    return {"model": "claude-fake-1", "max_tokens": 64, "system": "Be brief.", "messages": messages}


def test_an_under_threshold_request_reports_exactly_what_counting_first_gives(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    proxy = make_proxy()
    for n in (1, 3, 12):  # each turn adds new messages the counter has not seen
        body = _body(n, size=120)
        raw = orjson.dumps(body).replace(b'":', b'": ')  # a client's own spacing
        r = httpx.post(proxy.url + "/v1/messages", content=raw, headers={"x-api-key": KEY})
        assert r.status_code == 200
        assert upstream.requests[-1].body == raw  # forwarded as sent
        got = {k: v for k, v in r.headers.items() if k.startswith("x-compaction-")}
        assert got == _expected_headers(body)


def test_a_502_while_counting_still_carries_the_report(make_proxy: Any) -> None:
    proxy = make_proxy(upstream_url="http://127.0.0.1:9")
    body = _body(2, size=120)
    r = httpx.post(proxy.url + "/v1/messages", content=orjson.dumps(body), headers={"x-api-key": KEY})
    assert r.status_code == 502
    got = {k: v for k, v in r.headers.items() if k.startswith("x-compaction-")}
    assert got == _expected_headers(body)


async def test_which_requests_are_counted_while_forwarded() -> None:
    """Under the threshold for sure: counted while forwarded. With media (no bound), over the
    threshold's reach, or opted out: as ever (compacted or reported before forwarding)."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from proxy.server.compaction.service import CompactionService
    from proxy.server.http.metrics import new_metrics

    service = CompactionService(CompactionConfig(), "http://127.0.0.1:9", new_metrics())
    headers = CIMultiDictProxy(CIMultiDict({"x-api-key": KEY}))
    try:
        tiny = _body(1, size=1)  # few new bytes: counted on the spot
        prepared = await service.prepare(headers, tiny, orjson.dumps(tiny), "default")
        assert prepared.counting is None and prepared.headers == _expected_headers(tiny)

        small = _body(3, size=80)
        prepared = await service.prepare(headers, small, orjson.dumps(small), "default")
        assert prepared.counting is not None and prepared.headers == {}
        settled = await service.settle(prepared)
        assert settled.counting is None and settled.result is not None
        assert settled.headers == _expected_headers(small)
        assert prepared.headers is settled.headers  # filled in place: the ledger row reads it

        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
        with_media = {**small, "messages": [*small["messages"][:-1], {"role": "user", "content": [image]}]}
        prepared = await service.prepare(headers, with_media, orjson.dumps(with_media), "default")
        assert prepared.counting is None and prepared.headers["x-compaction-plan"] == "none"

        big = {**small, "messages": [{"role": "user", "content": "word " * 90_000}]}  # > 80k bytes
        prepared = await service.prepare(headers, big, orjson.dumps(big), "default")
        assert prepared.counting is None
    finally:
        await service.close()


async def test_a_large_body_never_seen_is_hashed_in_the_thread_not_on_the_loop() -> None:
    """Over ``offload_bytes`` and new to the counter: the whole request is compacted (and so
    hashed and counted) in a worker thread as ever, not bounded on the event loop first."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from proxy.server.compaction.service import CompactionService
    from proxy.server.http.metrics import new_metrics

    config = CompactionConfig(offload_bytes=8192)
    service = CompactionService(config, "http://127.0.0.1:9", new_metrics())
    headers = CIMultiDictProxy(CIMultiDict({"x-api-key": KEY}))
    try:
        body = _body(4, size=80)  # ~16 KB, far under the threshold
        prepared = await service.prepare(headers, body, orjson.dumps(body), "default")
        assert prepared.counting is None
        assert prepared.headers == _expected_headers(body)
        # the next turn: only its last two messages are new (~4 KB): bounded on the loop
        more = [{"role": "assistant", "content": "ok " * 700}, {"role": "user", "content": "and? " * 400}]
        body = {**body, "messages": [*body["messages"], *more]}
        prepared = await service.prepare(headers, body, orjson.dumps(body), "default")
        assert prepared.counting is not None
        assert (await service.settle(prepared)).headers == _expected_headers(body)
    finally:
        await service.close()


class _Where(TokenCounter):
    """Remembers on which thread each request was counted."""

    __slots__ = ("threads",)

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def count_request(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().count_request(*args, **kwargs)


async def test_a_usual_turn_is_counted_on_the_loop_once_forwarded_a_large_one_in_a_thread() -> None:
    """Up to ``LOOP_BYTES`` new: not counted before ``prepare`` returns (the request goes first),
    then on the event loop's own thread, a turn or two of the loop later; more than that: in a
    worker thread. Either way the report is what counting first gives."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from proxy.server.compaction.counting import DEFER_BYTES, LOOP_BYTES
    from proxy.server.compaction.service import CompactionService
    from proxy.server.http.metrics import new_metrics

    service = CompactionService(CompactionConfig(), "http://127.0.0.1:9", new_metrics())
    where = service.counter = _Where()
    headers = CIMultiDictProxy(CIMultiDict({"x-api-key": KEY}))
    loop_thread = threading.get_ident()
    try:
        usual = _body(1, size=40)
        assert DEFER_BYTES < len(orjson.dumps(usual["messages"])) <= LOOP_BYTES
        prepared = await service.prepare(headers, usual, orjson.dumps(usual), "default")
        assert prepared.counting is not None and not prepared.counting.task.done()
        assert where.threads == []  # nothing counted before the request could go
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert prepared.counting.task.done() and where.threads == [loop_thread]
        assert (await service.settle(prepared)).headers == _expected_headers(usual)

        large = _body(4, size=80)
        assert len(orjson.dumps(large["messages"])) > LOOP_BYTES
        prepared = await service.prepare(headers, large, orjson.dumps(large), "default")
        assert prepared.counting is not None
        assert (await service.settle(prepared)).headers == _expected_headers(large)
        assert where.threads[-1] != loop_thread  # a worker thread
    finally:
        await service.close()


async def test_a_request_s_messages_are_dumped_and_hashed_once(monkeypatch: Any) -> None:
    """The digests made for the count hold the conversation's anchor, and ``compact`` takes
    them: each message is serialised once per request, and the anchor is not hashed apart,
    whether the request is counted on the spot, counted while forwarded, or compacted."""
    from multidict import CIMultiDict, CIMultiDictProxy

    import proxy.core.compaction.digest as digest_module
    import proxy.server.compaction.plan_reads as plan_reads
    from proxy.server.compaction.service import CompactionService
    from proxy.server.http.metrics import new_metrics

    dumped: list[int] = []
    anchors: list[int] = []
    canonical_all, prefix_hashes = digest_module.canonical_all, plan_reads.prefix_hashes

    def counting_dumps(messages: Any) -> Any:
        dumped.append(len(messages))
        return canonical_all(messages)

    def counting_anchors(messages: Any) -> Any:
        anchors.append(len(messages))
        return prefix_hashes(messages)

    monkeypatch.setattr(digest_module, "canonical_all", counting_dumps)
    monkeypatch.setattr(plan_reads, "prefix_hashes", counting_anchors)
    service = CompactionService(CompactionConfig(), "http://127.0.0.1:9", new_metrics())
    headers = CIMultiDictProxy(CIMultiDict({"x-api-key": KEY}))
    tiny, small = _body(1, size=1), _body(3, size=80)
    over = _body(30, size=400)  # over the default threshold
    more = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
    over_next = {**over, "messages": [*over["messages"], *more]}
    try:
        # a large body never seen before is hashed in a thread (its anchor on the loop): the
        # conversation's next turn is compacted on the loop, from the plan made then
        await service.prepare(headers, over, orjson.dumps(over), "default")
        for body, forwarded_first in ((tiny, False), (small, True), (over_next, False)):
            dumped.clear()
            anchors.clear()
            prepared = await service.prepare(headers, body, orjson.dumps(body), "default")
            assert (prepared.counting is not None) is forwarded_first
            settled = await service.settle(prepared)
            assert settled.result is not None
            assert sum(dumped) == len(body["messages"])
            assert anchors == []
        assert settled.result.changed and settled.result.plan_status == "reused"
    finally:
        await service.close()
