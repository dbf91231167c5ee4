"""The model reads back what was cut: a view that offers ``context_proxy_retrieve`` is relayed
by the retrieval loop, which answers the model's calls and calls the provider again."""

from __future__ import annotations

import functools

from proxy.server.context.durable import DurableContext
from proxy.server.context.retrieval import RetrievalLoop
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.relay.forward import Forwarder


class Retrieve(Stage):
    """When the forwarded view offers the tool (``ex.prepared.view``: compaction decides when),
    ``ex.relay`` is a ``RetrievalLoop`` (``proxy.server.context.retrieval``): the client still
    gets one answer; its hidden rounds' calls are ``ex.rounds``, where the ledger, the traces and
    the transcript find them. Not on ``count_tokens`` (no answer to continue)."""

    name = "retrieve"
    count_tokens = False

    def __init__(self, forwarder: Forwarder, durable: DurableContext) -> None:
        self.forwarder = forwarder
        self.durable = durable

    async def request(self, ex: Exchange) -> None:
        prepared, conversation = ex.prepared, ex.conversation
        if prepared is None or prepared.view is None or conversation is None:
            return
        tenant = ex.tenant
        loop = RetrievalLoop(
            self.forwarder,
            ex.request,
            ex.upstream_headers,
            prepared.view,
            tenant.compaction.retrieval,
            self.durable.checks,
            tenant.name,
            tenant.sources,
            conversation,
            ex.route,
            settled=functools.partial(self.durable.settled, tenant.name, conversation),
            shared=ex.shared,
        )
        ex.relay = loop.run
        ex.rounds = loop.hidden
