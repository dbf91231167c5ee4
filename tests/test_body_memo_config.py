"""``limits.body_memo_bytes``: how much body text the memo keeps (0: none); the answers and the
forwarded bytes are the same either way."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.config.schema import ConfigError
from proxy.config.settings import parse_config
from proxy.server.exchange.stages.validate import BODIES
from tests.upstream import FakeUpstream

KEY = "sk-ant-memo-config-test-000111"


def _turn(n: int) -> bytes:
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i} " + "x" * 20_000})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "next?"})
    body = {"model": "claude-fake-1", "max_tokens": 16, "messages": messages}
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)  # a style of its own, > 64 KiB


@pytest.mark.parametrize("memo_bytes, reused", [(16 << 20, True), (0, False)])
def test_the_memo_bound_decides_whether_a_history_is_reused(
    upstream: FakeUpstream, make_proxy: Any, memo_bytes: int, reused: bool
) -> None:
    proxy = make_proxy(limits={"body_memo_bytes": memo_bytes})
    for n in (4, 5, 6):
        raw = _turn(n)
        r = httpx.post(proxy.url + "/v1/messages", content=raw, headers={"x-api-key": KEY})
        assert r.status_code == 200
        assert upstream.requests[-1].body == raw
    memo = proxy.app[BODIES]
    assert (memo.hits == 2) is reused
    assert (len(memo) > 0) is reused


def test_a_negative_memo_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="body_memo_bytes"):
        parse_config({"limits": {"body_memo_bytes": -1}})
