"""Request bodies for bench/bench_proxy.py: what each latency row sends.

* ``build_body``: a synthetic agent conversation of a given size (the 1 KB and 500 KB rows).
* The real Claude Code session (``tests/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json``)
  laid out as Claude Code sends it, turn by turn (``session_requests``) or its last turn alone
  (``last_turn``), serialised in one of several JSON styles (``STYLES``): the same value, other bytes.
* ``tag_messages`` makes a *fresh* conversation out of it (every text prefixed with a tag), so that
  no cache of the proxy (body memo, token memo, plans) recognises an earlier pass.
* ``sse_events`` / ``conc_events``: what the fake upstream streams back.

Pure functions, no I/O apart from reading the transcript file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from tests.upstream import text_stream_events

ROOT = Path(__file__).resolve().parent.parent
SESSION_PATH = ROOT / "tests/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json"
MODEL = "claude-sonnet-4-5"


SSE_DELTAS = 194  # + message_start, content_block_start, ping, block_stop, message_delta, stop = 200


def sse_events(n_deltas: int = SSE_DELTAS) -> list[bytes]:
    text = "".join(f"tok{k:04d} " for k in range(n_deltas))  # 8 chars a delta
    events = text_stream_events(text, deltas=n_deltas)
    assert len(events) == n_deltas + 6
    return events


def conc_events(idx: int, n_events: int) -> list[bytes]:
    """Stream ``idx``'s events: every delta names its stream and position, the ids are fixed."""
    n_deltas = n_events - 6
    text = "".join(f"s{idx:04d}e{k:03d};" for k in range(n_deltas))  # 10 chars a delta
    events = text_stream_events(text, deltas=n_deltas)
    events[0] = re.sub(rb'"id":"msg_\d+"', b'"id":"msg_bench%020d"' % idx, events[0])
    assert len(events) == n_events
    return events


_SOURCE_LINES = [
    'def handle(request: "Request") -> dict[str, object]:\n',
    '    """Return the parsed body; raise on a bad "messages" field."""\n',
    "    body = json.loads(request.body)  # may raise ValueError\n",
    '    if not isinstance(body.get("messages"), list):\n',
    '        raise BadRequest(f"messages: expected a list, got {type(body).__name__}")\n',
    "    for i, msg in enumerate(body['messages']):\n",
    "        total += len(msg.get('content') or '') * 1.5  # tokens ≈ chars / 4\n",
    "    return {\"ok\": True, \"count\": total, \"path\": '/srv/app/\\u00e9t\\u00e9.py'}\n",
    "\n",
]


def _file_text(seed: int, size: int) -> str:
    out: list[str] = []
    n = 0
    k = seed
    while n < size:
        line = _SOURCE_LINES[k % len(_SOURCE_LINES)]
        out.append(line)
        n += len(line)
        k += 1
    return "".join(out)[:size]


TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file from the repository and return its text with line numbers.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
            "required": ["path"],
        },
    },
    {
        "name": "bash",
        "description": "Run a shell command in the sandbox; returns stdout, stderr and the exit code.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
    {
        "name": "str_replace_based_edit_tool",
        "description": "View, create and edit files: view, create, str_replace, insert.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
                "path": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
            },
            "required": ["command", "path"],
        },
    },
]


def build_body(target_bytes: int, *, result_size: int, stream: bool = False) -> bytes:
    """A realistic /v1/messages body of about ``target_bytes``: an agent conversation made of
    assistant tool_use turns (sometimes two parallel calls) answered by tool_result turns (string
    or block-list content, escapes and non-ASCII included), ending on a user turn."""
    big = target_bytes > 8192
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are a careful coding agent. Use the tools; keep answers short.",
        "messages": [{"role": "user", "content": "Find why the request handler rejects valid bodies."}],
    }
    if big:
        body["tools"] = TOOLS
    if stream:
        body["stream"] = True
    messages = body["messages"]
    turn = 0
    while True:
        calls = 2 if (big and turn % 3 == 2) else 1
        uses = []
        for c in range(calls):
            uses.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{turn:06d}{c:02d}{'x' * 16}",
                    "name": "read_file" if c == 0 else "bash",
                    "input": {"path": f"src/app/module_{turn}.py"} if c == 0 else {"command": f"grep -n 'messages' src/app/module_{turn}.py"},
                }
            )
        messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"Step {turn}: let me look at the code."}, *uses]}
        )
        results: list[dict[str, Any]] = []
        for c, use in enumerate(uses):
            text = _file_text(turn + c, result_size)
            content: Any = text if (turn + c) % 2 == 0 else [{"type": "text", "text": text}]
            results.append({"type": "tool_result", "tool_use_id": use["id"], "content": content})
        messages.append({"role": "user", "content": results})
        turn += 1
        size = len(orjson.dumps(body))
        if size + result_size * 2 + 400 > target_bytes:
            break
    # Pad the last user turn with a text block so that the body is exactly target_bytes.
    pad_block: dict[str, Any] = {"type": "text", "text": ""}
    messages[-1]["content"].append(pad_block)
    missing = target_bytes - len(orjson.dumps(body))
    if missing > 0:
        pad_block["text"] = ("Please continue. " * (missing // 17 + 1))[:missing]
    raw = orjson.dumps(body)
    from proxy.core.protocol import validate_request  # the bench must send valid bodies

    assert validate_request(orjson.loads(raw)) is None
    return raw



# --- JSON styles -------------------------------------------------------------------------------
# Every style serialises the same value; ``orjson.loads`` of any of them is equal.

STYLES: dict[str, Callable[[Any], bytes]] = {
    "compact": orjson.dumps,  # what orjson (and Claude Code, modulo escapes) writes
    "spaced": lambda v: json.dumps(v).encode(),  # Python's defaults: ", " / ": ", ASCII escapes
    "ascii": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=True).encode(),
    "sorted": lambda v: json.dumps(v, sort_keys=True).encode(),  # keys reordered (and spaced)
    "indent": lambda v: json.dumps(v, indent=2).encode(),  # pretty-printed
}


# --- the real Claude Code session ----------------------------------------------------------------

# Claude Code sends its system prompt as text blocks, the first ones cached. The session file did
# not record it: a stand-in of a few KB, fixed (the same for every pass and style).
SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
     "cache_control": {"type": "ephemeral"}},
    {
        "type": "text",
        "text": (
            "You are an interactive CLI tool that helps users with software engineering tasks. "
            "Use the instructions below and the tools available to you to assist the user.\n\n"
            + "".join(
                f"# Rule {k}\n- Keep answers short and concrete; prefer editing existing files; "
                f"run the tests after a change; never commit secrets; \u00e9t\u00e9 \u2014 {k}.\n"
                for k in range(24)
            )
        ),
        "cache_control": {"type": "ephemeral"},
    },
]


