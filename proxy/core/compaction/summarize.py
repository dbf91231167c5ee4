"""L4: what the summariser is asked, and what its answer becomes.

The region L3 cut (see ``prune``) is rendered as compact plain text, not as JSON messages: role
labels, tool calls as ``tool_use Name({input json, cut})``, tool results as their text cut to
``summary_tool_result_cap`` tokens (L1 already cut them once), media as ``[image]`` /
``[document ...]`` (never base64), thinking omitted. A previous summary and the texts a previous
bridge carried come first, so a later compaction summarises incrementally (old summary + newly
dropped turns) instead of the whole history again. When the rendering is still over
``summary_input_cap`` tokens, its head and tail are kept and the middle is dropped by whole
messages, with a note saying how many.

The model call itself belongs to the edge: ``SummaryRequest`` carries the model, the token cap, the
system prompt and the text; ``SummaryRequest.body()`` is a ready Messages API body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.compaction.bridge import Bridge, cut_middle
from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.view import Message, blocks_of

__all__ = ["SummaryRequest", "clean_summary", "render_region", "summary_request"]

_OMIT_KEYS = frozenset({"signature", "encrypted_content", "cache_control", "citations"})
_MEDIA_KEYS = frozenset({"data"})


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """One summarisation call for the edge to make (with the request's own credentials)."""

    model: str
    max_tokens: int
    system: str
    text: str

    def body(self) -> dict[str, Any]:
        """A Messages API request body for this call (non-streaming)."""
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": self.system,
            "messages": [{"role": "user", "content": self.text}],
        }


def _compact_json(value: Any, max_chars: int) -> str:
    """Sorted-key JSON without signatures and base64 payloads, cut to ``max_chars``."""

    def scrub(v: Any) -> Any:
        if isinstance(v, Mapping):
            out: dict[str, Any] = {}
            for key, item in v.items():
                if key in _OMIT_KEYS:
                    continue
                if key in _MEDIA_KEYS and isinstance(item, str) and len(item) > 64:
                    out[str(key)] = f"<{len(item)} characters omitted>"
                else:
                    out[str(key)] = scrub(item)
            return out
        if isinstance(v, list | tuple):
            return [scrub(x) for x in v]
        return v

    try:
        text = orjson.dumps(scrub(value), option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def _media(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "document":
        title = block.get("title")
        return f"[document: {title}]" if isinstance(title, str) and title else "[document]"
    return f"[{kind}]"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            parts.append(text if isinstance(text, str) else "")
        elif isinstance(block, Mapping):
            parts.append(_media(block))
    return "\n".join(parts)


def _render_message(
    message: Message, policy: CompactionPolicy, tokens: Callable[[str], int]
) -> str:
    def cap(text: str, limit: int, what: str) -> str:
        return cut_middle(text, tokens(text), limit, what)

    role = str(message.get("role", "")).upper()
    content = message.get("content")
    lines: list[str] = []
    if isinstance(content, str):
        lines.append(cap(content, policy.summary_input_cap // 4, "message"))
    for block in blocks_of(message):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                lines.append(cap(text, policy.summary_input_cap // 4, "message"))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            args = _compact_json(block.get("input"), policy.summary_tool_input_chars)
            lines.append(f"{kind} {block.get('name')}({args})")
        elif kind in ("tool_result", "mcp_tool_result"):
            error = " (error)" if block.get("is_error") is True else ""
            body = cap(_result_text(block.get("content")), policy.summary_tool_result_cap, "result")
            lines.append(f"{kind}{error}: {body}")
        elif isinstance(kind, str) and kind.endswith("_tool_result"):
            lines.append(
                f"{kind}: {_compact_json(block.get('content'), policy.summary_tool_input_chars)}"
            )
        elif kind in ("image", "document"):
            lines.append(_media(block))
        else:
            lines.append(f"[{kind}]")
    return f"{role}:\n" + "\n".join(lines) if lines else f"{role}: (no text)"


def render_region(
    previous: Bridge | None,
    removed: Sequence[Message],
    policy: CompactionPolicy,
    tokens: Callable[[str], int],
) -> str:
    """The summariser's input: the previous summary and carried texts, then the transcript."""
    preamble: list[str] = []
    if previous is not None and previous.summary is not None:
        preamble.append(f"<previous_summary>\n{previous.summary}\n</previous_summary>")
    if previous is not None and previous.carried:
        texts = "\n---\n".join(previous.carried)
        preamble.append(f"<earlier_user_messages>\n{texts}\n</earlier_user_messages>")
    chunks = [_render_message(m, policy, tokens) for m in removed]
    sizes = [tokens(c) for c in chunks]
    budget = policy.summary_input_cap - sum(tokens(p) for p in preamble)
    if sum(sizes) > budget:
        head: list[str] = []
        used = 0
        i = 0
        while i < len(chunks) and used + sizes[i] <= budget // 2:
            head.append(chunks[i])
            used += sizes[i]
            i += 1
        tail: list[str] = []
        j = len(chunks) - 1
        while j >= i and used + sizes[j] <= budget:
            tail.append(chunks[j])
            used += sizes[j]
            j -= 1
        tail.reverse()
        omitted = j - i + 1
        chunks = [*head, f"[... {omitted} messages omitted to fit ...]", *tail]
    transcript = "\n\n".join(chunks)
    return "\n\n".join([*preamble, f"<transcript>\n{transcript}\n</transcript>"])


def summary_request(text: str, policy: CompactionPolicy, model: str) -> SummaryRequest:
    system = (
        f"{policy.summary_prompt.strip()}\n\n"
        f"The note must fit in {policy.summary_max_tokens} tokens."
    )
    return SummaryRequest(
        model=policy.summary_model or model,
        max_tokens=policy.summary_max_tokens,
        system=system,
        text=text,
    )


def clean_summary(
    text: str | None, policy: CompactionPolicy, tokens: Callable[[str], int]
) -> str | None:
    """The summary to insert, or ``None`` when the call failed (no text, or only whitespace)."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    size = tokens(text)
    limit = policy.summary_max_tokens
    keep = limit
    cut = text
    # the cut is by characters, not tokens: shrink until it fits (a few rounds at most)
    while size > limit and keep > 0:
        keep = keep * 3 // 4
        cut = cut_middle(text, tokens(text), keep, "summary")
        size = tokens(cut)
    return cut
