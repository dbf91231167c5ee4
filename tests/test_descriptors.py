"""Every socket, file and database handle the proxy opens is closed on every path (issue 28):
the client leaving mid-stream (its connection reset), the upstream cutting a stream, resetting the
connection or failing, a hidden retrieval round cancelled by the client leaving, sessions recorded
and exported. Each path runs a few times (the pools fill), then many more: the process's open file
descriptors are where they were. And a client that leaves is neither a 500 nor a traceback."""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.server.appkeys import DURABLE, STATE
from tests.harness import LoopThread, ProxyServer
from tests.test_retrieval import CUT, KEY, MESSAGES, SESSION, TOOLS, _call, _round, _text
from tests.upstream import (
    FakeUpstream,
    Hang,
    Reply,
    Reset,
    Stream,
    message_stream_events,
    text_stream_events,
)

HEADERS = {"x-api-key": KEY, "content-type": "application/json", "anthropic-version": "2023-06-01"}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _body(**more: Any) -> bytes:
    return orjson.dumps({"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS, **more})


def _settle(proxy: ProxyServer, upstream: FakeUpstream, loop_thread: LoopThread) -> None:
    deadline = time.monotonic() + 20
    while (proxy.app[STATE].inflight or upstream.active) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not proxy.app[STATE].inflight and not upstream.active
    loop_thread.run(proxy.app[DURABLE].drain())


def _leave_mid_stream(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    """A client that reads the head and a first chunk, then resets its connection."""
    upstream.script(Stream(text_stream_events("x" * 60_000, deltas=3000)))
    body = _body(stream=True)
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in {**HEADERS, "x-session-id": session}.items())
    sock.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while b"event: content_block_delta" not in got:
        chunk = sock.recv(65536)
        assert chunk, got[:300]
        got += chunk
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
    sock.close()


def _post(proxy: ProxyServer, session: str, timeout: float = 30, **more: Any) -> int:
    with httpx.Client(timeout=timeout) as http:
        r = http.post(f"{proxy.url}/v1/messages", content=_body(**more), headers={**HEADERS, "x-session-id": session})
        return r.status_code


def _upstream_cuts(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    upstream.script(Stream(text_stream_events("y" * 400, deltas=40), cut_after=5))
    assert _post(proxy, session, stream=True) == 200  # the cut stream ends with the proxy's error event


def _upstream_resets(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    upstream.script(Reset())
    assert _post(proxy, session) == 502


def _upstream_fails(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    upstream.script(Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, status=500))
    assert _post(proxy, session) == 500  # the provider's own 500, relayed


def _retrieval_cancelled(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    """The model calls the retrieval tool; the proxy answers it and calls again; the client gives
    up while that hidden round waits."""
    first = _round([_text("Let me read the whole log."), _call(pointer=_pointer(session))], "tool_use", 100, 20)
    upstream.script(Stream(message_stream_events(first)), Hang())
    with pytest.raises(httpx.ReadTimeout):
        _post(proxy, session, timeout=1.0, stream=True)


def _answered(proxy: ProxyServer, upstream: FakeUpstream, session: str) -> None:
    assert _post(proxy, session) == 200  # recorded, exported, its source checked


def _pointer(session: str) -> str:
    from proxy.core.compaction.truncate import artifact_pointer
    from tests.test_retrieval import BIG

    return artifact_pointer(session, BIG)


PATHS: list[Callable[[ProxyServer, FakeUpstream, str], None]] = [
    _leave_mid_stream, _upstream_cuts, _upstream_resets, _upstream_fails, _retrieval_cancelled, _answered,
]


def test_open_descriptors_stay_flat_on_every_path(
    make_proxy: Any, upstream: FakeUpstream, loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = make_proxy(compaction=CUT)

    def rounds(n: int, start: int) -> None:
        for k in range(start, start + n):
            for i, path in enumerate(PATHS):
                path(proxy, upstream, f"{SESSION}-{k}-{i}")  # a session each: new transcripts too
            _settle(proxy, upstream, loop_thread)

    rounds(2, 0)
    before = _fds()
    rounds(12, 2)
    after = _fds()
    assert after - before <= 2, f"{after - before} descriptors more after 12 more rounds of every path"
    statuses = {
        line.split('status="')[1].split('"')[0]: float(line.split()[-1])
        for line in httpx.get(proxy.url + "/metrics").text.splitlines()
        if line.startswith('context_proxy_requests_total{route="messages"')
    }
    assert statuses["500"] == 14  # the provider's 500s, relayed: none of the proxy's own
    ours = [r for r in caplog.records if r.name.startswith("context_proxy")]
    assert not [r for r in ours if r.exc_info], [r.getMessage() for r in ours if r.exc_info]
    assert not [r for r in ours if "unexpected" in r.getMessage()]


class RawUpstream:
    """A provider on a plain socket, in its own thread: answers one streamed request with a few
    events, then (when told) with the rest, at a moment the test chooses."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.more = threading.Event()
        self.sent = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            events = text_stream_events("z" * 400, deltas=40)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            conn.sendall(b"".join(events[:4]))
            self.more.wait(20)
            conn.sendall(b"".join(events[4:]))
            self.sent.set()
            time.sleep(1)

    def close(self) -> None:
        self.more.set()
        self.thread.join(5)
        self.server.close()


def test_a_client_gone_while_its_answer_is_written_is_no_500_and_no_traceback(
    make_proxy: Any, loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """The race the soak found: the client's reset and the provider's next bytes reach the proxy
    in the same turn of its event loop, the bytes first. The handler then writes to a connection
    already closing, before aiohttp cancels it (a ConnectionResetError, not a cancellation).
    Made certain here: the loop is held while the provider sends and then the client resets."""
    caplog.set_level(logging.INFO)
    raw = RawUpstream()
    try:
        proxy = make_proxy(upstream_url=raw.url)
        body = orjson.dumps({"model": "m", "max_tokens": 10, "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})
        host, port = proxy.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        head = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
        sock.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"event: content_block_delta" not in got:
            got += sock.recv(65536)
        held = threading.Event()
        loop_thread.loop.call_soon_threadsafe(lambda: (held.set(), time.sleep(0.6)))
        assert held.wait(5)  # the proxy's loop is held from here for 0.6 s
        raw.more.set()
        assert raw.sent.wait(5)
        time.sleep(0.1)  # the provider's bytes are ready first...
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # ... then the client's reset
        deadline = time.monotonic() + 10
        while proxy.app[STATE].inflight and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        raw.close()
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'route="messages",status="500"' not in metrics
    assert 'context_proxy_requests_total{route="messages",status="499"} 1.0' in metrics
    ours = [r for r in caplog.records if r.name.startswith("context_proxy")]
    assert not [r for r in ours if r.exc_info]
    assert any("the client went away during the answer" in r.getMessage() for r in ours)
