"""When the proxy offers ``context_proxy_retrieve`` (issue 25, item 6): on the forwarded body that
first names a pointer the model can redeem, never a request later, and from then on with the
same bytes, so ``tools`` changes once per conversation, together with the messages.

The bug: a view ending with a ``role: "system"`` entry was taken for one that does not ask for a
new turn, so it named pointers without the tool. Claude Code 2.1.197 on its default model
appends such an entry after the newest user turn whenever a turn brings new context (a
mid-conversation system message: its ``api_system`` messages, sent as ``role: "system"``; seen
on its first request and on a subagent's second); when that request was the first compacted one,
the tool came one request late, and a subagent ending there never got it. The provider's rule the
proxy relies on: "Claude Opus 4.8 accepts role: "system" messages immediately after a user turn
in the messages array" (platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-8;
"Mid-conversation system messages", platform.claude.com/docs/en/build-with-claude/
mid-conversation-system-messages): such an entry belongs to the user turn before it, and the
model answers with a new assistant turn, which the retrieval loop extends like any other. A
prefill (the last message that is not a system entry is the assistant's) is continued, not
extended: no tool there.

Everything goes through a real proxy and the fake upstream; what is asserted is what the upstream
received (the ``tools`` member's bytes, the messages) and what the client got.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from typing import Any

import httpx2 as httpx
import msgspec
import orjson
import pytest
from anthropic import AnthropicBedrock
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.compaction.retrieval import TOOL, TOOL_JSON, TOOL_NAME
from proxy.core.compaction.truncate import artifact_pointer
from proxy.server.appkeys import DURABLE, STORE, TENANCY
from proxy.sources.policy import SourcePolicy
from tests.harness import LoopThread, ProxyServer
from tests.strategies import Conversation, as_claude_code_sends, conversations
from tests.test_claude_code import _strip_cache_control
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-offer-test-1"
SUMMARY_MODEL = "summary-model"
TOOLS: list[dict[str, Any]] = [
    {"name": "Bash", "description": "run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
]
BIG = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
# what Claude Code 2.1.197 appends after the newest user turn (an ``api_system`` message)
SYSTEM_ENTRY = {"role": "system", "content": "Available agent types for the Agent tool:\n- claude: Catch-all."}
POINTER = re.compile(
    r"transcript:[A-Za-z0-9._-]+(?::[A-Za-z0-9._-]+)?:\d+|artifact:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[0-9a-f]{64}"
)
_sessions = itertools.count(1)


# -- what a forwarded body says -------------------------------------------------------------------


def tools_bytes(body: bytes) -> bytes:
    """The ``tools`` member exactly as forwarded (``b""`` without one)."""
    members = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    raw = members.get("tools")
    return bytes(raw) if raw is not None else b""


def offers_tool(body: dict[str, Any]) -> bool:
    tools = body.get("tools") or []
    return bool(tools) and tools[-1] == TOOL


def named_pointers(body: dict[str, Any]) -> list[str]:
    """The pointers a forwarded view names in its messages (bridges, truncation markers)."""
    return sorted(set(POINTER.findall(orjson.dumps(body.get("messages", [])).decode())))


def _sources(proxy: ProxyServer) -> SourcePolicy:
    default = proxy.app[TENANCY].current.default
    assert default is not None
    return default.sources


def redeemable(proxy: ProxyServer, loop_thread: LoopThread, session: str, pointers: list[str]) -> list[str]:
    """Those of ``pointers`` the retrieval tool can read for ``session`` (the checks its calls
    go through: grammar, the tenant's policy, the store or the artifact root)."""
    if not pointers:
        return []
    checks = proxy.app[DURABLE].checks
    found = loop_thread.run(checks.resolve_many("default", _sources(proxy), pointers, session=session))
    return [p for p, r in zip(pointers, found, strict=True) if r.status == "available"]


def _post(proxy: ProxyServer, session: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(timeout=30, trust_env=False) as http:
        return http.post(
            f"{proxy.url}/v1/messages",
            content=orjson.dumps(body),
            headers={"x-api-key": KEY, "x-session-id": session, "content-type": "application/json", "anthropic-version": "2023-06-01"},
        )


def _forwarded(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL]


def _summaries(req: RecordedRequest) -> Reply:
    """The provider: a summary for the proxy's summary calls, a short answer otherwise."""
    if req.json().get("model") == SUMMARY_MODEL:
        return Reply(message_json("Summary: the work so far.", model=SUMMARY_MODEL))
    return Reply(message_json("ok"))


# -- a view that ends with a mid-conversation system message --------------------------------------


CUT = {"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200}


def _cut_conversation(session: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": BIG}]},
        {"role": "assistant", "content": "It is long."},
        {"role": "user", "content": "what failed?"},
        SYSTEM_ENTRY,
    ]


def test_a_view_ending_with_a_system_message_carries_the_tool_and_the_loop_extends_it(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    proxy = make_proxy(compaction=CUT)
    session = "offer-sys"
    messages = _cut_conversation(session)
    pointer = artifact_pointer(session, BIG)
    call = {"type": "tool_use", "id": "toolu_r1", "name": TOOL_NAME, "input": {"pointer": pointer}}
    upstream.script(
        Reply(message_json(content=[call], stop_reason="tool_use")),
        Reply(message_json("Line 399 failed.")),
    )
    r = _post(proxy, session, {"model": "m", "max_tokens": 50, "messages": messages, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert [b["text"] for b in r.json()["content"]] == ["Line 399 failed."]  # one answer
    assert r.headers["x-compaction-retrievals"] == "1"
    first, second = _forwarded(upstream)
    sent = first.json()
    assert pointer in named_pointers(sent)
    assert tools_bytes(first.body) == orjson.dumps(TOOLS)[:-1] + b"," + TOOL_JSON + b"]"
    assert sent["messages"][-1] == SYSTEM_ENTRY  # the client's entry, where it put it
    # the hidden round extends the view after the system entry: a new assistant turn, then ours
    extended = second.json()["messages"]
    assert extended[:-2] == sent["messages"]
    assert extended[-2] == {"role": "assistant", "content": [call]}
    assert extended[-1]["content"][0]["content"] == [{"type": "text", "text": BIG}]
    assert tools_bytes(second.body) == tools_bytes(first.body)


@pytest.mark.parametrize(
    "tail",
    [
        [{"role": "assistant", "content": "The failure is"}],
        [SYSTEM_ENTRY, {"role": "assistant", "content": "The failure is"}],
    ],
    ids=["prefill", "system-then-prefill"],
)
def test_a_prefill_naming_a_pointer_is_continued_without_the_tool(
    upstream: FakeUpstream, make_proxy: Any, tail: list[dict[str, Any]]
) -> None:
    proxy = make_proxy(compaction=CUT)
    session = "offer-prefill"
    messages = [*_cut_conversation(session)[:-1], *tail]
    r = _post(proxy, session, {"model": "m", "max_tokens": 50, "messages": messages, "tools": TOOLS})
    assert r.status_code == 200 and r.headers["x-compaction-layers"] != "none"
    sent = _forwarded(upstream)[-1]
    assert named_pointers(sent.json())  # the view names the artifact...
    assert tools_bytes(sent.body) == orjson.dumps(TOOLS)  # ...but a prefill gets no tool
    assert "x-compaction-retrievals" not in r.headers


# -- the bridge: the request that introduces it carries the tool ----------------------------------


def _turns(n: int) -> list[dict[str, Any]]:
    """A tool loop of ``n`` turns whose results are large, each user turn followed by a system
    entry, as Claude Code sends them (the entry after the newest user turn is the last message)."""
    filler = "words " * 400
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start the work"}, SYSTEM_ENTRY]
    for i in range(n):
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_s{i}", "name": "Bash", "input": {"command": f"step {i}"}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_s{i}", "content": f"out {i} {filler}"}]})
        messages.append({"role": "system", "content": f"reminder {i}"})
    return messages


def _requests(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The bodies a client sends turn by turn: every prefix that ends right before an answer,
    and the whole conversation."""
    ends = [k for k in range(1, len(messages)) if messages[k]["role"] == "assistant"]
    return [messages[:k] for k in [*ends, len(messages)]]


def test_the_request_that_introduces_the_bridge_carries_the_tool_and_tools_change_once(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(compaction={"threshold": 2500, "hard_limit": 100_000, "keep_recent": 2, "tool_result_cap": 100_000, "summary": {"model": SUMMARY_MODEL}})
    upstream.script(*[_summaries] * 40)
    session = "offer-bridge"
    for messages in _requests(_turns(8)):
        r = _post(proxy, session, {"model": "m", "max_tokens": 20, "messages": messages, "tools": TOOLS})
        assert r.status_code == 200, r.text
    forwarded = _forwarded(upstream)
    named = [bool(named_pointers(r.json())) for r in forwarded]
    first = named.index(True)
    assert forwarded[first].json()["messages"][-1]["role"] == "system"  # the case that was late
    assert "transcript:" in " ".join(named_pointers(forwarded[first].json()))
    assert [offers_tool(r.json()) for r in forwarded] == named  # with a pointer, never without
    assert all(named[first:])
    # tools changed once, with the messages: one byte string from the first compaction on
    assert len({tools_bytes(r.body) for r in forwarded[first:]}) == 1
    assert len({tools_bytes(r.body) for r in forwarded}) == 2
    for request in forwarded[first:]:
        pointers = named_pointers(request.json())
        assert redeemable(proxy, loop_thread, session, pointers) == pointers


def test_the_tool_stays_when_a_later_compaction_drops_the_only_pointer(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    """The read whose result L1 cut (its marker the view's only pointer) is read again; a later
    compaction drops the superseded read (L2: nothing of it is lost, the newer read has the
    file). The view then names no pointer, but the tool stays with the same bytes: taking it
    away would change ``tools`` a second time, and rewrite the whole cached prefix for nothing."""
    proxy = make_proxy(compaction={"threshold": 1500, "target_ratio": 0.9, "hard_limit": 100_000, "keep_recent": 1, "tool_result_cap": 600})
    session = "offer-superseded"
    tools = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}]
    read = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a1", "name": "Read", "input": {"file_path": "/repo/a.log"}}]}
    again = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a2", "name": "Read", "input": {"file_path": "/repo/a.log"}}]}
    turns: list[list[dict[str, Any]]] = [
        [
            {"role": "user", "content": "read a.log"},
            read,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a1", "content": BIG}]},
            {"role": "assistant", "content": "It is long."},
            {"role": "user", "content": "read it again"},
        ],
        [again, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a2", "content": "a.log is short now"}]}],
        [{"role": "assistant", "content": "Noted: " + "words " * 850}, {"role": "user", "content": "and now?"}],
    ]
    messages: list[dict[str, Any]] = []
    layers = []
    for turn in turns:
        messages = [*messages, *turn]
        r = _post(proxy, session, {"model": "m", "max_tokens": 20, "messages": messages, "tools": tools})
        assert r.status_code == 200, r.text
        layers.append((r.headers["x-compaction-layers"], r.headers["x-compaction-plan"]))
    first, second, third = _forwarded(upstream)
    assert layers == [("truncate", "new"), ("truncate", "reused"), ("truncate,dedup", "new")], layers
    assert named_pointers(first.json()) == [artifact_pointer(session, BIG)]
    assert named_pointers(third.json()) == []  # the superseded read went, and its marker with it
    assert "toolu_a1" not in third.body.decode()
    assert offers_tool(third.json())
    assert tools_bytes(first.body) == tools_bytes(second.body) == tools_bytes(third.body)


def test_the_removed_turns_are_named_on_the_first_compacted_request_while_the_recorder_is_behind(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    """The recorder writes in the background; the request that first removes turns names them
    only once what was queued for its conversation is stored (``DurableContext.settled``), so a
    store that is behind delays that one request, never the tool: the bridge names the events
    and the body carries the tool. (A first run of the same turns, another session, says which
    request compacts first.)"""
    proxy = make_proxy(compaction={"threshold": 2500, "hard_limit": 100_000, "keep_recent": 2, "tool_result_cap": 100_000, "summary": {"model": SUMMARY_MODEL}})
    upstream.script(*[_summaries] * 80)
    requests = _requests(_turns(8))
    first = 0
    while True:  # the request that first names a pointer, on a store that keeps up
        _post(proxy, "offer-ahead", {"model": "m", "max_tokens": 20, "messages": requests[first], "tools": TOOLS})
        if named_pointers(_forwarded(upstream)[-1].json()):
            break
        first += 1
    store = proxy.app[STORE]
    original = store.record_transcript
    gate = asyncio.Event()

    async def behind(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await original(*args, **kwargs)

    session = "offer-behind"
    store.record_transcript = behind  # type: ignore[method-assign]
    try:
        for messages in requests[:first]:  # answered while their records wait in the queue
            _post(proxy, session, {"model": "m", "max_tokens": 20, "messages": messages, "tools": TOOLS})
        assert loop_thread.run(original.__self__.transcript_events("default", session)) == ()
        loop_thread.loop.call_soon_threadsafe(loop_thread.loop.call_later, 1.0, gate.set)
        started = time.monotonic()
        r = _post(proxy, session, {"model": "m", "max_tokens": 20, "messages": requests[first], "tools": TOOLS})
        waited = time.monotonic() - started
    finally:
        store.record_transcript = original  # type: ignore[method-assign]
        loop_thread.loop.call_soon_threadsafe(gate.set)
    assert r.status_code == 200 and waited >= 1.0  # it waited for the store to catch up...
    sent = _forwarded(upstream)[-1].json()
    pointers = named_pointers(sent)  # ...and named the removed turns
    assert pointers and all(p.startswith(f"transcript:{session}:") for p in pointers)
    assert offers_tool(sent)
    assert redeemable(proxy, loop_thread, session, pointers) == pointers


# -- a Bedrock-format client ----------------------------------------------------------------------


def test_a_bedrock_client_is_offered_the_tool_on_its_first_compacted_request(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    """InvokeModel through the official ``AnthropicBedrock`` client (the body without ``model``
    and ``stream``, ``anthropic_version`` inside): the same rule after the client format is
    decoded (code.claude.com/docs/en/llm-gateway-protocol)."""
    proxy = make_proxy(compaction={"threshold": 2500, "hard_limit": 100_000, "keep_recent": 2, "tool_result_cap": 100_000, "summary": {"model": SUMMARY_MODEL}})
    upstream.script(*[_summaries] * 40)
    client = AnthropicBedrock(
        base_url=proxy.url, api_key=KEY, aws_region="us-east-1", max_retries=0,
        default_headers={"x-session-id": "offer-bedrock"},
    )
    conversation = [m for m in _turns(8) if m["role"] != "system"]  # not on Bedrock (the docs)
    for messages in _requests(conversation):
        client.messages.create(
            model="us.anthropic.claude-sonnet-4-5-20250929-v1:0", max_tokens=20, messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
        )
    forwarded = _forwarded(upstream)
    named = [bool(named_pointers(r.json())) for r in forwarded]
    assert True in named
    first = named.index(True)
    assert [offers_tool(r.json()) for r in forwarded] == named
    assert len({tools_bytes(r.body) for r in forwarded[first:]}) == 1


# -- the property, over generated conversations ---------------------------------------------------


@pytest.mark.timeout(900)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(
    conv=conversations(min_turns=3, max_turns=9),
    every_turn=st.booleans(),
    cap=st.sampled_from([300, 100_000]),
)
def test_every_view_naming_a_redeemable_pointer_carries_the_tool_from_the_first_on(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, conv: Conversation, every_turn: bool, cap: int
) -> None:
    """Any valid conversation sent turn by turn (each request ends right before an answer, so a
    ``role: "system"`` entry there is its last message, as Claude Code sends it), with tool
    results cut (``cap`` 300) or not (bridges only): a forwarded view names only pointers the
    tool can redeem; the tool is carried from the first view that names one on, never before,
    in one byte string (also when a later compaction dropped the read whose cut result was the
    only pointer: ``tools`` changes once); and while a plan is reused, the cached prefix
    (``tools``, ``system``, the earlier messages) is the previous request's."""
    proxy = _property_proxy(make_proxy, cap)
    session = f"offer-prop-{next(_sessions)}"
    messages = as_claude_code_sends(conv.messages, every_turn)
    upstream.script(*[_summaries] * 200)
    bodies: list[tuple[RecordedRequest, dict[str, str]]] = []
    for sent in _requests(messages):
        body: dict[str, Any] = {"model": "m", "max_tokens": 20, "messages": sent, "tools": conv.tools}
        if conv.system is not None:
            body["system"] = conv.system
        before = len(upstream.requests)
        r = _post(proxy, session, body)
        assert r.status_code == 200, r.text
        mine = [q for q in upstream.requests[before:] if q.json().get("model") != SUMMARY_MODEL]
        bodies.append((mine[0], dict(r.headers)))
    upstream._script.clear()
    first: int | None = None
    for k, (request, headers) in enumerate(bodies):
        view = request.json()
        pointers = named_pointers(view)
        assert redeemable(proxy, loop_thread, session, pointers) == pointers, k
        if pointers and first is None:
            first = k
            event(f"first view with a pointer ends with a {view['messages'][-1]['role']} message")
        event(f"cap {cap} layers {headers.get('x-compaction-layers')}")
        if any(p.startswith("transcript:") for p in pointers):
            event("a view names transcript events")
        # from the first view with a pointer on (never before), the tool, in one byte string
        assert offers_tool(view) == (first is not None), _story(bodies)
        if first is not None:
            assert tools_bytes(request.body) == tools_bytes(bodies[first][0].body), k
        if k and headers.get("x-compaction-plan") == "reused":
            previous = bodies[k - 1][0].json()
            assert tools_bytes(request.body) == tools_bytes(bodies[k - 1][0].body)
            assert _strip_cache_control(view.get("system")) == _strip_cache_control(previous.get("system"))
            kept = _strip_cache_control(previous["messages"])
            assert _strip_cache_control(view["messages"][: len(kept)]) == kept, k


def _story(bodies: list[tuple[RecordedRequest, dict[str, str]]]) -> str:
    lines = []
    for k, (request, headers) in enumerate(bodies):
        view = request.json()
        lines.append(
            f"{k}: {headers.get('x-compaction-layers')} plan={headers.get('x-compaction-plan')}"
            f" messages={len(view['messages'])} pointers={named_pointers(view)}"
            f" text={orjson.dumps(view['messages']).decode()[:3000]}"
        )
    return "\n".join(lines)


_PROXIES: dict[tuple[Any, int], ProxyServer] = {}


def _property_proxy(make_proxy: Any, cap: int) -> ProxyServer:
    """One proxy per test run (hypothesis calls the test many times with one fixture value):
    a low threshold, a small cap and a summary model, so that conversations compact early and
    in every layer; every example is its own session (plans, transcripts, artifacts apart)."""
    if not any(factory is make_proxy for factory, _ in _PROXIES):
        _PROXIES.clear()  # a new test run: the earlier proxies are stopped
    if (make_proxy, cap) not in _PROXIES:
        _PROXIES[make_proxy, cap] = make_proxy(
            compaction={
                "threshold": 1000,
                "hard_limit": 1_000_000,
                "keep_recent": 2,
                "tool_result_cap": cap,
                "summary": {"model": SUMMARY_MODEL},
            }
        )
    return _PROXIES[make_proxy, cap]
