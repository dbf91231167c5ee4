"""The retrieval tool's pure parts as tables: offering, calls, pages, source text, usage; the
bridge's transcript range. And when a view carries the tool, as a property of compaction turn by
turn over generated conversations (the edge's own property runs through a real proxy:
tests/test_retrieval_offer.py)."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    Done,
    NeedsNaming,
    Plan,
    PlanCache,
    compact,
    step,
)
from proxy.core.compaction import named as named_turns
from proxy.core.compaction.bridge import Bridge, TranscriptNaming, TranscriptRange
from proxy.core.compaction.retrieval import (
    TOOL,
    TOOL_JSON,
    TOOL_NAME,
    BadCall,
    Call,
    artifact_text,
    asks_for_a_new_turn,
    error_result,
    event_text,
    offer_tool,
    page_result,
    parse_call,
    plan_names_pointers,
    sum_usage,
    with_tool,
)
from proxy.core.compaction.truncate import artifact_of
from proxy.core.compaction.view import Cut, FromClient
from proxy.core.tokens import TokenCounter
from tests.strategies import Conversation, as_claude_code_sends, conversations, policies

BASH = {"name": "Bash", "input_schema": {"type": "object"}}


def test_the_tool_is_appended_last_and_the_body_is_not_touched() -> None:
    body = {"model": "m", "tools": [BASH], "messages": []}
    offered = offer_tool(body)
    assert offered is not None and offered["tools"] == [BASH, TOOL]
    assert body["tools"] == [BASH]  # the client's body is untouched
    assert orjson.dumps(offered["tools"]).endswith(b"," + TOOL_JSON + b"]")
    assert TOOL_JSON == orjson.dumps(TOOL)  # one constant byte string
    assert TOOL["input_schema"]["required"] == ["pointer"]
    assert set(TOOL["input_schema"]["properties"]) == {"pointer", "offset", "max_chars"}


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"tools": [], "messages": []},
        {"tools": None, "messages": []},
        {"tools": [BASH, {"name": TOOL_NAME}], "messages": []},
    ],
)
def test_the_tool_is_not_offered(body: dict[str, Any]) -> None:
    assert offer_tool(body) is None


USER = {"role": "user", "content": "go on"}
ASSISTANT = {"role": "assistant", "content": "The answer is"}
SYSTEM_ENTRY = {"role": "system", "content": "Available agent types: claude."}


@pytest.mark.parametrize(
    ("messages", "new_turn"),
    [
        ([USER], True),
        ([USER, SYSTEM_ENTRY], True),  # Claude Code's mid-conversation system message
        ([USER, SYSTEM_ENTRY, SYSTEM_ENTRY], True),
        ([USER, ASSISTANT], False),  # a prefill is continued, not extended
        ([USER, SYSTEM_ENTRY, ASSISTANT], False),
        ([USER, ASSISTANT, SYSTEM_ENTRY], False),
        ([SYSTEM_ENTRY], False),
        ([], False),
        (None, False),
        ("text", False),
        ([USER, "not a message"], False),
    ],
)
def test_a_view_asks_for_a_new_turn_when_its_last_non_system_message_is_the_users(
    messages: Any, new_turn: bool
) -> None:
    assert asks_for_a_new_turn(messages) is new_turn


def _plan(items: tuple[Any, ...] = (FromClient(0),), bridge: Bridge | None = None, pointers: bool | None = None) -> Plan:
    return Plan("t", "a", 3, "h", items, ("truncate",), (), bridge, "skipped", pointers)


MARKED = "head\n[context-proxy: truncated 700 of 900 tokens from this tool result; full text: artifact:s:tool-result-0.txt:" + "0" * 64 + "]\ntail"
CUT_NAMING = FromClient(2, (Cut(0, MARKED),))
CUT_SILENT = FromClient(2, (Cut(0, "head\n[context-proxy: truncated 700 of 900 tokens from this tool result]\ntail"),))
BRIDGED = Bridge("a summary", (), TranscriptRange("s", 2, 5))


@pytest.mark.parametrize(
    ("plan", "names"),
    [
        (None, False),
        (_plan(), False),
        (_plan((FromClient(0), CUT_SILENT)), False),  # no session: the marker names nothing
        (_plan(bridge=Bridge("a summary")), False),  # a bridge that names no events
        (_plan((FromClient(0), CUT_NAMING)), True),
        (_plan(bridge=BRIDGED), True),
        (_plan((FromClient(0), FromClient(2, (Cut(0, [{"type": "text", "text": MARKED}]),)))), True),
        # recorded when the plan was made: its view or a plan it was built on named one...
        (_plan(pointers=True), True),
        # ...or none did (the flag wins over the view for plans that carry it)
        (_plan((FromClient(0), CUT_NAMING), pointers=False), False),
    ],
)
def test_a_plan_offers_the_tool_once_it_or_a_plan_it_was_built_on_names_a_pointer(
    plan: Plan | None, names: bool
) -> None:
    assert plan_names_pointers(plan) is names
    if plan is not None:
        assert Plan.from_json(plan.to_json()) == plan  # the flag is kept with the plan
    body = {"model": "m", "tools": [BASH], "messages": [USER, SYSTEM_ENTRY]}
    offered = with_tool(body, plan)
    assert (offered is not None) is names
    if offered is not None:
        assert offered["tools"] == [BASH, TOOL] and body["tools"] == [BASH]
    assert with_tool({**body, "messages": [USER, ASSISTANT]}, plan) is None  # a prefill never
    assert with_tool({**body, "tools": []}, plan) is None  # no tools declared: never


def test_a_plan_stored_without_the_flag_reads_back_without_it() -> None:
    """Plans stored before the flag: no ``pointers`` key, and their own view decides."""
    stored = orjson.loads(_plan((FromClient(0), CUT_NAMING)).to_json())
    assert "pointers" not in stored
    plan = Plan.from_json(orjson.dumps(stored))
    assert plan.pointers is None and plan_names_pointers(plan)
    with pytest.raises(ValueError, match="pointers"):
        Plan.from_json(orjson.dumps({**stored, "pointers": "yes"}))


POINTER = re.compile(rb"transcript:s1:\d+|artifact:s1:[A-Za-z0-9._-]+:[0-9a-f]{64}")


@st.composite
def agent_policies(draw: Any) -> CompactionPolicy:
    """Policies that compact an agent's loop early and often, in every layer (a low threshold,
    a small recent window, cut results)."""
    threshold = draw(st.integers(500, 2_500))
    return CompactionPolicy(
        threshold=threshold,
        hard_limit=threshold * 40,
        target_ratio=draw(st.sampled_from([0.55, 0.8, 0.95])),
        tool_result_cap=draw(st.integers(60, 500)),
        keep_recent=draw(st.integers(1, 3)),
        summarize=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    conv=conversations(min_turns=3, max_turns=12),
    policy=st.one_of(policies(), agent_policies()),
    every_turn=st.booleans(),
)
def test_turn_by_turn_the_tool_comes_with_the_first_pointer_and_stays(
    conv: Conversation, policy: CompactionPolicy, every_turn: bool
) -> None:
    """Compaction turn by turn (one plan cache; the transcript holds every message; cut results
    are named as artifacts of the session), each request ending right before an answer (with a
    system entry after every user turn when ``every_turn``, as Claude Code sends them): the
    views never carry the tool before the first one that names a pointer, and from that one on,
    every view does. (Provider ``compaction`` blocks are left out: a conversation the provider
    compacts itself is forwarded to it as sent, no view of ours.)"""
    messages = as_claude_code_sends(conv.messages, every_turn)
    plans = PlanCache()
    counter = TokenCounter()
    ends = [k for k in range(1, len(messages)) if messages[k]["role"] == "assistant"]
    first: int | None = None
    for k, end in enumerate([*ends, len(messages)]):
        request = CompactionInput(
            conv.system, conv.tools, messages[:end], "model", artifact_session="s1",
            transcript=TranscriptNaming("s1"),
        )
        outcome = compact(request, policy, counter, plans, "s1")
        while not isinstance(outcome, Done):
            if isinstance(outcome, NeedsNaming):
                outcome = named_turns(outcome.continuation, {i: i + 1 for i in outcome.indices})
            else:
                outcome = step(outcome.continuation, "a summary of the earlier turns")
        result = outcome.result
        view = result.messages
        if first is None and POINTER.search(orjson.dumps(view)):
            first = k
        offered = with_tool({"tools": conv.tools, "messages": view}, result.plan) if result.changed else None
        assert (offered is not None) == (first is not None), (k, first, result.layers)
        if offered is not None and not POINTER.search(orjson.dumps(view)):
            event("the tool stays on a view that names no pointer any more")


@pytest.mark.parametrize(
    ("tool_input", "expected"),
    [
        ({"pointer": "p"}, Call("t", "p", 0, 40_000)),
        ({"pointer": "p", "offset": 5, "max_chars": 10}, Call("t", "p", 5, 10)),
        ({"pointer": "p", "max_chars": 10**9}, Call("t", "p", 0, 40_000)),
        ({"pointer": "p", "offset": None, "max_chars": None}, Call("t", "p", 0, 40_000)),
        ({"pointer": ""}, BadCall("t", "input.pointer must be a non-empty string")),
        ({"pointer": 7}, BadCall("t", "input.pointer must be a non-empty string")),
        ({"pointer": "p", "offset": -1}, BadCall("t", "input.offset must be an integer >= 0")),
        ({"pointer": "p", "offset": 1.5}, BadCall("t", "input.offset must be an integer >= 0")),
        ({"pointer": "p", "offset": True}, BadCall("t", "input.offset must be an integer >= 0")),
        ({"pointer": "p", "max_chars": 0}, BadCall("t", "input.max_chars must be an integer >= 1")),
        ("text", BadCall("t", "input must be an object")),
    ],
)
def test_parse_call(tool_input: Any, expected: Call | BadCall) -> None:
    block = {"type": "tool_use", "id": "t", "name": TOOL_NAME, "input": tool_input}
    assert parse_call(block, 40_000) == expected


@given(st.text(max_size=300), st.integers(0, 320), st.integers(1, 400))
def test_pages_are_exact_slices_and_chain_to_the_whole(text: str, offset: int, size: int) -> None:
    result = page_result(Call("t", "p", offset, size), text)
    if not text:
        assert result["content"][0]["text"] == "[context-proxy: the source is empty]"
        return
    if offset >= len(text):
        assert result["is_error"] is True and "past the end" in result["content"][0]["text"]
        return
    assert "is_error" not in result
    assert result["content"][0]["text"] == text[offset : offset + size]
    # following the notes from 0 gives back the whole text
    pieces, at = [], 0
    while True:
        page = page_result(Call("t", "p", at, size), text)
        pieces.append(page["content"][0]["text"])
        if len(page["content"]) == 1:
            break
        at = int(page["content"][1]["text"].rsplit("offset ", 1)[1].rstrip("]"))
    assert "".join(pieces) == text


def test_the_last_round_says_so() -> None:
    result = page_result(Call("t", "p", 0, 10), "short", last_round=True)
    assert result["content"] == [
        {"type": "text", "text": "short"},
        {"type": "text", "text": "[context-proxy: that was the last retrieval this turn allows]"},
    ]


@pytest.mark.parametrize("status", ["denied", "missing", "corrupt", "unsupported"])
def test_errors_say_which(status: str) -> None:
    result = error_result("t", status, "artifact:s:x:0123456789ab")
    assert result["is_error"] is True and result["tool_use_id"] == "t"
    assert result["content"][0]["text"].startswith(f"[context-proxy] {TOOL_NAME} artifact:s:x:0123456789ab: {status}:")
    assert "x" * 501 not in error_result("t", status, "x" * 600)["content"][0]["text"]


def test_event_text_renders_text_verbatim_and_other_blocks_as_compact_json() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls -la"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb"}
    assert event_text({"content": "plain text\n"}) == "plain text\n"
    assert event_text({"content": [{"type": "text", "text": "x  y"}, call]}) == "x  y\n\n" + orjson.dumps(call).decode()
    assert event_text({"content": [result]}) == '{"type":"tool_result","tool_use_id":"toolu_1","content":"a\\nb"}'
    answer = {"id": "msg_1", "role": "assistant", "content": [{"type": "text", "text": "done"}]}
    assert event_text({"type": "answer", "content": answer}) == "done"
    assert event_text({"content": None}) == ""


def test_artifact_text_is_the_original_result_text() -> None:
    text = "line 1\nline 2 \u00e9\n"
    assert artifact_text(artifact_of(text).name, artifact_of(text).data) == text
    blocks = [{"type": "text", "text": "first"}, {"type": "image", "source": {}}, {"type": "text", "text": "second"}]
    kept = artifact_of(blocks)
    assert kept.name.endswith(".json")
    assert artifact_text(kept.name, kept.data) == "first\n[image block]\nsecond"


def test_usage_is_summed_over_rounds() -> None:
    rounds = [
        {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 100, "service_tier": "standard"},
        {"input_tokens": 20, "output_tokens": 4, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 5},
    ]
    assert sum_usage(rounds) == {
        "input_tokens": 30,
        "output_tokens": 7,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 5,
    }
    assert sum_usage([]) == {}


# -- the bridge's transcript range ----------------------------------------------------------------


def _named(session: str, pairs: dict[int, int], agent: str = "") -> TranscriptNaming:
    return TranscriptNaming(session, agent, tuple(sorted(pairs.items())))


def test_the_range_names_the_removed_messages_and_extends_a_previous_one() -> None:
    naming = _named("s1", {i: i + 1 for i in range(20)})
    assert naming.range_of((), None) is None
    # message i is the event the transcript gave it: 3, 4, 5 -> 4..6 and 8 -> 9, two runs
    assert naming.range_of((3, 4, 5, 8), None) == TranscriptRange("s1", 4, 6, "", ((9, 9),))
    previous = Bridge("old summary", (), TranscriptRange("s1", 2, 9))
    assert naming.range_of((9, 10, 11), previous) == TranscriptRange("s1", 2, 12)
    other = Bridge("old", (), TranscriptRange("s2", 1, 3))
    assert naming.range_of((10, 11), other) == TranscriptRange("s1", 11, 12)
    # another conversation of the same session is another transcript: never extended by it
    agents = Bridge("old", (), TranscriptRange("s1", 1, 3, "a1"))
    assert naming.range_of((10, 11), agents) == TranscriptRange("s1", 11, 12)


def test_messages_the_transcript_does_not_hold_are_not_named() -> None:
    # an interleaved side request took events 5 and 6: the removed messages are 1-4 and 7-9
    naming = _named("s1", {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 9}, "a7")
    named = naming.range_of((1, 2, 3, 4, 5, 6, 7), None)
    assert named == TranscriptRange("s1", 2, 4, "a7", ((7, 9),))
    assert named is not None and named.covers(3) and not named.covers(5) and not named.covers(6)
    text = named.text()
    assert "transcript:s1:a7:2 to transcript:s1:a7:4; transcript:s1:a7:7 to transcript:s1:a7:9." in text
    assert "this agent's transcript" in text
    assert _named("s1", {}).range_of((1, 2), None) is None


def test_a_bridge_names_at_most_max_runs_joining_the_closest() -> None:
    from proxy.core.compaction.bridge import MAX_RUNS

    # every other event is another request's: one run per message, twice as many as allowed
    naming = _named("s1", {i: 2 * i + 1 for i in range(2 * MAX_RUNS)})
    named = naming.range_of(range(2 * MAX_RUNS), None)
    assert named is not None and len(named.runs) == MAX_RUNS
    assert named.first == 1 and named.runs[-1][1] == 4 * MAX_RUNS - 1
    assert all(named.covers(2 * i + 1) for i in range(2 * MAX_RUNS))


def test_a_bridge_with_a_range_ends_with_its_pointers_and_round_trips() -> None:
    bridge = Bridge("sum", ("typed",), TranscriptRange("s1", 2, 41))
    _, user = bridge.messages()
    assert user["content"][-1]["text"].startswith(
        "[context-proxy: the compacted turns are kept verbatim in this session's transcript,"
        " one event per message: transcript:s1:2 to transcript:s1:41."
    )
    assert Bridge.from_json(orjson.loads(orjson.dumps(bridge.to_json()))) == bridge
    # a bridge without one keeps the bytes it always had (stored plans)
    assert Bridge("sum").to_json() == {"summary": "sum", "carried": []}
    only = Bridge(None, (), TranscriptRange("s1", 3, 3))
    assert not only.empty
    assert only.messages()[0]["content"][0]["text"].endswith("where they are kept follows.")
    assert "transcript:s1:3. The" in only.messages()[1]["content"][0]["text"]


def test_an_agents_or_interleaved_range_round_trips_and_the_main_one_keeps_its_bytes() -> None:
    many = TranscriptRange("s1", 2, 4, "", ((7, 9),))
    agent = TranscriptRange("s1", 2, 4, "a1")
    for named in (many, agent):
        data = orjson.loads(orjson.dumps(Bridge("s", (), named).to_json()))
        assert isinstance(data["transcript"], dict)
        assert Bridge.from_json(data).transcript == named
    assert Bridge("s", (), TranscriptRange("s1", 2, 4)).to_json()["transcript"] == ["s1", 2, 4]


@pytest.mark.parametrize(
    "bad",
    [
        ["s1", 0, 3],
        ["s1", 4, 3],
        ["s1", 1],
        [1, 1, 2],
        "s1:1:2",
        ["s1", True, 2],
        {"session": "s1", "agent": "a", "runs": []},
        {"session": "s1", "agent": "a", "runs": [[3, 2]]},
        {"session": "s1", "agent": "a", "runs": [[1, 4], [3, 5]]},
        {"session": "s1", "runs": [[1, 2]]},
        {"session": 1, "agent": "", "runs": [[1, 2]]},
    ],
)
def test_a_malformed_stored_range_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        Bridge.from_json({"summary": None, "carried": [], "transcript": bad})


def test_the_retrieval_keys_are_validated_with_their_names() -> None:
    from proxy.config.schema import ConfigError
    from proxy.config.settings import parse_config

    config = parse_config({"compaction": {"retrieval": {"max_rounds": 5, "enabled": False}}}, "c.yaml")
    assert config.compaction.retrieval.max_rounds == 5 and not config.compaction.retrieval.enabled
    assert config.compaction.retrieval.max_chars == 40_000  # the default, and >= 40,000
    with pytest.raises(ConfigError) as info:
        parse_config({"compaction": {"retrieval": {"max_rounds": 0, "max_chars": "x", "ping_seconds": -1}}}, "c.yaml")
    text = str(info.value)
    for key in ("compaction.retrieval.max_rounds", "compaction.retrieval.max_chars", "compaction.retrieval.ping_seconds"):
        assert key in text, text
