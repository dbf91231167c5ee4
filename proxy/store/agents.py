"""One session, many conversations: the agents family (``session_agents``), on both backends.

A client session (``x-session-id``, Claude Code's ``x-claude-code-session-id``) may hold several
conversations at once: Claude Code's main conversation and every subagent it spawns share one
session id, a subagent's requests adding ``x-claude-code-agent-id`` (and a nested one's
``x-claude-code-parent-agent-id``). Each conversation has its own transcript, numbered from 1
(``proxy.store.transcripts``): ``agent = ''`` is the session's main conversation (every event
recorded before migration 8 is one of its, with its sequence number unchanged, so every pointer
written before still redeems the same event); any other value is an agent's. ``session_agents``
lists the agents seen in a session, with the parent that spawned each (``''``: the main
conversation), for the admin API and the console.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store.checks import check_keys
from proxy.store.sql import Jobs, Tx

__all__ = ["MAIN", "AgentRecord", "AgentsFamily", "note_agent"]

MAIN = ""  # the agent id of a session's main conversation


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """A conversation of a session: an agent (who spawned it: ``''`` the main conversation),
    or the main conversation itself (``agent`` ``''``); when it was first and last recorded, and
    how many events its transcript holds (its last sequence)."""

    agent: str
    parent: str
    first_seen: str
    last_seen: str
    events: int


async def note_agent(tx: Tx, tenant: str, session: str, agent: str, parent: str, now: str) -> None:
    """The agent was recorded in the session now. The first recorded parent stands (a nested
    agent names it on every request; a later request without the header does not orphan it)."""
    await tx.execute(
        "INSERT INTO session_agents (tenant, session, agent, parent, first_seen, last_seen)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session, agent)"
        " DO UPDATE SET last_seen = excluded.last_seen",
        tenant,
        session,
        agent,
        parent,
        now,
        now,
    )


# the main conversation: the session's own row (it exists once anything was recorded)
_MAIN = (
    "SELECT '', '', s.created_at, s.updated_at, COALESCE(h.last_seq, 0) FROM sessions s"
    " LEFT JOIN transcript_heads h"
    " ON h.tenant = s.tenant AND h.session = s.session AND h.agent = ''"
    " WHERE s.tenant = ? AND s.session = ?"
)
_LIST = (
    "SELECT a.agent, a.parent, a.first_seen, a.last_seen, COALESCE(h.last_seq, 0)"
    " FROM session_agents a LEFT JOIN transcript_heads h"
    " ON h.tenant = a.tenant AND h.session = a.session AND h.agent = a.agent"
    " WHERE a.tenant = ? AND a.session = ? ORDER BY a.first_seen, a.agent"
)


class AgentsFamily(Jobs):
    """``session_agents``."""

    async def session_agents(self, tenant: str, session: str) -> tuple[AgentRecord, ...]:
        check_keys(tenant, session)

        async def job(tx: Tx) -> tuple[AgentRecord, ...]:
            rows = [*await tx.rows(_MAIN, tenant, session), *await tx.rows(_LIST, tenant, session)]
            return tuple(
                AgentRecord(str(a), str(p), str(f), str(la), int(n)) for a, p, f, la, n in rows
            )

        return await self._read(job)
