"""The L4 call of compaction: each summary made once across replicas, under a store lease.

:class:`Summaries` is the summariser of a ``CompactionService`` (``service``): ``once`` asks the
store for the summary of a request (``summary_key``: the same history in the same conversation
is the same key on every replica); one caller holds the lease and calls, the others wait for its
text. ``summarize`` is the call itself, through ``summary_client.SummaryClient`` with the
request's own credentials: the proxy's summary, or the provider's compaction (``CompactionCall``).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import secrets
import socket
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import orjson

from proxy.config.settings import CompactionConfig
from proxy.core.compaction import SummaryRequest
from proxy.core.compaction.provider import COMPACT_BETA, CompactionCall, block_of_answer
from proxy.core.durable import InvalidWrite
from proxy.server.compaction.summary_client import (
    SummaryClient,
    SummaryFailed,
    summary_auth_headers,
)
from proxy.server.http.metrics import Metrics
from proxy.store import Store, StoreError

log = logging.getLogger("context_proxy.compaction")

# A summary lease given up (the holder's client went away) is renewed to expire this soon.
RELEASE_SECONDS = 0.001


def _all(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of a header (a multidict's repeated lines, or a plain mapping's one)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    value = headers.get(name)
    return [value] if value else []


def summary_key(request: SummaryRequest | CompactionCall, scope: str = "") -> str:
    """The store key of a summary: the same history to summarise (same prompt, model and
    rendered text) in the same conversation (``scope``: the service's ``plan_scope`` less the
    tenant) is the same key on every replica. Each conversation has its own summaries, as it has
    its own plans; the tenant's requests without a session share theirs, as before."""
    body = orjson.dumps(request.body(), option=orjson.OPT_SORT_KEYS)
    if not scope:
        return "s1-" + hashlib.sha256(body).hexdigest()
    return "s2-" + hashlib.sha256(scope.encode() + b"\0" + body).hexdigest()


class Summaries:
    """The summariser: the lease around each L4 call, and the call."""

    def __init__(
        self,
        config: CompactionConfig,
        upstream_base_url: str,
        metrics: Metrics,
        background: Callable[[Coroutine[Any, Any, object]], None],
    ) -> None:
        self.metrics = metrics
        self.calls = 0  # L4 calls this process made
        # summary leases: one holder id per call (two requests of this process may race too)
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._claims = itertools.count(1)
        # store work nobody waits for (a given-up lease's release): the service's, which
        # ``close`` waits for
        self._background = background
        # records each exchange (retries too) in the usage ledger
        self._client = SummaryClient(
            upstream_base_url,
            max_retries=config.summary.max_retries,
            timeout_seconds=config.summary.timeout_seconds,
        )

    async def close(self) -> None:
        await self._client.close()

    async def once(
        self,
        store: Store | None,
        request: SummaryRequest | CompactionCall,
        tenant: str,
        config: CompactionConfig,
        headers: Mapping[str, str],
        scope: str = "",
    ) -> str | None:
        """The summary of ``request``, made once across every replica sharing the store (each
        call of a chain is a request of its own: its key includes the previous call's summary).

        Replicas (or concurrent requests) compacting the same history ask the same summary
        request; the store gives one of them a lease (renewed while it calls) and the others
        wait for its text. A holder that crashed stops renewing and its lease expires after
        ``summary.lease_seconds``; the first waiter then takes over. Without a usable store the
        call is made here (a duplicate call costs money, never correctness)."""
        if store is None:
            return await self.summarize(request, headers)
        key = summary_key(request, scope)
        holder = f"{self._holder}:{next(self._claims)}"
        lease = config.summary.lease_seconds
        loop = asyncio.get_running_loop()
        # a live holder's call lasts at most this long; after it, stop waiting and call
        give_up = loop.time() + lease + config.summary.timeout_seconds * (
            config.summary.max_retries + 1
        )
        pause = 0.05
        try:
            while True:
                claim = await store.claim_summary(tenant, key, holder, lease)
                if claim.state == "ok":
                    self.metrics.summaries.labels("shared").inc()
                    return claim.text
                if claim.state == "failed":
                    self.metrics.summaries.labels("failed").inc()
                    return None
                if claim.state == "acquired":
                    return await self._holding(store, request, headers, tenant, key, holder, lease)
                if loop.time() >= give_up:
                    log.warning("[compact] gave up waiting for another replica's summary")
                    break
                await asyncio.sleep(max(0.01, min(pause, claim.wait_seconds)))
                pause = min(pause * 2, 1.0)
        except (StoreError, InvalidWrite) as exc:
            store.health.lost("summary leases", exc, "summarised without a lease")
        return await self.summarize(request, headers)

    async def _holding(
        self,
        store: Store,
        request: SummaryRequest | CompactionCall,
        headers: Mapping[str, str],
        tenant: str,
        key: str,
        holder: str,
        lease: float,
    ) -> str | None:
        """Call while renewing the lease; then store the outcome for the waiters."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                try:
                    await store.claim_summary(tenant, key, holder, lease)
                except (StoreError, InvalidWrite) as exc:
                    store.health.lost("summary leases", exc, "a lease not renewed")

        renewing = asyncio.create_task(renew())
        try:
            text = await self.summarize(request, headers)
        except asyncio.CancelledError:
            # The client went away: let a waiter take over now rather than when the lease ends
            # (renewing it to expire at once; in the background, as this task is cancelled).
            self._background(store.claim_summary(tenant, key, holder, RELEASE_SECONDS))
            raise
        finally:
            renewing.cancel()
        try:
            await store.settle_summary(tenant, key, holder, text, lease)
        except (StoreError, InvalidWrite) as exc:
            store.health.lost("summaries", exc, "a summary not stored")
        return text

    async def summarize(
        self, request: SummaryRequest | CompactionCall, headers: Mapping[str, str]
    ) -> str | None:
        """The L4 model call. Failure, timeout or an empty answer → ``None`` (keep the view).
        A provider compaction (``CompactionCall``) answers its block's JSON text; ``None``
        there (refused: 400, 529 ``compaction_unavailable``; no block) falls back to the
        proxy's own summary."""
        self.calls += 1
        auth = summary_auth_headers(headers)
        provider = isinstance(request, CompactionCall)
        if provider:  # the request's own betas (its 1M window...), and the compaction's
            betas = [b.strip() for v in _all(headers, "anthropic-beta") for b in v.split(",")]
            auth["anthropic-beta"] = ",".join([*(b for b in betas if b and b != COMPACT_BETA), COMPACT_BETA])
        try:
            message = await self._client.create(request.body(), auth)
        except SummaryFailed as exc:
            what = "provider compaction" if provider else "summary call"
            log.warning("[compact] %s failed: %s", what, exc.reason)
            self.metrics.summaries.labels("failed").inc()
            return None
        if provider:
            block = block_of_answer(message)
            if block is None:
                log.warning("[compact] provider compaction answered no usable block")
            self.metrics.summaries.labels("called" if block else "failed").inc()
            return block
        text = "".join(
            block["text"]
            for block in message["content"]
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )
        self.metrics.summaries.labels("called" if text else "failed").inc()
        return text or None
