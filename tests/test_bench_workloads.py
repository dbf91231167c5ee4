"""The bench's request builders (bench/workloads.py, bench/bench_proxy.py's rows): every body is a
valid request, every JSON style parses to the same value, every pass of the session is a fresh
conversation, the cold rows never re-use a credential, and the bench's fake upstream answers a
target that does not forward ``x-bench-mode`` (a peer) like the provider. No timings here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from bench import workloads
from bench.bench_proxy import build_workloads, parse_args
from bench.servers import BenchUpstream
from proxy.core.protocol import validate_request


@pytest.fixture(scope="module")
def pass_a() -> list[dict[str, Any]]:
    return workloads.session_requests("[pass 0]")


def test_session_requests_are_valid_and_laid_out_like_claude_code(pass_a: list[dict[str, Any]]) -> None:
    messages, _tools = workloads.session()
    assert len(pass_a) == workloads.session_turns() == sum(m["role"] == "user" for m in messages) == 108
    for k, req in enumerate(pass_a):
        assert validate_request(req) is None, k
        assert list(req) == ["model", "messages", "system", "tools", "metadata", "max_tokens"]
        assert "stream" not in req
        assert req["messages"][-1]["role"] == "user"
        marked = [(i, j) for i, m in enumerate(req["messages"]) if isinstance(m["content"], list)
                  for j, b in enumerate(m["content"]) if "cache_control" in b]
        # the breakpoint is on the last block of the last message only: it moves every turn
        assert marked == [(len(req["messages"]) - 1, len(req["messages"][-1]["content"]) - 1)]
    assert [len(r["messages"]) for r in pass_a] == sorted({len(r["messages"]) for r in pass_a})
    # the client's conversation is not changed by the builders (the session is read once)
    assert all("cache_control" not in str(m) for m in workloads.session()[0])


@pytest.mark.parametrize("style", sorted(workloads.STYLES))
def test_every_style_parses_to_the_same_value(pass_a: list[dict[str, Any]], style: str) -> None:
    for req in (pass_a[0], pass_a[40], pass_a[-1], orjson.loads(workloads.body_1k())):
        raw = workloads.encode(req, style)
        assert orjson.loads(raw) == orjson.loads(orjson.dumps(req))
        if style != "compact" and not (style == "ascii" and raw.isascii()):
            assert raw != orjson.dumps(req)  # other bytes, the same value


def test_the_styles_are_what_their_names_say(pass_a: list[dict[str, Any]]) -> None:
    req = pass_a[-1]
    enc = {s: workloads.encode(req, s) for s in workloads.STYLES}
    assert b'", "' not in enc["compact"] and b'", "' in enc["spaced"]
    assert any(b > 127 for b in enc["compact"])  # the session has non-ASCII text
    assert all(b < 128 for s in ("spaced", "ascii", "sorted", "indent") for b in enc[s])
    assert b'":' in enc["ascii"] and b'", "' not in enc["ascii"]
    assert enc["sorted"].startswith(b'{"max_tokens": ')  # keys reordered
    assert b'\n  "model": ' in enc["indent"]


def test_each_pass_is_a_fresh_conversation(pass_a: list[dict[str, Any]]) -> None:
    pass_b = workloads.session_requests("[pass 1]")
    assert len(pass_b) == len(pass_a)
    last_a, last_b = pass_a[-1], pass_b[-1]
    assert validate_request(last_b) is None
    # no message of one pass equals the same message of the other: no prefix, no block in common
    for ma, mb in zip(last_a["messages"], last_b["messages"], strict=True):
        assert ma["role"] == mb["role"]
        assert ma != mb
    assert last_a["metadata"] != last_b["metadata"]  # another session id
    assert orjson.dumps(last_a["messages"][0]) != orjson.dumps(last_b["messages"][0])
    # the same conversation otherwise: the tag is the only change
    text_a = orjson.dumps(last_a["messages"]).decode().replace("[pass 0] ", "").replace("_pass-0", "")
    assert text_a == orjson.dumps(last_b["messages"]).decode().replace("[pass 1] ", "").replace("_pass-1", "")
    untagged = orjson.dumps(workloads.with_breakpoint(list(workloads.session()[0][:-1])))
    assert text_a.encode() == untagged


def test_the_1k_bodies() -> None:
    for raw, stream in ((workloads.body_1k(), False), (workloads.sse_body_1k(), True)):
        body = orjson.loads(raw)
        assert validate_request(body) is None
        assert len(raw) == 1024
        assert body.get("stream", False) is stream


def test_cold_rows_send_the_same_bytes_with_a_fresh_key_each_time() -> None:
    args = parse_args(["--quick", "--only", "cold,json_500k,json_500k_resend", "--styles", "compact,spaced"])
    rows = {w.name: w for w in build_workloads(args)}
    assert set(rows) == {"cold_compact", "cold_spaced", "json_500k", "json_500k_resend"}
    keys: set[str] = set()
    for name in ("cold_compact", "cold_spaced", "json_500k"):
        sent = [rows[name].request(i) for i in range(4)] + [rows[name].warm(0)]
        assert len({body for body, _ in sent}) == 1
        keys |= {h["x-api-key"] for _, h in sent}
        assert validate_request(orjson.loads(sent[0][0])) is None
    assert len(keys) == 15  # never the same credential twice, across rows too
    resend = {rows["json_500k_resend"].request(i)[1]["x-api-key"] for i in range(3)}
    assert len(resend) == 1  # the exact re-send keeps its credential
    # the cold rows send the session's last turn (each row its own conversation: its own plan)
    last = orjson.loads(rows["cold_spaced"].request(0)[0])
    assert last == workloads.last_turn("[cold_spaced]")
    assert len(last["messages"]) == len(workloads.session()[0]) - 1


def test_session_rows_walk_the_passes_in_order() -> None:
    args = parse_args(["--quick", "--passes", "2", "--only", "session_ascii,session_compact_off",
                       "--styles", "ascii"])
    rows = {w.name: w for w in build_workloads(args)}
    assert set(rows) == {"session_ascii", "session_compact_off"}
    row = rows["session_ascii"]
    n = workloads.session_turns()
    assert row.n == 2 * n and row.goal == 1.5
    first, second, warm = row.request(0)[0], row.request(n)[0], row.warm(0)[0]
    assert first != second != warm != first
    assert orjson.loads(first)["messages"][0]["content"][0]["text"].startswith("[session_ascii pass 0] ")
    assert orjson.loads(second)["messages"][0]["content"][0]["text"].startswith("[session_ascii pass 1] ")
    assert len(orjson.loads(row.request(n - 1)[0])["messages"]) == len(workloads.session()[0]) - 1
    assert rows["session_compact_off"].request(0)[1]["x-compaction"] == "off"
    assert rows["session_compact_off"].goal is None


@pytest.fixture
async def bench_upstream() -> AsyncIterator[BenchUpstream]:
    up = BenchUpstream()
    await up.start()
    yield up
    await up.stop()


async def test_fake_upstream_answers_a_target_that_drops_the_bench_header(bench_upstream: BenchUpstream) -> None:
    json_body = workloads.body_1k()
    sse_body = workloads.encode(orjson.loads(workloads.sse_body_1k()), "spaced")  # "stream": true
    headers = {"content-type": "application/json", "x-api-key": "sk-ant-test"}
    async with aiohttp.ClientSession() as s:
        async with s.post(bench_upstream.url + "/v1/messages", data=json_body, headers=headers) as r:
            assert r.status == 200
            assert (await r.read()).startswith(b'{"id":"msg_')
        async with s.post(bench_upstream.url + "/v1/messages", data=sse_body, headers=headers) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            data = await r.read()
            assert data == b"".join(bench_upstream.sse_200)
