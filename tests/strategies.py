"""Hypothesis strategies for valid Messages API conversations (reusable across test suites).

``conversations()`` draws a ``Conversation`` (system, tools, messages) that the provider would
accept: it starts with a user message, roles alternate (``role: "system"`` entries only between a
user message and the next assistant message), every client ``tool_use`` is answered first thing in
the next user message, ids are unique, server tools pair inside their assistant message, thinking
blocks carry signatures and never end an assistant message, and there are at most four
``cache_control`` markers in the whole request. It ends on a user message.

What it mixes in: parallel tool calls; file reads of a small set of paths (some spelled
differently, some partial) so that reads supersede each other; edits; text next to tool results;
server tools (``server_tool_use`` + ``web_search_tool_result``); ``thinking`` and
``redacted_thinking``; small base64 images; role-system entries; an occasional provider
``compaction`` block; big tool results. Text comes from a fixed vocabulary (fast to tokenise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

__all__ = ["PNG_2X2", "Conversation", "as_claude_code_sends", "conversations", "policies"]

PNG_2X2 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII="
)

WORDS = (
    "alpha beta gamma delta error fix test build deploy config server client request response "
    "token cache window summary module function class import return value list dict parse "
    "render layer plan prefix hash marker user assistant tool result read write edit bash"
).split()

# Same files spelled differently ("./", "//") normalise to one path.
PATHS = ("/repo/app.py", "/repo//app.py", "/repo/./lib.py", "/repo/lib.py", "/repo/README.md")

TOOLS: list[dict[str, Any]] = [
    {"name": name, "description": f"the {name} tool", "input_schema": {"type": "object"}}
    for name in ("Read", "Edit", "Bash", "str_replace_based_edit_tool", "read_file")
]

Draw = Any


@dataclass(frozen=True)
class Conversation:
    system: Any
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n:04d}"


def _words(draw: Draw, lo: int, hi: int) -> str:
    n = draw(st.integers(lo, hi))
    seed = draw(st.integers(0, 10_000))
    return " ".join(WORDS[(seed + 7 * i + i // 5) % len(WORDS)] for i in range(n))


def _lines(draw: Draw, lo: int, hi: int) -> str:
    n = draw(st.integers(lo, hi))
    seed = draw(st.integers(0, 10_000))
    return "\n".join(
        f"{i + 1:5}\t{WORDS[(seed + i) % len(WORDS)]} {WORDS[(seed * 3 + i * 5) % len(WORDS)]}"
        for i in range(n)
    )


def _image() -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_2X2},
    }


def _tool_use(draw: Draw, ids: _Ids) -> dict[str, Any]:
    kind = draw(st.sampled_from(["read", "read", "read_part", "view", "edit", "bash", "read_file"]))
    path = draw(st.sampled_from(PATHS))
    if kind == "read":
        name, tool_input = "Read", {"file_path": path}
    elif kind == "read_part":
        name, tool_input = "Read", {"file_path": path, "offset": draw(st.sampled_from([1, 50]))}
    elif kind == "view":
        name, tool_input = "str_replace_based_edit_tool", {"command": "view", "path": path}
    elif kind == "edit":
        if draw(st.booleans()):
            name = "Edit"
            tool_input = {"file_path": path, "old_string": "a", "new_string": "b"}
        else:
            name = "str_replace_based_edit_tool"
            tool_input = {"command": "str_replace", "path": path, "old_str": "a", "new_str": "b"}
    elif kind == "bash":
        name, tool_input = "Bash", {"command": _words(draw, 1, 6)}
    else:
        name, tool_input = "read_file", {"path": path}
    return {"type": "tool_use", "id": ids.next("toolu"), "name": name, "input": tool_input}


def _tool_result(draw: Draw, use: dict[str, Any]) -> dict[str, Any]:
    size = draw(st.sampled_from(["small", "small", "medium", "big"]))
    if size == "small":
        text = _words(draw, 1, 20)
    elif size == "medium":
        text = _lines(draw, 5, 60)
    else:
        text = _lines(draw, 100, 600)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"]}
    shape = draw(st.sampled_from(["str", "str", "list", "list_image", "none"]))
    if shape == "str":
        block["content"] = text
    elif shape == "list":
        block["content"] = [{"type": "text", "text": text}, {"type": "text", "text": "done"}]
    elif shape == "list_image":
        block["content"] = [{"type": "text", "text": text}, _image()]
    if draw(st.integers(0, 9)) == 0:
        block["is_error"] = True
    return block


def _assistant(draw: Draw, ids: _Ids, compaction: bool) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if compaction:
        blocks.append(
            {
                "type": "compaction",
                "content": _words(draw, 5, 30),
                "encrypted_content": "EnC" + _words(draw, 1, 3).replace(" ", ""),
            }
        )
    thinking = draw(st.sampled_from(["none", "none", "thinking", "redacted", "both"]))
    if thinking in ("thinking", "both"):
        blocks.append(
            {
                "type": "thinking",
                "thinking": _words(draw, 3, 40),
                "signature": f"sig{ids.next('s')}",
            }
        )
    if thinking in ("redacted", "both"):
        blocks.append({"type": "redacted_thinking", "data": f"RED{ids.next('r')}AAAA"})
    if draw(st.booleans()):
        blocks.append({"type": "text", "text": _words(draw, 1, 40)})
    if draw(st.integers(0, 5)) == 0:
        sid = ids.next("srvtoolu")
        blocks.append(
            {
                "type": "server_tool_use",
                "id": sid,
                "name": "web_search",
                "input": {"query": _words(draw, 1, 4)},
            }
        )
        blocks.append(
            {
                "type": "web_search_tool_result",
                "tool_use_id": sid,
                "content": [
                    {
                        "type": "web_search_result",
                        "url": "https://example.com/a",
                        "title": _words(draw, 1, 5),
                        "encrypted_content": "EncPage" + ids.next("p"),
                    }
                ],
            }
        )
    n_tools = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
    blocks.extend(_tool_use(draw, ids) for _ in range(n_tools))
    if not blocks or blocks[-1]["type"] in ("thinking", "redacted_thinking", "compaction"):
        blocks.append({"type": "text", "text": _words(draw, 1, 10)})
    return {"role": "assistant", "content": blocks}


def _user_after(draw: Draw, assistant: dict[str, Any]) -> dict[str, Any]:
    uses = [b for b in assistant["content"] if b["type"] == "tool_use"]
    blocks: list[dict[str, Any]] = [_tool_result(draw, u) for u in uses]
    if len(blocks) > 1 and draw(st.booleans()):
        blocks.reverse()  # the provider accepts results in any order
    extra = draw(st.sampled_from(["none", "none", "text", "image", "both"])) if uses else "text"
    if extra in ("text", "both"):
        blocks.append({"type": "text", "text": _words(draw, 1, 30)})
    if extra in ("image", "both"):
        blocks.append(_image())
    if not uses and len(blocks) == 1 and draw(st.booleans()):
        return {"role": "user", "content": blocks[0]["text"]}
    return {"role": "user", "content": blocks}


def _markable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "system" or not isinstance(message["content"], list):
            continue
        for block in message["content"]:
            if block["type"] in ("text", "tool_result", "tool_use", "image"):
                out.append(block)
    return out


@st.composite
def conversations(draw: Draw, min_turns: int = 1, max_turns: int = 14) -> Conversation:
    """A valid conversation ending on a user message (see the module docstring)."""
    ids = _Ids()
    first: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "text", "text": _words(draw, 1, 60)}],
    }
    if draw(st.integers(0, 4)) == 0:
        first["content"].append(_image())
    messages: list[dict[str, Any]] = [first]
    turns = draw(st.integers(min_turns, max_turns))
    compaction_at = draw(st.integers(-1, turns * 3))  # usually none
    for t in range(turns):
        if draw(st.integers(0, 7)) == 0:
            messages.append({"role": "system", "content": _words(draw, 2, 12)})
        assistant = _assistant(draw, ids, compaction=t == compaction_at)
        messages.append(assistant)
        messages.append(_user_after(draw, assistant))

    system: Any = draw(
        st.sampled_from(
            [None, "You are a coding agent.", [{"type": "text", "text": "You are an agent."}]]
        )
    )
    tools = [dict(t) for t in TOOLS]
    # cache_control: at most four in tools + system + messages; often one on the last block.
    budget = draw(st.integers(0, 4))
    last_message = messages[-1]
    if budget and isinstance(last_message["content"], list) and draw(st.booleans()):
        last_message["content"][-1]["cache_control"] = {"type": "ephemeral"}
        budget -= 1
    if budget and isinstance(system, list) and draw(st.booleans()):
        system[0]["cache_control"] = {"type": "ephemeral"}
        budget -= 1
    if budget and draw(st.booleans()):
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        budget -= 1
    candidates = [b for b in _markable(messages) if "cache_control" not in b]
    if budget and candidates:
        picks = draw(st.lists(st.integers(0, len(candidates) - 1), max_size=budget, unique=True))
        for i in picks:
            candidates[i]["cache_control"] = {"type": "ephemeral"}
    return Conversation(system, tools, messages)


@st.composite
def policies(draw: Draw) -> Any:
    """Small ``CompactionPolicy`` values, so that compaction actually triggers."""
    from proxy.core.compaction import CompactionPolicy

    threshold = draw(st.integers(150, 4_000))
    summary_max_tokens = draw(st.integers(20, 200))
    return CompactionPolicy(
        threshold=threshold,
        hard_limit=threshold * draw(st.sampled_from([1, 2, 3])),
        target_ratio=draw(st.sampled_from([0.3, 0.55, 0.8])),
        tool_result_cap=draw(st.integers(20, 600)),
        keep_recent=draw(st.integers(1, 8)),
        summarize=draw(st.booleans()),
        summary_max_tokens=summary_max_tokens,
        summary_input_cap=summary_max_tokens + draw(st.integers(200, 3_000)),
        summary_max_calls=draw(st.integers(1, 5)),
        carried_text_cap=draw(st.integers(10, 300)),
    )


def as_claude_code_sends(messages: list[dict[str, Any]], every_turn: bool) -> list[dict[str, Any]]:
    """``messages`` without provider ``compaction`` blocks (a conversation the provider compacts
    itself is forwarded to it as sent: no view of the proxy's), and with a ``role: "system"``
    entry after every user turn when ``every_turn``, as Claude Code 2.1.197 sends its
    mid-conversation system messages on its default model (after the newest user turn, so a
    request that ends right before an answer ends with one)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            message = {**message, "content": [b for b in content if b.get("type") != "compaction"]}
        out.append(message)
        if every_turn and message["role"] == "user":
            out.append({"role": "system", "content": f"context note {len(out)}"})
    return out
