"""Fidelity: every client works through the proxy exactly as against the provider.

Each test runs the same call side by side, directly against the fake upstream and through the
proxy, and compares what the upstream received and what the client got.
"""

from __future__ import annotations

import gzip
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from tests.harness import LoopThread, ProxyServer
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    text_stream_events,
    tool_use_stream_events,
)

KEY = "sk-ant-test-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "Say hello."}]

# Headers that legitimately differ between two runs or two hops.
_VOLATILE = {"host", "content-length", "accept-encoding", "x-stainless-retry-count", "connection"}


def _comparable_headers(req: RecordedRequest) -> dict[str, str]:
    return {k.lower(): v for k, v in req.headers.items() if k.lower() not in _VOLATILE}


def _client(base_url: str, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0, **kw)


def _side_by_side(upstream: FakeUpstream, proxy: ProxyServer, call: Any, *script: Any) -> tuple[Any, Any, RecordedRequest, RecordedRequest]:
    upstream.script(*script)
    direct = call(_client(upstream.url))
    upstream.script(*script)
    proxied = call(_client(proxy.url))
    return direct, proxied, upstream.requests[-2], upstream.requests[-1]


def test_non_streaming_create_is_byte_identical(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    reply = Reply(message_json("hi there"), headers={"x-custom-answer": "yes", "retry-after": "3"})

    def call(client: anthropic.Anthropic) -> Any:
        return client.messages.with_raw_response.create(
            model="claude-fake-1", max_tokens=50, messages=MESSAGES, metadata={"user_id": "u1"}
        )

    direct, proxied, d_req, p_req = _side_by_side(upstream, proxy, call, reply, reply)
    assert p_req.body == d_req.body
    assert p_req.path == "/v1/messages"
    assert _comparable_headers(p_req) == _comparable_headers(d_req)
    assert p_req.headers["authorization"] == f"Bearer {KEY}"
    assert proxied.http_response.content == direct.http_response.content
    assert proxied.status_code == 200
    for name in ("request-id", "anthropic-ratelimit-requests-limit", "x-custom-answer", "retry-after"):
        assert proxied.headers[name] == direct.headers[name] if name != "request-id" else proxied.headers[name]
    assert proxied.parse().content[0].text == "hi there"


def test_streaming_create_relays_every_event(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    events = text_stream_events("The quick brown fox jumps over the lazy dog.", deltas=9)

    def call(client: anthropic.Anthropic) -> Any:
        with client.messages.with_streaming_response.create(
            model="claude-fake-1", max_tokens=50, messages=MESSAGES, stream=True
        ) as response:
            return response.headers, response.read()

    (_, d_bytes), (p_headers, p_bytes), d_req, p_req = _side_by_side(
        upstream, proxy, call, Stream(events), Stream(events)
    )
    assert p_bytes == d_bytes == b"".join(events)
    assert p_req.body == d_req.body
    assert p_headers["content-type"].startswith("text/event-stream")


def test_messages_stream_helper_and_tool_use(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    upstream.script(Stream(tool_use_stream_events("get_weather", {"city": "Paris", "unit": "c"})))
    client = _client(proxy.url)
    with client.messages.stream(model="claude-fake-1", max_tokens=50, messages=MESSAGES) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    block = final.content[0]
    assert block.type == "tool_use"
    assert block.input == {"city": "Paris", "unit": "c"}


async def test_async_client_and_count_tokens(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    message = await client.messages.create(model="claude-fake-1", max_tokens=20, messages=MESSAGES)
    assert message.content[0].type == "text"
    upstream.script(Reply({"input_tokens": 4242}))
    counted = await client.messages.count_tokens(model="claude-fake-1", messages=MESSAGES)
    assert counted.input_tokens == 4242
    assert upstream.requests[-1].path == "/v1/messages/count_tokens"
    assert upstream.requests[-2].headers["user-agent"].startswith("AsyncAnthropic/Python")
    await client.close()


def test_models_list_and_passthrough_is_byte_for_byte(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    models = _client(proxy.url).models.list(limit=5)
    assert [m.id for m in models.data] == ["claude-fake-1"]
    recorded = upstream.requests[-1]
    assert (recorded.method, recorded.path, recorded.query_string) == ("GET", "/v1/models", "limit=5")

    # Any method and path, an odd body, an odd query: all passed through untouched.
    body = b"\x00\x01 not json at all \xff"
    upstream.script(Reply(b"raw-answer-\x00\xfe", status=207, headers={"x-odd": "1"}, content_type="application/x-thing"))
    r = httpx.request(
        "PATCH",
        f"{proxy.url}/v1/files/file_123/x%2Fy?a=1&a=2&b=%20c",
        content=body,
        headers={"x-api-key": KEY, "x-custom": "kept", "content-type": "application/octet-stream"},
    )
    recorded = upstream.requests[-1]
    assert recorded.method == "PATCH"
    assert recorded.raw_path == "/v1/files/file_123/x%2Fy?a=1&a=2&b=%20c"
    assert recorded.body == body
    assert recorded.headers["x-custom"] == "kept"
    assert r.status_code == 207
    assert r.content == b"raw-answer-\x00\xfe"
    assert r.headers["x-odd"] == "1"
    assert r.headers["content-type"] == "application/x-thing"


def test_passthrough_keeps_upstream_compression(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    upstream.script(Reply({"data": [], "has_more": False}, gzip=True))
    with httpx.Client() as client:
        r = client.get(f"{proxy.url}/v1/models", headers={"accept-encoding": "gzip", "x-api-key": KEY})
    assert upstream.requests[-1].headers["accept-encoding"] == "gzip"
    assert r.headers["content-encoding"] == "gzip"
    assert orjson.loads(r.content) == {"data": [], "has_more": False}  # httpx decoded it


def test_messages_route_reads_a_gzipped_upstream_answer(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    answer = orjson.dumps(message_json("compressed"))
    upstream.script(Reply(answer, gzip=True))
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        content=orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES}),
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "accept-encoding": "br, zstd"},
    )
    assert upstream.requests[-1].headers["accept-encoding"] == "gzip, deflate"
    assert "content-encoding" not in r.headers
    assert r.content == answer


def test_legacy_x_api_key_client_and_query_string(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    body = b'{"model": "claude-fake-1",  "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}'
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-management-2025-06-27,compact-2026-01-12",
        "content-type": "application/json",
        "x-app": "cli",
        "X-Claude-Code-Session-Id": "3af9b1a7-6512-4883-ad18-320658ced099",
    }
    r = httpx.post(f"{proxy.url}/v1/messages?beta=true", content=body, headers=headers)
    assert r.status_code == 200
    recorded = upstream.requests[-1]
    assert recorded.body == body  # not re-serialised: the odd spacing survives
    assert recorded.query_string == "beta=true"
    for name, value in headers.items():
        assert recorded.headers[name] == value
    assert "authorization" not in recorded.headers


def test_hop_by_hop_headers_are_not_forwarded(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    httpx.post(
        f"{proxy.url}/v1/messages",
        content=orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES}),
        headers={
            "x-api-key": KEY,
            "connection": "keep-alive, x-hop",
            "x-hop": "drop me",
            "proxy-authorization": "Basic c2VjcmV0",
            "te": "trailers",
        },
    )
    recorded = upstream.requests[-1]
    for name in ("x-hop", "proxy-authorization", "te"):
        assert name not in recorded.headers
    assert recorded.headers["host"] == upstream.url.removeprefix("http://")


def test_upstream_errors_pass_through_untouched(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    cases = [
        (400, "invalid_request_error", {"x-should-retry": "false"}),
        (429, "rate_limit_error", {"retry-after": "7", "x-should-retry": "true"}),
        (500, "api_error", {}),
        (529, "overloaded_error", {"x-should-retry": "false"}),
    ]
    for status, kind, headers in cases:
        body = orjson.dumps({"type": "error", "error": {"type": kind, "message": f"upstream says {status}"}, "request_id": "req_up"})
        upstream.script(Reply(body, status=status, headers={**headers, "request-id": "req_upstream_1"}))
        with pytest.raises(anthropic.APIStatusError) as info:
            _client(proxy.url).messages.create(model="m", max_tokens=5, messages=MESSAGES)
        response = info.value.response
        assert response.status_code == status
        assert response.content == body
        assert info.value.request_id == "req_upstream_1"
        for name, value in headers.items():
            assert response.headers[name] == value


def test_base_url_path_prefix_is_honoured(upstream: FakeUpstream, make_proxy: Any) -> None:
    """Every call the proxy makes upstream: the client's messages (JSON and streamed), its
    token counts and the ``/v1/*`` passthrough (the forwarder), and the L4 summary call (the
    summariser's own HTTP client)."""
    compaction = {"threshold": 2000, "hard_limit": 50_000, "keep_recent": 2, "summary": {"model": "summ"}}
    proxy = make_proxy(upstream.url + "/some/prefix", compaction=compaction)
    client = _client(proxy.url)
    client.messages.create(model="m", max_tokens=5, messages=MESSAGES)
    with client.messages.stream(model="m", max_tokens=5, messages=MESSAGES) as stream:
        stream.get_final_message()
    client.messages.count_tokens(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert [m.id for m in client.models.list()] == ["claude-fake-1"]
    long_history: list[Any] = [MESSAGES[0]]
    for i in range(40):
        long_history += [{"role": "assistant", "content": f"step {i} " + "detail " * 100}, {"role": "user", "content": f"go on {i}"}]
    response = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=long_history)
    assert response.headers["x-compaction-summary"] == "ok"
    assert [(r.path, r.json().get("model") if r.method == "POST" else None) for r in upstream.requests] == [
        ("/some/prefix/v1/messages", "m"),
        ("/some/prefix/v1/messages", "m"),
        ("/some/prefix/v1/messages/count_tokens", "m"),
        ("/some/prefix/v1/models", None),
        ("/some/prefix/v1/messages", "summ"),  # the summary call
        ("/some/prefix/v1/messages", "m"),
    ]


def test_gzip_request_body_is_inspected_and_forwarded_as_sent(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    body = gzip.compress(orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES}))
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        content=body,
        headers={"x-api-key": KEY, "content-encoding": "gzip", "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert upstream.requests[-1].body == body
    assert upstream.requests[-1].headers["content-encoding"] == "gzip"


def test_health_endpoints(proxy: ProxyServer, loop_thread: LoopThread) -> None:
    assert httpx.head(proxy.url + "/").status_code == 200
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(proxy.url + "/readyz").status_code == 200
    httpx.post(proxy.url + "/v1/messages", content=b"{}", headers={"x-api-key": KEY})
    _client(proxy.url).messages.create(model="m", max_tokens=5, messages=MESSAGES)
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'context_proxy_requests_total{route="messages",status="400"} 1.0' in metrics
    assert 'context_proxy_requests_total{route="messages",status="200"} 1.0' in metrics
    assert 'context_proxy_added_latency_seconds_count{route="messages"} 1.0' in metrics
    assert 'context_proxy_upstream_latency_seconds_count{route="messages"} 1.0' in metrics
    assert KEY not in metrics
    assert "context_proxy_active_streams 0.0" in metrics


def test_sse_is_relayed_as_it_arrives(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    import time

    events = text_stream_events("a b c d e", deltas=5)
    upstream.script(Stream(events, pace=0.15))  # ~1.5 s in all
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES, "stream": True})
    started = time.monotonic()
    with httpx.stream("POST", proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY}) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        first_at = time.monotonic() - started
        rest = b"".join(chunks)
    total = time.monotonic() - started
    assert first.startswith(b"event: message_start")
    assert first_at < 0.6 < total
    assert first + rest == b"".join(events)


def test_a_slow_client_slows_the_upstream_read(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    import time

    from tests.upstream import frame

    big = [frame("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"{i:06d}" + "x" * 16_000}}) for i in range(2_500)]
    events = text_stream_events("", deltas=1)[:3] + big + text_stream_events("", deltas=1)[-3:]
    total = sum(len(e) for e in events)  # ~40 MB
    upstream.script(Stream(events))
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES, "stream": True})
    with httpx.stream("POST", proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=60) as r:
        chunks = r.iter_raw()
        received = len(next(chunks))
        time.sleep(1.0)  # the client stalls: the proxy must stop reading the upstream
        written_while_stalled = upstream.stream_bytes_written
        for chunk in chunks:
            received += len(chunk)
    assert written_while_stalled < total // 2, (written_while_stalled, total)
    assert received == total
