"""The bridge: the pair of turns the proxy inserts where earlier turns were compacted.

Design decision (taken; do not "simplify" it away): whatever must stand between the first user
message and the kept recent turns (a summary, or text the user typed in a removed turn) goes into
a PAIR of messages::

    user       messages[0]                (the original intent, untouched)
    assistant  "[context-proxy] Earlier turns of this conversation were compacted ...; the summary
               follows."
    user       "[context-proxy summary of earlier conversation]\\n<summary>\\n...\\n</summary>"
               + one text block per carried user message
    (role: "system" entries that stood in the removed region, in their order)
    assistant  first message of the kept window
    ...

so roles keep alternating user/assistant: the window always starts with an assistant message and
messages[0] is a user message. Merging the summary into messages[0] would change the one message
that every later request shares (and carries the client's own cache breakpoint); a lone user
message would make two user turns in a row. With nothing to insert there is no bridge: messages[0]
is followed directly by the window's first assistant message.

The bridge never carries ``cache_control`` and contains no clock, id or error text; it is a pure
function of the summary and the carried texts, so a replay yields the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ASSISTANT_SUMMARY_TEXT",
    "ASSISTANT_TEXTS_TEXT",
    "CARRIED_HEADER",
    "SUMMARY_HEADER",
    "Bridge",
    "carry_texts",
    "cut_middle",
]

ASSISTANT_SUMMARY_TEXT = (
    "[context-proxy] Earlier turns of this conversation were compacted to fit the context "
    "window; the summary follows."
)
ASSISTANT_TEXTS_TEXT = (
    "[context-proxy] Earlier turns of this conversation were compacted to fit the context "
    "window; what the user wrote in them follows."
)
SUMMARY_HEADER = "[context-proxy summary of earlier conversation]"
CARRIED_HEADER = "[context-proxy: the user wrote this in an earlier, compacted turn]"


@dataclass(frozen=True, slots=True)
class Bridge:
    """What the bridge turn holds: a summary (or none) and the user's texts, oldest first."""

    summary: str | None = None
    carried: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.summary is None and not self.carried

    def messages(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (assistant, user) pair; only for a non-empty bridge."""
        if self.empty:
            raise ValueError("an empty bridge has no messages")
        lead = ASSISTANT_SUMMARY_TEXT if self.summary is not None else ASSISTANT_TEXTS_TEXT
        blocks: list[dict[str, Any]] = []
        if self.summary is not None:
            blocks.append(
                {"type": "text", "text": f"{SUMMARY_HEADER}\n<summary>\n{self.summary}\n</summary>"}
            )
        blocks.extend({"type": "text", "text": f"{CARRIED_HEADER}\n{t}"} for t in self.carried)
        return (
            {"role": "assistant", "content": [{"type": "text", "text": lead}]},
            {"role": "user", "content": blocks},
        )

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "carried": list(self.carried)}

    @staticmethod
    def from_json(data: Any) -> Bridge:
        summary = data["summary"]
        if summary is not None and not isinstance(summary, str):
            raise ValueError("bridge summary must be a string or null")
        carried = data["carried"]
        if not isinstance(carried, list) or not all(isinstance(t, str) for t in carried):
            raise ValueError("bridge carried texts must be a list of strings")
        return Bridge(summary, tuple(carried))


def cut_middle(text: str, tokens: int, keep_tokens: int, what: str = "text") -> str:
    """``text`` (``tokens`` long) cut to about ``keep_tokens``: head, a note, tail."""
    if tokens <= keep_tokens:
        return text
    keep_chars = len(text) * max(keep_tokens, 0) // max(tokens, 1)
    head = (keep_chars + 1) // 2
    tail = keep_chars - head
    note = f"[context-proxy: {tokens - keep_tokens} of {tokens} tokens of this {what} cut]"
    parts = [text[:head].rstrip(), note]
    if tail > 0:
        parts.append(text[len(text) - tail :].lstrip())
    return "\n".join(p for p in parts if p)


def carry_texts(
    previous: Sequence[str], new: Sequence[str], cap: int, tokens: Callable[[str], int]
) -> tuple[str, ...]:
    """The user texts a bridge carries: the most recent ones that fit in ``cap`` tokens.

    The newest text alone over the cap is cut in the middle to fit. Order stays chronological.
    """
    texts = [*previous, *new]
    kept: list[str] = []
    budget = cap
    for text in reversed(texts):
        size = tokens(text)
        if size <= budget:
            kept.append(text)
            budget -= size
        elif not kept:
            kept.append(cut_middle(text, size, budget, "message"))
            break
        else:
            break
    kept.reverse()
    return tuple(kept)
