"""Through the proxy: a conversation re-sent turn after turn is forwarded exactly as a proxy that
parses (validates, hashes) every body from scratch forwards it.

Two proxies get the same requests: one that remembers every body (re-sent histories are not
parsed again, see ``proxy.core.reparse``; as shipped it does so from 64 KiB on), one whose memo
never remembers a body. The upstream must receive the same
bytes from both, the client the same status, headers and error texts -- compaction plans, reused
views, opted-out requests, broken requests and the token-counting route included.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.core.reparse import BodyMemo
from proxy.server.exchange.stages.validate import BODIES
from tests.harness import ProxyServer
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-reparse-test-000111"
SUMMARY_MODEL = "claude-summary-test"
COMPACTION = {"threshold": 6_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}
TOOLS = [
    {"name": "Read", "description": "Reads a file. " * 40, "input_schema": {"type": "object"}},
    {"name": "Bash", "description": "Runs a command. " * 40, "input_schema": {"type": "object"}},
]


def step(i: int) -> list[dict[str, Any]]:
    """One agent step: a Read call and its (big, unique) result."""
    tool_id = f"toolu_{i:04d}"
    lines = "".join(
        f"{n:5}\u2192line {n} of file {i}: value = compute({n}, {i})\n" for n in range(60)
    )
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Reading file {i}."},
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": "Read",
                    "input": {"path": f"/r/{i}.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": lines}],
        },
    ]


STYLES = {
    "compact": orjson.dumps,  # as Claude Code writes
    "spaced": lambda value: json.dumps(value).encode(),  # Python's defaults: ", ", ": ", \\u
    "indented": lambda value: json.dumps(value, indent=2, sort_keys=True).encode(),
}


def body(messages: list[dict[str, Any]], style: str = "compact", **extra: Any) -> bytes:
    """Claude Code's members and its breakpoint on the last block of the last message, written
    in ``style``."""
    last = messages[-1]
    marked = {
        **last,
        "content": [
            *last["content"][:-1],
            {**last["content"][-1], "cache_control": {"type": "ephemeral"}},
        ],
    }
    return STYLES[style](
        {
            "model": "claude-fake-1",
            "messages": [*messages[:-1], marked],
            "system": "be brief",
            "tools": TOOLS,
            "max_tokens": 100,
            **extra,
        }
    )


def _answer(request: RecordedRequest) -> Reply:
    if request.json().get("model") == SUMMARY_MODEL:
        return Reply(message_json("SUMMARY: reading files one by one; all values computed."))
    return Reply(message_json("ok"))


@pytest.fixture
def proxies(upstream: FakeUpstream, make_proxy: Any) -> tuple[ProxyServer, ProxyServer]:
    upstream.script(_answer)
    remembering = make_proxy(compaction=COMPACTION)
    remembering.app[BODIES].min_bytes = 0  # small bodies too (the test's are 5-90 KiB)
    scratch = make_proxy(compaction=COMPACTION)
    scratch.app[BODIES].min_bytes = 1 << 40  # parses everything, every time
    return remembering, scratch


def send(
    upstream: FakeUpstream,
    proxy: ProxyServer,
    data: bytes,
    path: str = "/v1/messages",
    **headers: str,
) -> tuple[httpx.Response, bytes | None]:
    before = len(upstream.requests)
    response = httpx.post(
        proxy.url + path,
        content=data,
        headers={"x-api-key": KEY, "content-type": "application/json", **headers},
    )
    forwarded = [
        r.body
        for r in upstream.requests[before:]
        if r.path == path and orjson.loads(r.body).get("model") != SUMMARY_MODEL
    ]
    return response, forwarded[-1] if forwarded else None


def compare(
    upstream: FakeUpstream, proxies: tuple[ProxyServer, ProxyServer], data: bytes, **kw: Any
) -> httpx.Response:
    shipped, scratch = proxies
    got, got_body = send(upstream, shipped, data, **kw)
    want, want_body = send(upstream, scratch, data, **kw)
    assert got.status_code == want.status_code
    assert got_body == want_body
    if got.status_code != 200:  # the proxy's own answer (request ids differ)
        assert got.json()["error"] == want.json()["error"]
    for name in (
        "x-compaction-tokens-before",
        "x-compaction-tokens-after",
        "x-compaction-layers",
        "x-compaction-plan",
        "x-compaction-id",
    ):
        assert got.headers.get(name) == want.headers.get(name), name
    return got


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_conversation_is_forwarded_as_if_every_body_were_parsed_afresh(
    upstream: FakeUpstream, proxies: tuple[ProxyServer, ProxyServer], style: str
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Read the files. " * 200}]}
    ]
    plans: list[str] = []
    for i in range(24):
        messages += step(i)
        response = compare(upstream, proxies, body(messages, style))
        plans.append(response.headers["x-compaction-plan"])
        if i % 5 == 2:  # the same turn opted out, as another client would send it
            compare(
                upstream,
                proxies,
                body(messages, style, metadata={"user_id": "other"}),
                **{"x-compaction": "off"},
            )
        if i % 7 == 3:
            compare(upstream, proxies, body(messages, style), path="/v1/messages/count_tokens")
    assert "new" in plans and "reused" in plans  # compaction happened, then its plan was reused
    memo: BodyMemo = proxies[0].app[BODIES]
    assert memo.hits >= 20
    assert len(proxies[1].app[BODIES]) == 0


@pytest.mark.parametrize("style", ["compact", "spaced"])
def test_broken_turns_are_refused_alike_and_the_conversation_goes_on(
    upstream: FakeUpstream, proxies: tuple[ProxyServer, ProxyServer], style: str
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Go. " * 800}]}
    ]
    for i in range(6):
        messages += step(i)
        compare(upstream, proxies, body(messages, style))
    # a result for a call that was never made, a dropped result, then bad JSON in the new part
    stray = [
        *messages,
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}],
        },
    ]
    assert compare(upstream, proxies, body(stray, style)).status_code == 400
    dropped = [
        *messages,
        *step(6)[:1],
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
    ]
    assert compare(upstream, proxies, body(dropped, style)).status_code == 400
    # a new message nested one level deeper than the bound (the body is level 1; the tool
    # input at 6, its "v" at 7): the same 400, naming the same path
    call = step(6)
    deep: Any = "bottom"
    for _ in range(129 - 6):
        deep = [deep]
    call[0]["content"][1]["input"] = {"v": deep}
    refused = compare(upstream, proxies, body([*messages, *call], style))
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("messages.13.content.1.input.v.0.0....(120 more): JSON nested deeper")
    good = body([*messages, *step(6)], style)
    at = good.index(b'"/r/6.py"')
    bad = good[: good.index(b"}", at)] + b",}" + good[good.index(b"}", at) + 1 :]
    assert bad != good
    assert compare(upstream, proxies, bad).status_code == 400
    assert compare(upstream, proxies, good[:-40]).status_code == 400
    messages += step(6)
    assert compare(upstream, proxies, body(messages, style)).status_code == 200
    assert proxies[0].app[BODIES].hits >= 6


def test_another_clients_remembered_bodies_are_never_continued(
    upstream: FakeUpstream, proxies: tuple[ProxyServer, ProxyServer]
) -> None:
    """Without tenant policies every client is the default tenant: a body remembered for one
    credential is not continued for another (no shared objects, no timing to probe)."""
    remembering, _ = proxies
    memo: BodyMemo = remembering.app[BODIES]
    messages = [{"role": "user", "content": [{"type": "text", "text": "start"}]}]
    for i in range(3):
        messages += step(i)
    send(upstream, remembering, body(messages))
    assert send(upstream, remembering, body(messages))[0].status_code == 200
    hits = memo.hits
    other, forwarded = send(upstream, remembering, body(messages), **{"x-api-key": "sk-ant-another-client"})
    assert other.status_code == 200 and forwarded == body(messages)
    assert memo.hits == hits  # parsed afresh
    send(upstream, remembering, body(messages))  # the first client again: continued
    assert memo.hits == hits + 1
