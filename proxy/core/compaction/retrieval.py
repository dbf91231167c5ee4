"""The retrieval tool: the model reads back what compaction cut, and the proxy answers it.

Pure: the tool definition (one constant value, so its bytes never change from turn to turn), when
to offer it, how to recognise the model's calls, how to page a source's text into a
``tool_result``, and how the hidden rounds fold into the one answer the client receives. The edge
(``proxy.server.context.retrieval``) reads the sources and talks to the upstream.

Decisions:

* The tool is offered (``with_tool``) from the first forwarded view of a conversation that
  names a pointer the model can redeem on: that body, the one that first carries a bridge or a
  truncation marker with a pointer, carries the tool too, and every later view of the
  conversation keeps it (``plan_names_pointers``; also after a later compaction dropped the
  only pointer), so ``tools`` changes once, together with the messages, and keeps its bytes.
  Never before, never to a request that declares no tools (a non-empty ``tools`` list) or has
  a tool of the same name, and never to a view that continues an assistant prefill (the loop
  extends a view with a new assistant turn; a prefill is continued, not extended). A ``role:
  "system"`` entry after the newest user turn (a mid-conversation system message: Claude Code
  2.1.197 appends one whenever a turn brings new context) belongs to that user turn, so a view
  ending with one asks for a new assistant turn like any other. The tool is appended *last*,
  so the client's own tools keep their bytes and positions; the definition is a constant.
* A call is answered with a ``tool_result`` whose first text block is exactly the source's text
  from ``offset`` (at most ``max_chars`` characters, Python code points); when more remains a
  second, short text block gives the next offset. Every failure is an ``is_error`` result that
  says which: ``denied``, ``missing``, ``corrupt``, ``unsupported`` or an invalid input.
* The text of a source: an artifact kept as ``.txt`` is the tool result's string; one kept as
  ``.json`` (a list of blocks) is its text blocks joined by a newline, other blocks as
  ``[<type> block]``. A transcript event is its content: text verbatim, every other block
  (tool calls, tool results, thinking) as compact JSON, blocks separated by a blank line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.compaction.bridge import Bridge
from proxy.core.compaction.plan import Plan
from proxy.core.compaction.view import Cut, FromClient, ViewItem

__all__ = [
    "TOOL",
    "TOOL_JSON",
    "TOOL_NAME",
    "BadCall",
    "Call",
    "artifact_text",
    "asks_for_a_new_turn",
    "error_result",
    "event_text",
    "is_ours",
    "offer_tool",
    "page_result",
    "parse_call",
    "plan_names_pointers",
    "sum_usage",
    "view_names_pointers",
    "with_tool",
]

TOOL_NAME = "context_proxy_retrieve"
TOOL: dict[str, Any] = {
    "name": TOOL_NAME,
    "description": (
        "Read back, verbatim, text that was removed from this conversation to fit the context"
        " window. Pointers appear where text was removed: a truncated tool result names"
        " 'artifact:...' (its full text), and a note where earlier turns were compacted names"
        " 'transcript:<session>:<n>' events (one per message). Returns up to max_chars"
        " characters from offset; when more remains, a note gives the next offset."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "pointer": {
                "type": "string",
                "description": "An artifact:... or transcript:... pointer, exactly as written.",
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "description": "First character to return (default 0).",
            },
            "max_chars": {
                "type": "integer",
                "minimum": 1,
                "description": "Most characters to return (default and upper bound 40000).",
            },
        },
        "required": ["pointer"],
    },
}
# The exact bytes the tool adds to a forwarded ``tools`` list (orjson keeps key order).
TOOL_JSON = orjson.dumps(TOOL)

_MARKER_POINTER = "; full text: artifact:"


def offer_tool(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``body`` with the tool appended to its ``tools`` (a new dict; ``body`` is untouched), or
    ``None`` when it declares no tools or already has a tool of that name."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("name") == TOOL_NAME:
            return None
    return {**body, "tools": [*tools, TOOL]}


def asks_for_a_new_turn(messages: Any) -> bool:
    """Whether the model answers ``messages`` with a new assistant turn: the last message that is
    not a ``role: "system"`` entry is a user message. (A system entry stands immediately after a
    user turn and the provider merges it into that turn: "Claude Opus 4.8 accepts role: "system"
    messages immediately after a user turn", platform.claude.com/docs/en/about-claude/models/
    whats-new-claude-4-8.) ``False`` for a prefill: the last message is the assistant's."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return False
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role != "system":
            return role == "user"
    return False


def with_tool(view: Mapping[str, Any], plan: Plan | None) -> dict[str, Any] | None:
    """The forwarded ``view`` (a body) with the tool, when it carries it: ``plan`` (what made
    the view) names a pointer the model can redeem, or did on an earlier turn
    (``plan_names_pointers``), the view asks for a new assistant turn, and ``offer_tool``
    appends it. ``None`` otherwise (``view`` is never touched)."""
    if not plan_names_pointers(plan) or not asks_for_a_new_turn(view.get("messages")):
        return None
    return offer_tool(view)


def _names_artifact(content: Any) -> bool:
    if isinstance(content, str):
        return _MARKER_POINTER in content
    if isinstance(content, list):
        return any(
            isinstance(b, Mapping) and isinstance(b.get("text"), str) and _MARKER_POINTER in b["text"]
            for b in content
        )
    return False


def view_names_pointers(items: Sequence[ViewItem], bridge: Bridge | None) -> bool:
    """Whether the view of ``items`` and ``bridge`` holds a pointer the model can redeem: a cut
    result's artifact (in its truncation marker) or the transcript range the bridge names."""
    if bridge is not None and bridge.transcript is not None:
        return True
    for item in items:
        if isinstance(item, FromClient) and item.blocks is not None:
            for op in item.blocks:
                if isinstance(op, Cut) and _names_artifact(op.content):
                    return True
    return False


