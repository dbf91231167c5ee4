"""The conversation's transcript: the request's new messages, then its answer."""

from __future__ import annotations

from proxy.server.context.durable import DurableContext
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage


class Record(Stage):
    """With a session, on ``/v1/messages``: the messages are queued for the transcript before
    compaction runs (naming what it removes reads them back), the answer once it is over (also a
    cut one, when the client went away mid-stream), with the hidden retrieval rounds it took.
    Recording runs in the background (``DurableContext``): it never delays the answer."""

    name = "record"
    count_tokens = False

    def __init__(self, durable: DurableContext) -> None:
        self.durable = durable

    async def request(self, ex: Exchange) -> None:
        if ex.conversation is not None:
            tenant = ex.tenant
            messages = ex.body["messages"]
            ex.turn = self.durable.record_request(tenant.name, tenant.sources, ex.conversation, messages)
            ex.wants_answer = True

    def end(self, ex: Exchange) -> None:
        turn, answer = ex.turn, ex.answer
        if turn is None or answer is None:  # no session, or no 200 answer to record
            return
        message = ex.rounds.annotate(ex.message) if ex.rounds is not None else ex.message
        self.durable.record_answer(turn, message, answer.stopped)
