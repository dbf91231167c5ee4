"""The proxy's own 502/504 answers carry the ``x-compaction-*`` headers, like every other answer
of the messages routes (the compaction outcome is known before the upstream is called)."""

from __future__ import annotations

import socket
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from tests.upstream import FakeUpstream, Hang, Reset

KEY = "sk-ant-canary-7f3a9c1e5b2d4f60"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
GOOD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
REPORTED = (
    "x-compaction-tokens-before",
    "x-compaction-tokens-after",
    "x-compaction-layers",
    "x-compaction-plan",
    "x-compaction-summary",
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _assert_reported(headers: Any, *, skipped: bool = False) -> None:
    for name in REPORTED:
        assert name in headers, name
    assert int(headers["x-compaction-tokens-before"]) >= (0 if skipped else 1)
    assert headers["x-compaction-summary"] == "skipped"  # a short request needs no summary
    assert headers["x-compaction-layers"] == "none"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_refused_upstream_502_carries_compaction_headers(make_proxy: Any, path: str) -> None:
    proxy = make_proxy(f"http://127.0.0.1:{_closed_port()}")
    r = httpx.post(proxy.url + path, content=orjson.dumps(GOOD), headers=HEADERS, timeout=30)
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "api_error"
    _assert_reported(r.headers)
    assert r.headers["x-compaction-plan"] == "none"


def test_reset_upstream_502_carries_compaction_headers_through_the_sdk(
    upstream: FakeUpstream, proxy: Any
) -> None:
    upstream.script(Reset())
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502
    _assert_reported(info.value.response.headers)


def test_timeout_504_carries_compaction_headers(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(upstream={"read_timeout": 0.3})
    upstream.script(Hang())
    r = httpx.post(proxy.url + "/v1/messages", content=orjson.dumps(GOOD), headers=HEADERS, timeout=30)
    assert r.status_code == 504
    _assert_reported(r.headers)


def test_opted_out_request_reports_skipped_on_502(make_proxy: Any) -> None:
    proxy = make_proxy(f"http://127.0.0.1:{_closed_port()}")
    r = httpx.post(
        proxy.url + "/v1/messages",
        content=orjson.dumps(GOOD),
        headers={**HEADERS, "x-compaction": "off"},
        timeout=30,
    )
    assert r.status_code == 502
    _assert_reported(r.headers, skipped=True)
    assert r.headers["x-compaction-tokens-before"] == "0"
