"""OpenTelemetry traces end to end: the official SDK -> the proxy (tracing on) -> the fake
upstream, the spans exported over OTLP/HTTP to a real receiver (``tests/otlp_receiver.py``) that
decodes the protobuf with the collector's own message types.

GenAI attribute names and span names as published in the OpenTelemetry semantic conventions:
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans (span name
``{gen_ai.operation.name} {gen_ai.request.model}``, kind CLIENT) and
https://opentelemetry.io/docs/specs/semconv/gen-ai/anthropic (``gen_ai.provider.name`` =
``anthropic``; ``gen_ai.usage.input_tokens`` includes ``gen_ai.usage.cache_read.input_tokens``
and ``gen_ai.usage.cache_creation.input_tokens``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from proxy.server.http.tracing import TRACING
from tests.harness import LoopThread, ProxyServer
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.test_retrieval import CUT, MESSAGES, POINTER, SESSION, TOOLS, _call, _round, _text
from tests.upstream import FakeUpstream, Reply, Stream, message_json, message_stream_events

KEY = "sk-ant-tracing-test-000777"
MARKER = "PROMPT-MARKER-7f3a9c"  # prompt text that must never leave unless asked for
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def receiver(loop_thread: LoopThread) -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    loop_thread.run(found.start())
    yield found
    loop_thread.run(found.stop())


def _traced(
    make_proxy: Any, endpoint: str, compaction: dict[str, Any] | None = None, **tracing: Any
) -> ProxyServer:
    config: dict[str, Any] = {"enabled": True, "endpoint": endpoint, "flush_seconds": 0.05, **tracing}
    sections: dict[str, Any] = {"compaction": compaction} if compaction else {}
    return make_proxy(tracing=config, **sections)  # type: ignore[no-any-return]


def _wait(condition: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _server_span(receiver: OtlpReceiver, n: int = 1) -> list[ReceivedSpan]:
    return _wait(  # type: ignore[no-any-return]
        lambda: len(receiver.named("POST /v1/messages")) >= n and receiver.named("POST /v1/messages"),
        "the server span",
    )


def _client(proxy: ProxyServer, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.url, api_key=KEY, max_retries=0, default_headers=headers
    )


def _metric(proxy: ProxyServer, outcome: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics").text
    line = f'context_proxy_trace_spans_total{{outcome="{outcome}"}} '
    for row in text.splitlines():
        if row.startswith(line):
            return float(row[len(line):])
    return 0.0


# -- the span tree ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_a_compacting_retrieving_streaming_request_is_one_span_tree(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, stream: bool
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint, compaction=CUT)
    first = _round([_text("Let me read the whole log."), _call()], "tool_use", 100, 20)
    first["usage"]["cache_read_input_tokens"] = 900
    first["usage"]["cache_creation_input_tokens"] = 40
    second = _round([_text("The failure is on line 399.")], "end_turn", 7000, 15)
    client = _client(proxy, **{"x-session-id": SESSION, "x-agent-id": "agent-7"})
    if stream:
        upstream.script(Stream(message_stream_events(first)), Stream(message_stream_events(second)))
        with client.messages.stream(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS) as s:  # type: ignore[arg-type]
            final = s.get_final_message()
            headers = dict(s.response.headers)
    else:
        upstream.script(Reply(first), Reply(second))
        raw = client.messages.with_raw_response.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
        final, headers = raw.parse(), dict(raw.headers)
    assert [b.text for b in final.content] == ["Let me read the whole log.", "The failure is on line 399."]  # type: ignore[union-attr]
    assert "truncate" in headers["x-compaction-layers"]

    (server,) = _server_span(receiver)
    spans = _wait(lambda: [s for s in receiver.spans if s.trace_id == server.trace_id and len(receiver.spans) >= 10] or None, "every span")
    assert server.kind == "server" and server.parent_id == ""
    assert server.attributes["http.route"] == "/v1/messages"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["context_proxy.tenant"] == "default"
    assert server.attributes["context_proxy.session"] == SESSION
    assert server.attributes["context_proxy.agent"] == "agent-7"
    assert server.resource["service.name"] == "context-proxy"
    assert all(s.trace_id == server.trace_id for s in spans)

    top = [s.name for s in receiver.children(server)]
    assert top[0] == "context_proxy.validate"
    for name in ("context_proxy.store.read", "context_proxy.compaction", "chat m", "context_proxy.retrieval.round"):
        assert name in top, (name, top)
    assert top.index("context_proxy.compaction") < top.index("chat m") < top.index("context_proxy.retrieval.round")

    compaction = receiver.one("context_proxy.compaction")
    assert compaction.parent_id == server.span_id
    assert "truncate" in compaction.attributes["context_proxy.compaction.layers"]
    assert compaction.attributes["context_proxy.compaction.plan"] == "new"
    before = compaction.attributes["context_proxy.compaction.tokens_before"]
    assert before == int(headers["x-compaction-tokens-before"])
    assert compaction.attributes["context_proxy.compaction.tokens_after"] < before
    # the cut tool result stored as an artifact, before forwarding: a store write of the request
    write = [s for s in receiver.named("context_proxy.store.write") if s.attributes["context_proxy.store.kind"] == "artifacts"]
    assert len(write) == 1 and write[0].parent_id == server.span_id

    calls = receiver.named("chat m")
    assert len(calls) == 2
    client_call = next(s for s in calls if s.attributes["context_proxy.call"] == "client")
    hidden = next(s for s in calls if s.attributes["context_proxy.call"] == "retrieval")
    assert client_call.kind == hidden.kind == "client"
    assert client_call.parent_id == server.span_id
    assert client_call.attributes["gen_ai.operation.name"] == "chat"
    assert client_call.attributes["gen_ai.provider.name"] == "anthropic"
    assert client_call.attributes["gen_ai.request.model"] == "m"
    assert client_call.attributes["gen_ai.request.max_tokens"] == 100
    assert client_call.attributes["gen_ai.response.model"] == first["model"]
    assert client_call.attributes["gen_ai.response.id"] == first["id"]
    assert client_call.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert client_call.attributes["gen_ai.usage.input_tokens"] == 100 + 900 + 40
    assert client_call.attributes["gen_ai.usage.cache_read.input_tokens"] == 900
    assert client_call.attributes["gen_ai.usage.cache_creation.input_tokens"] == 40
    assert client_call.attributes["gen_ai.usage.output_tokens"] == 20
    assert client_call.attributes["context_proxy.session"] == SESSION  # identity on every span
    assert client_call.attributes["context_proxy.tenant"] == "default"
    # the conventions' own: the conversation (the session) and the server the call went to
    # (server.port is required whenever server.address is given)
    port = int(upstream.url.rsplit(":", 1)[1])
    for call in (client_call, hidden):
        assert call.attributes["gen_ai.conversation.id"] == SESSION
        assert call.attributes["server.address"] == "127.0.0.1"
        assert call.attributes["server.port"] == port

    rounds = receiver.named("context_proxy.retrieval.round")
    assert len(rounds) == 1 and rounds[0].parent_id == server.span_id
    assert rounds[0].attributes["context_proxy.retrieval.round"] == 1
    assert client_call.end_ns <= rounds[0].start_ns + 1_000_000  # the first call ends as the round begins
    inside = [s.name for s in receiver.children(rounds[0])]
    assert inside == ["context_proxy.source.fetch", "chat m"]
    fetch = receiver.one("context_proxy.source.fetch")
    assert fetch.attributes == {
        "context_proxy.source.kind": "artifact",
        "context_proxy.source.status": "available",
        "context_proxy.tenant": "default",
        "context_proxy.session": SESSION,
        "context_proxy.agent": "agent-7",
    }
    assert hidden.parent_id == rounds[0].span_id
    assert hidden.attributes["gen_ai.usage.input_tokens"] == 7000
    assert hidden.attributes["gen_ai.usage.output_tokens"] == 15
    assert hidden.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert server.start_ns <= client_call.start_ns and hidden.end_ns <= server.end_ns
    # nothing of the key, the prompt or the answer anywhere in what was exported
    exported = b"".join(receiver.bodies)
    assert KEY.encode() not in exported
    assert b"read the log" not in exported and b"line 399" not in exported and POINTER.encode() not in exported
    assert _metric(proxy, "exported") >= len(spans)


def test_the_server_span_continues_the_clients_traceparent(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint)
    upstream.script(Reply(message_json("ok")))
    client = _client(proxy, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01")
    client.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    (server,) = _server_span(receiver)
    assert server.trace_id == TRACE_ID and server.parent_id == PARENT_ID
    call = _wait(lambda: receiver.named("chat claude-x"), "the call span")[0]
    assert call.trace_id == TRACE_ID and call.parent_id == server.span_id
    assert "gen_ai.conversation.id" not in call.attributes  # no session, no conversation
    assert call.attributes["server.port"] == int(upstream.url.rsplit(":", 1)[1])
    # without one, a new trace
    upstream.script(Reply(message_json("ok")))
    _client(proxy).messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    second = _server_span(receiver, 2)[1]
    assert second.trace_id != TRACE_ID and second.parent_id == ""


def test_a_parent_that_was_not_sampled_is_not_recorded(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint)
    upstream.script(Reply(message_json("ok")), Reply(message_json("ok")))
    _client(proxy, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-00").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    _client(proxy).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    (server,) = _server_span(receiver)
    proxy.app[TRACING].export.force_flush()
    assert server.trace_id != TRACE_ID and all(s.trace_id != TRACE_ID for s in receiver.spans)


# -- content ------------------------------------------------------------------------------------


@pytest.mark.parametrize("capture", [False, True])
def test_prompt_text_is_exported_only_when_asked_for(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, capture: bool
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint, capture_content=capture)
    upstream.script(Reply(message_json("answer")))
    _client(proxy).messages.create(
        model="m", max_tokens=5, system=f"system {MARKER}",
        messages=[{"role": "user", "content": f"the secret plan is {MARKER}"}],
    )
    _server_span(receiver)
    call = _wait(lambda: receiver.named("chat m"), "the call span")[0]
    exported = b"".join(receiver.bodies)
    if capture:
        assert MARKER.encode() in exported
        assert MARKER in call.attributes["gen_ai.input.messages"]
        assert MARKER in call.attributes["gen_ai.system_instructions"]
    else:
        assert MARKER.encode() not in exported
        assert "gen_ai.input.messages" not in call.attributes
    assert KEY.encode() not in exported


# -- errors -------------------------------------------------------------------------------------


def test_a_rejected_request_and_an_upstream_failure_are_error_spans(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint)
    bad = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]
    with pytest.raises(anthropic.BadRequestError):
        _client(proxy).messages.create(model="m", max_tokens=5, messages=bad)  # type: ignore[arg-type]
    (server,) = _server_span(receiver)
    assert server.attributes["http.response.status_code"] == 400
    validate = _wait(lambda: receiver.named("context_proxy.validate"), "the validation span")[0]
    assert validate.status_code == 2 and validate.attributes["error.type"] == "InvalidRequest"
    assert validate.parent_id == server.span_id
    assert not receiver.named("chat m")  # never forwarded

    upstream.script(Reply({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, status=529))
    with pytest.raises(anthropic.APIStatusError):
        _client(proxy).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    call = _wait(lambda: receiver.named("chat m"), "the call span")[0]
    assert call.status_code == 2 and call.attributes["error.type"] == "529"
    assert call.attributes["http.response.status_code"] == 529


# -- a collector that is down or stuck ----------------------------------------------------------


def test_a_dead_collector_never_touches_a_request(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, loop_thread: LoopThread
) -> None:
    # a collector that takes exports and never answers: the export thread is stuck in it
    receiver.hang()
    proxy = _traced(make_proxy, receiver.endpoint, queue_size=4, batch_size=2, export_timeout=30)
    upstream.script(*[Reply(message_json("ok")) for _ in range(6)])
    client = _client(proxy)
    client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    _wait(lambda: receiver.pending, "the first export to reach the stuck collector")
    for _ in range(5):  # answered while the export hangs, far inside its 30 s deadline
        reply = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert reply.content[0].text == "ok"  # type: ignore[union-attr]
    assert receiver.pending == 1  # still stuck: the requests did not wait for it
    assert _metric(proxy, "dropped_queue_full") > 0  # the bounded queue overflowed, counted
    assert receiver.spans == []
    # the collector answers again: what the queue held goes out
    loop_thread.loop.call_soon_threadsafe(receiver.release)
    _wait(lambda: receiver.named("POST /v1/messages"), "spans after the collector came back")
    _wait(lambda: not proxy.app[TRACING].export._queue, "the queue to empty")


def test_a_refused_collector_drops_and_counts(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, loop_thread: LoopThread
) -> None:
    loop_thread.run(receiver.stop())  # nothing listens there any more
    proxy = _traced(make_proxy, receiver.endpoint, export_timeout=0.5)
    upstream.script(*[Reply(message_json("ok")) for _ in range(3)])
    client = _client(proxy)
    for _ in range(3):
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    _wait(lambda: _metric(proxy, "dropped_export_failed") >= 6, "the failed exports to be counted")
    assert _metric(proxy, "exported") == 0


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_an_answering_collector_gets_the_configured_headers(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, compression: str
) -> None:
    proxy = _traced(
        make_proxy, receiver.endpoint, headers="x-collector-token=abc%20def", service_name="cp-test",
        resource_attributes="deployment.environment=test", compression=compression,
    )
    upstream.script(Reply(message_json("ok")))
    _client(proxy).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    (server,) = _server_span(receiver)
    assert receiver.headers[0]["x-collector-token"] == "abc def"
    assert receiver.headers[0].get("Content-Encoding", "none") == compression
    assert server.resource == {"service.name": "cp-test", "deployment.environment": "test"}


# -- tracing off --------------------------------------------------------------------------------


def test_serving_with_tracing_off_never_imports_opentelemetry(tmp_path: Any) -> None:
    # (the anthropic SDK imports OpenTelemetry when it is installed: the client here is urllib)
    script = """
