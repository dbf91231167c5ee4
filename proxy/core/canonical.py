"""Canonical JSON of request values, and the prompt-cache markers in it. Pure.

The canonical JSON of a value is ``orjson`` with sorted keys: the same bytes whatever key order or
layout a client wrote. It is what the token memos' keys and the compaction plans' message hashes
are made of (``proxy.core.tokens``, ``proxy.core.compaction.digest``), and what the searches for
``cache_control`` markers (``MARKER_JSON``) and other keys run over: a key, or a string value,
shows in canonical JSON as itself in double quotes.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

__all__ = [
    "MARKER",
    "MARKER_JSON",
    "Canonical",
    "canonical_all",
    "canonical_json",
    "containing",
    "containing_each",
    "marker_blind",
    "strip_markers",
]

MARKER = "cache_control"
MARKER_JSON = b'"cache_control"'  # how the key shows in canonical JSON
_SEPARATOR = b"\0"  # never in canonical JSON (control characters are escaped)
# block types whose estimate reads none of the markers ``strip_markers`` removes (tool results:
# when their nested blocks read none either)
_MARKER_BLIND = frozenset(
    {
        "text",
        "tool_use",
        "server_tool_use",
        "mcp_tool_use",
        "thinking",
        "redacted_thinking",
        "image",
        "document",
    }
)
_NESTING = frozenset({"tool_result", "mcp_tool_result"})


def canonical_json(value: object) -> bytes | None:
    """The canonical JSON of ``value`` (``orjson``, sorted keys) -- what the memo keys are hashes
    of -- or ``None`` when it is not JSON (lone surrogates, huge ints, foreign objects)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


@dataclass(frozen=True, slots=True)
class Canonical:
    """``canonical_json`` of each of a messages list's elements from ``start`` on, made where
    they were walked anyway (the edge's nesting check): whoever needs them does not dump them
    again. Only for the list it was made of (the same objects, unchanged)."""

    start: int
    items: tuple[bytes, ...]
    objects: tuple[object, ...]  # the elements they are of (matched by identity)

    def of(self, messages: Sequence[object], start: int) -> list[bytes | None]:
        """``canonical_all(messages[start:])``, taking the ones made here (for the very same
        objects at the same places)."""
        if (
            start >= self.start
            and self.start + len(self.items) == len(messages)
            and all(map(operator.is_, messages[start:], self.objects[start - self.start :]))
        ):
            return list(self.items[start - self.start :])
        return canonical_all(messages[start:])


def canonical_all(values: Sequence[object]) -> list[bytes | None]:
    """``canonical_json`` of each value."""
    try:
        return [orjson.dumps(v, option=orjson.OPT_SORT_KEYS) for v in values]
    except TypeError:
        return [canonical_json(v) for v in values]


def containing(canonical: Sequence[bytes | None], needle: bytes) -> list[bool]:
    """Per entry of ``canonical``: whether its bytes contain ``needle`` (``None``: ``True``).

    One search over all entries at once. A key, or a string value, shows in canonical JSON as
    itself in double quotes: a message whose bytes lack ``MARKER_JSON`` has no marker."""
    return containing_each(canonical, (needle,))[0]


def containing_each(
    canonical: Sequence[bytes | None], needles: Sequence[bytes]
) -> list[list[bool]]:
    """``containing(canonical, needle)`` for each of ``needles`` (the entries joined once)."""
    joined = _SEPARATOR.join([b"" if c is None else c for c in canonical])
    starts: list[int] | None = None
    out: list[list[bool]] = []
    for needle in needles:
        found = [c is None for c in canonical]
        out.append(found)
        at = joined.find(needle)
        if at < 0:
            continue
        if starts is None:
            starts = list(accumulate([1 if c is None else len(c) + 1 for c in canonical], initial=0))
        while at >= 0:
            i = bisect_right(starts, at) - 1
            found[i] = True
            at = joined.find(needle, starts[i + 1])  # on from the next entry's first byte
    return out


def strip_markers(value: Any) -> Any:
    """``value`` without ``cache_control`` keys in blocks or nested ``tool_result`` content.

    Returns the very same object when there is nothing to strip (the common case).
    """
    if isinstance(value, Mapping):
        changed = MARKER in value
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == MARKER:
                continue
            if key == "content" and isinstance(item, list):
                new = strip_markers(item)
                changed = changed or new is not item
                out[key] = new
            else:
                out[key] = item
        return out if changed else value
    if isinstance(value, list):
        items = [strip_markers(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items
    return value


def marker_blind(block: object) -> bool:
    """Whether the estimate of ``block`` reads none of the markers ``strip_markers`` removes."""
    if isinstance(block, str):
        return True
    if not isinstance(block, dict):
        return False  # counted as JSON, markers included
    kind = block.get("type")
    if not isinstance(kind, str):
        return False
    if kind in _NESTING:
        content = block.get("content")
        return not isinstance(content, list) or all([marker_blind(b) for b in content])
    return kind in _MARKER_BLIND
