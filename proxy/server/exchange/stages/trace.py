"""The client call's GenAI span: opened as the call is sent, ended with what the answer said."""

from __future__ import annotations

from proxy.core.errors import ProxyError
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.relay.call_span import answered, end_call, start_call


class Trace(Stage):
    """Last in the list, so that its span opens as the call is sent (``proxy.server.relay.
    call_span``); it ends with the answer's id, model, stop reason and usage, the hidden rounds'
    calls each with their own; with the error's status when the call failed, or the error's type
    when the client went away before the provider answered. Without tracing: no-ops."""

    name = "trace"

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url  # where an Anthropic API call goes (a platform names its own)

    async def request(self, ex: Exchange) -> None:
        prepared = ex.prepared
        forwarded = prepared.forwarded if prepared is not None else None
        ex.call_span = start_call(
            forwarded if forwarded is not None else ex.body, ex.route, server_url=self.server_url
        )

    def end(self, ex: Exchange) -> None:
        span, upstream, usage = ex.call_span, ex.upstream, ex.usage
        if upstream is not None and usage is not None:
            answered(span, upstream.status, usage, ex.rounds)
            return
        error = ex.error
        if isinstance(error, ProxyError):  # the call failed before an answer: its status
            end_call(span, error.status, None)
            return
        span.fail(type(error).__name__)  # cancelled (the client went away), or a bug
        span.end()
