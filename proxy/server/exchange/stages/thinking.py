"""Thinking blocks bound to their prefix: a binding model never gets a stale block."""

from __future__ import annotations

from dataclasses import replace

import orjson

from proxy.core.thinking import BINDING_BETA
from proxy.server.compaction.service import CompactionService
from proxy.server.compaction.thinking import THINKING_HEADER, ThinkingGuard, with_beta
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.upstream.platforms import CURRENT


class GuardThinking(Stage):
    """On a model that binds thinking blocks to their prefix: what ``ThinkingGuard`` says to
    forward, given what compaction and durable context decided (``proxy.server.compaction.
    thinking``): as decided, with the provider asked to drop stale blocks (a beta), without them,
    or compaction deferred (``ex.prepared`` replaced); ``x-compaction-thinking`` on the answer.
    Once the answer is over, what its blocks were made under is learnt (not from an answer that
    took hidden retrieval rounds: its later blocks were made under a view the client never
    sends)."""

    name = "thinking"

    def __init__(self, guard: ThinkingGuard, service: CompactionService) -> None:
        self.guard = guard
        self.service = service

    async def request(self, ex: Exchange) -> None:
        if not self.guard.binds(ex.body.get("model")):
            return
        prepared = ex.prepared
        assert prepared is not None and ex.parsed is not None
        decided = ex.body
        forwarded = prepared.forwarded if prepared.forwarded is not None else decided
        digests = prepared.result.digests if prepared.result is not None else None
        own = digests.own if digests is not None and digests.hashed else ()
        platform = CURRENT.get()  # None: the Anthropic API, which takes the binding beta
        can_ask = platform is None or platform.accepts(BINDING_BETA)
        guarded = self.guard.check(ex.parsed.body, forwarded, decided, own, can_ask)
        ex.learn_from = guarded.end
        ex.wants_answer = True
        ex.headers[THINKING_HEADER] = guarded.header
        if guarded.body is None:
            return
        if guarded.deferred:
            if guarded.as_sent:  # the client's request, byte for byte: no durable block either
                ex.headers["x-durable-context"] = "deferred"
                deferred = self.service.deferred(prepared, ex.raw, False)
            else:
                deferred = self.service.deferred(prepared, orjson.dumps(guarded.body), True)
            for name in prepared.headers:  # the compaction report is now the deferral's
                ex.headers.pop(name, None)
            ex.headers.update(deferred.headers)
            ex.prepared = replace(deferred, forwarded=guarded.body)
            return
        if guarded.decision.action == "asked-to-drop":
            with_beta(ex.upstream_headers, BINDING_BETA)
        view = guarded.body if prepared.view is not None else None
        body = orjson.dumps(guarded.body)
        ex.prepared = replace(
            prepared, body=body, changed=True, view=view, forwarded=guarded.body
        )

    def end(self, ex: Exchange) -> None:
        answer = ex.answer
        if (
            ex.learn_from is not None
            and answer is not None
            and answer.stopped
            and not ex.hidden_rounds
        ):
            self.guard.learn(ex.learn_from, ex.message)