def plan_names_pointers(plan: Plan | None) -> bool:
    """Whether the views ``plan`` makes carry the tool: its own view names a pointer the model
    can redeem, or the view of a plan it was built on did (``Plan.pointers``, set when the plan
    is made: ``view_names_pointers`` or its base's). So once a conversation's view named a
    pointer, every later view offers the tool, also after a later compaction dropped the only
    one (a cut read superseded by a newer read of the file: nothing of it is lost), and
    ``tools``, the first thing in the prompt-cache prefix, changes once per conversation. A
    pointer that no view ever showed (a result cut and dropped in the same compaction) counts
    for nothing. A plan stored before ``pointers`` was recorded: its own view decides."""
    if plan is None:
        return False
    if plan.pointers is not None:
        return plan.pointers
    return view_names_pointers(plan.items, plan.bridge)


def is_ours(block: Any) -> bool:
    return (
        isinstance(block, Mapping)
        and block.get("type") == "tool_use"
        and block.get("name") == TOOL_NAME
    )


@dataclass(frozen=True, slots=True)
class Call:
    """One valid call of the tool."""

    id: str
    pointer: str
    offset: int
    max_chars: int


@dataclass(frozen=True, slots=True)
class BadCall:
    """A call whose input does not follow the schema."""

    id: str
    message: str


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_call(block: Mapping[str, Any], max_chars: int) -> Call | BadCall:
    """The call a ``tool_use`` block of ours makes; ``max_chars`` is the default and bound."""
    tool_id = str(block.get("id", ""))
    data = block.get("input")
    if not isinstance(data, Mapping):
        return BadCall(tool_id, "input must be an object")
    pointer = data.get("pointer")
    if not isinstance(pointer, str) or not pointer:
        return BadCall(tool_id, "input.pointer must be a non-empty string")
    offset = data.get("offset", 0)
    if offset is None:
        offset = 0
    if not _int(offset) or offset < 0:
        return BadCall(tool_id, "input.offset must be an integer >= 0")
    wanted = data.get("max_chars", max_chars)
    if wanted is None:
        wanted = max_chars
    if not _int(wanted) or wanted < 1:
        return BadCall(tool_id, "input.max_chars must be an integer >= 1")
    return Call(tool_id, pointer, offset, min(wanted, max_chars))


_STATUS_TEXT = {
    "denied": "denied: this session may not read that source",
    "missing": "missing: nothing is kept under that pointer",
    "corrupt": "corrupt: the pointer is malformed or the kept source failed verification",
    "unsupported": "unsupported: that kind of pointer cannot be read",
}


def error_result(tool_id: str, status: str, pointer: str | None = None) -> dict[str, Any]:
    """An ``is_error`` result saying what went wrong (a status, or an input problem)."""
    what = _STATUS_TEXT.get(status, status)
    subject = f" {pointer}" if pointer is not None and len(pointer) <= 500 else ""
    return {
        "type": "tool_result",
        "tool_use_id": tool_id,
        "is_error": True,
        "content": [{"type": "text", "text": f"[context-proxy] {TOOL_NAME}{subject}: {what}"}],
    }


def page_result(call: Call, text: str, *, last_round: bool = False) -> dict[str, Any]:
    """The result for a source whose text is ``text``: exactly ``text[offset:offset+max]``
    first, then a note with the next offset when more remains."""
    total = len(text)
    if total == 0:
        return {
            "type": "tool_result",
            "tool_use_id": call.id,
            "content": [{"type": "text", "text": "[context-proxy: the source is empty]"}],
        }
    if call.offset >= total:
        return error_result(
            call.id,
            f"offset {call.offset} is past the end of the source ({total} characters)",
            call.pointer,
        )
    end = min(total, call.offset + call.max_chars)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text[call.offset : end]}]
    notes: list[str] = []
    if end < total:
        notes.append(
            f"characters {call.offset}-{end} of {total}; {total - end} more: call {TOOL_NAME}"
            f" with offset {end}"
        )
    if last_round:
        notes.append("that was the last retrieval this turn allows")
    if notes:
        blocks.append({"type": "text", "text": f"[context-proxy: {'; '.join(notes)}]"})
    return {"type": "tool_result", "tool_use_id": call.id, "content": blocks}


def _block_text(block: Any) -> str:
    if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    return orjson.dumps(block).decode()


def event_text(record: Mapping[str, Any]) -> str:
    """A transcript record's content as text: text verbatim, other blocks as compact JSON."""
    content = record.get("content")
    if isinstance(content, Mapping) and "content" in content:  # an answer: the whole message
        content = content["content"]
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(_block_text(b) for b in content)
    return orjson.dumps(content).decode()


def artifact_text(name: str, data: bytes) -> str:
    """The original text of a cut tool result kept as artifact ``name`` (see ``artifact_of``)."""
    if not name.endswith(".json"):
        return data.decode("utf-8", "surrogatepass")
    try:
        blocks = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")
    if not isinstance(blocks, list):
        return orjson.dumps(blocks).decode()
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(str(block["text"]))
        else:
            kind = block.get("type") if isinstance(block, Mapping) else None
            parts.append(f"[{kind if isinstance(kind, str) else 'unknown'} block]")
    return "\n".join(parts)


_SUMMED = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def sum_usage(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The usage of the one answer: the last round's fields, with the token counts summed."""
    if not rounds:
        return {}
    out = dict(rounds[-1])
    for key in _SUMMED:
        values = [u[key] for u in rounds if _int(u.get(key))]
        if values:
            out[key] = sum(values)
    return out
