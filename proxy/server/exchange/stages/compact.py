"""Compaction: the view to forward (plans, L1-L4), the cut results kept, the report."""

from __future__ import annotations

import functools

from proxy.server.compaction.naming import transcript_naming
from proxy.server.compaction.service import CompactionService
from proxy.server.context.durable import DurableContext
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage


class Compact(Stage):
    """``ex.prepared`` (what to forward, ``proxy.server.compaction.service``) and
    ``ex.compaction`` (its result); the ``x-compaction-*`` report on the answer. A new plan's cut
    tool results are stored as the session's artifacts before the request is forwarded (the
    marker the model sees names them). A request forwarded while it is being counted is
    reported once the upstream answered (``response``), on an error answer too."""

    name = "compact"

    def __init__(self, service: CompactionService, durable: DurableContext) -> None:
        self.service = service
        self.durable = durable

    async def request(self, ex: Exchange) -> None:
        tenant = ex.tenant
        sources = tenant.sources
        conversation = ex.conversation
        session = conversation.session if conversation is not None else None
        prepared = await self.service.prepare(
            ex.request.headers,
            ex.body,
            ex.faithful,
            tenant.name,
            tenant.compaction,
            artifact_session=session if session is not None and sources.artifact_root else None,
            upstream_headers=ex.upstream_headers,
            transcript=transcript_naming(sources, conversation) if conversation is not None else None,
            offer_retrieval=conversation is not None,
            canonical=ex.canonical,
            conversation=conversation,
            settled=(
                None
                if conversation is None
                else functools.partial(self.durable.settled, tenant.name, conversation)
            ),
        )
        ex.prepared = prepared
        ex.compaction = result = prepared.result
        ex.headers.update(prepared.headers)
        if conversation is not None and result is not None and result.plan_status == "new":
            await self.durable.keep_compaction(
                tenant.name, sources, conversation, ex.body["messages"], result
            )

    async def response(self, ex: Exchange) -> None:
        prepared = ex.prepared
        if prepared is None or prepared.counting is None:
            return
        # counted while the provider worked: now reported (the same report as counted first)
        ex.prepared = prepared = await self.service.settle(prepared)
        ex.headers.update(prepared.headers)
        ex.compaction = prepared.result
