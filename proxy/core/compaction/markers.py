"""``cache_control`` breakpoints: at most four per request (tools, system and messages together).

Compaction never adds a marker: the view's blocks carry the client's own markers of this request
(see ``view``), and removed blocks take theirs with them. Only when the client itself sent more
than four, and the view is changed anyway, are the earliest markers in ``messages`` taken off until
four remain. Never touched: messages[0], anything up to a provider ``compaction`` block, the latest
assistant message and the last message (so the client's last marker survives).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.compaction.view import MARKER, Message, blocks_of

__all__ = ["MAX_MARKERS", "cap_markers", "count_markers"]

MAX_MARKERS = 4
_UNTOUCHABLE = frozenset({"thinking", "redacted_thinking", "compaction"})


def _in_blocks(blocks: Sequence[Any]) -> int:
    n = 0
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        if MARKER in block:
            n += 1
        nested = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(nested, list):
            n += _in_blocks(nested)
    return n


def count_markers(
    system: object,
    tools: object,
    messages: Sequence[Message],
    marked: Sequence[bool] | None = None,
) -> int:
    """Markers in the request. ``marked[i]`` ``False`` promises that ``messages[i]`` holds none
    (it is then not walked); ``None``: walk every message."""
    n = 0
    if isinstance(tools, list):
        n += sum(1 for t in tools if isinstance(t, Mapping) and MARKER in t)
    if isinstance(system, list):
        n += _in_blocks(system)
    if marked is None:
        for message in messages:
            n += _in_blocks(blocks_of(message))
    else:
        for message, may_have in zip(messages, marked, strict=True):
            if may_have:
                n += _in_blocks(blocks_of(message))
    return n


def _strip_block(block: Any, budget: list[int]) -> Any:
    """``block`` with up to ``budget[0]`` markers removed, earliest first (copy-on-write)."""
    if budget[0] <= 0 or not isinstance(block, Mapping) or block.get("type") in _UNTOUCHABLE:
        return block
    out = block
    if MARKER in block:
        out = {k: v for k, v in block.items() if k != MARKER}
        budget[0] -= 1
    nested = block.get("content") if block.get("type") == "tool_result" else None
    if isinstance(nested, list) and budget[0] > 0:
        new = [_strip_block(b, budget) for b in nested]
        if any(a is not b for a, b in zip(new, nested, strict=True)):
            out = {**out, "content": new}
    return out


def cap_markers(
    system: object,
    tools: object,
    messages: Sequence[Message],
    start: int,
    stop: int,
    marked: Sequence[bool] | None = None,
) -> list[Message]:
    """``messages`` with the earliest markers removed so that at most four remain in the request;
    only messages ``start`` to ``stop - 1`` are touched. ``marked``: see ``count_markers``."""
    excess = count_markers(system, tools, messages, marked) - MAX_MARKERS
    out = list(messages)
    if excess <= 0:
        return out
    budget = [excess]
    for i in range(start, min(stop, len(out))):
        if budget[0] <= 0:
            break
        blocks = blocks_of(out[i])
        if not blocks:
            continue
        new = [_strip_block(b, budget) for b in blocks]
        if any(a is not b for a, b in zip(new, blocks, strict=True)):
            out[i] = {**out[i], "content": new}
    return out
