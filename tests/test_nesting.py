"""The nesting bound: the fast check (orjson's serializer limit) decides exactly as the walk.

Every depth around the limit (the deepest container at level 126..130, the body being level 1)
at every position (a member before or after ``messages``, the first, a middle or a new message,
inside a tool input), on a body parsed afresh and on one continued from a remembered body: the
answer is the error text the full walk gives (``_walk_everything``, the check as it was before
the fast path), including the path it names.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.core.nesting import MAX_DEPTH, check_nesting, fits, nesting_violation, too_deep
from proxy.core.reparse import BodyMemo, Parsed
from proxy.core.tokens import canonical_all


def _walk_everything(body: dict[str, Any]) -> str | None:
    """Every member and message walked, nothing skipped (the reference)."""
    for name, value in body.items():
        if name == "messages" and isinstance(value, list):
            for i, message in enumerate(value):
                found = too_deep(message, 3)
                if found is not None:
                    return _text(("messages", i, *found))
            continue
        found = too_deep(value, 2)
        if found is not None:
            return _text((name, *found))
    return None


def _text(path: tuple[str | int, ...]) -> str:
    parts = [str(p) for p in path]
    if len(parts) > 8:
        parts = [*parts[:8], f"...({len(parts) - 8} more)"]
    return (
        f"{'.'.join(parts)}: JSON nested deeper than {MAX_DEPTH} levels (the proxy's limit for a"
        " request body; the body itself is level 1)"
    )


def tower(levels: int, bottom: Any = "x") -> Any:
    """``levels`` containers, one in the other (lists and objects in turn), around ``bottom``."""
    value = bottom
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


USE = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "/a"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


def conversation(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "the task " + "x" * 400}]
    for i in range(1, n):
        if i % 2:
            out.append({"role": "assistant", "content": [{**USE, "id": f"toolu_{i}"}]})
        else:
            out.append({"role": "user", "content": [{**RESULT, "tool_use_id": f"toolu_{i - 1}"}]})
    return out


def deep_at(position: str, level: int, n: int = 6) -> dict[str, Any]:
    """A body whose deepest container is at ``level``, at ``position``."""
    messages = conversation(n)
    body: dict[str, Any] = {"model": "m", "messages": messages, "system": "s", "max_tokens": 9}
    if position == "nowhere":
        pass
    elif position == "member before":
        body = {"metadata": {"x": tower(level - 2)}, **body}  # metadata 2, its dict 3, ...
    elif position == "member after":
        body["system"] = [{"type": "text", "text": "s", "citations": tower(level - 3)}]
    elif position in ("first message", "middle message", "last message"):
        i = {"first message": 0, "middle message": n // 2, "last message": n - 1}[position]
        # message 3, content 4, block 5, "extra" 6 ...
        block = {"type": "text", "text": "t", "extra": tower(level - 5)}
        messages[i] = {**messages[i], "content": [block]}
    elif position == "tool input":
        i = n - 1 if (n - 1) % 2 else n - 2
        use = {**USE, "id": f"toolu_{i}", "input": {"v": tower(level - 6)}}  # input 6, tower 7..
        messages[i] = {"role": "assistant", "content": [use]}
    else:
        raise AssertionError(position)
    return body


def deepest(value: Any, level: int = 1) -> int:
    """The level of the deepest container in ``value`` (test code may recurse)."""
    if isinstance(value, dict):
        return max([level, *(deepest(v, level + 1) for v in value.values())])
    if isinstance(value, list):
        return max([level, *(deepest(v, level + 1) for v in value)])
    return 0


POSITIONS = ["member before", "member after", "first message", "middle message", "last message", "tool input"]
LEVELS = [126, 127, 128, 129, 130]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("position", POSITIONS)
def test_a_body_parsed_afresh_is_answered_as_the_walk_answers(position: str, level: int) -> None:
    body = orjson.loads(orjson.dumps(deep_at(position, level)))
    assert deepest(body) == level  # the test builds what it says
    want = _walk_everything(body)
    assert (want is None) == (level <= MAX_DEPTH)
    assert nesting_violation(body) == want


@pytest.mark.parametrize("checked", [0, 3])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("position", POSITIONS)
def test_the_check_hands_on_the_canonical_json_of_the_messages_it_checked(
    position: str, level: int, checked: int
) -> None:
    """What the edge passes on to compaction: the canonical JSON of the messages the check
    walked (from ``checked`` on), exactly ``canonical_all``'s; none when a message is refused."""
    body = orjson.loads(orjson.dumps(deep_at(position, level)))
    violation, made = check_nesting(body, checked)
    assert violation == nesting_violation(body, checked)
    # compaction off: the same answer, no canonical JSON made
    assert check_nesting(body, checked, make_canonical=False) == (violation, None)
    new = body["messages"][checked:]
    if violation is None:
        assert made is not None and made.start == checked
        assert list(made.items) == canonical_all(new)
        assert all(a is b for a, b in zip(made.objects, new, strict=True))
    elif violation.startswith("messages."):
        assert made is None


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("bottom", ["x", [], {}])
def test_the_fast_check_holds_exactly_up_to_the_limit(level: int, bottom: Any) -> None:
    """A level-2 value whose deepest container is at ``level`` (empty ones count)."""
    value = tower(level - 1 - (bottom != "x"), bottom)
    assert deepest(value, 2) == level
    assert fits(value) == (level <= MAX_DEPTH)
    assert fits([value], 1) == (level <= MAX_DEPTH)  # the same value one level up, wrapped


