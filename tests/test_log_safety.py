"""Logs a client cannot forge, flood or use to drive a terminal; JSON lines on request."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.logs.formatting import JsonFormatter, RepeatLimiter, TextFormatter, escape
from proxy.logs.redact import RedactingFilter
from tests.harness import ListeningProcess
from tests.upstream import FakeUpstream

FORGED = "/nope%0a2026-12-02%2018:00:00,000%20WARNING%20context_proxy.app%20forged%1b[2J%e2%80%a8x%0d%c2%85y"
UNSAFE = [chr(c) for c in [*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)]] + [
    "\u2028", "\u2029", "\u202e", "\u2066", "\ufeff",
]


@given(st.text())
def test_escaped_text_has_no_unsafe_character_and_escaping_is_idempotent(text: str) -> None:
    out = escape(text, 10**6)
    assert not any(c in out for c in UNSAFE)
    assert escape(out, 10**6) == out


def test_escape_examples() -> None:
    assert escape("a\nb\rc\x1b[2J\u2028d\x85") == "a\\x0ab\\x0dc\\x1b[2J\\u2028d\\x85"
    assert escape("tab\tstays") == "tab\tstays"
    assert escape("x" * 50, 10) == "x" * 10 + "...[40 more]"


def test_repeat_limiter() -> None:
    limiter = RepeatLimiter(burst=3, window=1.0)
    allowed = [limiter.allow("bad", 100.0 + i * 0.01) for i in range(10)]
    assert allowed == [True] * 3 + [False] * 7
    assert limiter.allow("other", 100.2)  # per kind
    assert limiter.take_suppressed(100.5) == []  # the window is not over
    assert limiter.take_suppressed(101.0) == [("bad", 7, 1.0)]
    assert limiter.take_suppressed(102.0) == []
    assert limiter.allow("bad", 101.5)


def _serve(tmp_path: Path, upstream: FakeUpstream, fmt: str = "text") -> ListeningProcess:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\nlogging: {{format: {fmt}}}\n"
    )
    return ListeningProcess(["serve", "--config", str(config), "--port", "0"])


def _raw(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _settle(process: ListeningProcess, pause: float = 0.5) -> list[str]:
    time.sleep(pause)  # let stderr reach the reader thread
    return list(process.lines)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ListeningProcess]:
    """One proxy process for the text-format tests (its upstream is never called)."""
    tmp_path = tmp_path_factory.mktemp("logs")
    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {{base_url: 'http://127.0.0.1:9'}}\nstate_dir: '{tmp_path}'\n")
    process = ListeningProcess(["serve", "--config", str(config), "--port", "0"])
    yield process
    process.stop()


def test_a_forged_path_stays_on_one_escaped_line(served: ListeningProcess) -> None:
    process = served
    before = len(process.lines)
    r = httpx.get(process.url + FORGED)
    assert r.status_code == 404
    new = _settle(process)[before:]
    text = "".join(new)
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text and "\x85" not in text
    assert not any(line.startswith("2026-12-02 18:00:00,000") for line in new)
    access = [line for line in new if "context_proxy.access" in line]
    assert len(access) == 1, new
    assert "/nope\\x0a2026-12-02 18:00:00,000 WARNING context_proxy.app forged\\x1b[2J\\u2028x\\x0d\\x85y 404" in access[0]


MALFORMED = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n",  # TLS to an HTTP port
    b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n",
    b"GET /\x1b[2J\nforged HTTP/1.1\r\n\r\n",
    b"POST /v1/messages HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
]


def test_a_malformed_request_gets_a_400_and_one_log_line(served: ListeningProcess) -> None:
    process = served
    time.sleep(1.1)  # a fresh repeat-limit window
    for raw in MALFORMED:
        before = len(process.lines)
        answer = _raw(process.url, raw)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith((b"HTTP/1.1 400 ", b"HTTP/1.0 400 ")), answer[:200]
        error = orjson.loads(body)
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"].startswith("malformed HTTP request")
        new = _settle(process, 0.3)[before:]
        assert len(new) == 1, new
        assert "malformed request" in new[0] and "Traceback" not in new[0]
        assert "\x1b" not in new[0]


def test_a_flood_of_malformed_requests_is_rate_limited(served: ListeningProcess) -> None:
    process = served
    time.sleep(1.1)  # a fresh repeat-limit window
    before = len(process.lines)
    for _ in range(60):
        _raw(process.url, b"NOT HTTP AT ALL\r\n\r\n")
    deadline = time.monotonic() + 10
    while not any("suppressed" in line for line in process.lines[before:]):
        assert time.monotonic() < deadline, process.lines[before:]
        time.sleep(0.1)
    time.sleep(1.5)  # every window over: every held line reported
    new = process.lines[before:]
    lines = [line for line in new if "malformed request" in line]
    assert len(lines) < 60 and len(lines) >= 5
    summary = [line for line in new if "suppressed" in line]
    suppressed = sum(int(line.split("[edge] ")[1].split()[0]) for line in summary)
    assert len(lines) + suppressed == 60, new


def test_json_log_lines(tmp_path: Path, upstream: FakeUpstream) -> None:
    process = _serve(tmp_path, upstream, "json")
    try:
        httpx.get(process.url + FORGED)
        _raw(process.url, b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n")
        lines = _settle(process)
    finally:
        process.stop()
    entries: list[dict[str, Any]] = [orjson.loads(line) for line in lines]
    for entry in entries:
        assert set(entry) >= {"ts", "level", "logger", "message"}
        assert entry["ts"].endswith("Z")
    assert any(e["logger"] == "context_proxy.runner" and "listening on" in e["message"] for e in entries)
    access = [e for e in entries if e["logger"] == "context_proxy.access"]
    assert access and "\\x0a2026-12-02" in access[0]["message"] and "\x1b" not in access[0]["message"]
    assert any("malformed request" in e["message"] for e in entries)


def _formatted(formatter: logging.Formatter, message: str, *args: Any, exc: BaseException | None = None) -> str:
    record = logging.LogRecord("context_proxy.test", logging.ERROR, __file__, 1, message, args, None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    RedactingFilter().filter(record)  # as ``serve`` installs it
    return formatter.format(record)


def test_text_lines_keep_tracebacks_apart_and_unforgeable() -> None:
    forged = "boom\n2026-12-02 18:00:00,000 WARNING forged\x1b[2J"
    try:
        raise ValueError(forged + " sk-ant-abcdefgh12345")
    except ValueError as err:
        out = _formatted(TextFormatter(), "failed for %s", forged, exc=err)
    first, *rest = out.split("\n")
    assert first.endswith("failed for boom\\x0a2026-12-02 18:00:00,000 WARNING forged\\x1b[2J")
    assert rest and all(line.startswith("    | ") for line in rest), rest
    assert any("Traceback" in line for line in rest)
    assert "\x1b" not in out and "sk-ant-abcdefgh12345" not in out


def test_json_lines_carry_the_traceback_as_a_field() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError as err:
        out = _formatted(JsonFormatter(), "x %s", "a\u2028b", exc=err)
    assert "\n" not in out
    entry = orjson.loads(out)
    assert entry["message"] == "x a\\u2028b"
    assert entry["level"] == "ERROR" and entry["logger"] == "context_proxy.test"
    assert "Traceback" in entry["exc"] and "ValueError: bad\nthing" in entry["exc"]
