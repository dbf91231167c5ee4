"""Budgets and rate limits at the edge: admission before the upstream call, settlement after.

:meth:`QuotaKeeper.admit` runs in the messages handler once the request is validated and before
anything is sent upstream (the durable read, compaction and its summary calls come after it): a
tenant without a ``quota`` costs one attribute test; otherwise one store statement increments and
reads every counter of the request (``proxy.store.quota``), and :func:`proxy.core.quota.decide`
admits it (a :class:`Ticket`, whose headers go on the answer) or refuses it
(:class:`proxy.core.errors.RateLimited`: 429, after taking its increments back). A stream already
running is never cut: nothing is checked after the upstream call.

Every upstream call made for an admitted request is charged to its ticket as it is recorded in
the usage ledger (:func:`proxy.server.ledger.record_upstream_call`: the client's call, each
summary attempt, each retrieval round), priced by the ledger's own table; the increments are
written in the background (never on the answer's path), coalesced: while one write is on its way,
the next settlements add up in memory and go in the next statement (one per tenant), so under load
the store sees a write per batch, not per call. The client call's charge replaces its
output reservation; a request that never reached the provider gives the reservation back when the
handler ends (:meth:`Ticket.finish`).

The store failing at admission lets the request through (limits are not enforced while the store
is down; the outage line says so); a failed settlement is lost (an under-count).

The clock is :attr:`QuotaKeeper.clock` (epoch seconds): tests move it to roll a period over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from proxy.core.errors import RateLimited
from proxy.core.ledger import Pricing
from proxy.core.provider_usage import Usage
from proxy.core.quota import Counter, admission, charge_of, decide, rate_headers, settlement
from proxy.server.appkeys import REQUEST_TENANT
from proxy.server.http.metrics import Metrics
from proxy.store.base import Store, StoreError
from proxy.tenancy.tenants import Tenant, key_id

__all__ = ["QUOTA", "QUOTA_TICKET", "QuotaKeeper", "Ticket", "admit"]

log = logging.getLogger("context_proxy.quota")

SWEEP_EVERY_MS = 3_600_000  # windows that ended are deleted about once an hour per replica
# settlements written at most this many counters a statement (6 parameters each: far under
# PostgreSQL's and SQLite's parameter limits)
FLUSH_ROWS = 500


class Ticket:
    """An admitted request: its counters (the windows it counts in) and its answer's headers."""

    __slots__ = ("_keeper", "_released", "counters", "headers", "tenant")

    def __init__(
        self, keeper: QuotaKeeper, tenant: str, counters: tuple[Counter, ...], headers: dict[str, str]
    ) -> None:
        self._keeper = keeper
        self.tenant = tenant
        self.counters = counters
        self.headers = headers
        self._released = False

    def charge(self, kind: str, model: str, usage: Usage | None) -> None:
        """Count one upstream call made for this request (queued; never raises)."""
        release = kind == "client" and not self._released
        self._released = self._released or release
        found = charge_of(usage, self._keeper.prices.price(model))
        self._keeper.add_later(self.tenant, settlement(self.counters, found, release))

    def finish(self) -> None:
        """The handler ended: a request whose client call was never made gives its output
        reservation back."""
        if not self._released:
            self.charge("client", "", None)


