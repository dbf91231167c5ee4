"""A re-sent body parsed from what was remembered is exactly what ``orjson.loads`` gives.

Every check compares with ``orjson.loads`` of the whole text: equal values, the same key order
(``orjson.dumps`` bytes), or the same error. Re-use is checked too: the leading messages are the
very objects of the earlier body, and the digests and checkpoints remembered with it come back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.compaction.digest import Resent, digests
from proxy.core.protocol import scan_messages
from proxy.core.reparse import BodyMemo, Parsed

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TOOLS = [
    {"name": f"tool{i}", "description": "does things " * 20, "input_schema": {}} for i in range(8)
]


def message(i: int, marker: bool = False, tag: str = "") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": f"{tag}turn {i}: " + "words → more " * 20}
    if marker:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [block]}


def body(n: int, tag: str = "", **extra: Any) -> dict[str, Any]:
    """Claude Code's layout: model, messages (breakpoint on the last), then the rest; ``tag``
    makes the messages another conversation's."""
    messages = [message(i, marker=i == n - 1, tag=tag) for i in range(n)]
    return {"model": "m", "messages": messages, "system": "be brief", "tools": TOOLS, **extra}


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def parse(memo: BodyMemo, text: bytes, scope: str = "t") -> Parsed:
    """``memo.parse``, checked against ``orjson.loads``; remembered like the edge does."""
    try:
        want = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        with pytest.raises(orjson.JSONDecodeError) as raised:
            memo.parse(scope, text)
        assert str(raised.value) == str(exc)
        raise
    got = memo.parse(scope, text)
    assert got.body == want
    assert dumps(got.body) == dumps(want)  # key order included
    if isinstance(got.body, dict) and isinstance(got.body.get("messages"), list):
        messages = got.body["messages"]
        _, kept = scan_messages(messages, None, range(len(messages) + 1))
        got.remember(kept)
    return got


def test_the_next_turn_reuses_the_history_objects() -> None:
    memo = BodyMemo(min_bytes=0)
    first = parse(memo, dumps(body(6)))
    assert first.reused == 0 and memo.misses == 1
    second = parse(memo, dumps(body(8)))
    # message 5 lost its breakpoint (it moved to message 7): reused up to there
    assert second.reused == 5 and memo.hits == 1
    messages = second.body["messages"]
    assert isinstance(messages, Resent)
    assert all(a is b for a, b in zip(messages[:5], first.body["messages"][:5], strict=True))
    assert messages[5] is not first.body["messages"][5]
    assert len(memo) == 1  # a conversation keeps its latest body
    # the members after the array are the same bytes: the same objects (once remembered)
    third = parse(memo, dumps(body(10)))
    assert third.reused == 7
    assert third.body["tools"] is second.body["tools"]


def test_the_same_body_again_reuses_everything() -> None:
    memo = BodyMemo(min_bytes=0)
    text = dumps(body(5))
    first = parse(memo, text)
    again = parse(memo, text)
    assert again.reused == 5
    assert all(a is b for a, b in zip(again.body["messages"], first.body["messages"], strict=True))


def test_changed_members_after_the_array_are_parsed() -> None:
    memo = BodyMemo(min_bytes=0)
    parse(memo, dumps(body(6)))
    second = parse(memo, dumps(body(8, system="be very brief", stream=True)))
    assert second.reused == 5
    third = parse(memo, dumps(body(10, system="be very brief", stream=True)))
    assert third.reused == 7
    assert third.body["tools"] is second.body["tools"]


def test_checkpoints_and_digests_come_back_with_the_history() -> None:
    memo = BodyMemo(min_bytes=0)
    first = parse(memo, dumps(body(9)))
    first.keep_digests(digests(first.body["messages"]))
    second = parse(memo, dumps(body(11)))
    assert second.reused == 8
    assert second.checkpoint is not None and second.checkpoint.index == 8
    known = second.body["messages"].known
    assert known is not None and known.messages[:8] == tuple(second.body["messages"][:8])
    # digests of other objects are not kept
    other = parse(BodyMemo(min_bytes=0), dumps(body(3)))
    second.keep_digests(digests(other.body["messages"]))
    third = parse(memo, dumps(body(13)))
    assert third.body["messages"].known is None


