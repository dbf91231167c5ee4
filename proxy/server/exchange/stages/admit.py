"""Budgets and rate limits: admission before anything goes upstream (429 when over)."""

from __future__ import annotations

from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.quota import QUOTA_TICKET, admit


class Admit(Stage):
    """``ex.ticket`` (``proxy.server.quota``: one store statement when the tenant has limits,
    nothing otherwise) and its allowance headers on the answer. ``count_tokens`` is not
    limited."""

    name = "admit"
    count_tokens = False

    async def request(self, ex: Exchange) -> None:
        ex.headers.update(await admit(ex.request, ex.route, ex.body))
        ex.ticket = ex.request.get(QUOTA_TICKET)
