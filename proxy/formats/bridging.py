"""Betas and the body fields they enable, bridged to an upstream that accepts fewer of them.

A beta travels with the body fields it turns on: sending a field without its beta is a 400
("Extra inputs are not permitted"), sending a beta the platform does not know is Bedrock's 400
``invalid beta flag``. So a beta the upstream platform does not accept is dropped *together with*
its fields, never one half alone; a field two betas claim stays while one of them is kept.

Two tables, both overridable in the config (``upstream.accepted_betas``, ``upstream.beta_fields``):

* :data:`ACCEPTED`: the betas each platform accepts. Bedrock's list follows AWS's "Anthropic Claude
  Messages API" pages (request and response, extended thinking, compaction, thinking block binding:
  docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages*.html);
  Vertex's follows the provider's and Google Cloud's feature pages. Both agree with the per-platform
  table LiteLLM keeps since its Claude Code incident (docs.litellm.ai/blog/claude-code-beta-headers-incident).
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

# The betas each platform accepts in ``anthropic_beta`` / ``anthropic-beta``.
ACCEPTED: Mapping[str, frozenset[str]] = {
    "bedrock": frozenset(
        {
            "computer-use-2024-10-22",
            "computer-use-2025-01-24",
            "computer-use-2025-11-24",
            "token-efficient-tools-2025-02-19",
            "interleaved-thinking-2025-05-14",
            "output-128k-2025-02-19",
            "context-1m-2025-08-07",
            "context-management-2025-06-27",
            "compact-2026-01-12",
            "effort-2025-11-24",
            "fine-grained-tool-streaming-2025-05-14",
            "tool-search-tool-2025-10-19",
            "tool-examples-2025-10-29",
            "thinking-binding-controls-2026-08-01",
            "thinking-display-updates-2026-08-18",
        }
    ),
    "vertex": frozenset(
        {
            "computer-use-2024-10-22",
            "computer-use-2025-01-24",
            "computer-use-2025-11-24",
            "interleaved-thinking-2025-05-14",
            "context-1m-2025-08-07",
            "context-management-2025-06-27",
            "compact-2026-01-12",
            "compact-2026-09-04",
            "tool-search-tool-2025-10-19",
            "web-search-2025-03-05",
            "thinking-binding-controls-2026-08-01",
            "thinking-display-updates-2026-08-18",
        }
    ),
}

# The body fields a beta enables (dropped with it).
FIELDS: Mapping[str, tuple[str, ...]] = {
    "context-management-2025-06-27": ("context_management",),
    "compact-2026-01-12": (
        "context_management.edits[type=compact_20260112]",
        "messages[].content[type=compaction]",
    ),
    "compact-2026-09-04": ("compaction", "messages[].content[type=compaction]"),
    "thinking-binding-controls-2026-08-01": ("thinking.block_binding",),
    "effort-2025-11-24": ("output_config.effort",),
    "structured-outputs-2025-11-13": ("output_format",),
    "mcp-client-2025-04-04": ("mcp_servers",),
    "mcp-client-2025-11-20": ("mcp_servers",),
    "fast-mode-2026-02-01": ("speed",),
    "context-1m-2025-08-07": (),
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
