"""What a compaction did, as frozen records (the manifest).

Message indices always refer to the client's own ``messages`` (the request as received), never
to positions in the compacted view. Token figures are raw estimates (not calibrated). Records
are cumulative and in the order they were applied: a plan reused on a later turn carries the
records of every compaction that built it, so a message truncated once and later summarised
appears in a ``Truncated`` and then in a ``Summarized`` record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ManifestRecord", "Removed", "Summarized", "Truncated", "record_from_json"]


@dataclass(frozen=True, slots=True)
class Truncated:
    """L1: a ``tool_result`` kept only its head and tail."""

    message_index: int
    tool_use_id: str
    tokens_before: int
    tokens_after: int
    artifact_key: str | None = None  # where the full original is stored (durable-context issue)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "truncated",
            "message_index": self.message_index,
            "tool_use_id": self.tool_use_id,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "artifact_key": self.artifact_key,
        }


@dataclass(frozen=True, slots=True)
class Removed:
    """L2 (``dedup``: a superseded file read) or L3 (``prune``: old interactions dropped).

    ``message_indices`` lists whole messages removed; a dedup that only took blocks out of
    messages that stay has an empty tuple there and names the calls in ``tool_use_ids``.
    """

    message_indices: tuple[int, ...]
    tool_use_ids: tuple[str, ...]
    tokens: int
    reason: Literal["dedup", "prune"]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "removed",
            "message_indices": list(self.message_indices),
            "tool_use_ids": list(self.tool_use_ids),
            "tokens": self.tokens,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Summarized:
    """L4: old interactions replaced by a model-written summary in the bridge turn."""

    message_indices: tuple[int, ...]
    tool_use_ids: tuple[str, ...]
    tokens_before: int
    summary_tokens: int
    calls: int = 1  # summariser calls of the chain that wrote it (one per part of the region)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "summarized",
            "message_indices": list(self.message_indices),
            "tool_use_ids": list(self.tool_use_ids),
            "tokens_before": self.tokens_before,
            "summary_tokens": self.summary_tokens,
            "calls": self.calls,
        }


ManifestRecord = Truncated | Removed | Summarized


def record_from_json(data: Any) -> ManifestRecord:
    """Inverse of ``record.to_json()``; raises ``ValueError`` on anything else."""
    try:
        kind = data["kind"]
        if kind == "truncated":
            key = data["artifact_key"]
            return Truncated(
                int(data["message_index"]),
                str(data["tool_use_id"]),
                int(data["tokens_before"]),
                int(data["tokens_after"]),
                None if key is None else str(key),
            )
        if kind == "removed":
            reason = data["reason"]
            if reason not in ("dedup", "prune"):
                raise ValueError(f"unknown removal reason {reason!r}")
            return Removed(
                tuple(int(i) for i in data["message_indices"]),
                tuple(str(i) for i in data["tool_use_ids"]),
                int(data["tokens"]),
                "dedup" if reason == "dedup" else "prune",
            )
        if kind == "summarized":
            return Summarized(
                tuple(int(i) for i in data["message_indices"]),
                tuple(str(i) for i in data["tool_use_ids"]),
                int(data["tokens_before"]),
                int(data["summary_tokens"]),
                int(data.get("calls", 1)),  # plans stored before chunked summaries: one call
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed manifest record: {exc}") from exc
    raise ValueError(f"unknown manifest record kind {data.get('kind')!r}")
