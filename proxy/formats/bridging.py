"""Betas and the body fields they enable, bridged to an upstream that accepts fewer of them.

A beta travels with the body fields it turns on: sending a field without its beta is a 400
("Extra inputs are not permitted"), sending a beta the platform does not know is Bedrock's 400
``invalid beta flag`` (Vertex's ``Unsupported beta header``). So a beta the upstream platform
does not accept is dropped *together with* its fields, never one half alone; a field two betas
claim stays while one of them is kept.

The tables are the catalogue's beta rows (:data:`proxy.core.catalogue_data.BETAS`), each citing
its evidence (a platform page, or what Claude Code itself sends in that platform's mode: what
Claude Code sends to a platform is accepted there), overridable in the config
(``upstream.accepted_betas``, ``upstream.beta_fields``):

* :data:`ACCEPTED`: the betas each platform accepts;
* :data:`FIELDS`: the body fields each beta enables, as paths: ``a.b`` (a key in a mapping),
  ``a[]`` (every item of a list), ``a[type=x]`` (the items of type ``x``). An empty tuple: a
  beta that changes behaviour only (``context-1m-2025-08-07``).

Pure: values in, values out; the client's body is never changed (copy on write).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.catalogue_data import BETAS

# The betas each platform accepts in ``anthropic_beta`` / ``anthropic-beta``.
ACCEPTED: Mapping[str, frozenset[str]] = {
    platform: frozenset(b.name for b in BETAS if platform in b.accepted)
    for platform in sorted({p for b in BETAS for p in b.accepted})
}
# The body fields a beta enables (dropped with it).
FIELDS: Mapping[str, tuple[str, ...]] = {
    b.name: b.fields for b in BETAS if b.fields or b.fields_source
}

_SEGMENT = re.compile(r"^(?P<name>[A-Za-z0-9_]+)(?:\[(?:type=(?P<type>[A-Za-z0-9_.-]+))?\])?$")
_LIST = re.compile(r"\[(?:type=[^\]]*)?\]$")


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a field path (``a.b``, ``a[]``, ``a[type=x]``); ``None`` when it is."""
    if not path or not all(_SEGMENT.match(part) for part in path.split(".")):
        return "a field path like context_management, thinking.block_binding or messages[].content[type=compaction]"
    return None


@dataclass(frozen=True, slots=True)
class Bridging:
    """What one upstream accepts: its betas, and the fields each beta enables."""

    accepted: frozenset[str]
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(FIELDS))

    @classmethod
    def for_platform(
        cls,
        platform: str,
        accepted: Iterable[str] = (),
        fields: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Bridging:
        """The built-in tables for ``platform``; a non-empty ``accepted`` replaces its betas,
        ``fields`` entries replace the built-in pairing of theirs."""
        betas = frozenset(accepted) or ACCEPTED.get(platform, frozenset())
        return cls(betas, {**FIELDS, **(fields or {})})


@dataclass(frozen=True, slots=True)
class Bridged:
    body: Mapping[str, Any]
    betas: tuple[str, ...]  # kept, in the client's order
    dropped_betas: tuple[str, ...] = ()
    dropped_fields: tuple[str, ...] = ()  # the paths that matched something in the body


def betas_of(values: Iterable[str]) -> list[str]:
    """The betas of one or more ``anthropic-beta`` header values (comma lists), in order, once."""
    seen: dict[str, None] = {}
    for value in values:
        for beta in value.split(","):
            beta = beta.strip()
            if beta:
                seen.setdefault(beta)
    return list(seen)


def bridge(body: Mapping[str, Any], betas: Sequence[str], bridging: Bridging) -> Bridged:
    """``body`` and ``betas`` as the upstream accepts them: each beta it does not accept is
    dropped with the fields it enables (a field another kept beta also claims stays)."""
    kept = tuple(b for b in betas if b in bridging.accepted)
    dropped = tuple(b for b in betas if b not in bridging.accepted)
    if not dropped:
        return Bridged(body, kept)
    keep_paths = {p for b in kept for p in bridging.fields.get(b, ())}
    paths = [
        p for b in dropped for p in bridging.fields.get(b, ()) if p not in keep_paths
    ]
    removed: list[str] = []
    out: Any = body
    for path in dict.fromkeys(paths):
        out, hit = _remove(out, path.split("."))
        if hit:
            removed.append(path)
    return Bridged(out, kept, dropped, tuple(removed))


def _remove(value: Any, parts: list[str]) -> tuple[Any, bool]:
    """``value`` without what ``parts`` names (a new value when something was removed)."""
    match = _SEGMENT.match(parts[0])
    if match is None or not isinstance(value, Mapping):
        return value, False
    name, wanted = match.group("name"), match.group("type")
    is_list = _LIST.search(parts[0]) is not None
    if name not in value:
        return value, False
    rest = parts[1:]
    if not is_list:
        if not rest:
            return {k: v for k, v in value.items() if k != name}, True
        inner, hit = _remove(value[name], rest)
        return ({**value, name: inner}, True) if hit else (value, False)
    items = value[name]
    if not isinstance(items, list):
        return value, False
    changed = False
    new_items: list[Any] = []
    for item in items:
        typed = isinstance(item, Mapping) and (wanted is None or item.get("type") == wanted)
        if not typed:
            new_items.append(item)
        elif not rest:
            changed = True  # the item itself goes
        else:
            inner, hit = _remove(item, rest)
            changed = changed or hit
            new_items.append(inner)
    return ({**value, name: new_items}, True) if changed else (value, False)