import json, sys, urllib.request
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream
loop = LoopThread()
up = FakeUpstream()
loop.run(up.start())
proxy = ProxyServer(proxy_config(up.url, sys.argv[1]))
loop.run(proxy.start())
body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
request = urllib.request.Request(
    proxy.url + "/v1/messages", data=body.encode(), method="POST",
    headers={"x-api-key": "sk-ant-x", "content-type": "application/json", "anthropic-version": "2023-06-01"},
)
with urllib.request.urlopen(request) as answer:
    assert answer.status == 200 and json.loads(answer.read())["type"] == "message"
loop.run(proxy.stop())
loop.run(up.stop())
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True,
        env=env, cwd=os.path.dirname(os.path.dirname(__file__)), timeout=60,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- summary calls, count_tokens ------------------------------------------------------------------

SUMMARY_MODEL = "claude-summary-traced"


def test_summary_calls_are_call_spans_under_the_compaction_span(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver, transcript: dict[str, Any]
) -> None:
    compaction = {
        "threshold": 20_000, "hard_limit": 60_000,
        "summary": {"model": SUMMARY_MODEL, "input_budget": 4_000, "max_tokens": 300, "max_calls": 8},
    }
    proxy = _traced(make_proxy, receiver.endpoint, compaction=compaction)

    def answer(request: Any) -> Reply:
        if request.json()["model"] == SUMMARY_MODEL:
            return Reply(message_json("A SUMMARY.", model=SUMMARY_MODEL, input_tokens=3000, output_tokens=50))
        return Reply(message_json("ok"))

    upstream.script(*[answer] * 20)
    messages = transcript["messages"]
    k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
    raw = _client(proxy).messages.with_raw_response.create(
        model="claude-fake-1", max_tokens=100, messages=messages[:k], tools=transcript["tools"]
    )
    calls = int(raw.headers["x-compaction-summary-calls"])
    assert calls >= 1 and raw.headers["x-compaction-summary"] == "ok"
    (server,) = _server_span(receiver)
    compaction_span = _wait(lambda: receiver.named("context_proxy.compaction"), "the compaction span")[0]
    assert compaction_span.parent_id == server.span_id
    assert compaction_span.attributes["context_proxy.compaction.summary_calls"] == calls
    assert "summarize" in compaction_span.attributes["context_proxy.compaction.layers"]
    summaries = receiver.named(f"chat {SUMMARY_MODEL}")
    assert len(summaries) == calls
    for span in summaries:
        assert span.parent_id == compaction_span.span_id and span.kind == "client"
        assert span.attributes["context_proxy.call"] == "summary"
        assert span.attributes["gen_ai.request.model"] == SUMMARY_MODEL
        assert span.attributes["gen_ai.usage.input_tokens"] == 3000
        assert span.attributes["gen_ai.usage.output_tokens"] == 50
        assert span.attributes["context_proxy.tenant"] == "default"
        assert span.attributes["server.address"] == "127.0.0.1"  # the summary's upstream
        assert span.attributes["server.port"] == int(upstream.url.rsplit(":", 1)[1])
    plan = [s for s in receiver.named("context_proxy.store.write") if s.attributes["context_proxy.store.kind"] == "plan"]
    assert len(plan) == 1 and plan[0].parent_id == compaction_span.span_id
    client_call = receiver.one("chat claude-fake-1")
    assert client_call.attributes["context_proxy.call"] == "client"
    assert compaction_span.end_ns <= client_call.start_ns


