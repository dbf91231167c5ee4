"""The request path as a chain of stages: a real request, followed through the chain.

Each stage's hooks are watched (the app's own stages, their hooks wrapped to note the call, then
called as they were) and real requests go through the proxy with the official SDK: every stage
is visited once, in the list's order on the way in and in reverse on the way out; the stages
that take no part in ``count_tokens`` are not visited there; a request refused, failed by the
provider or left by its client ends exactly the stages it joined, and says how it ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from proxy.core.compaction.retrieval import TOOL_NAME
from proxy.core.compaction.truncate import artifact_pointer
from proxy.server.appkeys import FORWARDER, STORE
from proxy.server.exchange.chain import CHAIN, Chain
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import defines
from proxy.server.ledger import LEDGER
from proxy.store.usage import UsageQuery
from tests.harness import LoopThread, ProxyServer
from tests.test_retrieval import BIG, CUT, MESSAGES, TOOLS  # the view the retrieval tests cut
from tests.upstream import FakeUpstream, Reply, Stream, message_json, message_stream_events

KEY = "sk-ant-chain-test-1"
SESSION = "chain-1"

# THE list, as chain.py writes it; the hooks each stage defines
ORDER = (
    "identify", "validate", "admit", "book", "durable", "record", "compact", "thinking",
    "retrieve", "calibrate", "remember", "trace",
)  # fmt: skip
REQUEST_HOOKS = ("identify", "validate", "admit", "book", "durable", "record", "compact", "thinking", "retrieve", "trace")
RESPONSE_HOOKS = ("compact",)
END_HOOKS = ("book", "record", "thinking", "calibrate", "remember", "trace")

Event = tuple[str, str, str | None]  # stage, hook, how the exchange ended (end hooks)


def _watch(proxy: ProxyServer) -> list[Event]:
    """The app's chain rebuilt from its own stages, each hook it defines noted when called."""
    events: list[Event] = []
    app = proxy.app
    stages = app[CHAIN].stages
    assert tuple(s.name for s in stages) == ORDER

    def watched(name: str, hook: str, original: Callable[[Exchange], Any]) -> Callable[[Exchange], Any]:
        if hook == "end":
            def end(ex: Exchange) -> None:
                events.append((name, hook, ex.ended))
                original(ex)
            return end

        async def step(ex: Exchange) -> None:
            events.append((name, hook, None))
            await original(ex)
        return step

    for stage in stages:
        for hook in ("request", "response", "end"):
            if defines(stage, hook):  # the instance's hook (what the chain binds) wraps the class's
                setattr(stage, hook, watched(stage.name, hook, getattr(stage, hook)))

    # the chain binds its stages' hooks when it is made: made again, in place, it binds these
    chain = app[CHAIN]
    Chain.__init__(chain, stages, app[FORWARDER])
    return events


def _client(proxy: ProxyServer, session: str | None = SESSION) -> anthropic.Anthropic:
    headers = {"x-session-id": session} if session else {}
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers=headers)


def _expected(route_stages: tuple[str, ...], ended: str) -> list[Event]:
    requests = [(s, "request", None) for s in route_stages if s in REQUEST_HOOKS]
    responses = [(s, "response", None) for s in reversed(route_stages) if s in RESPONSE_HOOKS]
    ends = [(s, "end", ended) for s in reversed(route_stages) if s in END_HOOKS]
    return [*requests, *responses, *ends]


def _wait_for(events: list[Event], count: int) -> None:
    deadline = time.monotonic() + 10
    while len(events) < count and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_one_request_visits_each_stage_once_in_order(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, stream: bool
) -> None:
    proxy = make_proxy(compaction=CUT)
    events = _watch(proxy)
    call = {"type": "tool_use", "id": "toolu_r1", "name": TOOL_NAME, "input": {"pointer": artifact_pointer(SESSION, BIG)}}
    first = message_json(content=[{"type": "text", "text": "Reading."}, call], stop_reason="tool_use")
    second = message_json("Line 399 failed.")
    upstream.script(*[Stream(message_stream_events(m)) if stream else Reply(m) for m in (first, second)])
    params: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS}
    if stream:
        with _client(proxy).messages.stream(**params) as s:
            final = s.get_final_message()
            headers = s.response.headers
    else:
        raw = _client(proxy).messages.with_raw_response.create(**params)
        final, headers = raw.parse(), raw.headers
    _wait_for(events, len(_expected(ORDER, "answered")))

    assert events == _expected(ORDER, "answered")
    # and each stage did its part on this very request
    assert [b.text for b in final.content if b.type == "text"] == ["Reading.", "Line 399 failed."]
    assert len(upstream.requests) == 2  # Retrieve: one hidden round, one answer
    assert "truncate" in headers["x-compaction-layers"]  # Compact
    assert headers["x-compaction-session"] == SESSION  # InjectDurable
    loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    rows = loop_thread.run(proxy.app[STORE].usage_rows("default", UsageQuery(session=SESSION)))
    assert sorted(r.entry.kind for r in rows) == ["client", "retrieval"]  # Book


def test_count_tokens_visits_the_stages_that_take_part_in_it(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(compaction=CUT)
    events = _watch(proxy)
    counted = _client(proxy).messages.count_tokens(model="m", messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    route = tuple(s for s in ORDER if s not in ("admit", "record", "retrieve"))
    _wait_for(events, len(_expected(route, "answered")))
    assert events == _expected(route, "answered")


def test_a_request_refused_by_a_stage_goes_no_further(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy()
    events = _watch(proxy)
    broken = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {}}]}, {"role": "user", "content": "no result"}]
    with pytest.raises(anthropic.BadRequestError):
        _client(proxy).messages.create(model="m", max_tokens=5, messages=broken)  # type: ignore[arg-type]
    # Validate raised: it never joined, nor did anything after it; Identify has no end hook
    assert events == [("identify", "request", None), ("validate", "request", None)]
    assert upstream.requests == []


def test_an_upstream_that_cannot_be_reached_ends_every_stage_as_upstream_failed(
    make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(upstream_url="http://127.0.0.1:9", compaction=CUT)  # nothing listens there
    events = _watch(proxy)
    with pytest.raises(anthropic.APIStatusError) as caught:
        _client(proxy).messages.create(model="m", max_tokens=5, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    assert caught.value.status_code == 502
    assert "truncate" in caught.value.response.headers["x-compaction-layers"]  # the stages' report
    _wait_for(events, len(_expected(ORDER, "upstream_failed")))
    assert events == _expected(ORDER, "upstream_failed")
    loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    rows = loop_thread.run(proxy.app[STORE].usage_rows("default", UsageQuery(session=SESSION)))
    assert [(r.entry.kind, r.entry.status) for r in rows] == [("client", 502)]


def test_a_client_gone_before_the_answer_ends_every_stage_it_joined(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy()
    events = _watch(proxy)
    upstream.script(Reply(message_json("too late"), delay=3.0))
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{proxy.url}/v1/messages",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": KEY, "x-session-id": SESSION, "anthropic-version": "2023-06-01"},
            timeout=0.5,
        )
    requests = [(s, "request", None) for s in ORDER if s in REQUEST_HOOKS]
    ends = [(s, "end", "client_gone") for s in reversed(ORDER) if s in END_HOOKS]
    _wait_for(events, len(requests) + len(ends))
    # no response hook: the provider never answered
    assert events == [*requests, *ends]
