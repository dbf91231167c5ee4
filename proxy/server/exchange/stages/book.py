"""The usage ledger: every upstream call made for the request is a row of its tenant, and counts
to its budgets and rate limits."""

from __future__ import annotations

from proxy.core.errors import ProxyError
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.ledger import CALL_CONTEXT, CallContext, ClientCall, LedgerRecorder


class Book(Stage):
    """From here on, the calls the proxy makes for the request (summaries) are its tenant's,
    session's and agent's, and charged to its ticket (``proxy.server.ledger.CALL_CONTEXT``);
    once it ends, the client's own call on ``/v1/messages`` is one row, and each hidden
    retrieval round's call one more (``ClientCall``): also when the client went away mid-answer
    (the call was made, and billed), not when the call never reached the provider's answer
    for a reason of the request's own (the platform refused its body)."""

    name = "book"

    def __init__(self, recorder: LedgerRecorder | None) -> None:
        self.recorder = recorder

    async def request(self, ex: Exchange) -> None:
        session, agent = _whose(ex)
        ex.calls = CALL_CONTEXT.set(
            CallContext(ex.tenant.name, session, self.recorder, agent, ex.ticket)
        )

    def end(self, ex: Exchange) -> None:
        if ex.calls is not None:
            CALL_CONTEXT.reset(ex.calls)
            ex.calls = None
        if ex.route != "messages" or ex.sent_at is None:  # count_tokens, or never sent
            return
        ticket = ex.ticket
        if self.recorder is None and ticket is None:
            return
        assert ex.prepared is not None
        session, agent = _whose(ex)
        call = ClientCall(
            self.recorder, ex.tenant.name, session, ex.body, ex.prepared.headers,
            agent=agent, quota=ticket, sent=(ex.sent_at, ex.sent),
        )
        upstream, usage = ex.upstream, ex.usage
        if upstream is None or usage is None:
            error = ex.error
            if ex.ended == "upstream_failed" and isinstance(error, ProxyError):
                call.record(error.status, None, None)  # never reached the provider's answer
            return
        request_id = upstream.headers.get("request-id")
        rounds = ex.rounds
        if rounds is not None and rounds.continuations:
            call.record_rounds(
                upstream.status, rounds.usages(), rounds.continuations, request_id, notes=usage.notes
            )
        else:
            call.record(upstream.status, usage.usage, request_id, notes=usage.notes)


def _whose(ex: Exchange) -> tuple[str | None, str | None]:
    """The session and agent the request's calls are booked to (``None``: none)."""
    conversation = ex.conversation
    if conversation is None:
        return None, None
    return conversation.session, conversation.agent or None
