"""The retrieval tool end to end: the official SDK -> the proxy -> the fake upstream, which plays
a model that calls ``context_proxy_retrieve``. Asserts on what the upstream received (the tool's
bytes, the extended view, the tool results) and what the client got (one message)."""

from __future__ import annotations

import os
import re
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from proxy.core.compaction.retrieval import TOOL, TOOL_JSON, TOOL_NAME
from proxy.core.compaction.truncate import artifact_of, artifact_pointer
from proxy.server.appkeys import DURABLE, TENANCY
from proxy.sources.policy import SourcePolicy
from tests.harness import LoopThread, ProxyServer
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    message_stream_events,
)

KEY = "sk-ant-retrieval-test-1"
SESSION = "ret-1"
BIG = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
POINTER = artifact_pointer(SESSION, BIG)
TOOLS: list[dict[str, Any]] = [
    {"name": "Bash", "description": "run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "read the log"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": BIG}]},
    {"role": "assistant", "content": "It is long."},
    {"role": "user", "content": "what failed?"},
]
CUT = {"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200}


def _proxy(make_proxy: Any, **retrieval: Any) -> ProxyServer:
    compaction: dict[str, Any] = dict(CUT)
    if retrieval:
        compaction["retrieval"] = retrieval
    return make_proxy(compaction=compaction)  # type: ignore[no-any-return]


def _client(proxy: ProxyServer, session: str | None = SESSION) -> anthropic.Anthropic:
    headers = {"x-session-id": session} if session else {}
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers=headers)


def _call(pointer: str = POINTER, tool_id: str = "toolu_r1", **more: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": TOOL_NAME, "input": {"pointer": pointer, **more}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _bash(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": "pytest -x"}}


