"""What the provider says it did to a request besides answering it, kept with the call's ledger row
(pure: no I/O).

* ``context_management.applied_edits``: the context edits it applied server-side
  (``clear_tool_uses_20250919``: ``cleared_tool_uses``, ``cleared_input_tokens``;
  ``clear_thinking_20251015``: ``cleared_thinking_turns``, ``cleared_input_tokens``). On the
  Message of a JSON answer; in a stream at the top level of ``message_delta``.
* ``input_transformations``: blocks it changed or flagged before the model saw them, e.g.
  ``{"type": "thinking_dropped", "path": "messages.3.content.0", "reason":
  "prefix_binding_mismatch"}`` (a thinking block bound to another prefix, model, organization or end
  user, removed under ``block_binding.mismatch_behavior: drop_block``) or
  ``thinking_mismatch_allowed`` (flagged, still shown). A top-level array of the Message; in a
  stream inside ``message_start``'s message (a ``message_delta`` carrying one replaces it: the
  SDK's accumulator does the same, after a mid-stream fallback).

Both are the provider's own, so they are bounded before they are stored: at most
:data:`MAX_ENTRIES` entries of each list (and :data:`MAX_BYTES` of JSON for both), each entry's
strings cut to :data:`MAX_TEXT` characters, objects and lists inside an entry cut to
:data:`MAX_ITEMS` items and :data:`MAX_DEPTH` levels. What was cut is counted
(``applied_edits_total`` / ``input_transformations_total`` say how many the provider listed).
``thinking_blocks_dropped`` counts the ``thinking_dropped`` entries of the whole list, cut or not.
Empty lists are no note: a call without either has none (``None``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MAX_ENTRIES", "MAX_TEXT", "ProviderNotes", "notes_from"]

MAX_ENTRIES = 64
MAX_TEXT = 200
MAX_ITEMS = 16
MAX_DEPTH = 3
MAX_BYTES = 32 * 1024
THINKING_DROPPED = "thinking_dropped"
_INT64 = 2**63


@dataclass(frozen=True, slots=True)
class ProviderNotes:
    """The bounded notes of one call (entries are JSON values, already bounded)."""

    applied_edits: tuple[Any, ...] | None = None
    input_transformations: tuple[Any, ...] | None = None
    applied_edits_total: int = 0
    input_transformations_total: int = 0
    thinking_blocks_dropped: int = 0

    def to_json(self) -> dict[str, Any]:
        """``{"applied_edits": [...], "input_transformations": [...]}`` (each only when present),
        with ``..._total`` beside a list that was cut."""
        out: dict[str, Any] = {}
        for name, kept, total in (
            ("applied_edits", self.applied_edits, self.applied_edits_total),
            ("input_transformations", self.input_transformations, self.input_transformations_total),
        ):
            if kept is None:
                continue
            out[name] = list(kept)
            if total > len(kept):
                out[f"{name}_total"] = total
        return out

    @classmethod
    def from_json(cls, raw: object, thinking_blocks_dropped: int = 0) -> ProviderNotes | None:
        """What :meth:`to_json` wrote (and the stored count of dropped thinking blocks)."""
        if not isinstance(raw, Mapping):
            return None
        lists: dict[str, tuple[Any, ...] | None] = {}
        totals: dict[str, int] = {}
        for name in ("applied_edits", "input_transformations"):
            kept = raw.get(name)
            lists[name] = tuple(kept) if isinstance(kept, list) else None
            total = raw.get(f"{name}_total")
            totals[name] = total if isinstance(total, int) else len(lists[name] or ())
        if lists["applied_edits"] is None and lists["input_transformations"] is None:
            return None
        return cls(
            lists["applied_edits"],
            lists["input_transformations"],
            totals["applied_edits"],
            totals["input_transformations"],
            thinking_blocks_dropped,
        )


def bounded(value: object, depth: int = 0) -> Any:
    """A JSON value cut to the bounds above (``None`` for what is too deep or not JSON)."""
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else None
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {
            str(k)[:MAX_TEXT]: bounded(v, depth + 1)
            for k, v in list(value.items())[:MAX_ITEMS]
        }
    if isinstance(value, list | tuple):
        return [bounded(v, depth + 1) for v in value[:MAX_ITEMS]]
    return None


def _kept(entries: list[Any], budget: int) -> tuple[tuple[Any, ...], int]:
    """The first entries (at most ``MAX_ENTRIES``) whose JSON fits ``budget`` bytes; the bytes used."""
    kept: list[Any] = []
    used = 0
    for entry in entries[:MAX_ENTRIES]:
        value = bounded(entry)
        size = len(orjson.dumps(value)) + 1
        if used + size > budget:
            break
        kept.append(value)
        used += size
    return tuple(kept), used


def notes_from(context_management: object, input_transformations: object) -> ProviderNotes | None:
    """The notes of an answer's ``context_management`` object and ``input_transformations`` list
    (either may be absent or null); ``None`` when neither lists anything."""
    edits = (
        context_management.get("applied_edits")
        if isinstance(context_management, Mapping)
        else None
    )
    edits = edits if isinstance(edits, list) and edits else None
    changes = (
        input_transformations
        if isinstance(input_transformations, list) and input_transformations
        else None
    )
    if edits is None and changes is None:
        return None
    budget = MAX_BYTES
    kept_edits = kept_changes = None
    if edits is not None:
        kept_edits, used = _kept(edits, budget)
        budget -= used
    if changes is not None:
        kept_changes, _ = _kept(changes, budget)
    dropped = sum(
        1
        for entry in changes or ()
        if isinstance(entry, Mapping) and entry.get("type") == THINKING_DROPPED
    )
    return ProviderNotes(
        kept_edits,
        kept_changes,
        len(edits or ()),
        len(changes or ()),
        dropped,
    )