def test_the_latest_checkpoint_at_or_before_the_reused_messages() -> None:
    memo = BodyMemo(min_bytes=0)
    first = memo.parse("t", dumps(body(9)))
    _, kept = scan_messages(first.body["messages"], None, {2, 4, 7})
    first.remember(kept)
    second = memo.parse("t", dumps(body(11)))
    assert second.reused == 8
    assert second.checkpoint is not None and second.checkpoint.index == 7


def test_scopes_do_not_share() -> None:
    memo = BodyMemo(min_bytes=0)
    parse(memo, dumps(body(6)), scope="a")
    assert parse(memo, dumps(body(8)), scope="b").reused == 0
    assert parse(memo, dumps(body(8)), scope="a").reused == 5


def test_conversations_that_start_alike_are_told_apart() -> None:
    """Agents start sessions with the same long preamble: one lookup key, many conversations."""
    memo = BodyMemo(min_bytes=0)

    def conversation(c: int, n: int) -> bytes:
        data = body(n)
        preamble = {"role": "user", "content": "the same preamble " * 40 + f"; task {c}"}
        return dumps({**data, "messages": [preamble, *data["messages"][1:]]})

    firsts = [parse(memo, conversation(c, 6)) for c in range(12)]
    assert len(memo) == 12
    for c in range(12):
        got = parse(memo, conversation(c, 8))
        assert got.reused == 5
        assert got.body["messages"][0] is firsts[c].body["messages"][0]
    assert len(memo) == 12



def test_two_conversations_sharing_only_their_first_message_keep_an_entry_each() -> None:
    """Headless runs started with the same prompt: they must not evict each other every turn."""
    memo = BodyMemo(min_bytes=0)
    first = {"role": "user", "content": "the same prompt " * 100}
    convs: dict[str, list[dict[str, Any]]] = {"a": [first], "b": [first]}
    for turn in range(5):
        for name, messages in convs.items():
            messages += [
                {"role": "assistant", "content": f"{name}{turn} " + "a" * 500},
                {"role": "user", "content": f"{name}{turn} " + "u" * 500},
            ]
            got = parse(memo, dumps({"model": "m", "messages": messages, "system": "s"}))
            if turn:
                assert got.reused == len(messages) - 2  # all of its own previous turn
    assert len(memo) == 2


@pytest.mark.parametrize("depth", [1018, 1019, 1020, 1021])
@pytest.mark.parametrize("system", ["s", "changed"])
def test_the_depth_limit_holds_for_new_messages(depth: int, system: str) -> None:
    """A new message nested as deep as orjson allows in the whole body, and one level more: the
    memo parses or refuses exactly as ``orjson.loads`` does, whether or not the end changed."""
    memo = BodyMemo(min_bytes=0)
    old = [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "ok"}]

    def text(deep: bytes | None, system: str) -> bytes:
        out = b'{"model":"m","messages":[' + b",".join(dumps(m) for m in old)
        if deep is not None:
            out += b"," + deep
        return out + b'],"system":"' + system.encode() + b'"}'

    parse(memo, text(None, "s"))
    deep = b'{"role":"user","content":[{"type":"text","text":"x","z":' + b"[" * depth + b"]" * depth + b"}]}"
    whole = text(deep, system)
    try:
        want = orjson.loads(whole)
    except orjson.JSONDecodeError as exc:
        with pytest.raises(orjson.JSONDecodeError) as raised:
            memo.parse("t", whole)
        assert str(raised.value) == str(exc)
        assert depth >= 1020  # {"messages":[{"content":[{"z": + depth > 1024 levels
        return
    got = memo.parse("t", whole)  # (too deep to compare with ==: compare the shape)
    assert got.reused == 2 and list(got.body) == list(want) and got.body["system"] == system
    assert len(got.body["messages"]) == 3 and got.body["messages"][:2] == old

def test_small_bodies_are_not_remembered() -> None:
    memo = BodyMemo(min_bytes=1 << 20)
    parse(memo, dumps(body(6)))
    assert len(memo) == 0
    assert parse(memo, dumps(body(8))).reused == 0


def test_memory_is_bounded_by_the_text_remembered() -> None:
    one = len(dumps(body(6, tag="c0 ")))
    memo = BodyMemo(max_bytes=3 * one + 10, min_bytes=0)
    for i in range(6):
        parse(memo, dumps(body(6, tag=f"c{i} ")))  # 6 conversations
        assert memo.size <= 3 * one + 10
    assert len(memo) == 3
    # the oldest ones are gone, the latest ones are kept
    assert parse(memo, dumps(body(8, tag="c0 "))).reused == 0
    assert parse(memo, dumps(body(8, tag="c5 "))).reused == 5


