"""Conversations from files, as the proxy would receive them: pure parsing, no network.

Two formats:

* **Messages JSON** (``/work/shared/data/transcripts``): one object
  ``{"meta", "system", "tools", "messages"}`` whose ``messages`` is a Messages API array.
* **A raw Claude Code session** (``~/.claude/projects/<project>/<session>.jsonl``): one JSON object
  per line. Kept: ``user`` / ``assistant`` lines that are not sidechain (subagent) traffic, in file
  order; a file whose message lines are all sidechain traffic (a subagent's own
  ``agent-*.jsonl``) is that subagent's conversation and is read the same way. A file with no
  message line at all raises :class:`ReaderError` ("no conversation found"). One provider response is often split over several consecutive ``assistant`` lines (one
  block each, same ``message.id``): they become one assistant message. Parallel tool results
  arrive as one ``user`` line each: consecutive user lines become one user message, results first.
  ``system``, ``summary``, ``file-history-snapshot``, ``queue-operation`` and other bookkeeping
  lines are skipped; lines that are not valid JSON are skipped and counted. A ``compact_boundary``
  system line followed by an ``isCompactSummary`` user line is where Claude Code compacted by
  itself: the summary is left out (the proxy, in front of the provider, would have kept receiving
  the whole conversation, since its own compaction keeps the context small) and the boundary is
  recorded for comparison.

Thinking blocks are dropped by default (``keep_thinking=False``): published sessions are usually
redacted, which breaks their signatures, and the provider strips earlier turns' thinking anyway.

Both readers end with :func:`repair_messages`, which makes the array pass
:func:`proxy.core.protocol.validate_messages` and says what it changed: empty messages dropped,
consecutive same-role messages merged, duplicate ``tool_use`` ids and orphan ``tool_result`` blocks
dropped, and every ``tool_use`` left without a result (its line was lost) answered with an
``is_error`` result reading ``[tool result missing in source transcript]``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

__all__ = [
    "MISSING_RESULT_TEXT",
    "CompactionBoundary",
    "Conversation",
    "ReaderError",
    "load_conversation",
    "parse_claude_code_lines",
    "parse_messages_json",
    "repair_messages",
]

MISSING_RESULT_TEXT = "[tool result missing in source transcript]"
STUB_TOOL_DESCRIPTION = "(tool definition not recorded in the Claude Code session file)"

Format = Literal["messages-json", "claude-code-jsonl"]
Message = dict[str, Any]


class ReaderError(ValueError):
    """The file is not a conversation this module can read."""


@dataclass(frozen=True, slots=True)
class CompactionBoundary:
    """Where the source's own client compacted (Claude Code's auto-compact)."""

    message_index: int  # first message of ``messages`` written after the compaction
    line: int | None  # 1-based line of the ``compact_boundary`` in a .jsonl source
    trigger: str | None  # "auto" / "manual"
    pre_tokens: int | None  # the client's own context size when it compacted


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation ready to replay: valid ``messages`` plus what reading it took."""

    source: str
    format: Format
    system: Any
    tools: Any
    messages: list[Message]
    model: str
    boundaries: tuple[CompactionBoundary, ...] = ()
    invalid_lines: int = 0  # .jsonl lines that are not valid JSON objects (skipped)
    stats: Mapping[str, int] = field(default_factory=dict)  # what was skipped / merged / repaired
    # the source's own context size (input + cache tokens) for the request that produced the
    # assistant message at this index, when the source recorded usage
    source_context: Mapping[int, int] = field(default_factory=dict)

    @property
    def tool_uses(self) -> int:
        return sum(
            1
            for m in self.messages
            for b in _blocks(m)
            if isinstance(b, Mapping) and b.get("type") == "tool_use"
        )


# --- repair -------------------------------------------------------------------------------


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, list):
        return content
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return []