def _round(content: list[dict[str, Any]], stop: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return message_json(content=content, stop_reason=stop, input_tokens=input_tokens, output_tokens=output_tokens)


def _scripted(message: dict[str, Any], stream: bool) -> Reply | Stream:
    return Stream(message_stream_events(message)) if stream else Reply(message)


def platform_rounds() -> list[dict[str, Any]]:
    """What a platform's model answers in the one-round scenario: a call of ours, then the answer."""
    return [
        _round([_text("Let me read the whole log."), _call()], "tool_use", 100, 20),
        _round([_text("The failure is on line 399.")], "end_turn", 7000, 15),
    ]


def one_round_through(proxy: ProxyServer, stream: bool, bodies: Any) -> None:
    """The one-round scenario through a proxy whose platform answers :func:`platform_rounds`:
    the client gets one answer, and the second call's view is the first's plus our round (the
    round's assistant turn, then the verified source). ``bodies()``: what the platform got."""
    sdk = anthropic.Anthropic(
        base_url=proxy.url, api_key="sk-ant-client-key", max_retries=0,
        default_headers={"x-session-id": SESSION},
    )  # fmt: skip
    params: dict[str, Any] = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 100,
                              "messages": MESSAGES, "tools": TOOLS}  # fmt: skip
    if stream:
        with sdk.messages.stream(**params) as s:
            final = s.get_final_message()
    else:
        final = sdk.messages.create(**params)
    assert [b.text for b in final.content] == [  # type: ignore[union-attr]
        "Let me read the whole log.", "The failure is on line 399."
    ]
    assert final.usage.input_tokens == 7100
    first, second = bodies()
    assert second["messages"][:-2] == first["messages"]
    result = second["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == [{"type": "text", "text": BIG}]


def _messages_requests(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages"]


def _ask(client: anthropic.Anthropic, stream: bool, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    """The final message (through the SDK's stream accumulator when streaming) and headers."""
    params: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS, **kwargs}
    if stream:
        with client.messages.stream(**params) as s:
            events = [e.type for e in s]
            final = s.get_final_message()
            headers = dict(s.response.headers)
        assert events.count("message_start") == 1 and events.count("message_stop") == 1
        return final, headers
    raw = client.messages.with_raw_response.create(**params)
    return raw.parse(), dict(raw.headers)


def _raw_stream(proxy: ProxyServer, **kwargs: Any) -> bytes:
    body = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS, "stream": True, **kwargs}
    with httpx.Client(timeout=30) as http:
        r = http.post(
            f"{proxy.url}/v1/messages",
            content=orjson.dumps(body),
            headers={"x-api-key": KEY, "x-session-id": SESSION, "content-type": "application/json", "anthropic-version": "2023-06-01"},
        )
    assert r.status_code == 200
    return r.content


def _tool_result(request: RecordedRequest) -> dict[str, Any]:
    last = request.json()["messages"][-1]
    assert last["role"] == "user"
    block = last["content"][0]
    assert block["type"] == "tool_result"
    return block  # type: ignore[no-any-return]


# -- offering the tool --------------------------------------------------------------------------


def test_the_tool_is_offered_last_with_constant_bytes_once_the_view_names_a_pointer(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    client = _client(proxy)
    r1 = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    assert "truncate" in r1.headers["x-compaction-layers"]
    assert r1.headers["x-compaction-retrievals"] == "0"
    first = _messages_requests(upstream)[-1]
    sent = first.json()
    assert sent["tools"] == [*TOOLS, TOOL]
    assert POINTER in sent["messages"][2]["content"][0]["content"]  # the marker names it
    tools_bytes = orjson.dumps(sent["tools"])
    assert tools_bytes in first.body and tools_bytes.endswith(TOOL_JSON + b"]")

    # the next turns: the same tool bytes at the same place
    later = [*MESSAGES, {"role": "assistant", "content": "Line 399."}, {"role": "user", "content": "thanks"}]
    client.messages.create(model="m", max_tokens=5, messages=later, tools=TOOLS)  # type: ignore[arg-type]
    later2 = [*later, {"role": "assistant", "content": "You are welcome."}, {"role": "user", "content": "and now?"}]
    client.messages.create(model="m", max_tokens=5, messages=later2, tools=TOOLS)  # type: ignore[arg-type]
    bodies = [r.body for r in _messages_requests(upstream)[-3:]]
    positions = [b.index(TOOL_JSON) - b.index(b'"tools":') for b in bodies]
    assert all(tools_bytes in b for b in bodies)
    assert len(set(positions)) == 1
    # and the view before the tool (the cached prefix) is unchanged up to the old last message
    assert bodies[1].startswith(bodies[0][: bodies[0].index(b'"what failed?"')])


def test_never_offered_without_tools_without_a_session_or_without_a_pointer(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    _client(proxy).messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    assert "tools" not in _messages_requests(upstream)[-1].json()
    r = _client(proxy, None).messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    assert _messages_requests(upstream)[-1].json()["tools"] == TOOLS
    assert "x-compaction-retrievals" not in r.headers
    short = [{"role": "user", "content": "hi"}]
    _client(proxy).messages.create(model="m", max_tokens=5, messages=short, tools=TOOLS)  # type: ignore[arg-type]
    assert _messages_requests(upstream)[-1].body == orjson.dumps(
        {"model": "m", "max_tokens": 5, "messages": short, "tools": TOOLS}
    ) or _messages_requests(upstream)[-1].json()["tools"] == TOOLS
    # a client tool of the same name: the client's, untouched, and never intercepted
    theirs = [{**TOOLS[0], "name": TOOL_NAME}]
    _client(proxy).messages.create(model="m", max_tokens=5, messages=MESSAGES, tools=theirs)  # type: ignore[arg-type]
    assert _messages_requests(upstream)[-1].json()["tools"] == theirs


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_retrieval_round_trip_gives_one_answer(upstream: FakeUpstream, make_proxy: Any, stream: bool) -> None:
    proxy = _proxy(make_proxy)
    first = _round([_text("Let me read the whole log."), _call()], "tool_use", 100, 20)
    second = _round([_text("The failure is on line 399.")], "end_turn", 7000, 15)
    upstream.script(_scripted(first, stream), _scripted(second, stream))
    final, headers = _ask(_client(proxy), stream)
    assert [b.type for b in final.content] == ["text", "text"]
    assert [b.text for b in final.content] == ["Let me read the whole log.", "The failure is on line 399."]
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 7100 and final.usage.output_tokens == 35
    assert final.id == first["id"]
    if not stream:
        assert headers["x-compaction-retrievals"] == "1"
    sent = _messages_requests(upstream)
    assert len(sent) == 2
    one, two = sent[0].json(), sent[1].json()
    assert two["messages"][:-2] == one["messages"]
    assert two["tools"] == one["tools"] and two.get("stream") == one.get("stream") == (True if stream else None)
    assert two["messages"][-2] == {"role": "assistant", "content": [_text("Let me read the whole log."), _call()]}
    result = _tool_result(sent[1])
    assert result["tool_use_id"] == "toolu_r1" and "is_error" not in result
    assert result["content"] == [{"type": "text", "text": BIG}]  # exactly the original, whole
    assert sent[1].headers["authorization"] == sent[0].headers["authorization"] == f"Bearer {KEY}"


def test_the_spliced_stream_on_the_wire(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    first = _round([_text("Reading."), _call()], "tool_use", 100, 20)
    second = _round([_text("Found it."), _bash("toolu_c9")], "tool_use", 7000, 15)
    upstream.script(_scripted(first, True), _scripted(second, True))
    body = _raw_stream(proxy)
    names = re.findall(rb"^event: (\w+)$", body, re.M)
    assert names.count(b"message_start") == 1
    assert names.count(b"message_delta") == 1 and names.count(b"message_stop") == 1
    assert names[-2:] == [b"message_delta", b"message_stop"]
    assert TOOL_NAME.encode() not in body
    starts = [orjson.loads(m) for m in re.findall(rb"^data: (\{\"type\":\"content_block_start\".*)$", body, re.M)]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert [s["content_block"]["type"] for s in starts] == ["text", "text", "tool_use"]
    delta = orjson.loads(re.search(rb"^data: (\{\"type\":\"message_delta\".*)$", body, re.M).group(1))  # type: ignore[union-attr]
    assert delta["usage"]["input_tokens"] == 7100 and delta["usage"]["output_tokens"] == 35
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert b"\n: x-compaction-retrievals: 1\n\n" in body


def test_a_stream_without_a_call_is_relayed_byte_for_byte(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    message = _round([_text("Nothing to fetch."), _bash("toolu_c1")], "tool_use", 100, 20)
    events = message_stream_events(message)
    upstream.script(Stream(events))
    assert _raw_stream(proxy) == b"".join(events)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_client_calls_next_to_ours_are_dropped_and_reissued(upstream: FakeUpstream, make_proxy: Any, stream: bool) -> None:
    proxy = _proxy(make_proxy)
    first = _round([_text("Checking."), _bash("toolu_c1"), _call()], "tool_use", 100, 30)
    second = _round([_text("Now run the tests."), _bash("toolu_c2")], "tool_use", 7000, 15)
    upstream.script(_scripted(first, stream), _scripted(second, stream))
    final, _ = _ask(_client(proxy), stream)
    assert [b.type for b in final.content] == ["text", "text", "tool_use"]
    assert final.content[2].id == "toolu_c2" and final.content[2].name == "Bash"
    assert final.content[2].input == {"command": "pytest -x"}
    assert final.stop_reason == "tool_use"
    sent = _messages_requests(upstream)
    assistant = sent[1].json()["messages"][-2]
    assert assistant["content"] == [_text("Checking."), _call()]  # the client's call is not there
    assert [b["tool_use_id"] for b in sent[1].json()["messages"][-1]["content"]] == ["toolu_r1"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_round_limit_ends_the_answer_without_our_call(upstream: FakeUpstream, make_proxy: Any, stream: bool) -> None:
    proxy = _proxy(make_proxy, max_rounds=2)
    rounds = [_round([_text(f"Round {i}."), _call(tool_id=f"toolu_r{i}")], "tool_use", 10, 5) for i in range(3)]
    upstream.script(*[_scripted(m, stream) for m in rounds])
    final, headers = _ask(_client(proxy), stream)
    assert [b.text for b in final.content] == ["Round 0.", "Round 1.", "Round 2."]
    assert final.stop_reason == "end_turn"  # nothing left for the client to run
    assert final.usage.input_tokens == 30 and final.usage.output_tokens == 15
    if not stream:
        assert headers["x-compaction-retrievals"] == "2"
    sent = _messages_requests(upstream)
    assert len(sent) == 3
    last = _tool_result(sent[2])
    assert last["content"][-1]["text"].endswith("that was the last retrieval this turn allows]")


def test_pages_with_offset_and_max_chars(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    first = _round([_call(offset=5000, max_chars=10_000)], "tool_use", 1, 1)
    upstream.script(Reply(first), Reply(message_json("ok")))
    _client(proxy).messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    result = _tool_result(_messages_requests(upstream)[1])
    assert result["content"][0] == {"type": "text", "text": BIG[5000:15000]}
    note = result["content"][1]["text"]
    assert f"characters 5000-15000 of {len(BIG)}" in note and "offset 15000" in note


def test_the_configured_max_chars_bounds_a_page(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy, max_chars=1000)
    upstream.script(Reply(_round([_call(max_chars=50_000)], "tool_use", 1, 1)), Reply(message_json("ok")))
    _client(proxy).messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    result = _tool_result(_messages_requests(upstream)[1])
    assert result["content"][0]["text"] == BIG[:1000]
    assert "offset 1000" in result["content"][1]["text"]


# -- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_input", "says"),
    [
        ({"pointer": artifact_pointer("other-session", BIG)}, "denied"),
        ({"pointer": f"artifact:{SESSION}:tool-result-none.txt:{'0' * 64}"}, "missing"),
        ({"pointer": "artifact:../etc:passwd"}, "corrupt"),
        ({"pointer": f"store:{SESSION}:1"}, "unsupported"),
        ({"pointer": f"transcript:{SESSION}:999"}, "missing"),
        ({"pointer": POINTER, "offset": 10**9}, "past the end"),
        ({"pointer": POINTER, "offset": -1}, "invalid input: input.offset"),
        ({"pointer": POINTER, "max_chars": 0}, "invalid input: input.max_chars"),
        ({}, "invalid input: input.pointer"),
    ],
)
def test_bad_pointers_get_an_error_result_that_says_which(upstream: FakeUpstream, make_proxy: Any, tool_input: dict[str, Any], says: str) -> None:
    proxy = _proxy(make_proxy)
    call = {"type": "tool_use", "id": "toolu_bad", "name": TOOL_NAME, "input": tool_input}
    upstream.script(Reply(_round([call], "tool_use", 1, 1)), Reply(message_json("I could not read it.")))
    reply = _client(proxy).messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    assert [b.type for b in reply.content] == ["text"]
    result = _tool_result(_messages_requests(upstream)[1])
    assert result["is_error"] is True and result["tool_use_id"] == "toolu_bad"
    assert says in result["content"][0]["text"]
    assert BIG[:50] not in orjson.dumps(result).decode()


def _sources(proxy: ProxyServer) -> SourcePolicy:
    default = proxy.app[TENANCY].current.default
    assert default is not None
    return default.sources


def test_a_tampered_artifact_is_corrupt(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    root = _sources(proxy).artifact_root
    assert root is not None
    path = os.path.join(root, SESSION, "tool-results", artifact_of(BIG).name)

    def tamper(_: RecordedRequest) -> Reply:
        with open(path, "wb") as f:
            f.write(b"not what was cut")
        return Reply(_round([_call()], "tool_use", 1, 1))

    upstream.script(tamper, Reply(message_json("ok")))
    _client(proxy).messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    result = _tool_result(_messages_requests(upstream)[1])
    assert result["is_error"] is True and "corrupt" in result["content"][0]["text"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_failed_continuation(upstream: FakeUpstream, make_proxy: Any, stream: bool) -> None:
    proxy = _proxy(make_proxy)
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.script(_scripted(_round([_text("Reading."), _call()], "tool_use", 1, 1), stream), Reply(overloaded, status=529))
    client = _client(proxy)
    if stream:
        body = _raw_stream(proxy)
        assert body.count(b"event: message_start") == 1
        assert body.rstrip().split(b"\n\n")[-1].startswith(b"event: error\ndata: ")
        assert b"overloaded_error" in body and b"message_stop" not in body
    else:
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
        assert info.value.status_code == 529


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_error_answer_to_a_view_that_offers_the_tool_is_relayed_as_it_came(
    upstream: FakeUpstream, make_proxy: Any, stream: bool
) -> None:
    """The provider refuses the first call (429): no round of ours, the client gets the
    provider's status, headers and bytes exactly, with the proxy's report beside them."""
    proxy = _proxy(make_proxy)
    refused = b'{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"},"request_id":"req_up_1"}'
    upstream.script(Reply(refused, status=429, headers={"retry-after": "7"}))
    body = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS, **({"stream": True} if stream else {})}
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        content=orjson.dumps(body),
        headers={"x-api-key": KEY, "x-session-id": SESSION, "content-type": "application/json", "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert r.status_code == 429
    assert r.content == refused
    assert r.headers["retry-after"] == "7" and r.headers["content-type"] == "application/json"
    assert "truncate" in r.headers["x-compaction-layers"]
    assert "x-compaction-retrievals" not in r.headers  # no hidden round was possible
    assert len(_messages_requests(upstream)) == 1
    assert _messages_requests(upstream)[0].json()["tools"][-1]["name"] == TOOL_NAME  # it was offered


def test_pings_flow_while_a_hidden_round_waits(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy, ping_seconds=0.05)
    first = _round([_text("Reading."), _call()], "tool_use", 1, 1)
    second = message_stream_events(_round([_text("Done.")], "end_turn", 1, 1), pings=False)
    upstream.script(Stream(message_stream_events(first, pings=False)), Stream(second, delay=0.4))
    body = _raw_stream(proxy)
    assert body.count(b"event: ping") >= 3
    assert body.count(b"event: content_block_start") == 2 and body.count(b"event: message_stop") == 1


# -- transcript pointers ---------------------------------------------------------------------------


def test_the_bridge_names_removed_turns_and_retrieves_them(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    session = "ret-t"
    proxy = make_proxy(compaction={"threshold": 1500, "hard_limit": 100_000, "keep_recent": 2})
    filler = "words " * 400
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start the work"}]
    for i in range(6):
        messages.append({"role": "assistant", "content": [_text(f"step {i}"), _bash(f"toolu_h{i}")]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_h{i}", "content": f"out {i} {filler}"}]})
    messages.append({"role": "assistant", "content": "All steps ran."})
    messages.append({"role": "user", "content": "what did step 0 print?"})
    calls = [_call(f"transcript:{session}:2", "toolu_t1"), _call(f"transcript:{session}:3", "toolu_t2")]
    upstream.script(
        Reply(message_json("Summary: six steps ran.")),  # the summary call
        Reply(_round(calls, "tool_use", 1, 1)),
        Reply(message_json("Step 0 printed out 0.")),
    )
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers={"x-session-id": session})
    r = client.messages.with_raw_response.create(model="m", max_tokens=100, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert "summarize" in r.headers["x-compaction-layers"] and r.headers["x-compaction-retrievals"] == "1"
    sent = _messages_requests(upstream)[1:]  # [0] is the summary call
    bridge = sent[0].json()["messages"][2]["content"]
    assert re.search(rf"transcript:{session}:2 to transcript:{session}:\d+\. The context_proxy_retrieve", bridge[-1]["text"])
    assert sent[0].json()["tools"][-1] == TOOL
    results = sent[1].json()["messages"][-1]["content"]
    assert results[0]["content"] == [{"type": "text", "text": "step 0\n\n" + orjson.dumps(_bash("toolu_h0")).decode()}]
    expected = orjson.dumps(messages[2]["content"][0]).decode()
    assert results[1]["content"] == [{"type": "text", "text": expected}]
    # the hidden round is kept with the recorded answer
    loop_thread.run(proxy.app[DURABLE].drain())
    from proxy.server.appkeys import STORE

    events = loop_thread.run(proxy.app[STORE].transcript_events("default", session))
    answer = events[-1].event
    assert answer.type == "answer"
    assert answer.content["context_proxy_retrievals"] == [
        {"round": 1, "calls": [
            {"pointer": f"transcript:{session}:2", "offset": 0, "status": "available", "chars": len(results[0]["content"][0]["text"])},
            {"pointer": f"transcript:{session}:3", "offset": 0, "status": "available", "chars": len(expected)},
        ]}
    ]
    assert [b["text"] for b in answer.content["content"]] == ["Step 0 printed out 0."]


def test_a_session_reused_for_another_conversation_names_that_conversations_events(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    """The transcript interleaves two conversations of one identity: the bridge names the
    events the recorder gave the removed messages (looked up by their keys), never the other
    conversation's, however they are numbered."""
    from proxy.core.pointers import TranscriptPointer, parse_pointer
    from proxy.server.appkeys import STORE

    session = "ret-reused"
    proxy = make_proxy(compaction={"threshold": 1500, "hard_limit": 100_000, "keep_recent": 2})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers={"x-session-id": session})
    client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "an unrelated first conversation"}])
    loop_thread.run(proxy.app[DURABLE].drain())
    filler = "words " * 1500
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start the work"}]
    for i in range(6):
        messages.append({"role": "assistant", "content": f"step {i} {filler}"})
        messages.append({"role": "user", "content": f"go on {i}"})
    upstream.script(Reply(message_json("Summary.")))
    r = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert "summarize" in r.headers["x-compaction-layers"], {k: v for k, v in r.headers.items() if k.startswith("x-")}
    sent = _messages_requests(upstream)[-1].json()
    assert sent["tools"] == [*TOOLS, TOOL]  # the view names pointers the model can redeem
    text = orjson.dumps(sent["messages"]).decode()
    named = {m for m in re.findall(rf"transcript:{session}:\d+", text)}
    assert named
    loop_thread.run(proxy.app[DURABLE].drain())
    events = {e.seq: e for e in loop_thread.run(proxy.app[STORE].transcript_events("default", session))}
    assert events[1].event.content == "an unrelated first conversation"  # the other conversation
    contents = [m["content"] for m in messages]
    for pointer in named:
        parsed = parse_pointer(pointer)
        assert isinstance(parsed, TranscriptPointer) and parsed.sequence > 2
        assert events[parsed.sequence].event.content in contents  # one of this conversation's


def test_count_tokens_counts_the_view_with_the_tool(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    _client(proxy).messages.count_tokens(model="m", messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    counted = [r for r in upstream.requests if r.path == "/v1/messages/count_tokens"][-1].json()
    assert counted["tools"] == [*TOOLS, TOOL]
    _client(proxy).messages.create(model="m", max_tokens=5, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    sent = _messages_requests(upstream)[-1].json()
    assert {k: v for k, v in sent.items() if k != "max_tokens"} == counted


def test_a_continuation_cut_mid_stream_ends_with_one_error_event(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = _proxy(make_proxy)
    second = message_stream_events(_round([_text("Partial answer that never ends.")], "end_turn", 1, 1))
    upstream.script(
        Stream(message_stream_events(_round([_text("Reading."), _call()], "tool_use", 1, 1))),
        Stream(second, cut_after=4, cut_mid_event=True),
    )
    body = _raw_stream(proxy)
    events = body.rstrip().split(b"\n\n")
    assert events[-1].startswith(b"event: error\ndata: ") and b"api_error" in events[-1]
    assert body.count(b"event: error") == 1 and b"event: message_stop" not in body
    assert body.count(b"event: message_start") == 1


def test_a_malformed_pointer_is_never_logged_or_recorded_as_sent(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, caplog: pytest.LogCaptureFixture) -> None:
    from proxy.server.appkeys import STORE

    proxy = _proxy(make_proxy)
    evil = "artifact:x\n[retrieval] forged line"
    call = {"type": "tool_use", "id": "toolu_evil", "name": TOOL_NAME, "input": {"pointer": evil}}
    upstream.script(Reply(_round([call], "tool_use", 1, 1)), Reply(message_json("ok")))
    with caplog.at_level("DEBUG"):  # every logger, every level
        _client(proxy).messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
        loop_thread.run(proxy.app[DURABLE].drain())
    assert "forged" not in caplog.text and "<malformed>=corrupt" in caplog.text
    loop_thread.run(proxy.app[DURABLE].drain())
    answer = loop_thread.run(proxy.app[STORE].transcript_events("default", SESSION))[-1].event
    assert answer.content["context_proxy_retrievals"][0]["calls"][0]["pointer"] == "<malformed>"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_each_upstream_call_of_a_retrieval_answer_is_its_own_ledger_row(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, stream: bool
) -> None:
    """The client's call carries its own round's usage; each hidden round is a ``retrieval`` row
    with that round's usage as the provider reported it (never the sum the client sees)."""
    from proxy.server.appkeys import STORE
    from proxy.server.ledger import LEDGER
    from proxy.store.usage import UsageQuery

    proxy = _proxy(make_proxy)
    first = _round([_text("Reading."), _call()], "tool_use", 100, 20)
    second = _round([_text("Again."), _call(offset=10, tool_id="toolu_r2")], "tool_use", 7000, 15)
    third = _round([_text("Found it.")], "end_turn", 7100, 9)
    upstream.script(*[_scripted(m, stream) for m in (first, second, third)])
    final, _ = _ask(_client(proxy), stream)
    assert final.usage.input_tokens == 14200 and final.usage.output_tokens == 44  # summed for the client
    loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    rows = loop_thread.run(proxy.app[STORE].usage_rows("default", UsageQuery(session=SESSION)))
    got = [
        (r.entry.kind, r.entry.status, r.entry.usage and r.entry.usage.input_tokens,
         r.entry.usage and r.entry.usage.output_tokens)
        for r in rows
    ]
    assert sorted(got) == sorted(
        [("client", 200, 100, 20), ("retrieval", 200, 7000, 15), ("retrieval", 200, 7100, 9)]
    )
