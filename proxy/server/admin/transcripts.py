"""The admin API's transcript routes: a session's conversations and each one's events.

::

    GET /admin/v1/sessions/{session}/agents                   the session's agents, parent -> child
    GET /admin/v1/sessions/{session}/transcript?agent=&after=&limit=
                                                              one conversation's events, by seq

A session holds its main conversation (no ``agent``) and one conversation per agent that
recorded under it (``proxy.store.agents``). ``agents`` lists them as a tree: each agent with the
one that spawned it (``parent``: ``null`` for the main conversation, which is not listed as an
agent itself), when it was first and last recorded, and how many events its transcript holds.
Another tenant's session answers 404, as a missing one does.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from proxy.core.errors import InvalidRequest
from proxy.core.pointers import is_valid_agent_id
from proxy.server.admin.wire import SESSION_NOT_FOUND, require_session, session_of
from proxy.server.appkeys import STORE
from proxy.sources.transcript_records import record_sha256
from proxy.store.agents import AgentRecord
from proxy.store.base import RecordedEvent
from proxy.tenancy.tenants import Tenant

__all__ = [
    "DEFAULT_TRANSCRIPT_LIMIT",
    "MAX_TRANSCRIPT_LIMIT",
    "SESSION_NOT_FOUND",
    "event_json",
    "get_agents",
    "get_transcript",
    "require_session",
    "session_of",
]

DEFAULT_TRANSCRIPT_LIMIT = 100
MAX_TRANSCRIPT_LIMIT = 1000
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)


def _integer(request: web.Request, name: str, default: int, low: int, high: int) -> int | str:
    """The parameter's value, or what is wrong with it."""
    text = request.query.get(name)
    if text is None:
        return default
    expected = f"{name}: expected an integer from {low} to {high}"
    if not _DIGITS.fullmatch(text):
        return expected
    value = int(text)
    return value if low <= value <= high else expected


def event_json(recorded: RecordedEvent) -> dict[str, Any]:
    event = recorded.event
    return {
        "seq": recorded.seq,
        "pointer": recorded.pointer,
        "event_id": event.event_id,
        "recorded_at": event.recorded_at,
        "type": event.type,
        "role": event.role,
        "content": event.content,
        "complete": event.complete,
        "prefix_count": recorded.prefix_count,
        "prefix_hash": recorded.prefix_hash,
        "evidence_sha256": record_sha256(recorded),
    }


def _json(data: object) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


async def get_transcript(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    agent = request.query.get("agent", "")
    after = _integer(request, "after", 0, 0, 10**18 - 1)
    limit = _integer(request, "limit", DEFAULT_TRANSCRIPT_LIMIT, 1, MAX_TRANSCRIPT_LIMIT)
    problems = [p for p in (after, limit) if isinstance(p, str)]
    if agent and not is_valid_agent_id(agent):
        problems.append("agent: not a valid agent id (1-200 characters of [A-Za-z0-9._-])")
    if problems:
        raise InvalidRequest("; ".join(problems))
    assert isinstance(after, int) and isinstance(limit, int)
    store = request.app[STORE]
    await require_session(store, tenant, session)
    events = await store.transcript_events(tenant.name, session, after, limit + 1, agent=agent)
    page = events[:limit]
    more = len(events) > limit
    return _json(
        {
            "session": session,
            "agent": agent or None,
            "events": [event_json(e) for e in page],
            "next_after": page[-1].seq if more else None,
        }
    )


def _agent_json(record: AgentRecord) -> dict[str, Any]:
    return {
        "agent": record.agent,
        "parent": record.parent or None,
        "first_seen": record.first_seen,
        "last_seen": record.last_seen,
        "events": record.events,
    }


async def get_agents(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    store = request.app[STORE]
    await require_session(store, tenant, session)
    found = await store.session_agents(tenant.name, session)
    main = next((r for r in found if not r.agent), None)
    return _json(
        {
            "session": session,
            "main": {"events": main.events if main is not None else 0},
            "agents": [_agent_json(r) for r in found if r.agent],
        }
    )
