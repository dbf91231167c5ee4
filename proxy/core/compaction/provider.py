"""L4 by the provider: the summary is the provider's own on-demand compaction. Pure.

With ``compaction.summary.mode: provider``, what L3 cuts is not summarised by the proxy's
summary model but compacted by the provider, on the request's own model: a request with the
top-level ``compaction: {"type": "summarize"}`` (beta ``compact-2026-09-04``) answers one signed
``compaction`` block (``stop_reason: "compaction"``), which later requests send back *first* in
``messages``, byte for byte, in place of what it summarised; the recent turns follow verbatim
(the SDK's tool runner: ``[assistant{compaction}, *later messages]``; the provider's pages on
compaction). The block is stored in the plan (an inserted message, exact JSON), so every replica
and every later turn forwards the same bytes.

The view::

    assistant  [the compaction block]                     (first: nothing of ours before it)
    user       "[context-proxy] ..." + the texts the user typed in the compacted turns
               (the first message's among them) + the transcript pointers of those turns
    (role: "system" entries that stood in the compacted region)
    assistant  first message of the kept window ...

Everything before the kept window -- the first user message too: nothing may precede the
block -- goes into the compaction request: the view's messages as the model saw them (L1 cuts
included), thinking blocks and ``cache_control`` markers left out (a compaction request samples
nothing, and the prefix of a block it would carry is not the one it was made under), with the
request's ``system`` and ``tools``. A refused or failed compaction (400, 529
``compaction_unavailable``, no block) falls back to the proxy's own summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.canonical import strip_markers
from proxy.core.compaction.view import Message

__all__ = [
    "COMPACT_BETA",
    "CompactionCall",
    "block_of_answer",
    "compaction_call",
    "leads_with_compaction",
    "parse_block",
]

COMPACT_BETA = "compact-2026-09-04"
_THINKING = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True, slots=True)
class CompactionCall:
    """The on-demand compaction request for the edge to make (with the request's credentials
    and the beta ``COMPACT_BETA``). ``model`` and ``body()`` as ``SummaryRequest`` has them."""

    model: str
    max_tokens: int
    system: Any
    tools: Any
    messages: tuple[Message, ...]

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if self.system is not None:
            body["system"] = self.system
        if self.tools:
            body["tools"] = self.tools
        body["messages"] = list(self.messages)
        body["compaction"] = {"type": "summarize"}
        return body


def _plain(message: Message) -> Message | None:
    """``message`` without thinking blocks and markers (``None``: nothing left)."""
    content = message.get("content")
    if isinstance(content, list):
        kept = [b for b in content if not (isinstance(b, Mapping) and b.get("type") in _THINKING)]
        if not kept:
            return None
        if len(kept) != len(content):
            message = {**message, "content": kept}
    stripped = strip_markers(message)
    return stripped if isinstance(stripped, dict) else message


def compaction_call(
    model: str, max_tokens: int, system: Any, tools: Any, messages: Sequence[Message]
) -> CompactionCall:
    """The compaction request for the view messages ``messages`` (what precedes the kept
    window), without thinking blocks or markers, and without role-system entries at its end (a
    compaction request ends on the conversation, not on an instruction)."""
    plain = [m for m in (_plain(m) for m in messages) if m is not None]
    while plain and plain[-1].get("role") == "system":
        plain.pop()
    return CompactionCall(model, max_tokens, strip_markers(system), strip_markers(tools), tuple(plain))


def _is_block(value: Any) -> bool:
    content = value.get("content") if isinstance(value, Mapping) else None
    return (
        isinstance(value, Mapping)
        and value.get("type") == "compaction"
        and isinstance(content, str)
        and bool(content.strip())
        and "cache_control" not in value
    )


def block_of_answer(message: Mapping[str, Any]) -> str | None:
    """The answer's one compaction block as JSON text (its keys in the order the provider sent
    them: the bytes later requests send back), or ``None``: no usable block (none, several, or
    one with no summary: the provider's way of saying the compaction failed)."""
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, Mapping) and b.get("type") == "compaction"] if isinstance(content, list) else []
    if len(blocks) != 1 or not _is_block(blocks[0]):
        return None
    return orjson.dumps(blocks[0]).decode()


def leads_with_compaction(messages: Sequence[Message]) -> bool:
    """Whether a view leads with a compaction block (its requests need ``COMPACT_BETA``)."""
    if not messages:
        return False
    content = messages[0].get("content")
    first = content[0] if isinstance(content, list) and content else None
    return isinstance(first, Mapping) and first.get("type") == "compaction"


def parse_block(text: str | None) -> dict[str, Any] | None:
    """The block a stored compaction text holds, or ``None`` (not a usable block)."""
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and _is_block(value) else None
