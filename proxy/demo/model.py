"""What the demo provider's model answers (pure: a request body in, a Messages answer out).

Deterministic, so a demo (and a test) always runs the same way:

* **an agent's loop**: when the request offers a tool with a ``path`` (or ``file_path``) input,
  the model works through the plan in ``system`` (else the first user message), one line
  ``- <path>`` per step: while steps remain it asks for the next one with a ``tool_use`` (the
  text before it says which step); then it ends the turn with a short report. A path listed twice
  is read twice (the proxy then drops the superseded read). Which step comes next is read from
  the id of the tool result the request ends with (``toolu_demo_<step>_...``), never by counting
  earlier turns: the proxy compacts them away, as it should;
* **anything else** (no such tool, no plan, a summary request): one text answer naming the number
  of messages and the last user text's length.

The usage it reports is the request's size at 4 bytes a token, no prompt caching.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.catalogue_data import DEMO_MODEL

__all__ = ["BYTES_PER_TOKEN", "MODEL", "answer", "estimate_tokens", "plan_of"]

MODEL = DEMO_MODEL  # its catalogue row carries the demo's own price
BYTES_PER_TOKEN = 4
PATH_KEYS = ("path", "file_path")
# the proxy's own tool (context_proxy_retrieve) is never the one the demo agent reads with
_OWN_TOOLS = ("context_proxy_retrieve",)


def estimate_tokens(raw: bytes) -> int:
    return max(1, len(raw) // BYTES_PER_TOKEN)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def _messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    return messages if isinstance(messages, list) else []


def _steps(text: str) -> list[str]:
    return [line[2:].strip() for line in text.splitlines() if line.startswith("- ") and line[2:].strip()]


def plan_of(body: Mapping[str, Any]) -> list[str]:
    """The ``- <path>`` lines of ``system``, else of the first user message, in order."""
    found = _steps(text_of(body.get("system")))
    if found:
        return found
    for message in _messages(body):
        if isinstance(message, dict) and message.get("role") == "user":
            return _steps(text_of(message.get("content")))
    return []


def _reading_tool(tools: Any) -> tuple[str, str] | None:
    """The first tool that reads a path: its name and the input key for the path."""
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("name") in _OWN_TOOLS:
            continue
        schema = tool.get("input_schema")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict) and isinstance(tool.get("name"), str):
            for key in PATH_KEYS:
                if key in properties:
                    return tool["name"], key
    return None


_STEP = re.compile(r"toolu_demo_(\d{4})_")


def _results(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The tool results of the last message (the client's answer to the last ``tool_use``)."""
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or not isinstance(last.get("content"), list):
        return []
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def _next_step(messages: Sequence[Any]) -> int:
    """The step after the one the last tool result answers (0: none answered yet)."""
    for result in _results(messages):
        found = _STEP.match(str(result.get("tool_use_id", "")))
        if found:
            return int(found.group(1)) + 1
    return 0


def _last_result_chars(messages: Sequence[Any]) -> int | None:
    """The size of the last tool result the client sent, if its last message holds one."""
    for result in _results(messages):
        content = result.get("content")
        return len(content) if isinstance(content, str) else len(text_of(content))
    return None


def _text_answer(messages: Sequence[Any]) -> str:
    last_user = ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            last_user = text_of(message.get("content"))
            break
    return (
        f"Demo upstream: your last message was {len(last_user)} characters long;"
        f" the conversation has {len(messages)} messages."
    )


def content_of(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The answer's content blocks and its stop reason."""
    messages = _messages(body)
    tool = _reading_tool(body.get("tools"))
    plan = plan_of(body) if tool is not None else []
    if tool is None or not plan:
        return [{"type": "text", "text": _text_answer(messages)}], "end_turn"
    done = _next_step(messages)
    size = _last_result_chars(messages)
    seen = f" The last file was {size:,} characters long." if size is not None else ""
    if done >= len(plan):
        report = f"Done: I read {len(plan)} files, step by step.{seen}"
        return [{"type": "text", "text": report}], "end_turn"
    name, key = tool
    path = plan[done]
    digest = hashlib.sha256(f"{done}:{path}".encode()).hexdigest()[:12]
    call = f"toolu_demo_{done:04d}_{digest}"
    return [
        {"type": "text", "text": f"Step {done + 1} of {len(plan)}: reading {path}.{seen}"},
        {"type": "tool_use", "id": call, "name": name, "input": {key: path}},
    ], "tool_use"


def answer(body: Mapping[str, Any], raw: bytes) -> dict[str, Any]:
    """The whole Messages answer to ``body`` (its bytes ``raw`` give the input tokens)."""
    content, stop = content_of(body)
    model = body.get("model") if isinstance(body.get("model"), str) else MODEL
    output = sum(len(str(b.get("text", b.get("input", "")))) for b in content)
    return {
        "id": "msg_demo_" + hashlib.sha256(raw).hexdigest()[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": estimate_tokens(raw),
            "output_tokens": max(1, output // BYTES_PER_TOKEN),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
