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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ASSISTANT_SUMMARY_TEXT",
    "ASSISTANT_TEXTS_TEXT",
    "CARRIED_HEADER",
    "MAX_RUNS",
    "PROVIDER_TEXT",
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
PROVIDER_TEXT = (
    "[context-proxy] The earlier turns of this conversation were compacted by the provider into"
    " the block above."
)
ASSISTANT_POINTERS_TEXT = (
    "[context-proxy] Earlier turns of this conversation were compacted to fit the context "
    "window; where they are kept follows."
)


# A bridge names at most this many runs of events: a conversation whose transcript interleaves
# with another's (Claude Code's side requests share its main conversation's identity) could
# otherwise need one run per turn. Beyond it, the runs closest together are joined: the joined
# gap's events are of the same conversation (tenant, session, agent), never another's.
MAX_RUNS = 16


def _pointer(session: str, agent: str, seq: int) -> str:
    return f"transcript:{session}:{agent}:{seq}" if agent else f"transcript:{session}:{seq}"


@dataclass(frozen=True, slots=True)
class TranscriptRange:
    """The removed turns, named by transcript pointers: runs of events ``first``..``last`` (then
    ``more``) of one conversation's transcript (``agent`` ``""``: the session's main
    conversation), one event per message. Written as the bridge's last text block."""

    session: str
    first: int
    last: int
    agent: str = ""
    more: tuple[tuple[int, int], ...] = ()  # further runs, in order, after ``first..last``

    @property
    def runs(self) -> tuple[tuple[int, int], ...]:
        return ((self.first, self.last), *self.more)

    def covers(self, seq: int) -> bool:
        return any(first <= seq <= last for first, last in self.runs)

    def text(self) -> str:
        spans = []
        for first, last in self.runs:
            a, b = _pointer(self.session, self.agent, first), _pointer(self.session, self.agent, last)
            spans.append(a if first == last else f"{a} to {b}")
        where = "this session's transcript" if not self.agent else "this agent's transcript"
        joined = "; ".join(spans)
        return (
            f"[context-proxy: the compacted turns are kept verbatim in {where},"
            f" one event per message: {joined}. The context_proxy_retrieve tool reads one by its"
            " pointer.]"
        )

    def to_json(self) -> list[Any] | dict[str, Any]:
        # the main conversation's one run keeps the form plans had before agents (same bytes)
        if not self.agent and not self.more:
            return [self.session, self.first, self.last]
        return {"session": self.session, "agent": self.agent, "runs": [list(r) for r in self.runs]}

    @staticmethod
    def from_json(data: Any) -> TranscriptRange:
        if isinstance(data, list):
            if (
                len(data) != 3
                or not isinstance(data[0], str)
                or not all(type(n) is int and n >= 1 for n in data[1:])
                or data[1] > data[2]
            ):
                raise ValueError("bridge transcript must be [session, first, last]")
            return TranscriptRange(data[0], data[1], data[2])
        if not isinstance(data, dict):
            raise ValueError("bridge transcript must be a list or an object")
        session, agent, runs = data.get("session"), data.get("agent"), data.get("runs")
        if not isinstance(session, str) or not isinstance(agent, str) or not isinstance(runs, list):
            raise ValueError("bridge transcript must name a session, an agent and runs")
        checked: list[tuple[int, int]] = []
        for run in runs:
            if (
                not isinstance(run, list)
                or len(run) != 2
                or not all(type(n) is int and n >= 1 for n in run)
                or run[0] > run[1]
                or (checked and run[0] <= checked[-1][1])
            ):
                raise ValueError("bridge transcript runs must be ordered [first, last] pairs")
            checked.append((run[0], run[1]))
        if not checked:
            raise ValueError("bridge transcript must name at least one run")
        return TranscriptRange(session, checked[0][0], checked[0][1], agent, tuple(checked[1:]))


def _runs(spans: Sequence[tuple[int, int]], limit: int = MAX_RUNS) -> list[tuple[int, int]]:
    """The union of the ``(first, last)`` spans as ordered runs of consecutive numbers; at most
    ``limit`` runs (the closest neighbours joined first)."""
    runs: list[list[int]] = []
    for first, last in sorted(spans):
        if runs and first <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], last)
        else:
            runs.append([first, last])
    while len(runs) > limit:
        gap = min(range(len(runs) - 1), key=lambda i: runs[i + 1][0] - runs[i][1])
        runs[gap][1] = runs[gap + 1][1]
        del runs[gap + 1]
    return [(a, b) for a, b in runs]


@dataclass(frozen=True, slots=True)
class TranscriptNaming:
    """Which conversation's transcript holds the client's messages (``session``, ``agent``), and
    once looked up, the event number of each removed message (``sequences``: pairs of client
    message index and sequence number; ``None``: not looked up yet, the pipeline asks for them
    with ``NeedsNaming``). A message the transcript does not hold (yet) is not named."""

    session: str
    agent: str = ""
    sequences: tuple[tuple[int, int], ...] | None = None

    def range_of(self, indices: Sequence[int], previous: Bridge | None) -> TranscriptRange | None:
        """The events of the removed messages ``indices``; a replaced bridge's runs (same
        conversation) are kept, so the new bridge still names every turn removed so far."""
        known = dict(self.sequences or ())
        spans = [(known[i], known[i]) for i in indices if i in known]
        old = previous.transcript if previous is not None else None
        if old is not None and (old.session, old.agent) == (self.session, self.agent):
            spans.extend(old.runs)
        if not spans:
            return None
        runs = _runs(spans)
        return TranscriptRange(self.session, runs[0][0], runs[0][1], self.agent, tuple(runs[1:]))


@dataclass(frozen=True, slots=True)
class Bridge:
    """What the bridge turn holds: a summary (or none), the user's texts, oldest first, and
    the transcript pointers of the removed turns (when they can be named). With ``compaction``
    (the provider's signed block: ``compaction.summary.mode: provider``, see ``provider``) the
    block is the assistant half, and the bridge comes first in the view."""

    summary: str | None = None
    carried: tuple[str, ...] = ()
    transcript: TranscriptRange | None = None
    compaction: Mapping[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return (
            self.summary is None
            and not self.carried
            and self.transcript is None
            and self.compaction is None
        )

    def messages(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (assistant, user) pair; only for a non-empty bridge."""
        if self.empty:
            raise ValueError("an empty bridge has no messages")
        if self.compaction is not None:
            texts: list[dict[str, Any]] = [{"type": "text", "text": PROVIDER_TEXT}]
            texts.extend({"type": "text", "text": f"{CARRIED_HEADER}\n{t}"} for t in self.carried)
            if self.transcript is not None:
                texts.append({"type": "text", "text": self.transcript.text()})
            return (
                {"role": "assistant", "content": [dict(self.compaction)]},
                {"role": "user", "content": texts},
            )
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
            data["transcript"] = self.transcript.to_json()
        if self.compaction is not None:
            data["compaction"] = dict(self.compaction)
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
        named = None if transcript is None else TranscriptRange.from_json(transcript)
        compaction = data.get("compaction")
        if compaction is not None and (
            not isinstance(compaction, dict) or compaction.get("type") != "compaction"
        ):
            raise ValueError("bridge compaction must be a compaction block")
        return Bridge(summary, tuple(carried), named, compaction)


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
