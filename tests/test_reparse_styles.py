"""The body memo for every JSON style a client may write: property tests.

A conversation (text, tool_use / tool_result blocks with nested inputs, non-ASCII, escapes) is
written turn after turn in a style drawn at random -- ``orjson``; ``json.dumps`` with any
whitespace separators, indentation, ASCII escapes, sorted keys; or a writer that puts random
whitespace between tokens, escapes random characters and repeats keys -- and changed between turns
as clients do (messages appended, the last ones edited, the breakpoint moved, members after or
before the array changed, the style switched) or damaged (bytes dropped or doubled, trailing
commas, a lone surrogate, a second top-level ``messages``, a nested ``"messages": [`` before the
real one). For every turn the memo's body is what ``orjson.loads`` gives (equal, same key order),
or both raise the same error; and a well-formed next turn in the same style reuses the history.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.nesting import nesting_violation
from proxy.core.protocol import scan_messages
from proxy.core.reparse import BodyMemo, Parsed

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- values -------------------------------------------------------------------------------------

# ASCII, quotes and backslashes, controls, Latin-1, BMP (incl. U+2028/9), astral (surrogate pairs
# when escaped)
_CHARS = st.sampled_from(
    [*'ab z"\\/\n\t\r\x00\x1f\x7fé→\u2028\u2029ü中', "😀", "𝄞", "\U0010ffff"]
)
texts = st.text(_CHARS, max_size=20)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)  # beyond 64 bits too (orjson reads those as floats)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=10,
)


@st.composite
def blocks(draw: Any, role: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "tool"]))
        if kind == "text":
            out.append({"type": "text", "text": draw(texts)})
        elif role == "assistant":
            out.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{draw(st.integers(0, 99))}",
                    "name": draw(st.sampled_from(["Read", "Bash", "résumé"])),
                    "input": draw(st.dictionaries(texts, json_values, max_size=3)),
                }
            )
        else:
            content: Any = draw(texts | st.lists(st.builds(lambda t: {"type": "text", "text": t}, texts), max_size=2))
            block = {"type": "tool_result", "tool_use_id": f"toolu_{draw(st.integers(0, 99))}", "content": content}
            if draw(st.booleans()):
                block["is_error"] = True
            out.append(block)
    return out


@st.composite
def messages(draw: Any, first_index: int, count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(first_index, first_index + count):
        role = "user" if i % 2 == 0 else "assistant"
        content = draw(texts) if draw(st.integers(0, 4)) == 0 else draw(blocks(role))
        out.append({"role": role, "content": content})
    return out


# --- writing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    """How a client writes JSON. ``kind``: "orjson", "json" (``json.dumps`` with these
    options) or "random" (random whitespace, escapes and repeated keys, the same bytes for the
    same message every turn)."""

    kind: str
    item: str = ","
    key: str = ":"
    indent: int | str | None = None
    ascii: bool = False
    sort: bool = False
    seed: int = 0


styles = st.one_of(
    st.just(Style("orjson")),
    st.builds(
        Style,
        st.just("json"),
        st.sampled_from([",", ", ", " ,", " , ", ",\n", ",\r\n\t"]),
        st.sampled_from([":", ": ", " :", " : ", ":\t"]),
        st.sampled_from([None, 0, 2, "\t", " \r\n"]),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(Style, st.just("random"), ascii=st.booleans(), sort=st.booleans(), seed=st.integers(0, 2**32)),
)

_SPACE = ["", "", " ", "\n", "\t", "\r\n", "  \n  "]


def _string(value: str, style: Style, rnd: random.Random) -> str:
    out = ['"']
    for ch in value:
        escaped = json.dumps(ch, ensure_ascii=style.ascii)[1:-1]
        if escaped == ch and rnd.random() < 0.1:  # an escape no writer needs
            escaped = "".join(f"\\u{u:04x}" for u in _utf16(ch))
        out.append(escaped)
    return "".join(out) + '"'


def _utf16(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


def _random(value: Any, style: Style, rnd: random.Random) -> str:
    def ws() -> str:
        return rnd.choice(_SPACE)

    if isinstance(value, dict):
        items = sorted(value.items()) if style.sort else list(value.items())
        parts = []
        for k, v in items:
            if rnd.random() < 0.15:  # the same key twice: orjson keeps its first place, last value
                parts.append(ws() + _string(k, style, rnd) + ws() + ":" + ws() + '"decoy"' + ws())
            parts.append(ws() + _string(k, style, rnd) + ws() + ":" + ws() + _random(v, style, rnd) + ws())
        return "{" + (",".join(parts) if parts else ws()) + "}"
    if isinstance(value, list):
        inner = ",".join(ws() + _random(v, style, rnd) + ws() for v in value)
        return "[" + (inner if value else ws()) + "]"
    if isinstance(value, str):
        return _string(value, style, rnd)
    return json.dumps(value)


def write(members: list[tuple[str, Any]], style: Style) -> bytes:
    """The body: ``members`` in this order (keys sorted by the sorting styles)."""
    if style.kind == "orjson":
        try:
            return orjson.dumps(dict(members))
        except TypeError:  # an integer beyond 64 bits: the same layout, by json
            return json.dumps(dict(members), separators=(",", ":"), ensure_ascii=False).encode()
    if style.kind == "json":
        return json.dumps(
            dict(members),
            separators=(style.item, style.key),
            indent=style.indent,
            ensure_ascii=style.ascii,
            sort_keys=style.sort,
        ).encode()
    # random: every member and every message from its own generator, so that a message is
    # written the same way in every turn it is in
    order = sorted(members) if style.sort else members
    parts = []
    for name, value in order:
        rnd = random.Random(f"{style.seed}/{name}")
        if name == "messages" and isinstance(value, list):
            written = [
                _random(m, style, random.Random(f"{style.seed}/{i}/{json.dumps(m)}"))
                for i, m in enumerate(value)
            ]
            space = rnd.choice(_SPACE)
            text = "[" + space + ("," + space).join(written) + space + "]"
        else:
            text = _random(value, style, rnd)
        parts.append(rnd.choice(_SPACE) + _string(name, style, rnd) + " : " + text + "\n")
    return ("{" + ",".join(parts) + "}").encode()


# --- a conversation, turn by turn ---------------------------------------------------------------

FIRST = {"role": "user", "content": [{"type": "text", "text": "the task: " + "x → " * 80}]}
CLEAN = ("append", "edit", "same", "after")


def marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's breakpoint: on the last block of the last message (it moves every turn)."""
    last = history[-1]
    content = last["content"]
    if isinstance(content, list) and content:
        block = {**content[-1], "cache_control": {"type": "ephemeral"}}
        last = {**last, "content": [*content[:-1], block]}
    return [*history[:-1], last]