class QuotaKeeper:
    """Admission and settlement of the tenants' budgets and rate limits (one per process)."""

    def __init__(
        self,
        store: Store,
        prices: Pricing,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prices = prices
        self.metrics = metrics
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_sweep = 0
        # settlements not written yet: (tenant, scope, metric, window start) -> their sum
        self._pending: dict[tuple[str, str, str, int], Counter] = {}
        self._flusher: asyncio.Task[None] | None = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def admit(
        self, tenant: Tenant, headers: Mapping[str, str], max_tokens: object
    ) -> Ticket | None:
        """The request's ticket, ``None`` when its tenant has no limits (or the store is down);
        :class:`RateLimited` when a limit refuses it."""
        quota = tenant.quota
        if quota is None:
            return None
        key = key_id(headers) if quota.limits_keys else None
        now = self.now_ms()
        counters = admission(quota, key, now, max_tokens)
        adding = asyncio.ensure_future(self.store.quota_add(tenant.name, counters))
        try:
            values = await asyncio.shield(adding)
        except asyncio.CancelledError:  # the client went away: what the store counted goes back
            adding.add_done_callback(lambda done: self._give_back(tenant.name, counters, done))
            raise
        except StoreError as exc:
            self.store.health.lost("budgets and rate limits", exc, "requests admitted unchecked")
            return None
        self._sweep(now)
        decision = decide(counters, values, now)
        if not decision.admitted:
            taken = _negated(counters)
            # before answering (the next request sees it), and whether or not the client waits
            await asyncio.shield(self._add(tenant.name, taken))
            if self.metrics is not None:
                for s in decision.refused:
                    self.metrics.quota_refusals.labels(tenant.name, s.counter.metric).inc()
            raise RateLimited(
                decision.message(tenant.name),
                retry_after_seconds=decision.retry_after,
                retry=all(s.counter.period == "minute" for s in decision.refused),
                headers=rate_headers(decision.standings),
            )
        return Ticket(self, tenant.name, counters, rate_headers(decision.standings))

    # -- background writes ----------------------------------------------------------------------

    def _give_back(
        self, tenant: str, counters: Sequence[Counter], added: asyncio.Future[Any]
    ) -> None:
        """An admission whose request was cancelled while the store counted it: taken back."""
        if not added.cancelled() and added.exception() is None:
            self.add_later(tenant, _negated(counters))

    def add_later(self, tenant: str, counters: Sequence[Counter]) -> None:
        if not counters:
            return
        pending = self._pending
        for c in counters:
            key = (tenant, *c.key)
            before = pending.get(key)
            pending[key] = c if before is None else replace(before, delta=before.delta + c.delta)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            tenants: dict[str, list[Counter]] = {}
            for (tenant, *_key), c in sorted(batch.items()):
                if c.delta:
                    tenants.setdefault(tenant, []).append(c)
            for tenant, counters in tenants.items():
                for at in range(0, len(counters), FLUSH_ROWS):  # within one statement's parameters
                    await self._add(tenant, counters[at : at + FLUSH_ROWS])

    async def _add(self, tenant: str, counters: Sequence[Counter]) -> None:
        try:
            await self.store.quota_add(tenant, counters)
        except StoreError as exc:
            self.store.health.lost("budgets and rate limits", exc, "a settlement was not counted")
        except Exception:  # counting must never break the call it counts
            log.exception("[quota] settlement not counted")

    def _sweep(self, now: int) -> None:
        if now - self._last_sweep < SWEEP_EVERY_MS:
            return
        self._last_sweep = now
        task = asyncio.get_running_loop().create_task(self._delete_ended(now - SWEEP_EVERY_MS))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_ended(self, cutoff_ms: int) -> None:
        with contextlib.suppress(StoreError):
            await self.store.delete_quota_before(cutoff_ms)

    async def drain(self) -> None:
        """Wait for every queued write (bound it with ``asyncio.timeout``)."""
        while self._tasks or (self._flusher is not None and not self._flusher.done()):
            waiting = [*self._tasks, *([self._flusher] if self._flusher is not None else [])]
            await asyncio.gather(*waiting, return_exceptions=True)

    async def close(self, grace_seconds: float = 5.0) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_seconds):
                await self.drain()
        for task in (*self._tasks, *([self._flusher] if self._flusher is not None else [])):
            task.cancel()


QUOTA = web.AppKey("quota", QuotaKeeper)
# The request's ticket (set by the messages handler when its tenant has limits).
QUOTA_TICKET = web.RequestKey("quota_ticket", Ticket)


async def admit(request: web.Request, route: str, body: Mapping[str, object]) -> Mapping[str, str]:
    """The messages handler's admission: the headers of the request's allowance (none when its
    tenant has no limits); :class:`RateLimited` when over. The ticket is kept on the request
    (:data:`QUOTA_TICKET`) for the calls made for it."""
    tenant = request[REQUEST_TENANT]
    if tenant.quota is None or route != "messages":
        return {}
    ticket = await request.app[QUOTA].admit(tenant, request.headers, body.get("max_tokens"))
    if ticket is None:
        return {}
    request[QUOTA_TICKET] = ticket
    return ticket.headers


def _negated(counters: Sequence[Counter]) -> tuple[Counter, ...]:
    return tuple(replace(c, delta=-c.delta) for c in counters if c.delta)
