"""Checks every compacted view must pass, shared by the compaction test modules."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.compaction.markers import count_markers
from proxy.core.protocol import validate_messages

_VERBATIM = frozenset({"thinking", "redacted_thinking", "compaction"})


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def latest_assistant(messages: Sequence[Mapping[str, Any]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    return -1


def tool_ids(messages: Sequence[Mapping[str, Any]], kind: str, field: str) -> list[str]:
    return [b[field] for m in messages for b in blocks(m) if b.get("type") == kind]


def check_view(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    system: Any = None,
    tools: Any = None,
) -> None:
    """Assert the invariants of a compacted view ``after`` of the client's ``before``."""
    violation = validate_messages(list(after))
    assert violation is None, violation.message

    # tool_use and its tool_result are kept or dropped together
    uses = tool_ids(after, "tool_use", "id")
    results = tool_ids(after, "tool_result", "tool_use_id")
    assert sorted(uses) == sorted(results)
    assert set(uses) <= set(tool_ids(before, "tool_use", "id"))

    # first, last and latest assistant message are byte-identical
    assert dumps(after[0]) == dumps(before[0])
    assert dumps(after[-1]) == dumps(before[-1])
    i, j = latest_assistant(before), latest_assistant(after)
    if i >= 0:
        assert dumps(after[j]) == dumps(before[i])

    # thinking / redacted_thinking / signed / compaction blocks are verbatim copies
    verbatim = {
        dumps(b)
        for m in before
        for b in blocks(m)
        if b.get("type") in _VERBATIM or "signature" in b
    }
    for m in after:
        for b in blocks(m):
            if b.get("type") in _VERBATIM or "signature" in b:
                assert dumps(b) in verbatim, b

    # roles alternate user/assistant (system entries aside), starting with user; no empty content
    roles = [m["role"] for m in after if m["role"] != "system"]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for m in after:
        content = m["content"]
        assert content, m
        if isinstance(content, str):
            assert content.strip()
        for b in blocks(m):
            if b.get("type") == "text":
                assert b["text"], m

    # a provider compaction block and everything before it stays
    last_compaction = max(
        (k for k, m in enumerate(before) for b in blocks(m) if b.get("type") == "compaction"),
        default=-1,
    )
    for k in range(last_compaction + 1):
        assert dumps(after[k]) == dumps(before[k])

    # cache_control: never more markers than the client sent, at most four when it sent <= 4
    n_before = count_markers(system, tools, before)
    n_after = count_markers(system, tools, after)
    assert n_after <= n_before
    if n_before <= 4:
        assert n_after <= 4
