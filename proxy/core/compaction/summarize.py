"""L4: what the summariser is asked, and what its answer becomes.

The region L3 cut (see ``prune``) is rendered as compact plain text, not as JSON messages: role
labels, tool calls as ``tool_use Name({input json, cut})``, tool results as their text cut to
``summary_tool_result_cap`` tokens (L1 already cut them once), media as ``[image]`` /
``[document ...]`` (never base64), thinking omitted. A previous summary and the texts a previous
bridge carried come first, so a later compaction summarises incrementally (old summary + newly
dropped turns) instead of the whole history again. Each message is labelled with its index in
the client's ``messages`` (``[#12] USER:``).

Nothing removed is left out: when the rendering is over ``summary_input_cap`` tokens (the
summariser's input budget, ``compaction.summary.input_budget``), it is cut into parts at message
boundaries and summarised as an incremental chain (``SummaryPlan``): call 1 reads the previous
summary and part 1, call ``i`` reads what call ``i - 1`` wrote and part ``i``. At most
``summary_max_calls`` calls: a region that needs more is rendered again with smaller per-piece
caps (see ``plan_summary``).

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

__all__ = [
    "SummaryPlan",
    "SummaryRequest",
    "clean_summary",
    "plan_summary",
    "render_region",
    "summary_request",
]

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


@dataclass(frozen=True, slots=True)
class _Caps:
    """Per-piece caps of one rendering (tokens; characters for tool inputs)."""

    text: int
    result: int
    tool_input: int


def _render_message(
    message: Message, caps: _Caps, tokens: Callable[[str], int], origin: int | None = None
) -> str:
    def cap(text: str, limit: int, what: str) -> str:
        return cut_middle(text, tokens(text), limit, what)

    role = str(message.get("role", "")).upper()
    label = f"[#{origin}] {role}" if origin is not None else role
    content = message.get("content")
    lines: list[str] = []
    if isinstance(content, str):
        lines.append(cap(content, caps.text, "message"))
    for block in blocks_of(message):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                lines.append(cap(text, caps.text, "message"))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            args = _compact_json(block.get("input"), caps.tool_input)
            lines.append(f"{kind} {block.get('name')}({args})")
        elif kind in ("tool_result", "mcp_tool_result"):
            error = " (error)" if block.get("is_error") is True else ""
            body = cap(_result_text(block.get("content")), caps.result, "result")
            lines.append(f"{kind}{error}: {body}")
        elif isinstance(kind, str) and kind.endswith("_tool_result"):
            lines.append(f"{kind}: {_compact_json(block.get('content'), caps.tool_input)}")
        elif kind in ("image", "document"):
            lines.append(_media(block))
        else:
            lines.append(f"[{kind}]")
    return f"{label}:\n" + "\n".join(lines) if lines else f"{label}: (no text)"


# Tokens a call's text spends beyond the transcript's messages: the tags, the part note.
_FRAME_TOKENS = 64
# The smallest transcript room a call gets, whatever the previous summary takes.
_MIN_ROOM = 100
# Successive renderings when the region does not fit in ``summary_max_calls`` calls: every cap
# is divided by these factors (down to the floors below) before giving up on the budget.
_SHRINK = (1, 2, 4, 8, 16)
_FLOOR = _Caps(text=50, result=20, tool_input=60)


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """The removed region as the summariser will read it, cut into calls.

    Call 1 reads ``preamble`` (the previous bridge's summary and carried texts) and ``parts[0]``;
    call ``i`` > 1 reads the summary call ``i - 1`` wrote and ``parts[i - 1]`` (an incremental
    chain). ``origins[i]`` are the client message indices ``parts[i]`` renders: every removed
    message is in exactly one part."""

    preamble: str
    parts: tuple[str, ...]
    origins: tuple[tuple[int, ...], ...]

    @property
    def calls(self) -> int:
        return len(self.parts)

    def text(self, index: int, previous_summary: str | None) -> str:
        """The text of call ``index`` (0-based); ``previous_summary``: what call ``index - 1``
        wrote (unused for the first call, whose preamble holds the previous bridge's)."""
        pieces: list[str] = []
        if index == 0:
            if self.preamble:
                pieces.append(self.preamble)
        elif previous_summary is not None:
            pieces.append(f"<previous_summary>\n{previous_summary}\n</previous_summary>")
        if len(self.parts) > 1:
            pieces.append(
                f"[part {index + 1} of {len(self.parts)} of the compacted turns, oldest first;"
                " merge it with the previous summary into one note]"
            )
        pieces.append(f"<transcript>\n{self.parts[index]}\n</transcript>")
        return "\n\n".join(pieces)


def _pack(
    rendered: Sequence[tuple[int, str, int]], first_room: int, room: int
) -> list[list[tuple[int, str, int]]]:
    """Greedy, in order: each part takes messages while they fit in its room."""
    parts: list[list[tuple[int, str, int]]] = [[]]
    used = 0
    for item in rendered:
        limit = first_room if len(parts) == 1 else room
        if parts[-1] and used + item[2] > limit:
            parts.append([])
            used = 0
        parts[-1].append(item)
        used += item[2]
    return parts


def _even(rendered: Sequence[tuple[int, str, int]], calls: int) -> list[list[tuple[int, str, int]]]:
    """``calls`` parts of about equal tokens (the last resort: over the budget, but bounded)."""
    total = sum(size for _, _, size in rendered)
    share = max(1, -(-total // calls))
    parts: list[list[tuple[int, str, int]]] = [[]]
    used = 0
    for item in rendered:
        if parts[-1] and used + item[2] > share and len(parts) < calls:
            parts.append([])
            used = 0
        parts[-1].append(item)
        used += item[2]
    return parts


def plan_summary(
    previous: Bridge | None,
    removed: Sequence[tuple[int, Message]],
    policy: CompactionPolicy,
    tokens: Callable[[str], int],
) -> SummaryPlan:
    """Every removed message (``(client index, message)``, in order) rendered and cut into at
    most ``policy.summary_max_calls`` parts, each call's text within ``summary_input_cap``
    tokens: the previous summary (the old bridge's, or the chain's last) takes its room first.
    When the region does not fit, the per-piece caps shrink (long texts and tool results are cut
    harder) rather than any message being left out; only a region too large even for the
    smallest caps is spread evenly over the calls, over the budget."""
    preamble_parts: list[str] = []
    if previous is not None and previous.summary is not None:
        preamble_parts.append(f"<previous_summary>\n{previous.summary}\n</previous_summary>")
    if previous is not None and previous.carried:
        texts = "\n---\n".join(previous.carried)
        preamble_parts.append(f"<earlier_user_messages>\n{texts}\n</earlier_user_messages>")
    preamble = "\n\n".join(preamble_parts)
    budget = policy.summary_input_cap
    first_room = max(_MIN_ROOM, budget - _FRAME_TOKENS - (tokens(preamble) if preamble else 0))
    room = max(_MIN_ROOM, budget - _FRAME_TOKENS - policy.summary_max_tokens - 8)
    base = _Caps(budget // 4, policy.summary_tool_result_cap, policy.summary_tool_input_chars)
    parts: list[list[tuple[int, str, int]]] = []
    for factor in _SHRINK:
        caps = _Caps(
            max(min(base.text, _FLOOR.text), base.text // factor),
            max(min(base.result, _FLOOR.result), base.result // factor),
            max(min(base.tool_input, _FLOOR.tool_input), base.tool_input // factor),
        )
        rendered: list[tuple[int, str, int]] = []
        for origin, message in removed:
            text = _render_message(message, caps, tokens, origin)
            size = tokens(text) + 1  # + the separator
            if size > room:  # one message alone over a call's room: its middle goes
                text = cut_middle(text, size, room - 1, "message")
                size = tokens(text) + 1
            rendered.append((origin, text, size))
        parts = _pack(rendered, first_room, room)
        if len(parts) <= policy.summary_max_calls:
            break
    else:
        parts = _even(rendered, policy.summary_max_calls)
    return SummaryPlan(
        preamble=preamble,
        parts=tuple("\n\n".join(text for _, text, _ in part) for part in parts),
        origins=tuple(tuple(origin for origin, _, _ in part) for part in parts),
    )


def render_region(
    previous: Bridge | None,
    removed: Sequence[Message],
    policy: CompactionPolicy,
    tokens: Callable[[str], int],
) -> str:
    """The first call's text for ``removed`` (indices 0..n-1): kept for callers that render a
    region that fits in one call; see :func:`plan_summary`."""
    plan = plan_summary(previous, list(enumerate(removed)), policy, tokens)
    return plan.text(0, None)


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
