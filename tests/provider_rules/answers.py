"""Answer shapes: what a script asks for (``Turn``), the provider's compaction summary, and
the SSE events that stream a whole message the way the provider streams it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.provider_rules.prefix import THINKING_TYPES, content_blocks, without_markers
from tests.provider_rules.signing import canonical, digest


@dataclass(frozen=True)
class Turn:
    """One scripted assistant turn, built for the request it answers (signed thinking bound to
    that request, ``input_transformations`` where the rules say, JSON or SSE per ``stream``).

    ``thinking``: the text of a leading thinking block (``""``: an omitted-display block;
    ``None``: no thinking block). ``redacted``: a redacted_thinking block after it. Then a text
    block and/or one ``tool_use`` (name, input). ``threshold_compaction``: start the answer
    with a threshold compaction block (the request must configure ``compact_20260112``); with
    ``pause_after_compaction`` the answer is that block alone.
    """

    text: str | None = None
    thinking: str | None = None
    redacted: bool = False
    tool_use: tuple[str, Mapping[str, Any]] | None = None
    tool_id: str | None = None
    threshold_compaction: bool = False
    applied_edits: tuple[Mapping[str, Any], ...] = ()
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 7


def _first_words(block: Mapping[str, Any], count: int = 8) -> str:
    kind = block.get("type")
    if kind == "text":
        text = str(block.get("text", ""))
    elif kind == "tool_use":
        text = f"[tool_use {block.get('name')}]"
    elif kind == "tool_result":
        inner = block.get("content")
        text = inner if isinstance(inner, str) else " ".join(str(b.get("text", "")) for b in content_blocks(inner))
        text = f"[tool_result] {text}"
    elif kind == "compaction":
        text = str(block.get("content") or "")
    else:
        text = f"[{kind}]"
    return " ".join(text.split()[:count])


def default_summary(messages: Sequence[Any], instructions: str | None) -> str:
    """A deterministic stand-in for the summary: a digest of the summarised messages and the
    first words of each (enough for a test to see what was summarised)."""
    lines = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        blocks = [b for b in content_blocks(message.get("content")) if b.get("type") not in THINKING_TYPES]
        words = [w for w in (_first_words(b) for b in blocks) if w]
        lines.append(f"{message.get('role')}: {words[0] if words else ''}")
    head = f"Summary of {len(lines)} messages ({digest(canonical(list(messages)))[:12]})"
    if instructions and instructions.strip():
        head += f", under instructions {digest(instructions)[:8]}"
    return "<summary>" + head + ": " + " | ".join(lines) + "</summary>"


def net_tool_changes(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The ``tool_addition`` / ``tool_removal`` blocks of the summarised ``system`` messages,
    the last change of each tool winning (an approximation of "their net effect")."""
    latest: dict[str, dict[str, Any]] = {}
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "system":
            for block in content_blocks(message.get("content")):
                if block.get("type") in ("tool_addition", "tool_removal"):
                    tool = block.get("tool")
                    key = str(tool.get("name")) if isinstance(tool, Mapping) and "name" in tool else canonical(tool).decode()
                    latest.pop(key, None)
                    latest[key] = {"type": block["type"], "tool": without_markers(tool) if isinstance(tool, Mapping) else tool}
    return list(latest.values())


def usage(input_tokens: int = 0, output_tokens: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        **extra,
    }


def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events that stream ``message``: ``input_transformations`` inside ``message_start``'s
    message; thinking as thinking deltas and one signature delta; a signed compaction block
    whole in its ``content_block_start`` (on-demand), an unsigned one as one
    ``compaction_delta`` (threshold); ``usage.iterations`` and ``context_management`` in the
    final ``message_delta``."""
    full_usage = dict(message.get("usage") or {})
    start_usage = {k: v for k, v in full_usage.items() if k != "iterations"}
    start_usage["output_tokens"] = min(1, int(full_usage.get("output_tokens", 0)))
    start = {
        key: value for key, value in message.items() if key not in ("context_management",)
    } | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    events.append(("ping", {"type": "ping"}))
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            text = str(block["text"])
            deltas = [{"type": "text_delta", "text": part} for part in (text[: len(text) // 2], text[len(text) // 2 :]) if part]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            if block.get("thinking"):
                deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            raw = canonical(block.get("input", {})).decode()
            deltas = [{"type": "input_json_delta", "partial_json": raw[: len(raw) // 2]},
                      {"type": "input_json_delta", "partial_json": raw[len(raw) // 2 :]}]
        elif kind == "compaction" and block.get("signature") is None:
            opening = {"type": "compaction", "content": None}
            deltas = [{"type": "compaction_delta", "content": block.get("content"), "encrypted_content": block.get("encrypted_content")}]
        else:
            opening = dict(block)  # redacted_thinking, a signed compaction block: whole, no deltas
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}))
        for delta in deltas:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    final_usage: dict[str, Any] = {"output_tokens": int(full_usage.get("output_tokens", 0))}
    if "iterations" in full_usage:
        final_usage["input_tokens"] = full_usage.get("input_tokens", 0)
        final_usage["iterations"] = full_usage["iterations"]
    delta_event: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")},
        "usage": final_usage,
    }
    if "context_management" in message:
        delta_event["context_management"] = message["context_management"]
    events.append(("message_delta", delta_event))
    events.append(("message_stop", {"type": "message_stop"}))
    return events
