"""How deep a request's JSON nests: the proxy's bound, checked once at the edge.

Every later step (hashing, token counting, marker handling, re-serialising a changed body,
recording the transcript) can then rely on it: nothing nests deeper than :data:`MAX_DEPTH`
levels of objects and arrays, counted from the body itself (the body is level 1, ``messages``
level 2, a message level 3). orjson writes at most 254 levels; real requests use a few dozen.

The check is fast where nothing is too deep: orjson's serializer refuses to write more than 254
nested containers, so a level-2 value wrapped in ``MAX_DEPTH - 1`` lists serialises iff nothing
in it is deeper than level ``MAX_DEPTH`` (one C pass, no Python walk). When it does not (or when
this orjson's limit is not the one measured at import), the exact walk below decides and names
the path. The walk is iterative: no recursion, whatever the input. Pure.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any, cast

import orjson

from proxy.core.canonical import Canonical, canonical_all

__all__ = ["MAX_DEPTH", "canonical_within", "fits", "nesting_violation", "too_deep"]

MAX_DEPTH = 128
# orjson writes at most this many nested containers ("Recursion limit reached" beyond)
_ORJSON_LEVELS = 254


def _nested(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


def _writes(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError included
        return False
    return True


# the fast check holds only for the limit it was built on: probed once
_FAST = _writes(_nested(None, _ORJSON_LEVELS)) and not _writes(_nested(None, _ORJSON_LEVELS + 1))


_wrappers = threading.local()  # per thread: levels -> (outermost list, innermost list)


def _writes_within(value: Any, levels: int) -> bool:
    """``_writes(_nested(value, levels))`` without building the lists each time: one chain per
    thread and depth, its innermost slot set for the call (orjson calls back into no Python
    code while it writes, so nothing else sees the slot in between)."""
    chains = getattr(_wrappers, "chains", None)
    if chains is None:
        chains = _wrappers.chains = {}
    chain = chains.get(levels)
    if chain is None:
        inner: list[Any] = [None]
        chain = chains[levels] = (_nested(inner, levels - 1), inner)
    outer, inner = chain
    inner[0] = value
    try:
        return _writes(outer)
    finally:
        inner[0] = None  # holds nothing between calls


def fits(value: Any, level: int = 2) -> bool:
    """Whether nothing in ``value`` (a value at ``level``) is nested deeper than
    :data:`MAX_DEPTH` levels, by the fast check; ``False`` also means "not known"."""
    if not isinstance(value, dict | list):
        return True
    wrap = _ORJSON_LEVELS - MAX_DEPTH + level - 1  # >= 126 for any level a body has
    return _FAST and wrap > 0 and _writes_within(value, wrap)


def canonical_within(messages: Sequence[Any], start: int) -> Canonical | None:
    """The canonical JSON (``tokens.canonical_json``) of ``messages[start:]`` (elements at level
    3), made here because it makes the check cheap: the first serialisation of a freshly parsed
    string encodes it to UTF-8 (CPython keeps that with the string), so the check's pass (see
    ``fits``) over what was just dumped costs a fraction of a first pass. ``None`` when one
    is not JSON to orjson or does not fit: the exact walk then decides."""
    new = tuple(messages[start:])
    items = canonical_all(new)
    if any(item is None for item in items) or not fits(list(new)):
        return None
    return Canonical(start, tuple(cast("list[bytes]", items)), new)


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


def nesting_violation(
    body: dict[str, Any], checked_messages: int = 0, checked_members: Collection[str] = ()
) -> str | None:
    """The error text for a body nested deeper than :data:`MAX_DEPTH`, or ``None``.

    ``checked_messages``: leading messages already checked (the same objects as in an earlier,
    accepted body) are not checked again; nor are the members named in ``checked_members``
    (values of an earlier, accepted body)."""
    return check_nesting(body, checked_messages, checked_members, make_canonical=False)[0]


def check_nesting(
    body: dict[str, Any],
    checked_messages: int = 0,
    checked_members: Collection[str] = (),
    *,
    make_canonical: bool = True,
) -> tuple[str | None, Canonical | None]:
    """``nesting_violation``, and the canonical JSON of the messages it checked (when the
    pass that checked them made it: see ``canonical_within``; not made without
    ``make_canonical``: nobody will hash or count them)."""
    canonical: Canonical | None = None
    messages = body.get("messages")
    messages_fit = True
    if isinstance(messages, list):
        if make_canonical:
            canonical = canonical_within(messages, checked_messages)  # each at level 3
            messages_fit = canonical is not None
        else:  # the new messages, at level 3 as a level-2 list's elements
            messages_fit = fits(messages[checked_messages:])
    members = [
        value
        for name, value in body.items()
        if isinstance(value, dict | list)
        and name not in checked_members
        and not (name == "messages" and isinstance(value, list))
    ]
    # all the other members at once (a level-1 list of level-2 values, as in the body)
    members_fit = not members or fits(members, 1)
    if members_fit and messages_fit:
        return None, canonical
    # something is (or may be) too deep: the walk names the first path, in the body's order
    for name, value in body.items():
        if name == "messages" and isinstance(value, list):
            if messages_fit:
                continue
            for i in range(checked_messages, len(value)):
                found = too_deep(value[i], 3)
                if found is not None:
                    return _message(("messages", i, *found)), None
            continue
        if name in checked_members or members_fit:
            continue
        found = too_deep(value, 2)
        if found is not None:
            return _message((name, *found)), None
    return None, canonical


def _message(path: tuple[str | int, ...]) -> str:
    return (
        f"{_dotted(path)}: JSON nested deeper than {MAX_DEPTH} levels (the proxy's limit for a"
        " request body; the body itself is level 1)"
    )
