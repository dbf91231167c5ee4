"""The SSE splice (sans-I/O): rounds of upstream events in, one client stream out."""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.compaction.retrieval import TOOL_NAME
from proxy.server.relay.accumulate import AnswerAccumulator
from proxy.server.relay.splice import Splice, split_events
from tests.upstream import message_json, message_stream_events


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def _ours(i: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_o{i}", "name": TOOL_NAME, "input": {"pointer": f"transcript:s:{i + 1}"}}


def _client_call(i: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_c{i}", "name": "Bash", "input": {"command": f"echo {i}"}}


def _thinking(i: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": f"think {i}", "signature": f"sig{i}"}


def _run(rounds: list[list[dict[str, Any]]], stops: list[str]) -> tuple[bytes, Splice, list[list[Any]]]:
    """Feed every round as the loop does (every round but the last calls ours and continues)."""
    splice = Splice()
    out: list[bytes] = []
    continued: list[list[Any]] = []
    for n, (content, stop) in enumerate(zip(rounds, stops, strict=True)):
        if n:
            splice.start_round()
        message = message_json(content=content, stop_reason=stop, input_tokens=10 * (n + 1), output_tokens=n + 1)
        for event in split_events(b"".join(message_stream_events(message))):
            out.append(splice.feed(event))
        if n < len(rounds) - 1:
            assert splice.our_calls()
            released, _ = splice.release(drop_client_calls=True)
            out.append(released)
            continued.append(splice.assistant_content(drop_client_calls=True))
        else:
            released, client_call = splice.release(drop_client_calls=False)
            out.append(released)
            out.append(splice.finish(len(rounds) - 1, client_call))
    return b"".join(out), splice, continued


def _folded(stream: bytes) -> dict[str, Any]:
    acc = AnswerAccumulator(sse=True)
    acc.feed(stream)
    message = acc.message()
    assert message is not None and acc.stopped
    return message


def test_two_rounds_become_one_message() -> None:
    rounds = [[_thinking(0), _text("Reading."), _client_call(0), _ours(0)], [_text("Found."), _client_call(1)]]
    stream, _, continued = _run(rounds, ["tool_use", "tool_use"])
    message = _folded(stream)
    assert message["content"] == [_thinking(0), _text("Reading."), _text("Found."), _client_call(1)]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 30 and message["usage"]["output_tokens"] == 3
    # what the continuation carries: the model's turn without the client's dropped call
    assert continued == [[_thinking(0), _text("Reading."), _ours(0)]]
    names = re.findall(rb"^event: (\w+)$", stream, re.M)
    assert names.count(b"message_start") == 1 and names[-2:] == [b"message_delta", b"message_stop"]
    assert b": x-compaction-retrievals: 1\n\n" in stream


def test_a_round_without_our_call_leaves_as_it_came() -> None:
    message = message_json(content=[_text("a"), _client_call(0), _text("b")], stop_reason="tool_use")
    events = b"".join(message_stream_events(message))
    splice = Splice()
    out = [splice.feed(e) for e in split_events(events)]
    released, client_call = splice.release(drop_client_calls=False)
    assert client_call
    assert b"".join([*out, released, splice.finish(0, client_call)]) == events


def test_the_limit_hides_our_last_call_and_ends_the_turn() -> None:
    splice = Splice()
    message = message_json(content=[_text("again"), _ours(0)], stop_reason="tool_use")
    out = [splice.feed(e) for e in split_events(b"".join(message_stream_events(message)))]
    released, client_call = splice.release(drop_client_calls=False)
    stream = b"".join([*out, released, splice.finish(2, client_call)])
    folded = _folded(stream)
    assert folded["content"] == [_text("again")] and folded["stop_reason"] == "end_turn"
    assert TOOL_NAME.encode() not in stream


@st.composite
def _rounds(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    n = draw(st.integers(1, 4))
    rounds = []
    counter = 0
    for r in range(n):
        kinds = draw(st.lists(st.sampled_from(["text", "thinking", "client", "ours"]), max_size=5))
        if r < n - 1 and "ours" not in kinds:
            kinds.append("ours")
        if r == n - 1:
            kinds = [k for k in kinds if k != "ours"]
        content = []
        for kind in kinds:
            counter += 1
            content.append(
                {"text": _text(f"t{counter}"), "thinking": _thinking(counter), "client": _client_call(counter), "ours": _ours(counter)}[kind]
            )
        rounds.append(content)
    return rounds


@settings(max_examples=60, deadline=None)
@given(_rounds())
def test_the_client_sees_every_visible_block_once_in_order(rounds: list[list[dict[str, Any]]]) -> None:
    stops = ["tool_use"] * (len(rounds) - 1) + ["end_turn"]
    stream, _, continued = _run(rounds, stops)
    expected: list[Any] = []
    for n, content in enumerate(rounds):
        last = n == len(rounds) - 1
        expected += [b for b in content if b.get("name") != TOOL_NAME and (last or b["type"] != "tool_use")]
    message = _folded(stream)
    assert message["content"] == expected
    starts = [orjson.loads(m)["index"] for m in re.findall(rb"^data: (\{\"type\":\"content_block_start\".*)$", stream, re.M)]
    assert starts == list(range(len(expected)))
    assert TOOL_NAME.encode() not in stream
    assert message["usage"]["input_tokens"] == sum(10 * (i + 1) for i in range(len(rounds)))
    for content, carried in zip(rounds, continued, strict=False):
        assert carried == [b for b in content if b["type"] != "tool_use" or b.get("name") == TOOL_NAME]
