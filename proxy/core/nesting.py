"""How deep a request's JSON nests: the proxy's bound, checked once at the edge.

Every later step (hashing, token counting, marker handling, re-serialising a changed body,
recording the transcript) can then rely on it: nothing nests deeper than :data:`MAX_DEPTH`
levels of objects and arrays, counted from the body itself (the body is level 1, ``messages``
level 2, a message level 3). orjson writes at most 254 levels; real requests use a few dozen.
Iterative: no recursion, whatever the input. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_DEPTH", "nesting_violation", "too_deep"]

MAX_DEPTH = 128


def _children(value: Any) -> Iterator[tuple[str | int, Any]]:
    if isinstance(value, dict):
        return iter(value.items())
    return enumerate(value)


def too_deep(value: Any, depth: int, limit: int = MAX_DEPTH) -> tuple[str | int, ...] | None:
    """The path (below ``value``) to the first container nested deeper than ``limit`` levels,
    ``value`` itself being at level ``depth``; ``None`` when nothing is."""
    if not isinstance(value, dict | list):
        return None
    if depth > limit:
        return ()
    stack = [_children(value)]
    path: list[str | int] = []
    while stack:
        for key, child in stack[-1]:
            if isinstance(child, dict | list):
                if depth + len(stack) > limit:
                    return (*path, key)
                path.append(key)
                stack.append(_children(child))
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def _dotted(path: tuple[str | int, ...], shown: int = 8) -> str:
    parts = [str(p) for p in path]
    if len(parts) > shown:
        parts = [*parts[:shown], f"...({len(parts) - shown} more)"]
    return ".".join(parts)


def nesting_violation(body: dict[str, Any], checked_messages: int = 0) -> str | None:
    """The error text for a body nested deeper than :data:`MAX_DEPTH`, or ``None``.

    ``checked_messages``: leading messages already checked (the same objects as in an earlier,
    accepted body) are not walked again."""
    for name, value in body.items():
        if name == "messages" and isinstance(value, list):
            for i in range(checked_messages, len(value)):
                found = too_deep(value[i], 3)
                if found is not None:
                    return _message(("messages", i, *found))
            continue
        found = too_deep(value, 2)
        if found is not None:
            return _message((name, *found))
    return None


def _message(path: tuple[str | int, ...]) -> str:
    return (
        f"{_dotted(path)}: JSON nested deeper than {MAX_DEPTH} levels (the proxy's limit for a"
        " request body; the body itself is level 1)"
    )
