"""The session's durable context: read, its pointers re-verified, appended to ``system``."""

from __future__ import annotations

from proxy.server.context.durable import DurableContext, with_system_block
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage


class InjectDurable(Stage):
    """With a session: ``ex.body`` with the rendered block last in ``system`` (then
    ``ex.faithful`` is ``None``: the client's bytes are no longer what goes), the block's
    pointers in ``ex.shared``, the ``x-durable-*`` headers on the answer
    (``proxy.server.context.durable``)."""

    name = "durable"

    def __init__(self, durable: DurableContext) -> None:
        self.durable = durable

    async def request(self, ex: Exchange) -> None:
        conversation = ex.conversation
        if conversation is None:
            return
        tenant = ex.tenant
        injection = await self.durable.injection(tenant.name, tenant.sources, conversation.session)
        ex.headers.update(injection.headers(conversation))
        ex.shared = injection.sources
        if injection.block is not None:
            ex.body = with_system_block(ex.body, injection.block)
            ex.faithful = None
