"""The request path: THE list of stages, and the runner that takes an exchange through it.

Read ``messages_chain`` top to bottom: it is what the proxy does to a Messages request, in
order. ``Chain.run`` calls each stage's ``request`` hook in that order, forwards, calls the
``response`` hooks, relays the answer (feeding the exchange's readers as it goes), and ends with
the ``end`` hooks, in reverse order, whatever happened. Design: docs/ARCHITECTURE.md, "The
request path: a chain of stages".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from proxy.core.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.appkeys import COMPACTION, DURABLE, FORWARDER, THINKING
from proxy.server.compaction.thinking import with_beta
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage, defines
from proxy.server.exchange.stages.admit import Admit
from proxy.server.exchange.stages.book import Book
from proxy.server.exchange.stages.calibrate import Calibrate
from proxy.server.exchange.stages.compact import Compact
from proxy.server.exchange.stages.durable import InjectDurable
from proxy.server.exchange.stages.identify import Identify
from proxy.server.exchange.stages.record import Record
from proxy.server.exchange.stages.remember import Remember
from proxy.server.exchange.stages.retrieve import Retrieve
from proxy.server.exchange.stages.thinking import GuardThinking
from proxy.server.exchange.stages.trace import Trace
from proxy.server.exchange.stages.validate import BODIES, Validate
from proxy.server.ledger import LEDGER, now_ms
from proxy.server.relay.accumulate import AnswerAccumulator
from proxy.server.relay.forward import Forwarder
from proxy.server.relay.usage import UsageTap

log = logging.getLogger("context_proxy.chain")


def messages_chain(app: web.Application) -> Chain:
    """What the proxy does to a Messages request, in order (built once, when the app's upstream
    session and store are open). A new feature: one module in ``stages/``, one line here, after
    the stages whose fields it reads and before those that read its own."""
    service, durable, forwarder = app[COMPACTION], app[DURABLE], app[FORWARDER]
    return Chain(
        (
            Identify(),  # whose conversation: session and agent (400 if malformed)
            Validate(app[BODIES]),  # parsed (a re-sent history through the memo), checked (400)
            Admit(),  # budgets and rate limits: 429 before anything goes upstream
            Book(app.get(LEDGER)),  # every upstream call made for it: a ledger row of its tenant
            InjectDurable(durable),  # the session's durable context appended to system
            Record(durable),  # its new messages into the transcript; the answer at the end
            Compact(service, durable),  # the view to forward; the cut results kept
            GuardThinking(app[THINKING], service),  # no stale thinking block to a binding model
            Retrieve(forwarder, durable),  # the model reads back what was cut
            Calibrate(service),  # the provider's real input size against our estimate
            Remember(),  # the memo learns this body, for the conversation's next turn
            Trace(forwarder.base_url),  # the client call's span (last: it opens as the call is sent)
        ),
        forwarder,
    )


Hook = Callable[[Exchange], Awaitable[None]]
EndHook = Callable[[Exchange], None]


class _Route:
    """The stages one route takes, and their hooks, looked up once."""

    __slots__ = ("ends", "requests", "responses", "stages")

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        # position i: stage i's hook, or None (not called); ``end`` of stage i runs once it joined
        self.requests: tuple[Hook | None, ...] = tuple(
            s.request if defines(s, "request") else None for s in self.stages
        )
        # reversed: the way out (called once every stage joined, i.e. when the call is made)
        self.responses: tuple[Hook, ...] = tuple(
            s.response for s in reversed(self.stages) if defines(s, "response")
        )
        self.ends: tuple[EndHook | None, ...] = tuple(
            s.end if defines(s, "end") else None for s in self.stages
        )


class Chain:
    """The stages of the request path and the forward step between their hooks."""

    def __init__(self, stages: Sequence[Stage], forwarder: Forwarder) -> None:
        self.stages = tuple(stages)
        self.forwarder = forwarder
        self._routes = {
            "messages": _Route(self.stages),
            "count_tokens": _Route([s for s in self.stages if s.count_tokens]),
        }

    async def run(self, ex: Exchange) -> web.StreamResponse:
        """Take ``ex`` through the stages; the client's response (written by the relay)."""
        route = self._routes[ex.route]
        joined = 0  # the stages whose ``request`` returned: theirs are the ``end`` hooks to run
        try:
            for hook in route.requests:
                if hook is not None:
                    await hook(ex)
                joined += 1
            response = await self._forward(ex, route.responses)
            ex.ended = "answered"
            return response
        except asyncio.CancelledError as exc:
            ex.ended, ex.error = "client_gone", exc
            raise
        except ProxyError as exc:
            if ex.ended is None:
                ex.ended = "refused"
            ex.error = exc
            raise
        except BaseException as exc:
            ex.ended, ex.error = "failed", exc
            raise
        finally:
            ends = route.ends
            for i in range(joined - 1, -1, -1):
                end = ends[i]
                if end is not None:
                    try:
                        end(ex)
                    except Exception:  # recording what happened must never change what happened
                        log.exception("[chain] %s: end failed", route.stages[i].name)

    async def _forward(self, ex: Exchange, responses: Sequence[Hook]) -> web.StreamResponse:
        """Send the request upstream, let the stages see the answer's status, relay the answer."""
        prepared = ex.prepared
        assert prepared is not None
        headers = ex.upstream_headers
        for beta in prepared.betas:  # what the view itself needs (the provider's compaction block)
            with_beta(headers, beta)
        if prepared.changed:
            headers.popall("Content-Encoding", None)  # a re-serialised body is sent as identity
        value = prepared.forwarded if prepared.forwarded is not None else ex.body
        before_upstream = time.perf_counter() - ex.started
        ex.sent_at, ex.sent = now_ms(), time.perf_counter()
        try:
            upstream = await self.forwarder.open(
                ex.request, route=ex.route, data=prepared.body, decode=True, headers=headers,
                body=value,
            )
        except ProxyError as exc:  # the outcome of the stages is known, and reported
            if isinstance(exc, UpstreamUnavailable | UpstreamTimeout):
                ex.ended = "upstream_failed"
            ex.error = exc
            await _each(responses, ex)
            exc.headers = {**ex.headers, **exc.headers}
            raise
        ex.upstream = upstream
        async with upstream:
            await _each(responses, ex)
            sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            ex.usage = usage = UsageTap(sse=sse)
            if ex.wants_answer and upstream.status == 200:
                ex.answer = AnswerAccumulator(sse=sse)
            try:
                if ex.relay is not None:
                    ex.response, ex.outcome = await ex.relay(
                        upstream, ex.headers, before_upstream, ex.feed
                    )
                else:
                    ex.response, ex.outcome = await self.forwarder.relay(
                        ex.request,
                        upstream,
                        decoded=True,
                        extra_headers=ex.headers,
                        on_prepared=before_upstream,
                        route=ex.route,
                        tap=ex.feed,
                    )
            except ProxyError as exc:  # failed before the answer began: still reported in full
                ex.ended = "upstream_failed"
                exc.headers = {**ex.headers, **exc.headers}
                raise
            finally:
                if ex.answer is not None:
                    ex.message = ex.answer.message()
                if upstream.status == 200:
                    usage.close()
        return ex.response


async def _each(hooks: Sequence[Hook], ex: Exchange) -> None:
    for hook in hooks:
        await hook(ex)


# The chain an app serves Messages requests with (set with the upstream session).
CHAIN = web.AppKey("chain", Chain)