@dataclass
class Turn:
    text: bytes
    op: str
    style: Style


@st.composite
def conversations(draw: Any) -> list[Turn]:
    style = draw(styles)
    history = [FIRST, *draw(messages(1, draw(st.integers(1, 4))))]
    names = ["model", "messages", "system", "tools", "max_tokens"]
    if draw(st.booleans()):
        names.insert(0, "metadata")  # {"messages": [...]} before the real array
    names = draw(st.permutations(names)) if draw(st.integers(0, 3)) == 0 else names
    values: dict[str, Any] = {
        "model": "claude-x",
        "system": draw(texts),
        "tools": [{"name": "Read", "description": draw(texts), "input_schema": {"type": "object"}}],
        "max_tokens": 1000,
        "metadata": {"messages": [{"role": "user", "content": "nested"}], "user_id": draw(texts)},
    }
    out: list[Turn] = []
    for turn in range(draw(st.integers(2, 7))):
        op = "first" if turn == 0 else draw(
            st.sampled_from([*CLEAN, *CLEAN, "before", "style", "corrupt", "comma", "surrogate", "twice"])
        )
        if op == "append":
            history = history + draw(messages(len(history), draw(st.integers(1, 3))))
        elif op == "edit":
            keep = draw(st.integers(2, max(2, len(history) - 1)))
            history = history[:keep] + draw(messages(keep, draw(st.integers(1, 3))))
        elif op == "after":
            written = sorted(names) if style.sort and style.kind != "orjson" else names
            later = written[written.index("messages") + 1 :]
            if later:
                values[draw(st.sampled_from(later))] = draw(json_values)
            else:
                names = [*names, "stream"]
                values["stream"] = draw(st.booleans())
        elif op == "before":
            values["model"] = draw(texts)
            if names.index("model") > names.index("messages"):
                names = ["model", *[n for n in names if n != "model"]]
        elif op == "style":
            style = draw(styles)
        members = [(n, marked(history) if n == "messages" else values[n]) for n in names]
        text = write(members, style)
        if op == "corrupt":  # a byte dropped, doubled or replaced (most often in the new part)
            at = draw(st.integers(max(0, len(text) - 400), len(text) - 1) | st.integers(0, len(text) - 1))
            byte = draw(st.sampled_from([b"", b",", b"]", b"}", b'"', b" ", b"\xff", text[at : at + 1] * 2]))
            text = text[:at] + byte + text[at + 1 :]
        elif op == "comma":  # a trailing comma in the array or in the body
            end = text.rfind(b"]", 0, text.rfind(b'"max_tokens"') if b'"max_tokens"' in text else len(text))
            at = draw(st.sampled_from([end, len(text) - 1]))
            text = text[:at] + draw(st.sampled_from([b",", b" , ", b",\n"])) + text[at:]
        elif op == "surrogate":  # a lone surrogate escape in the new part
            at = text.rfind(b'"text"')
            if at > 0:
                text = text[:at] + b'"\\ud800",' + text[at:]
        elif op == "twice":  # the array given again (orjson keeps the last one)
            again = orjson.dumps(history[:1])
            text = text[:1] + b'"messages":' + again + b"," + text[1:]
        out.append(Turn(text, op, style))
    return out