def _is_empty(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return content == ""
    return not isinstance(content, list) or not content


def _merge(a: Message, b: Message) -> Message:
    """Two consecutive same-role messages as one; for users, ``tool_result`` blocks first."""
    blocks = [*_blocks(a), *_blocks(b)]
    if a.get("role") == "user":
        results = [x for x in blocks if isinstance(x, Mapping) and x.get("type") == "tool_result"]
        others = [
            x for x in blocks if not (isinstance(x, Mapping) and x.get("type") == "tool_result")
        ]
        blocks = [*results, *others]
    return {**a, "content": blocks}


def _merge_runs(messages: Sequence[Message], stats: Counter[str]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if _is_empty(m):
            stats["empty_messages_dropped"] += 1
            continue
        role = m.get("role")
        if out and role == out[-1].get("role") and role in ("user", "assistant"):
            out[-1] = _merge(out[-1], m)
            stats["same_role_messages_merged"] += 1
        else:
            out.append(m)
    return out


def _missing_result(tool_use_id: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": MISSING_RESULT_TEXT,
        "is_error": True,
    }


def repair_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[Message], dict[str, int]]:
    """A copy of ``messages`` that passes ``validate_messages``, and counts of what changed.

    ``origins`` are not tracked here; callers that need to map indices keep the messages they
    pass in untouched when nothing needed repair (the usual case for Messages JSON files).
    """
    stats: Counter[str] = Counter()
    work = [dict(m) for m in messages]
    work = _merge_runs(work, stats)

    # duplicate tool_use ids (a line written twice): keep the first
    seen: set[str] = set()
    for i, m in enumerate(work):
        if m.get("role") != "assistant" or not isinstance(m.get("content"), list):
            continue
        kept = []
        for b in m["content"]:
            if isinstance(b, Mapping) and b.get("type") == "tool_use":
                uid = b.get("id")
                if isinstance(uid, str) and uid in seen:
                    stats["duplicate_tool_use_dropped"] += 1
                    continue
                if isinstance(uid, str):
                    seen.add(uid)
            kept.append(b)
        if len(kept) != len(m["content"]):
            work[i] = {**m, "content": kept}

    # results must answer a tool_use of the previous message, once, and come first
    for i, m in enumerate(work):
        if m.get("role") != "user" or not isinstance(m.get("content"), list):
            continue
        prev = work[i - 1] if i > 0 else None
        wanted = (
            [
                b.get("id")
                for b in _blocks(prev)
                if isinstance(b, Mapping) and b.get("type") == "tool_use"
            ]
            if prev is not None and prev.get("role") == "assistant"
            else []
        )
        results: dict[str, Any] = {}
        others: list[Any] = []
        for b in m["content"]:
            if isinstance(b, Mapping) and b.get("type") == "tool_result":
                uid = b.get("tool_use_id")
                if uid not in wanted:
                    stats["orphan_tool_results_dropped"] += 1
                elif uid in results:
                    stats["duplicate_tool_results_dropped"] += 1
                else:
                    results[str(uid)] = b
            else:
                others.append(b)
        ordered = [results[str(u)] for u in wanted if str(u) in results]
        blocks = [*ordered, *others]
        if blocks != m["content"]:
            work[i] = {**m, "content": blocks}
    work = _merge_runs(work, stats)  # a user message that held only orphans is gone now

    # every tool_use answered in the next message
    out: list[Message] = []
    for i, m in enumerate(work):
        out.append(m)
        if m.get("role") != "assistant":
            continue
        uses = [
            str(b.get("id"))
            for b in _blocks(m)
            if isinstance(b, Mapping) and b.get("type") == "tool_use"
        ]
        if not uses:
            continue
        nxt = work[i + 1] if i + 1 < len(work) else None
        if nxt is None or nxt.get("role") != "user":
            stats["missing_tool_results_synthesised"] += len(uses)
            out.append({"role": "user", "content": [_missing_result(u) for u in uses]})
            continue
        blocks = _blocks(nxt)
        have = {
            b.get("tool_use_id")
            for b in blocks
            if isinstance(b, Mapping) and b.get("type") == "tool_result"
        }
        missing = [u for u in uses if u not in have]
        if missing:
            stats["missing_tool_results_synthesised"] += len(missing)
            by_id = {
                b.get("tool_use_id"): b
                for b in blocks
                if isinstance(b, Mapping) and b.get("type") == "tool_result"
            }
            others = [
                b for b in blocks if not (isinstance(b, Mapping) and b.get("type") == "tool_result")
            ]
            answered = [by_id[u] if u in by_id else _missing_result(u) for u in uses]
            work[i + 1] = {**nxt, "content": [*answered, *others]}
    return out, dict(stats)


def _require_user_turn(messages: Sequence[Message], source: str) -> None:
    """A replay sends one request per user turn: without one there is nothing to replay."""
    if not any(m.get("role") == "user" for m in messages):
        raise ReaderError(f"{source}: no conversation found (no user message to send)")


# --- Messages JSON ----------------------------------------------------------------------------


def parse_messages_json(data: object, source: str = "<memory>") -> Conversation:
    """A ``{"system", "tools", "messages", "meta"?}`` object (or a bare messages list)."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, Mapping) or not isinstance(data.get("messages"), list):
        raise ReaderError(f"{source}: expected an object with a `messages` list")
    raw = data["messages"]
    if not all(isinstance(m, Mapping) for m in raw):
        raise ReaderError(f"{source}: every entry of `messages` must be an object")
    messages, stats = repair_messages(raw)
    _require_user_turn(messages, source)
    if not stats:
        messages = list(raw)  # untouched: keep the very objects (and their key order)
    meta = data.get("meta") if isinstance(data.get("meta"), Mapping) else {}
    assert isinstance(meta, Mapping)
    boundaries: list[CompactionBoundary] = []
    for c in meta.get("compactions_in_source") or ():
        if isinstance(c, Mapping) and isinstance(c.get("final_message_index"), int):
            pre = c.get("preTokens")
            trigger = c.get("trigger")
            boundaries.append(
                CompactionBoundary(
                    message_index=c["final_message_index"],
                    line=None,
                    trigger=trigger if isinstance(trigger, str) else None,
                    pre_tokens=pre if isinstance(pre, int) else None,
                )
            )
    model = data.get("model")
    if not isinstance(model, str):
        models = meta.get("models")
        model = (
            max(models, key=lambda k: models[k]) if isinstance(models, Mapping) and models else ""
        )
    source_context: dict[int, int] = {}
    real = meta.get("real_context_tokens")
    by_index = real.get("by_assistant_message_index") if isinstance(real, Mapping) else None
    if isinstance(by_index, Mapping) and not stats:
        for k, v in by_index.items():
            if str(k).isdigit() and isinstance(v, int):
                source_context[int(k)] = v
    return Conversation(
        source=source,
        format="messages-json",
        system=data.get("system"),
        tools=data.get("tools"),
        messages=messages,
        model=str(model),
        boundaries=tuple(boundaries),
        invalid_lines=0,
        stats=stats,
        source_context=source_context,
    )


# --- Claude Code .jsonl -----------------------------------------------------------------------


@dataclass
class _Unit:
    role: str
    blocks: list[Any]
    message_id: str | None  # assistant responses: the provider's message id
    line: int
    is_string: bool = False  # a user line whose content was a plain string
    usage: int | None = None


def _context_tokens(usage: object) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    total = 0
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        v = usage.get(key)
        if isinstance(v, int):
            total += v
    return total or None


def parse_claude_code_lines(
    lines: Iterable[str | bytes],
    source: str = "<memory>",
    *,
    keep_thinking: bool = False,
) -> Conversation:
    """Read a Claude Code session, line by line (see the module docstring)."""
    stats: Counter[str] = Counter()
    invalid = 0
    units: list[_Unit] = []
    side_units: list[_Unit] = []  # subagent (sidechain) traffic
    pending_boundary: tuple[int, str | None, int | None] | None = None
    summary_lines: list[tuple[int, tuple[int, str | None, int | None] | None]] = []
    seen_uuids: set[str] = set()
    models: Counter[str] = Counter()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            invalid += 1
            continue
        if not isinstance(obj, dict):
            invalid += 1
            continue
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "compact_boundary":
            meta = obj.get("compactMetadata")
            meta = meta if isinstance(meta, Mapping) else {}
            trigger = meta.get("trigger")
            pre = meta.get("preTokens")
            pending_boundary = (
                number,
                trigger if isinstance(trigger, str) else None,
                pre if isinstance(pre, int) else None,
            )
            stats["compact_boundaries"] += 1
            continue
        if kind not in ("user", "assistant"):
            stats[f"skipped_{kind}_lines"] += 1
            continue
        sidechain = obj.get("isSidechain") is True
        uuid = obj.get("uuid")
        if isinstance(uuid, str):
            if uuid in seen_uuids:
                stats["duplicate_lines_skipped"] += 1
                continue
            seen_uuids.add(uuid)
        message = obj.get("message")
        if not isinstance(message, Mapping):
            stats["lines_without_message_skipped"] += 1
            continue
        if kind == "user" and obj.get("isCompactSummary") is True:
            summary_lines.append((number, pending_boundary))
            pending_boundary = None
            stats["compact_summaries_skipped"] += 1
            continue
        if kind == "assistant" and message.get("model") == "<synthetic>":
            stats["synthetic_assistant_lines_skipped"] += 1  # client-side error notices
            continue
        content = message.get("content")
        is_string = isinstance(content, str)
        if is_string:
            blocks: list[Any] = [{"type": "text", "text": content}] if content else []
        elif isinstance(content, list):
            blocks = [copy.deepcopy(b) for b in content if isinstance(b, Mapping)]
        else:
            stats["lines_without_content_skipped"] += 1
            continue
        if kind == "assistant" and not keep_thinking:
            before = len(blocks)
            blocks = [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")]
            stats["thinking_blocks_dropped"] += before - len(blocks)
        model = message.get("model")
        if kind == "assistant" and isinstance(model, str):
            models[model] += 1
        mid = message.get("id") if kind == "assistant" else None
        (side_units if sidechain else units).append(
            _Unit(
                role=kind,
                blocks=blocks,
                message_id=mid if isinstance(mid, str) else None,
                line=number,
                is_string=is_string,
                usage=_context_tokens(message.get("usage")) if kind == "assistant" else None,
            )
        )

    if units:
        if side_units:
            stats["sidechain_lines_skipped"] += len(side_units)
    elif side_units:
        # a subagent's own file (``agent-*.jsonl``): every line is sidechain traffic, and that
        # traffic is the conversation (its first user line is the task the agent was given)
        units = side_units
        stats["sidechain_lines_replayed"] += len(side_units)
    if not units:
        raise ReaderError(
            f"{source}: no conversation found (no user or assistant message lines;"
            f" {invalid} invalid lines)"
        )

    # one provider response = consecutive assistant lines with the same message.id
    grouped: list[tuple[Message, list[int], int | None]] = []
    for u in units:
        last = grouped[-1] if grouped else None
        if (
            last is not None
            and u.role == "assistant"
            and last[0]["role"] == "assistant"
            and u.message_id is not None
            and last[0].get("_id") == u.message_id
        ):
            last[0]["content"].extend(u.blocks)
            last[1].append(u.line)
            stats["assistant_lines_merged"] += 1
            grouped[-1] = (last[0], last[1], u.usage if u.usage is not None else last[2])
            continue
        msg: Message = {"role": u.role, "content": list(u.blocks)}
        if u.message_id is not None:
            msg["_id"] = u.message_id
        grouped.append((msg, [u.line], u.usage))

    messages = [{k: v for k, v in m.items() if k != "_id"} for m, _, _ in grouped]
    # repair with line tracking: run it on messages tagged with their first line
    tagged = [
        {**m, "_line": lines_[0]} for m, (_, lines_, _) in zip(messages, grouped, strict=True)
    ]
    repaired, repairs = repair_messages(tagged)
    stats.update(repairs)
    first_line = [m.get("_line") for m in repaired]
    final = [{k: v for k, v in m.items() if k != "_line"} for m in repaired]
    if not final:
        raise ReaderError(f"{source}: no conversation found (every message line was empty)")
    _require_user_turn(final, source)
    # a merged message keeps the first message's tag (synthesised ones have none): it covers the
    # lines up to the next tag, and its source context is the largest among the responses merged
    # into it (where lines were lost, one message may stand for several responses)
    usages = sorted((lines_[0], usage) for _, lines_, usage in grouped if usage is not None)
    tags = [(i, ln) for i, ln in enumerate(first_line) if isinstance(ln, int)]
    source_context: dict[int, int] = {}
    for (i, start), stop in zip(tags, [*(ln for _, ln in tags[1:]), None], strict=True):
        if final[i]["role"] != "assistant":
            continue
        inside = [u for ln, u in usages if ln >= start and (stop is None or ln < stop)]
        if inside:
            source_context[i] = max(inside)

    boundaries: list[CompactionBoundary] = []
    for summary_line, b in summary_lines:
        index = next(
            (i for i, ln in enumerate(first_line) if isinstance(ln, int) and ln > summary_line),
            len(final),
        )
        boundaries.append(
            CompactionBoundary(
                message_index=index,
                line=b[0] if b is not None else None,
                trigger=b[1] if b is not None else None,
                pre_tokens=b[2] if b is not None else None,
            )
        )

    tools = _stub_tools(final)
    return Conversation(
        source=source,
        format="claude-code-jsonl",
        system=None,
        tools=tools or None,
        messages=final,
        model=models.most_common(1)[0][0] if models else "",
        boundaries=tuple(boundaries),
        invalid_lines=invalid,
        stats=dict(stats),
        source_context=source_context,
    )


def _stub_tools(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """One stub definition per tool name used, in order of first use (the session file does not
    record the tool definitions, and the provider wants every used tool defined)."""
    names: list[str] = []
    for m in messages:
        for b in _blocks(m):
            if isinstance(b, Mapping) and b.get("type") == "tool_use":
                name = b.get("name")
                if isinstance(name, str) and name not in names:
                    names.append(name)
    return [
        {
            "name": n,
            "description": STUB_TOOL_DESCRIPTION,
            "input_schema": {"type": "object", "additionalProperties": True},
        }
        for n in names
    ]


# --- files ------------------------------------------------------------------------------------


def load_conversation(path: str | Path, *, keep_thinking: bool = False) -> Conversation:
    """Read ``path``: a Claude Code ``.jsonl`` session or a Messages JSON file (by content)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ReaderError(f"{p}: cannot read the file: {exc.strerror or exc}") from None
    source = str(p)
    if p.suffix != ".jsonl" and raw.lstrip()[:1] in (b"{", b"["):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None  # not one JSON document: JSON lines
        if data is not None:
            return parse_messages_json(data, source)
    return parse_claude_code_lines(raw.splitlines(), source, keep_thinking=keep_thinking)
