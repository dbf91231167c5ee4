"""Whose conversation a request belongs to: its session and agent, named on every span."""

from __future__ import annotations

from proxy.server.context.durable import conversation_from
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.http import spans


class Identify(Stage):
    """``ex.conversation`` from ``x-session-id`` / ``X-Claude-Code-Session-Id`` and the agent
    headers (``proxy.server.context.durable.conversation_from``: a malformed id is a 400); the
    tenant, session and agent on the request's spans from here on."""

    name = "identify"

    async def request(self, ex: Exchange) -> None:
        ex.conversation = conversation_from(ex.request.headers)
        spans.identify(ex.tenant.name, ex.conversation)