# --- the checks ---------------------------------------------------------------------------------


def _check(memo: BodyMemo, text: bytes) -> Parsed | None:
    """``memo.parse`` is ``orjson.loads`` (value, key order, error); remembered as the edge does
    (a body with a ``messages`` list). ``None`` when it does not parse."""
    try:
        want = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        with pytest.raises(orjson.JSONDecodeError) as raised:
            memo.parse("t", text)
        assert str(raised.value) == str(exc)
        return None
    got = memo.parse("t", text)
    assert got.body == want
    assert orjson.dumps(got.body) == orjson.dumps(want)
    if isinstance(got.body, dict) and isinstance(got.body.get("messages"), list):
        assert nesting_violation(got.body, got.reused, got.reused_members) is None
        msgs = got.body["messages"]
        _, kept = scan_messages(msgs, None, range(len(msgs) + 1))
        got.remember(kept)
    return got


@SETTINGS
@given(conversations())
def test_every_turn_parses_as_orjson_has_it_and_the_history_is_reused(turns: list[Turn]) -> None:
    memo = BodyMemo(min_bytes=0)
    accepted: list[dict[str, Any]] = []
    previous: Turn | None = None
    for turn in turns:
        got = _check(memo, turn.text)
        if got is not None and got.reused:
            assert isinstance(got.body, dict)
            # the members said to be reused have the values of a remembered body
            for name in got.reused_members:
                assert any(name in old and old[name] == got.body[name] for old in accepted), name
        if (
            previous is not None
            and previous.op in ("first", *CLEAN)
            and turn.op in CLEAN
            and turn.style == previous.style
        ):
            assert got is not None and got.reused > 0, (turn.op, turn.style)
            event(f"history reused ({turn.style.kind} style)")
            if turn.op == "same":
                assert got.reused == len(got.body["messages"])
                assert got.reused_members == frozenset(got.body) - {"messages"}
        if got is not None and isinstance(got.body, dict):
            accepted.append(got.body)
        previous = turn


@SETTINGS
@given(conversations(), st.randoms(use_true_random=False))
def test_turns_in_any_order_parse_as_orjson_has_them(turns: list[Turn], rnd: random.Random) -> None:
    """Bodies of one conversation sent out of order, twice, or interleaved with others."""
    memo = BodyMemo(min_bytes=0)
    texts = [t.text for t in turns] * 2
    rnd.shuffle(texts)
    for text in texts:
        _check(memo, text)


def test_every_style_writes_what_orjson_reads() -> None:
    """The writer of these tests writes JSON (for each kind), and the same message alike."""
    value = [("model", "m"), ("messages", marked([FIRST, {"role": "assistant", "content": "é\u2028😀"}]))]
    for style in (Style("orjson"), Style("json", ", ", ": ", 2, True, True), Style("random", ascii=True, seed=7)):
        text = write(value, style)
        assert orjson.loads(text) == dict(value), style
        assert text == write(value, style)