@cache
def session() -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """(messages, tools) of the real session, read once with the replay reader."""
    from proxy.replay.readers import load_conversation

    conv = load_conversation(SESSION_PATH)
    return tuple(conv.messages), tuple(conv.tools or ())


def _tag_text(text: str, tag: str) -> str:
    return f"{tag} {text}"


def _tag_id(tool_id: Any, slug: str) -> Any:
    return f"{tool_id}_{slug}" if isinstance(tool_id, str) else tool_id


def _tag_block(block: Any, tag: str, slug: str) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {**block, "text": _tag_text(block["text"], tag)}
    if kind == "tool_use":  # no text: its id (and its result's) carries the tag
        return {**block, "id": _tag_id(block.get("id"), slug)}
    if kind == "tool_result":
        out = {**block, "tool_use_id": _tag_id(block.get("tool_use_id"), slug)}
        content = block.get("content")
        if isinstance(content, str):
            out["content"] = _tag_text(content, tag)
        elif isinstance(content, list):
            out["content"] = [_tag_block(b, tag, slug) for b in content]
        return out
    return block


def slug_of(tag: str) -> str:
    """``tag`` as the characters a tool_use id may hold."""
    return re.sub(r"[^0-9A-Za-z]+", "-", tag).strip("-") or "untagged"


def tag_messages(messages: Any, tag: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` where every message carries ``tag``: texts (text blocks, tool_result
    texts) are prefixed with it, tool_use ids (and their results' tool_use_id) end with it. The
    same conversation, but one that no cache keyed on its content has seen."""
    slug = slug_of(tag)
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            out.append({**m, "content": _tag_text(content, tag)})
        else:
            out.append({**m, "content": [_tag_block(b, tag, slug) for b in content]})
    return out


def with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with a ``cache_control`` breakpoint on the last block of the last message, as
    Claude Code sends them (it moves to the new last message every turn); a copy."""
    last = messages[-1]
    content = last["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    marked = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
    return [*messages[:-1], {**last, "content": marked}]


def cc_request(messages: list[dict[str, Any]], tools: Any, session_id: str) -> dict[str, Any]:
    """A request laid out as Claude Code sends it (member order included), no stream."""
    return {
        "model": MODEL,
        "messages": with_breakpoint(messages),
        "system": SYSTEM,
        "tools": list(tools),
        "metadata": {"user_id": f"user_bench_account__session_{session_id}"},
        "max_tokens": 32000,
    }


def session_requests(tag: str) -> list[dict[str, Any]]:
    """The session in order, as one conversation tagged ``tag``: request k = messages[:k] for every
    k that ends on a user turn (108 requests)."""
    messages, tools = session()
    tagged = tag_messages(messages, tag)
    sid = slug_of(tag)
    return [
        cc_request(tagged[:k], tools, sid) for k in range(1, len(tagged) + 1) if tagged[k - 1]["role"] == "user"
    ]


def last_turn(tag: str) -> dict[str, Any]:
    """The session's last request (the longest), tagged ``tag``."""
    return session_requests(tag)[-1]


def encode(value: Any, style: str) -> bytes:
    return STYLES[style](value)


def cold_key(i: int) -> str:
    """A credential the proxy has never seen: its body memo is scoped by credential."""
    return f"sk-ant-bench-cold-{i}"


def body_1k() -> bytes:
    return build_body(1024, result_size=150)


def sse_body_1k() -> bytes:
    """About 1 KB, like ``body_1k``, with ``"stream": true``."""
    return build_body(1024, result_size=150, stream=True)


def session_turns() -> int:
    """How many requests a pass of the session makes (one per user turn)."""
    messages, _tools = session()
    return sum(1 for m in messages if m["role"] == "user")
