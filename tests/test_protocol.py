"""Tool-protocol validation: a table of conversations -> expected provider-style text, real
transcripts (every valid prefix), and mutations of a real transcript."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.protocol import Violation, validate_messages, validate_request
from tests.shared_data import CC_TRANSCRIPT
from tests.shared_data import TRANSCRIPTS as SHARED_TRANSCRIPTS

TRANSCRIPTS = sorted(SHARED_TRANSCRIPTS.glob("*.json"))
CC = CC_TRANSCRIPT

Msg = dict[str, Any]


# --- builders -------------------------------------------------------------------------------


def user(*blocks: Any) -> Msg:
    return {"role": "user", "content": list(blocks)}


def asst(*blocks: Any) -> Msg:
    return {"role": "assistant", "content": list(blocks)}


def system(text: str = "be brief") -> Msg:
    return {"role": "system", "content": text}


def text(t: str = "hi") -> Msg:
    return {"type": "text", "text": t}


def use(uid: str, name: str = "Read") -> Msg:
    return {"type": "tool_use", "id": uid, "name": name, "input": {"path": "/x"}}


def result(uid: str, content: Any = "ok") -> Msg:
    return {"type": "tool_result", "tool_use_id": uid, "content": content}


def srv(uid: str, name: str = "web_search") -> Msg:
    return {"type": "server_tool_use", "id": uid, "name": name, "input": {"query": "q"}}


def srv_result(uid: str, kind: str = "web_search_tool_result") -> Msg:
    return {"type": kind, "tool_use_id": uid, "content": []}


def mcp(uid: str) -> Msg:
    return {"type": "mcp_tool_use", "id": uid, "name": "n", "server_name": "s", "input": {}}


def mcp_result(uid: str) -> Msg:
    return {"type": "mcp_tool_result", "tool_use_id": uid, "content": "x", "is_error": False}


IMAGE = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}


# --- the provider's wording, built from the brief's exact texts -------------------------------


def missing(n: int, *ids: str) -> str:
    return (
        f"messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block "
        "in the next message."
    )


def not_first(n: int, k: int) -> str:
    return (
        f"messages.{n}: Did not find {k} `tool_result` block(s) at the beginning of this message. "
        "Messages following `tool_use` blocks must begin with a matching number of `tool_result` "
        "blocks."
    )


def unexpected(n: int, m: int, uid: str) -> str:
    return (
        f"messages.{n}.content.{m}: unexpected `tool_use_id` found in `tool_result` blocks: {uid}. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous "
        "message."
    )


def dup_result(n: int, m: int, uid: str) -> str:
    return (
        f"messages.{n}.content.{m}: each tool_use must have a single result. Found multiple "
        f"`tool_result` blocks with id: {uid}"
    )


def dup_use(n: int, m: int, uid: str, kind: str = "tool_use") -> str:
    return f"messages.{n}.content.{m}: `{kind}` ids must be unique: {uid}"


def srv_unexpected(n: int, m: int, uid: str, kind: str, want: str = "server_tool_use") -> str:
    return (
        f"messages.{n}.content.{m}: unexpected `tool_use_id` found in `{kind}` blocks: {uid}. "
        f"Each `{kind}` block must have a corresponding `{want}` block before it."
    )


def srv_dup_result(n: int, m: int, uid: str, kind: str, want: str = "server_tool_use") -> str:
    return (
        f"messages.{n}.content.{m}: each `{want}` must have a single result. "
        f"Found multiple `{kind}` blocks with id: {uid}"
    )


def srv_unanswered(n: int, *ids: str, kind: str = "server_tool_use") -> str:
    return (
        f"messages.{n}: `{kind}` ids were found without a corresponding result block: "
        f"{', '.join(ids)}. Each `{kind}` block must be followed by its result block in the same "
        f"assistant turn; only the last assistant turn may end with an unanswered `{kind}` "
        "(a `pause_turn` being continued)."
    )


def wrong_role(n: int, m: int, kind: str, role: str) -> str:
    home = "user" if kind == "tool_result" else "assistant"
    article = "an" if role == "assistant" else "a"
    return (
        f"messages.{n}.content.{m}: `{kind}` blocks are only allowed in {home} messages, "
        f"found in {article} {role} message."
    )


def bad_block(n: int, m: int) -> str:
    return f'messages.{n}.content.{m}: each content block must be an object with a string "type"'


def no_field(n: int, m: int, kind: str, field: str) -> str:
    return f'messages.{n}.content.{m}: `{kind}` blocks must have a string "{field}"'


BAD_CONTENT = "content must be a string or a list of content blocks"

# --- the table ------------------------------------------------------------------------------

Q = user(text("question"))

CASES: list[tuple[str, object, str | None]] = [
    # valid conversations
    ("empty list", [], None),
    (
        "string contents",
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        None,
    ),
    ("empty content list", [user(), asst()], None),
    ("one round trip", [Q, asst(text(), use("a")), user(result("a")), asst(text("done"))], None),
    ("final user message with results", [Q, asst(use("a")), user(result("a"))], None),
    (
        "parallel uses, results permuted (provider accepts any order)",
        [Q, asst(use("a"), use("b"), use("c")), user(result("c"), result("a"), result("b"))],
        None,
    ),
    ("text and image after results", [Q, asst(use("a")), user(result("a"), text(), IMAGE)], None),
    (
        "result content as blocks",
        [Q, asst(use("a")), user(result("a", [text("out"), IMAGE]))],
        None,
    ),
    (
        "system entries anywhere",
        [system(), Q, system(), asst(use("a")), user(result("a")), system()],
        None,
    ),
    ("system entry with text blocks", [Q, {"role": "system", "content": [text("note")]}], None),
    ("consecutive user messages", [Q, Q, asst(text())], None),
    ("prefill: final assistant text", [Q, asst(text("{"))], None),
    (
        "thinking and redacted thinking",
        [
            Q,
            asst(
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                use("a"),
            ),
            user(result("a")),
        ],
        None,
    ),
    (
        "unknown block types pass in every role",
        [
            user({"type": "future_block", "x": 1}, text()),
            asst({"type": "compaction", "content": None}, {"type": "future_block"}),
            {"role": "system", "content": [{"type": "future_block"}]},
        ],
        None,
    ),
    (
        "server tool paired in the same message",
        [Q, asst(srv("s1"), srv_result("s1"), text("found"))],
        None,
    ),
    (
        "every *_tool_result kind pairs with server_tool_use",
        [
            Q,
            asst(
                srv("s1", "web_fetch"),
                srv_result("s1", "web_fetch_tool_result"),
                srv("s2", "code_execution"),
                srv_result("s2", "code_execution_tool_result"),
                srv("s3", "bash_code_execution"),
                srv_result("s3", "bash_code_execution_tool_result"),
                srv("s4", "text_editor_code_execution"),
                srv_result("s4", "text_editor_code_execution_tool_result"),
                srv("s5", "tool_search_tool_regex"),
                srv_result("s5", "tool_search_tool_result"),
                srv("s6", "advisor"),
                srv_result("s6", "advisor_tool_result"),
            ),
        ],
        None,
    ),
    (
        "server and client tools in one message",
        [Q, asst(srv("s1"), srv_result("s1"), use("a")), user(result("a")), asst(text())],
        None,
    ),
    ("mcp use and result", [Q, asst(mcp("m1"), mcp_result("m1"), text())], None),
    ("pause_turn: last assistant ends on a server use", [Q, asst(text(), srv("s1"))], None),
    (
        "pause_turn continuation: use and result in consecutive assistant entries",
        [Q, asst(srv("s1")), asst(srv_result("s1"), text()), user(text("thanks"))],
        None,
    ),
    (
        "unanswered server use in the last assistant turn, then a user message",
        [Q, asst(srv("s1")), user(text("go on"))],
        None,
    ),
    (
        "server ids may repeat across turns",
        [Q, asst(srv("s1"), srv_result("s1")), Q, asst(srv("s1"), srv_result("s1"))],
        None,
    ),
    # shape
    ("messages not a list", {"role": "user"}, "messages: Input should be a valid list"),
    (
        "entry not an object",
        [Q, "hello"],
        'messages.1: each message must be an object with "role" and "content"',
    ),
    (
        "unknown role",
        [Q, {"role": "tool", "content": "x"}],
        'messages.1: role must be "user", "assistant" or "system"',
    ),
    (
        "missing role",
        [{"content": "x"}],
        'messages.0: role must be "user", "assistant" or "system"',
    ),
    (
        "unhashable role",
        [{"role": ["user"], "content": "x"}],
        'messages.0: role must be "user", "assistant" or "system"',
    ),
    (
        "content is a number",
        [Q, asst(text()), Q, {"role": "user", "content": 3}],
        f"messages.3: {BAD_CONTENT}",
    ),
    ("content missing", [{"role": "assistant"}], f"messages.0: {BAD_CONTENT}"),
    (
        "content is an object",
        [{"role": "user", "content": {"type": "text"}}],
        f"messages.0: {BAD_CONTENT}",
    ),
    ("block is a string", [Q, asst(text()), user(text(), "raw")], bad_block(2, 1)),
    ("block without type", [Q, asst(text(), {"text": "x"})], bad_block(1, 1)),
    ("block type not a string", [user({"type": 7})], bad_block(0, 0)),
    ("block in system entry without type", [{"role": "system", "content": [{}]}], bad_block(0, 0)),
    (
        "tool_use without id",
        [Q, asst({"type": "tool_use", "name": "x", "input": {}})],
        no_field(1, 0, "tool_use", "id"),
    ),
    (
        "tool_result without tool_use_id",
        [Q, asst(use("a")), user({"type": "tool_result"})],
        no_field(2, 0, "tool_result", "tool_use_id"),
    ),
    (
        "server use with numeric id",
        [Q, asst({"type": "server_tool_use", "id": 5})],
        no_field(1, 0, "server_tool_use", "id"),
    ),
    (
        "server result without id",
        [Q, asst(srv("s"), {"type": "web_search_tool_result"})],
        no_field(1, 1, "web_search_tool_result", "tool_use_id"),
    ),
    (
        "shape problems win over an earlier protocol problem",
        [Q, asst(use("a")), user(text()), {"role": "user", "content": None}],
        f"messages.3: {BAD_CONTENT}",
    ),
    # client tools: uniqueness
    (
        "duplicate tool_use id across messages",
        [Q, asst(use("a")), user(result("a")), asst(text(), use("a")), user(result("a"))],
        dup_use(3, 1, "a"),
    ),
    (
        "duplicate tool_use id in one message",
        [Q, asst(use("a"), use("a")), user(result("a"))],
        dup_use(1, 1, "a"),
    ),
    # client tools: missing results
    ("next user message has no result", [Q, asst(use("a")), user(text())], missing(1, "a")),
    (
        "next user message is a string",
        [Q, asst(use("a")), {"role": "user", "content": "go"}],
        missing(1, "a"),
    ),
    (
        "one of two results missing",
        [Q, asst(use("a"), use("b")), user(result("b"))],
        missing(1, "a"),
    ),
    (
        "all ids listed in order",
        [Q, asst(use("a"), use("b"), use("c")), user(result("b"))],
        missing(1, "a", "c"),
    ),
    (
        "final assistant ends on tool_use",
        [Q, asst(text(), use("a"), use("b"))],
        missing(1, "a", "b"),
    ),
    (
        "system entry between tool_use and its results",
        [Q, asst(use("a")), system(), user(result("a"))],
        missing(1, "a"),
    ),
    (
        "assistant entry between tool_use and its results",
        [Q, asst(use("a")), asst(text()), user(result("a"))],
        missing(1, "a"),
    ),
    (
        "results two messages later",
        [Q, asst(use("a")), user(text()), asst(text()), user(result("a"))],
        missing(1, "a"),
    ),
    # client tools: results first
    ("result after text", [Q, asst(use("a")), user(text(), result("a"))], not_first(2, 1)),
    ("result after image", [Q, asst(use("a")), user(IMAGE, result("a"))], not_first(2, 1)),
    (
        "second result after text: K counts every tool_use",
        [Q, asst(use("a"), use("b")), user(result("a"), text(), result("b"))],
        not_first(2, 2),
    ),
    (
        "an unknown id after text is unexpected, not misplaced",
        [Q, asst(use("a")), user(result("a"), text(), result("x"))],
        unexpected(2, 2, "x"),
    ),
    # client tools: unexpected and duplicate results
    (
        "unknown tool_use_id",
        [Q, asst(use("a")), user(result("a"), result("zz"))],
        unexpected(2, 1, "zz"),
    ),
    ("result in the first message", [user(result("a"))], unexpected(0, 0, "a")),
    (
        "result after an assistant without tool_use",
        [Q, asst(text()), user(result("a"))],
        unexpected(2, 0, "a"),
    ),
    (
        "result answering a tool_use two messages back",
        [Q, asst(use("a")), user(result("a")), asst(use("b")), user(result("b"), result("a"))],
        unexpected(4, 1, "a"),
    ),
    ("result after a system entry", [Q, system(), user(result("a"))], unexpected(2, 0, "a")),
    (
        "duplicate result",
        [Q, asst(use("a")), user(result("a"), result("a"))],
        dup_result(2, 1, "a"),
    ),
    (
        "a missing result is reported before problems in the answering message",
        [Q, asst(use("a")), user(result("x"))],
        missing(1, "a"),
    ),
    (
        "misplaced result is reported before an unknown id in the same message",
        [Q, asst(use("a")), user(result("x"), text(), result("a"))],
        not_first(2, 1),
    ),
    # roles
    (
        "tool_use in a user message",
        [Q, user(text(), use("a"))],
        wrong_role(1, 1, "tool_use", "user"),
    ),
    (
        "tool_result in an assistant message",
        [Q, asst(text(), result("a"))],
        wrong_role(1, 1, "tool_result", "assistant"),
    ),
    (
        "tool_use in a system entry",
        [Q, {"role": "system", "content": [use("a")]}],
        wrong_role(1, 0, "tool_use", "system"),
    ),
    (
        "tool_result in a system entry",
        [Q, {"role": "system", "content": [result("a")]}],
        wrong_role(1, 0, "tool_result", "system"),
    ),
    (
        "server use in a user message",
        [user(srv("s1"))],
        wrong_role(0, 0, "server_tool_use", "user"),
    ),
    (
        "server result in a user message",
        [user(srv_result("s1"))],
        wrong_role(0, 0, "web_search_tool_result", "user"),
    ),
    (
        "mcp result in a user message",
        [user(text(), mcp_result("m"))],
        wrong_role(0, 1, "mcp_tool_result", "user"),
    ),
    # server tools
    (
        "server result without a use",
        [Q, asst(text(), srv_result("srvtoolu_x"))],
        srv_unexpected(1, 1, "srvtoolu_x", "web_search_tool_result"),
    ),
    (
        "server result before its use",
        [Q, asst(srv_result("s1", "advisor_tool_result"), srv("s1", "advisor"))],
        srv_unexpected(1, 0, "s1", "advisor_tool_result"),
    ),
    (
        "server result answering a client tool_use",
        [Q, asst(use("a"), srv_result("a")), user(result("a"))],
        srv_unexpected(1, 1, "a", "web_search_tool_result"),
    ),
    (
        "mcp result answering a server_tool_use",
        [Q, asst(srv("s1"), mcp_result("s1"))],
        srv_unexpected(1, 1, "s1", "mcp_tool_result", "mcp_tool_use"),
    ),
    (
        "server result answering an mcp use",
        [Q, asst(mcp("m1"), srv_result("m1"))],
        srv_unexpected(1, 1, "m1", "web_search_tool_result"),
    ),
    (
        "server result for a use of an earlier turn",
        [Q, asst(srv("s1")), Q, asst(srv_result("s1"))],
        srv_unanswered(1, "s1"),
    ),
    (
        "duplicate server result",
        [Q, asst(srv("s1"), srv_result("s1"), srv_result("s1"))],
        srv_dup_result(1, 2, "s1", "web_search_tool_result"),
    ),
    (
        "duplicate server use id in one turn",
        [Q, asst(srv("s1"), srv("s1"))],
        dup_use(1, 1, "s1", "server_tool_use"),
    ),
    (
        "unanswered server use in an earlier turn",
        [Q, asst(text(), srv("s1"), srv("s2")), Q, asst(text())],
        srv_unanswered(1, "s1", "s2"),
    ),
    (
        "unanswered mcp use in an earlier turn",
        [Q, asst(mcp("m1")), Q, asst(text())],
        srv_unanswered(1, "m1", kind="mcp_tool_use"),
    ),
    (
        "unanswered server use is reported at the message that made it",
        [Q, asst(text()), asst(srv("s1")), Q, asst(text())],
        srv_unanswered(2, "s1"),
    ),
]


@pytest.mark.parametrize(("name", "messages", "expected"), CASES, ids=[c[0] for c in CASES])
def test_table(name: str, messages: object, expected: str | None) -> None:
    before = copy.deepcopy(messages)
    got = validate_messages(messages)
    assert (got.message if got else None) == expected
    assert messages == before  # never mutates its input


def test_table_wording_is_unique() -> None:
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))


def test_violation_is_a_frozen_value() -> None:
    v = Violation("x")
    assert v == Violation("x")
    with pytest.raises(AttributeError):
        v.message = "y"  # type: ignore[misc]


# --- validate_request -----------------------------------------------------------------------


def test_request_without_messages() -> None:
    assert validate_request({"model": "m"}) == Violation("messages: Field required")


def test_request_with_non_list_messages() -> None:
    assert validate_request({"messages": "hi"}) == Violation(
        "messages: Input should be a valid list"
    )


def test_request_delegates_to_messages() -> None:
    body = {"model": "m", "messages": [Q, asst(use("a")), user(text())]}
    assert validate_request(body) == Violation(missing(1, "a"))
    assert validate_request({"messages": [Q]}) is None


# --- real transcripts -----------------------------------------------------------------------


def _load(path: Path) -> list[Msg]:
    messages: list[Msg] = json.loads(path.read_text())["messages"]
    return messages


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_every_user_ending_prefix_of_a_real_transcript_is_valid(path: Path) -> None:
    messages = _load(path)
    checked = 0
    for k in range(1, len(messages) + 1):
        if messages[k - 1]["role"] == "user":
            assert validate_messages(messages[:k]) is None, k
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_prefix_ending_on_a_tool_call_is_reported(path: Path) -> None:
    messages = _load(path)
    for k, msg in enumerate(messages):
        if msg["role"] == "assistant" and isinstance(msg["content"], list):
            ids = [b["id"] for b in msg["content"] if b["type"] == "tool_use"]
            if ids:
                assert validate_messages(messages[: k + 1]) == Violation(missing(k, *ids))


def _tool_turns(messages: list[Msg]) -> list[int]:
    """Indices of user messages that answer tool calls."""
    return [
        i
        for i, m in enumerate(messages)
        if m["role"] == "user"
        and isinstance(m["content"], list)
        and any(b["type"] == "tool_result" for b in m["content"])
    ]


@pytest.fixture(scope="module")
def cc() -> list[Msg]:
    return _load(CC)


def test_mutation_drop_one_tool_result(cc: list[Msg]) -> None:
    for i in _tool_turns(cc)[::7]:
        messages = copy.deepcopy(cc)
        blocks = messages[i]["content"]
        dropped = next(b for b in blocks if b["type"] == "tool_result")
        blocks.remove(dropped)
        assert validate_messages(messages) == Violation(missing(i - 1, dropped["tool_use_id"]))


def test_mutation_result_after_text(cc: list[Msg]) -> None:
    for i in _tool_turns(cc)[::5]:
        messages = copy.deepcopy(cc)
        messages[i]["content"].insert(0, text("I ran it:"))
        k = sum(1 for b in messages[i - 1]["content"] if b["type"] == "tool_use")
        assert validate_messages(messages) == Violation(not_first(i, k))


def test_mutation_duplicate_tool_use_id(cc: list[Msg]) -> None:
    turns = _tool_turns(cc)
    first, later = turns[3], turns[-2]
    messages = copy.deepcopy(cc)
    old_id = messages[first - 1]["content"][-1]["id"]
    m = next(j for j, b in enumerate(messages[later - 1]["content"]) if b["type"] == "tool_use")
    new_id = messages[later - 1]["content"][m]["id"]
    messages[later - 1]["content"][m]["id"] = old_id  # reuse an earlier id ...
    for b in messages[later]["content"]:  # ... and answer it consistently
        if b.get("tool_use_id") == new_id:
            b["tool_use_id"] = old_id
    assert validate_messages(messages) == Violation(dup_use(later - 1, m, old_id))


def test_mutation_renamed_result_id(cc: list[Msg]) -> None:
    i = _tool_turns(cc)[10]
    messages = copy.deepcopy(cc)
    r = messages[i]["content"][0]
    uid = r["tool_use_id"]
    r["tool_use_id"] = "toolu_renamed"
    # the call that lost its answer comes first in message order
    assert validate_messages(messages) == Violation(missing(i - 1, uid))


def test_mutation_system_entry_before_results(cc: list[Msg]) -> None:
    i = _tool_turns(cc)[4]
    messages = [*cc[:i], system("reminder"), *cc[i:]]
    ids = [b["id"] for b in cc[i - 1]["content"] if b["type"] == "tool_use"]
    assert validate_messages(messages) == Violation(missing(i - 1, *ids))


def test_validation_does_not_mutate_a_real_transcript(cc: list[Msg]) -> None:
    before = copy.deepcopy(cc)
    validate_messages(cc[:-1])
    validate_messages(cc)
    assert cc == before


# --- properties -----------------------------------------------------------------------------

turns = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3),  # tool calls in this turn
        st.randoms(use_true_random=False),  # result order
        st.booleans(),  # text after the results
    ),
    min_size=1,
    max_size=8,
)


def _conversation(
    spec: list[tuple[int, Any, bool]],
) -> tuple[list[Msg], list[tuple[int, int, str]]]:
    messages: list[Msg] = [Q]
    results: list[tuple[int, int, str]] = []  # (user message index, block index, id)
    for t, (n, rnd, trailing) in enumerate(spec):
        ids = [f"toolu_{t}_{k}" for k in range(n)]
        messages.append(asst(text(), *(use(u) for u in ids)) if ids else asst(text()))
        order = ids[:]
        rnd.shuffle(order)
        answer = [result(u) for u in order] + ([text()] if trailing or not ids else [])
        results += [(len(messages), j, u) for j, u in enumerate(order)]
        messages.append(user(*answer))
    return messages, results


@settings(max_examples=60, deadline=None)
@given(turns)
def test_generated_conversations_are_valid(spec: list[tuple[int, Any, bool]]) -> None:
    messages, _ = _conversation(spec)
    assert validate_messages(messages) is None


@settings(max_examples=60, deadline=None)
@given(turns, st.integers(min_value=0))
def test_dropping_any_result_is_reported_at_its_call(
    spec: list[tuple[int, Any, bool]], pick: int
) -> None:
    messages, results = _conversation(spec)
    if not results:
        return
    i, j, uid = results[pick % len(results)]
    del messages[i]["content"][j]
    assert validate_messages(messages) == Violation(missing(i - 1, uid))