def test_count_tokens_is_a_count_tokens_call_span(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    proxy = _traced(make_proxy, receiver.endpoint)
    upstream.script(Reply({"input_tokens": 12}))
    _client(proxy).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    server = _wait(lambda: receiver.named("POST /v1/messages/count_tokens"), "the server span")[0]
    call = _wait(lambda: receiver.named("count_tokens m"), "the call span")[0]
    assert call.parent_id == server.span_id
    assert call.attributes["gen_ai.operation.name"] == "count_tokens"
    assert call.attributes["gen_ai.usage.input_tokens"] == 12


def test_concurrent_requests_keep_their_own_identity(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    """Two sessions in flight at once: the first waits for its answer while the second runs from
    start to end, then opens more spans (a hidden retrieval round). Every span of each trace
    names its own session and agent, never the other's."""
    import threading

    proxy = _traced(make_proxy, receiver.endpoint, compaction=CUT)
    first = _round([_text("Reading."), _call()], "tool_use", 10, 5)
    upstream.script(Reply(first, delay=0.5), Reply(message_json("ok")), Reply(message_json("done")))

    def ask(session: str, agent: str, **more: Any) -> None:
        _client(proxy, **{"x-session-id": session, "x-agent-id": agent}).messages.create(
            model="m", max_tokens=100, **more
        )

    slow = threading.Thread(target=ask, args=(SESSION, "agent-slow"), kwargs={"messages": MESSAGES, "tools": TOOLS})
    slow.start()
    _wait(lambda: len(upstream.requests) >= 1, "the first request upstream")
    ask("sess-fast", "agent-fast", messages=[{"role": "user", "content": "hi"}])
    slow.join(10)
    servers = _server_span(receiver, 2)
    by_session = {s.attributes["context_proxy.session"]: s for s in servers}
    assert set(by_session) == {SESSION, "sess-fast"}
    agents = {SESSION: "agent-slow", "sess-fast": "agent-fast"}
    fast = by_session["sess-fast"]
    for session, server in by_session.items():
        trace = [s for s in receiver.spans if s.trace_id == server.trace_id]
        assert len(trace) >= 4  # server, validation, the durable-state read, compaction, the call
        for span in trace:
            assert span.attributes["context_proxy.session"] == session, span.name
            assert span.attributes["context_proxy.agent"] == agents[session], span.name
    (round_span,) = receiver.named("context_proxy.retrieval.round")
    assert round_span.start_ns > fast.end_ns  # opened after the other request had come and gone


def test_a_client_gone_while_the_provider_is_called_still_ends_the_call_span(
    upstream: FakeUpstream, make_proxy: Any, receiver: OtlpReceiver
) -> None:
    """The client gives up before the provider's headers arrive (aiohttp cancels the handler):
    the call's span is still ended and exported, marked with the cancellation."""
    proxy = _traced(make_proxy, receiver.endpoint)
    upstream.script(Reply(message_json("too late"), delay=3.0))
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{proxy.url}/v1/messages",
            json={"model": "claude-gone", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
            timeout=0.5,
        )
    call = _wait(lambda: receiver.named("chat claude-gone"), "the call span")[0]
    assert call.attributes["error.type"] == "CancelledError"