STYLES: dict[str, Callable[[Any], bytes]] = {
    "compact": orjson.dumps,
    "spaced": lambda v: json.dumps(v).encode(),  # ", " and ": ", \\u escapes
    "ascii": lambda v: json.dumps(v, separators=(",", ":")).encode(),
    "sorted": lambda v: json.dumps(v, sort_keys=True, ensure_ascii=False).encode(),
    "indent": lambda v: json.dumps(v, indent=2).encode(),
    "tabs": lambda v: json.dumps(v, indent="\t", separators=(" ,\r\n", " :\t")).encode(),
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_every_json_style_reuses_the_history(style: str) -> None:
    memo = BodyMemo(min_bytes=0)
    write = STYLES[style]
    first = parse(memo, write(body(6)))
    assert first.reused == 0
    second = parse(memo, write(body(8)))
    assert second.reused == 5  # up to the message that lost its breakpoint
    assert all(a is b for a, b in zip(second.body["messages"][:5], first.body["messages"], strict=False))
    third = parse(memo, write(body(10)))
    assert third.reused == 7
    assert third.body["tools"] is second.body["tools"]  # the same bytes after the array
    assert third.reused_members == frozenset(third.body) - {"messages"}


# --- tricky texts: each one must come out as orjson.loads has it ------------------------------


def _texts_after(first: bytes) -> list[bytes]:
    start = first.index(b'"messages":[') + len(b'"messages":[')
    second = dumps(body(8))
    at = second.index(b'],"system"')
    return [
        # a later "messages" member replaces the array (orjson keeps the last one)
        second[:-1] + b',"messages":[{"role":"user","content":"other"}]}',
        # ... spelled with an escape
        second[:-1] + b',"messag\\u0065s":[]}',
        # a member before the array given again after it: first position, last value
        second[:-1] + b',"model":"another"}',
        # a trailing comma in the array, and one before the members
        second[:at] + b",]" + second[at + 1 :],
        second[:at] + b",," + second[at:],
        first.replace(b'],"system"', b',],"system"'),
        first.replace(b'],"system"', b'],,"system"'),
        first.replace(b'],"system"', b', ],"system"'),
        # whitespace between the elements, and around the end of the array
        second[:at] + b" ]" + second[at + 1 :],
        second.replace(b'},{"role"', b'}, {"role"'),
        # the array cut short, or left open
        second[:at] + b"}",
        second[:at],
        # the history changed in the middle, or at the start
        second.replace(b"turn 3:", b"turn 3!"),
        second.replace(b"turn 0:", b"turn 0!"),
        # the whole body replaced by something else
        b'{"model":"m","messages":[]}',
        b"[1, 2, 3]",
        b'{"model":"m"}',
        first[:start] + b"]}",
        first,
    ]


@pytest.mark.parametrize("case", range(len(_texts_after(dumps(body(6))))))
def test_tricky_continuations(case: int) -> None:
    memo = BodyMemo(min_bytes=0)
    first = dumps(body(6))
    parse(memo, first)
    text = _texts_after(first)[case]
    try:
        parse(memo, text)
    except orjson.JSONDecodeError:
        pass
    parse(memo, dumps(body(10)))  # and the conversation goes on


def test_a_nested_messages_member_before_the_array_is_never_taken_for_it() -> None:
    memo = BodyMemo(min_bytes=0)
    tricky = {"model": "m", "metadata": {"messages": [1, 2]}, **body(6)}
    parse(memo, dumps(tricky))
    tricky2 = {"model": "m", "metadata": {"messages": [1, 2]}, **body(8)}
    got = parse(memo, dumps(tricky2))  # (equal to orjson.loads: checked by ``parse``)
    assert got.reused == 5  # the top-level array, found after the nested one
    assert got.body["metadata"] == {"messages": [1, 2]}


def test_a_body_whose_messages_are_not_a_list_is_not_remembered() -> None:
    memo = BodyMemo(min_bytes=0)
    parse(memo, b'{"model":"m","messages":{"role":"user"}}')
    parse(memo, b'{"model":"m","messages":[1,2],"messages":3}')
    assert len(memo) == 0


def test_a_never_seen_body_is_located_only_when_a_next_turn_comes() -> None:
    """Where a never-seen body's messages end is found when a later body looks like its next
    turn (not for a body whose conversation never comes back): the lookup then finds it."""
    memo = BodyMemo(min_bytes=0)
    parse(memo, dumps(body(6)))
    (entry,) = memo.entries.values()
    assert not entry.located and entry.ends == []  # remembered, not scanned
    got = parse(memo, dumps(body(8)))
    assert got.reused == 5 and entry.located and len(entry.ends) == 6


def test_a_body_whose_elements_cannot_be_located_is_dropped_when_looked_up() -> None:
    """Two ``messages`` members: orjson keeps the last, the remembered array start is the
    first's. Locating its elements then fails: the entry goes, the next body parses afresh."""

    def text(n: int) -> bytes:
        return b'{"model":"m","messages":[1],"messages":' + dumps(body(n)["messages"]) + b"}"

    memo = BodyMemo(min_bytes=0)
    parse(memo, text(6))
    assert len(memo) == 1
    got = parse(memo, text(8))  # (equal to orjson.loads: checked by ``parse``)
    assert got.reused == 0
    (entry,) = memo.entries.values()
    assert entry.text == text(8)  # the first one was dropped at the lookup


# --- property: any sequence of bodies ----------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
keys = st.sampled_from(["model", "system", "tools", "stream", "metadata", "messages", "x", "ë"])


@st.composite
def turns(draw: Any) -> list[bytes]:
    """A conversation's bodies: each one the previous messages up to a random point plus new
    ones, the members around the array sometimes changed; rendered compact (as Claude Code),
    sometimes with another layout, sometimes damaged."""
    head = draw(st.lists(st.tuples(keys, json_values), max_size=3))
    tail = draw(st.lists(st.tuples(keys, json_values), max_size=3))
    # a long first message (as agents have): the lookup key, which covers the start of the
    # array, stays the same from turn to turn, and what follows is compared byte for byte
    first = {"role": "user", "content": "the task: " + "x" * 300}
    messages: list[Any] = [first, *draw(st.lists(json_values, max_size=6))]
    out: list[bytes] = []
    for _ in range(draw(st.integers(2, 6))):
        lowest = 0 if not messages or draw(st.integers(0, 9)) == 0 else 1
        keep = draw(st.integers(lowest, len(messages)))
        messages = messages[:keep] + draw(st.lists(json_values, max_size=4))
        if draw(st.integers(0, 5)) == 0:
            head = draw(st.lists(st.tuples(keys, json_values), max_size=3))
        if draw(st.integers(0, 5)) == 0:
            tail = draw(st.lists(st.tuples(keys, json_values), max_size=3))
        members = [
            *(f"{json.dumps(k)}:{orjson.dumps(v).decode()}" for k, v in head),
            f'"messages":{orjson.dumps(messages).decode()}',
            *(f"{json.dumps(k, ensure_ascii=False)}:{orjson.dumps(v).decode()}" for k, v in tail),
        ]
        text = ("{" + ",".join(members) + "}").encode()
        style = draw(st.integers(0, 9))
        if style == 0:  # another client's layout
            text = json.dumps(json.loads(text)).encode()
        elif style == 1:  # a byte dropped, doubled or replaced
            at = draw(st.integers(0, len(text) - 1))
            byte = draw(st.sampled_from([b"", b",", b"]", b"}", b'"', b" ", text[at : at + 1] * 2]))
            text = text[:at] + byte + text[at + 1 :]
        out.append(text)
    return out


@SETTINGS
@given(turns())
def test_any_sequence_of_bodies_parses_as_orjson_has_it(texts: list[bytes]) -> None:
    memo = BodyMemo(min_bytes=0)
    earlier: list[list[Any]] = []  # the messages of the bodies parsed so far
    for text in texts:
        try:
            got = parse(memo, text)
        except orjson.JSONDecodeError:
            continue
        if got.reused:  # the very objects of one earlier body
            reused = got.body["messages"][: got.reused]
            assert any(
                len(before) >= len(reused)
                and all(a is b for a, b in zip(reused, before, strict=False))
                for before in earlier
            )
        if isinstance(got.body, dict) and isinstance(got.body.get("messages"), list):
            earlier.append(got.body["messages"])
