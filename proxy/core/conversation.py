"""Who a request's conversation is: a session's main conversation, or one of its agents'. Pure.

One client session may carry several conversations at once. Claude Code sends every request of
a session with the same ``x-claude-code-session-id``; the requests of a subagent it spawned add
``x-claude-code-agent-id`` (fresh per spawn; the teammates of an agent team keep a stable one),
and a nested agent's ``x-claude-code-parent-agent-id`` (Claude Code's "Gateway protocol
reference"; the generic ``x-agent-id`` / ``x-parent-agent-id`` are ours for other clients).
Each conversation gets its own transcript, plans, summaries and transcript naming; the durable
context (facts, pending items, evidence) stays the session's, shared by its agents.

Never a function of bytes a client decorates: the identity is read from headers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.pointers import TranscriptPointer, is_valid_agent_id, is_valid_session_id

__all__ = ["Conversation"]


@dataclass(frozen=True, slots=True)
class Conversation:
    """``agent`` ``""``: the session's main conversation; ``parent``: the agent that spawned
    this one (``""``: the main conversation; only meaningful for an agent)."""

    session: str
    agent: str = ""
    parent: str = ""

    def __post_init__(self) -> None:
        if not is_valid_session_id(self.session):
            raise ValueError("invalid session id")
        for value in (self.agent, self.parent):
            if value and not is_valid_agent_id(value):
                raise ValueError("invalid agent id")

    @property
    def scope(self) -> str:
        """The conversation as one key: ``<session>`` or ``<session>/<agent>`` (``/`` is in
        neither id's grammar, so two conversations never share a scope)."""
        return f"{self.session}/{self.agent}" if self.agent else self.session

    def owns(self, pointer: TranscriptPointer) -> bool:
        """Whether ``pointer`` names an event of this conversation's transcript."""
        return pointer.session == self.session and pointer.agent == self.agent
