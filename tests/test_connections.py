"""Slow and idle clients: each timeout closes the connection, the connection limit holds, and a
normal request still gets through (short timeouts here; the 2,000-connection figures are in
bench/README.md, ``bench/bench_slow_clients.py``)."""

from __future__ import annotations

import os
import resource
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from tests.harness import ListeningProcess
from tests.upstream import FakeUpstream

KEY = "sk-ant-canary-7f3a9c1e5b2d4f60"
GOOD = orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
SHORT = {"header_timeout": 0.4, "body_timeout": 0.4, "idle_timeout": 0.6}


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket, within: float = 8.0) -> tuple[bytes, float]:
    """Everything the proxy sends until it closes the connection; and when it closed."""
    started = time.monotonic()
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the connection was still open after {within}s") from None
    return data, time.monotonic() - started


def _metric(url: str, text: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(text + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_silent_new_connection_is_closed_after_header_timeout(make_proxy: Any) -> None:
    proxy = make_proxy(limits=SHORT)
    with _connect(proxy.url) as sock:
        data, _ = _read_until_closed(sock)
    assert data == b""
    assert _metric(proxy.url, 'context_proxy_connections_closed_total{reason="header_timeout"}') == 1


def test_a_dribbled_request_head_gets_408_and_is_closed(make_proxy: Any) -> None:
    """Bytes keep arriving (one every 0.1 s), but the head is never complete: the timer runs from
    its first byte, it is not reset by each one."""
    proxy = make_proxy(limits=SHORT)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    with _connect(proxy.url) as sock:
        started = time.monotonic()
        for byte in head:
            if select.select([sock], [], [], 0.1)[0]:
                break  # the proxy answered: stop sending
            sock.sendall(bytes([byte]))
            assert time.monotonic() - started < 8, "still open after 8 s of a dribbled head"
        data, _ = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 "), data[:100]
    body = orjson.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert time.monotonic() - started < 3  # header_timeout 0.4 s, far less than the 20 s dribble


def test_a_stalled_body_closes_the_connection_and_nothing_goes_upstream(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(limits=SHORT)
    with _connect(proxy.url) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(GOOD)
            + GOOD[:10]
        )
        _data, _ = _read_until_closed(sock)
    assert upstream.requests == []
    assert _metric(proxy.url, 'context_proxy_connections_closed_total{reason="body_timeout"}') == 1


def test_a_slow_but_steady_body_is_not_cut(upstream: FakeUpstream, make_proxy: Any) -> None:
    """The body timeout bounds silence, not the upload: 1.5 s of 0.15 s gaps is fine."""
    proxy = make_proxy(limits=SHORT)

    def chunks() -> Any:
        step = len(GOOD) // 10 + 1
        for i in range(0, len(GOOD), step):
            time.sleep(0.15)
            yield GOOD[i : i + step]

    r = httpx.post(proxy.url + "/v1/messages", content=chunks(), headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].body == GOOD


def test_an_idle_kept_alive_connection_is_closed_after_idle_timeout(make_proxy: Any) -> None:
    proxy = make_proxy(limits=SHORT)
    with _connect(proxy.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        data, waited = _read_until_closed(sock)
    assert data == b""
    assert waited >= 0.3  # idle_timeout 0.6 s (aiohttp rounds timers up to whole seconds)


def test_the_connection_limit_closes_the_oldest_waiting_connection(make_proxy: Any) -> None:
    proxy = make_proxy(limits={"max_connections": 4})
    socks = [_connect(proxy.url) for _ in range(4)]
    try:
        socks[0].sendall(b"GET /healthz HTTP/1.1\r\n")  # half a head: waiting, not busy
        time.sleep(0.2)
        # a fifth connection: the oldest waiting one (socks[0]) makes room, and a normal request
        # on the new one is answered
        r = httpx.get(proxy.url + "/healthz", timeout=10)
        assert r.status_code == 200
        data, _ = _read_until_closed(socks[0])
        assert data == b""
        for sock in socks[1:3]:  # the others are still open
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert _metric(proxy.url, 'context_proxy_connections_closed_total{reason="limit"}') >= 1
    finally:
        for sock in socks:
            sock.close()


def test_the_limit_never_cuts_a_request_in_progress(upstream: FakeUpstream, make_proxy: Any) -> None:
    """Every connection busy with a request: the new connection is the one closed."""
    from tests.upstream import Reply, message_json

    proxy = make_proxy(limits={"max_connections": 1})
    upstream.script(Reply(message_json(), delay=1.0))
    with _connect(proxy.url) as busy:
        busy.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + KEY.encode()
            + b"\r\nContent-Length: %d\r\n\r\n" % len(GOOD) + GOOD
        )
        deadline = time.monotonic() + 5
        while upstream.active == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with _connect(proxy.url) as extra:
            data, _ = _read_until_closed(extra)
            assert data == b""
        answer = busy.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_serve_raises_the_soft_open_files_limit_to_the_hard_limit(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"needs a finite hard open files limit above 256 (hard: {hard})")
    config = tmp_path / "proxy.yaml"
    config.write_text(f"state_dir: '{tmp_path}'\n")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # inherited by the child
    try:
        process = ListeningProcess(["serve", "--config", str(config), "--port", "0"])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{process.proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
        assert any(f"open files limit: {hard}" in x for x in process.lines)
    finally:
        process.stop()


def test_the_limits_are_validated(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("limits: {header_timeout: 0, max_connections: -1}\nlogging: {format: xml}\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )
    assert result.returncode == 1
    assert "limits.header_timeout" in result.stderr and "limits.max_connections" in result.stderr
    assert "logging.format': expected one of text, json" in result.stderr
