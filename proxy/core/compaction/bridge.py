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
    "TranscriptNaming",
    "TranscriptRange",
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
ASSISTANT_POINTERS_TEXT = (
    "[context-proxy] Earlier turns of this conversation were compacted to fit the context "
    "window; where they are kept follows."
)


@dataclass(frozen=True, slots=True)
class TranscriptRange:
    """The removed turns, named by transcript pointers: events ``first``..``last`` of the
    session's transcript (one event per message). Written as the bridge's last text block."""

    session: str
    first: int
    last: int

    def text(self) -> str:
        first = f"transcript:{self.session}:{self.first}"
        last = f"transcript:{self.session}:{self.last}"
        span = first if self.first == self.last else f"{first} to {last}"
        return (
            "[context-proxy: the compacted turns are kept verbatim in this session's transcript,"
            f" one event per message: {span}. The context_proxy_retrieve tool reads one by its"
            " pointer.]"
        )


@dataclass(frozen=True, slots=True)
class TranscriptNaming:
    """How the client's messages map to transcript events: message ``i`` is event
    ``first_sequence + i`` of ``session`` (the edge decides whether that holds)."""

    session: str
    first_sequence: int

    def range_of(self, indices: Sequence[int], previous: Bridge | None) -> TranscriptRange | None:
        """The events of the removed messages ``indices``; a replaced bridge's range (same
        session) extends it back, so the new bridge still names every turn removed so far."""
        if not indices:
            return None
        first = self.first_sequence + min(indices)
        last = self.first_sequence + max(indices)
        old = previous.transcript if previous is not None else None
        if old is not None and old.session == self.session and old.first < first:
            first = old.first
        return TranscriptRange(self.session, first, last)


@dataclass(frozen=True, slots=True)
class Bridge:
    """What the bridge turn holds: a summary (or none), the user's texts, oldest first, and
    the transcript pointers of the removed turns (when they can be named)."""

    summary: str | None = None
    carried: tuple[str, ...] = ()
    transcript: TranscriptRange | None = None

    @property
    def empty(self) -> bool:
        return self.summary is None and not self.carried and self.transcript is None

    def messages(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (assistant, user) pair; only for a non-empty bridge."""
        if self.empty:
            raise ValueError("an empty bridge has no messages")
        lead = ASSISTANT_SUMMARY_TEXT if self.summary is not None else ASSISTANT_TEXTS_TEXT
        if self.summary is None and not self.carried:
            lead = ASSISTANT_POINTERS_TEXT
        blocks: list[dict[str, Any]] = []
        if self.summary is not None:
            blocks.append(
                {"type": "text", "text": f"{SUMMARY_HEADER}\n<summary>\n{self.summary}\n</summary>"}
            )
        blocks.extend({"type": "text", "text": f"{CARRIED_HEADER}\n{t}"} for t in self.carried)
        if self.transcript is not None:
            blocks.append({"type": "text", "text": self.transcript.text()})
        return (
            {"role": "assistant", "content": [{"type": "text", "text": lead}]},
            {"role": "user", "content": blocks},
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"summary": self.summary, "carried": list(self.carried)}
        if self.transcript is not None:  # absent otherwise: older plans keep their bytes
            t = self.transcript
            data["transcript"] = [t.session, t.first, t.last]
        return data

    @staticmethod
    def from_json(data: Any) -> Bridge:
        summary = data["summary"]
        if summary is not None and not isinstance(summary, str):
            raise ValueError("bridge summary must be a string or null")
        carried = data["carried"]
        if not isinstance(carried, list) or not all(isinstance(t, str) for t in carried):
            raise ValueError("bridge carried texts must be a list of strings")
        transcript = data.get("transcript")
        if transcript is None:
            return Bridge(summary, tuple(carried))
        if (
            not isinstance(transcript, list)
            or len(transcript) != 3
            or not isinstance(transcript[0], str)
            or not all(type(n) is int and n >= 1 for n in transcript[1:])
            or transcript[1] > transcript[2]
        ):
            raise ValueError("bridge transcript must be [session, first, last]")
        return Bridge(summary, tuple(carried), TranscriptRange(*transcript))


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