def _remembered(memo: BodyMemo, text: bytes) -> Parsed:
    """Parsed and checked as the edge does: remembered only when accepted."""
    parsed = memo.parse("t", text)
    if nesting_violation(parsed.body, parsed.reused, parsed.reused_members) is None:
        parsed.remember()
    return parsed


@pytest.mark.parametrize("style", ["compact", "spaced"])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("position", ["member after", "last message", "tool input"])
def test_a_continued_body_is_answered_as_the_walk_answers(position: str, level: int, style: str) -> None:
    """The deep part is new in the next turn; what came before is reused, not walked again."""

    def write(value: Any) -> bytes:
        return orjson.dumps(value) if style == "compact" else json.dumps(value).encode()

    memo = BodyMemo(min_bytes=0)
    _remembered(memo, write(deep_at("nowhere", 0, n=6)))
    parsed = _remembered(memo, write(deep_at(position, level, n=8)))
    assert parsed.reused >= 5
    assert parsed.body == orjson.loads(write(deep_at(position, level, n=8)))
    want = _walk_everything(parsed.body)
    assert (want is None) == (level <= MAX_DEPTH)
    assert nesting_violation(parsed.body, parsed.reused, parsed.reused_members) == want


@pytest.mark.parametrize("learnt", ["afresh", "continued"])
def test_a_member_overridden_in_the_remembered_body_is_checked_when_it_comes_back(learnt: str) -> None:
    """``{"system": <too deep>, "messages": [...], "system": "s"}`` is accepted (orjson keeps
    the last value); a next turn without the second ``system`` has the deep one: refused."""
    too_deep_system = orjson.dumps(tower(MAX_DEPTH))  # the member at 2: its deepest at 129
    memo = BodyMemo(min_bytes=0)

    def text(n: int, again: bool) -> bytes:
        out = b'{"system":' + too_deep_system + b',"messages":' + orjson.dumps(conversation(n))
        return out + (b',"system":"s"}' if again else b',"max_tokens":9}')

    if learnt == "continued":
        first = _remembered(memo, text(4, True))
        assert first.reused == 0 and nesting_violation(first.body) is None
    accepted = _remembered(memo, text(6, True))
    assert nesting_violation(accepted.body, accepted.reused, accepted.reused_members) is None
    again = memo.parse("t", text(8, False))
    assert again.reused >= 5 and "system" not in again.reused_members
    refused = nesting_violation(again.body, again.reused, again.reused_members)
    assert refused is not None and refused == _walk_everything(again.body)
    assert refused.startswith("system.0.k.0.k.0.k.0....(120 more): JSON nested deeper")
