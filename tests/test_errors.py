"""Every error path: a clear Anthropic-shaped error, and nothing forwarded that should not be."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from tests.harness import LoopThread, ProxyServer
from tests.upstream import (
    FakeUpstream,
    Hang,
    Reply,
    Reset,
    Stream,
    frame,
    message_json,
    text_stream_events,
)

KEY = "sk-ant-canary-7f3a9c1e5b2d4f60"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
GOOD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def _post(proxy: ProxyServer, body: bytes, path: str = "/v1/messages", **kw: Any) -> httpx.Response:
    return httpx.post(proxy.url + path, content=body, headers={**HEADERS, **kw.pop("headers", {})}, timeout=30, **kw)


def _assert_error(r: httpx.Response, status: int, error_type: str, contains: str = "") -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert contains in body["error"]["message"]
    assert r.headers["request-id"].startswith("req_")
    assert body["request_id"] == r.headers["request-id"]
    assert KEY not in r.text
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b'{"model": "m", "max_tokens": 5}', "messages: Field required"),
        (b'{"model": "m", "messages": {"role": "user"}}', "messages: Input should be a valid list"),
    ],
)
def test_bad_bodies_are_400_and_not_forwarded(upstream: FakeUpstream, proxy: ProxyServer, body: bytes, contains: str) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        _assert_error(_post(proxy, body, path), 400, "invalid_request_error", contains)
    assert upstream.requests == []


def test_broken_tool_protocol_is_400_naming_index_and_id(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    messages = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_A1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "never mind"}]},
    ]
    r = _post(proxy, orjson.dumps({**GOOD, "messages": messages}))
    body = _assert_error(r, 400, "invalid_request_error", "messages.1")
    assert "toolu_A1" in body["error"]["message"]
    assert "`tool_use` ids were found without `tool_result` blocks immediately after" in body["error"]["message"]
    # The SDK sees the proxy's request id from the header.
    with pytest.raises(anthropic.BadRequestError) as info:
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).messages.create(
            model="m", max_tokens=5, messages=messages  # type: ignore[arg-type]
        )
    assert info.value.request_id is not None and info.value.request_id.startswith("req_cp")
    assert upstream.requests == []


def test_body_over_limit_is_413_and_upstream_never_contacted(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(limits={"max_body_bytes": 1000})
    big = orjson.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * 2000}]})
    _assert_error(_post(proxy, big), 413, "request_too_large")

    # Without a Content-Length (chunked upload), the bound still holds while reading.
    def chunks() -> Any:
        for i in range(0, len(big), 100):
            yield big[i : i + 100]

    r = httpx.post(proxy.url + "/v1/messages", content=chunks(), headers=HEADERS)
    _assert_error(r, 413, "request_too_large")
    assert upstream.requests == []
    # A body exactly at the limit is fine.
    ok = orjson.dumps({**GOOD, "messages": [{"role": "user", "content": "y"}]})
    assert _post(proxy, ok).status_code == 200


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_upstream_refused_is_502(make_proxy: Any) -> None:
    proxy = make_proxy(f"http://127.0.0.1:{_closed_port()}")
    _assert_error(_post(proxy, orjson.dumps(GOOD)), 502, "api_error", "unreachable")
    r = httpx.get(proxy.url + "/v1/models", headers=HEADERS)
    _assert_error(r, 502, "api_error")


def test_upstream_reset_before_headers_is_502(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    upstream.script(Reset())
    _assert_error(_post(proxy, orjson.dumps(GOOD)), 502, "api_error", "before a response")


def test_upstream_timeout_is_504(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(upstream={"read_timeout": 0.3})
    upstream.script(Hang())
    started = time.monotonic()
    _assert_error(_post(proxy, orjson.dumps(GOOD)), 504, "timeout_error")
    assert time.monotonic() - started < 5


def test_overloaded_and_draining_are_529_with_retry_after(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    proxy = make_proxy(limits={"max_concurrent_requests": 1})
    upstream.script(Reply(message_json(), delay=1.0))
    first: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: first.setdefault("r", _post(proxy, orjson.dumps(GOOD))))
    t.start()
    deadline = time.monotonic() + 5
    while upstream.active == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    r = _post(proxy, orjson.dumps(GOOD))
    _assert_error(r, 529, "overloaded_error", "concurrency limit")
    assert r.headers["retry-after"] == "1"
    t.join()
    assert first["r"].status_code == 200
    assert len(upstream.requests) == 1

    from proxy.server.appkeys import STATE

    proxy.app[STATE].draining = True
    r = _post(proxy, orjson.dumps(GOOD))
    _assert_error(r, 529, "overloaded_error", "shutting down")
    assert httpx.get(proxy.url + "/readyz").status_code == 503
    proxy.app[STATE].draining = False


def _stream_bytes(proxy: ProxyServer) -> bytes:
    with httpx.stream("POST", proxy.url + "/v1/messages", content=orjson.dumps({**GOOD, "stream": True}), headers=HEADERS) as r:
        assert r.status_code == 200
        return r.read()


@pytest.mark.parametrize("mid_event", [False, True])
def test_upstream_death_mid_stream_ends_with_an_error_event(upstream: FakeUpstream, proxy: ProxyServer, mid_event: bool) -> None:
    events = text_stream_events("one two three four five six", deltas=6)
    upstream.script(Stream(events, cut_after=5, cut_mid_event=mid_event))
    got = _stream_bytes(proxy)
    prefix = b"".join(events[:5])
    assert got.startswith(prefix)
    tail = got[len(prefix) :]
    assert tail.startswith(b"event: error\ndata: ")
    error = orjson.loads(tail.split(b"data: ", 1)[1])
    assert error["error"]["type"] == "api_error"
    assert b"message_stop" not in got
    assert tail.count(b"\n\n") == 1  # exactly one extra event, nothing after it

    # The SDK raises a (non-retried) APIStatusError for it.
    upstream.script(Stream(events, cut_after=5, cut_mid_event=mid_event))
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model="m", max_tokens=5, messages=GOOD["messages"]) as stream:
            stream.get_final_message()


def test_stream_that_ends_without_message_stop_gets_an_error_event(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    events = text_stream_events("abc", deltas=1)[:-1]  # clean EOF, no message_stop
    upstream.script(Stream(events))
    got = _stream_bytes(proxy)
    assert got.startswith(b"".join(events))
    assert got[len(b"".join(events)) :].startswith(b"event: error\n")


def test_upstream_error_event_is_relayed_untouched(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    events = [
        *text_stream_events("abc", deltas=1)[:3],
        frame("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]
    upstream.script(Stream(events))
    assert _stream_bytes(proxy) == b"".join(events)


def test_non_streaming_body_cut_is_not_silently_truncated(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    upstream.script(Stream([b'{"id": "msg_1", "type": "mess', b'age"}'], cut_after=1, headers={"Content-Type": "application/json", "Content-Length": "500"}))
    with pytest.raises(httpx.HTTPError):
        _post(proxy, orjson.dumps(GOOD))


def test_unknown_path_is_anthropic_404(proxy: ProxyServer) -> None:
    _assert_error(httpx.get(proxy.url + "/nope"), 404, "not_found_error")


async def _settle(predicate: Any, limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


@pytest.mark.parametrize("phase", ["before_first_byte", "after_first_byte"])
def test_client_disconnect_cancels_the_upstream_request(
    upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread, phase: str
) -> None:
    async def task_count() -> int:
        await asyncio.sleep(0.1)
        return len(asyncio.all_tasks())

    baseline = loop_thread.run(task_count())
    if phase == "before_first_byte":
        upstream.script(Hang())
    else:
        upstream.script(Stream(text_stream_events("x" * 400, deltas=200), pace=0.05))
    body = orjson.dumps({**GOOD, "stream": True})
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        if phase == "after_first_byte":
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
        else:
            deadline = time.monotonic() + 5
            while upstream.active == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert upstream.active == 1
        # Leaving the block closes the client connection mid-request / mid-response.
    started = time.monotonic()
    assert loop_thread.run(_settle(lambda: upstream.cancelled == 1 and upstream.active == 0))
    assert time.monotonic() - started < 2.0
    assert loop_thread.run(_settle(lambda: upstream.open_connections == 0))
    assert loop_thread.run(task_count()) <= baseline


def test_canary_key_never_appears_in_logs(upstream: FakeUpstream, make_proxy: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = make_proxy()
    dead = make_proxy(f"http://127.0.0.1:{_closed_port()}")
    bearer = {"authorization": f"Bearer {KEY}"}
    _post(proxy, orjson.dumps(GOOD))
    _post(proxy, orjson.dumps(GOOD), headers=bearer)
    _post(proxy, b"{bad", headers=bearer)
    _post(dead, orjson.dumps(GOOD), headers=bearer)
    upstream.script(Stream(text_stream_events(), cut_after=2))
    _stream_bytes(proxy)
    upstream.script(Reset())
    _post(proxy, orjson.dumps(GOOD))
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records, "expected some log lines to inspect"
    assert KEY not in text
    assert KEY not in httpx.get(proxy.url + "/metrics").text


def test_a_body_nested_too_deep_is_a_clear_400(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    """Valid JSON nested deeper than the proxy's bound (128 levels; orjson writes 254) is refused
    with a 400 that names where, before anything is forwarded or recorded -- never a 500, never
    a request that is answered but silently not recorded (tests/test_exactly_once.py has every
    position)."""
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"v": deep}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ]
    raw = json.dumps({"model": "m", "max_tokens": 5, "messages": messages}).encode()
    before = len(upstream.requests)
    r = httpx.post(proxy.url + "/v1/messages", content=raw, headers={"x-api-key": KEY, "x-session-id": "deep-1"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.1.content.0.input.v.0.0.")
    assert "nested deeper than 128 levels" in error["message"]
    assert len(upstream.requests) == before


def test_an_unexpected_failure_is_an_anthropic_shaped_500(
    upstream: FakeUpstream, proxy: ProxyServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from proxy.logs.redact import RedactingFilter
    from proxy.server.appkeys import COMPACTION

    caplog.handler.addFilter(RedactingFilter())  # as ``serve`` installs it on its handlers

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug with sk-ant-secret-in-message-0123456789")

    monkeypatch.setattr(proxy.app[COMPACTION], "prepare", broken)
    r = httpx.post(proxy.url + "/v1/messages", content=orjson.dumps(GOOD), headers={"x-api-key": KEY})
    assert r.status_code == 500
    assert r.json()["type"] == "error"
    assert r.json()["error"] == {"type": "api_error", "message": "internal error in the proxy"}
    assert r.headers["x-should-retry"] == "true"
    assert upstream.requests == []
    assert "RuntimeError" in caplog.text and "Traceback" in caplog.text  # for whoever debugs it
    assert "sk-ant-secret-in-message-0123456789" not in caplog.text
