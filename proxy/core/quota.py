"""Budgets and rate limits per tenant (and per proxy key): the counters, the decision, the headers.

Pure: no I/O, no clock (``now_ms`` is always a value the edge passes in).

A tenant's :class:`Quota` holds an :class:`Allowance` for the tenant as a whole and one that each
of its proxy keys gets on its own (``per_key``; ``auth.mode: keys``), or, for a key listed in
``keys``, that key's own allowance instead. An allowance limits, each optional (0 = no limit):

* ``requests`` per minute, ``input_tokens`` per minute, ``output_tokens`` per minute: fixed windows
  of one UTC minute (``[floor(now / 60 s), +60 s)``);
* ``spend`` (USD, counted in nano-USD integers) per UTC day or UTC calendar month.

Every limit is one counter in the store per (tenant, scope, metric, window start): ``scope`` is
``tenant`` or ``key:<id>``. Before the upstream is called, :func:`admission` lists the increments
to make, all in one atomic statement; the store answers each counter's value after its increment
and :func:`decide` admits or refuses:

* **requests** are reserved by the increment itself: a request is admitted when the value after
  its own increment is at most the limit. Increments are serialised by the store, so no more
  requests than the limit are ever admitted in a window, whatever the number of replicas (a
  refused request's increment is taken back; under contention a request may see another's
  increment that is about to be taken back and be refused a moment early: never late);
* **output tokens** reserve the request's ``max_tokens`` (capped at the limit), as the provider
  does for its own output limit, and are settled with the real figure when the answer ends;
* **input tokens** and **spend** are known only once the provider has answered: a request is
  admitted while the window's count is under the limit, and the real usage is added when each
  upstream call ends (:func:`charge_of`, :func:`settlement`).

The overshoot bound this gives (docs/guides/limits.md): requests never; output tokens
by at most the reservation of the last request admitted under the limit (admission asks "under
the limit before this request", as for tokens and spend) plus what the proxy's own calls
(summaries, retrieval rounds) produced for the requests in flight; input tokens and spend by at most what the requests in flight when the limit was reached
(and the proxy's calls made for them) used.

Settlements go to the windows the request was admitted in, so a request counts in one window
whatever the time its answer ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from proxy.core.ledger import Price, cost_of, row_sums
from proxy.core.provider_usage import Usage

__all__ = [
    "METRICS",
    "MINUTE_MS",
    "NANO_USD",
    "Allowance",
    "Charge",
    "Counter",
    "Decision",
    "Quota",
    "Standing",
    "admission",
    "charge_of",
    "decide",
    "iso_ms",
    "rate_headers",
    "settlement",
    "standings",
    "window_of",
]

Metric = Literal["requests", "input_tokens", "output_tokens", "spend"]
METRICS: tuple[Metric, ...] = ("requests", "input_tokens", "output_tokens", "spend")
Period = Literal["minute", "day", "month"]
MINUTE_MS = 60_000
DAY_MS = 86_400_000
NANO_USD = 1_000_000_000  # spend is counted in nano-USD: integer increments, exact sums
TENANT_SCOPE = "tenant"
HEADER_PREFIX = "x-context-proxy-"


@dataclass(frozen=True, slots=True)
class Allowance:
    """One scope's limits; 0 = no limit."""

    requests_per_minute: int = 0
    input_tokens_per_minute: int = 0
    output_tokens_per_minute: int = 0
    budget_usd: float = 0.0
    budget_period: Literal["day", "month"] = "month"

    @property
    def active(self) -> bool:
        return any(self.limit(m) > 0 for m in METRICS)

    def limit(self, metric: Metric) -> int:
        """The limit in the counter's unit (spend: nano-USD); 0 = none."""
        if metric == "requests":
            return self.requests_per_minute
        if metric == "input_tokens":
            return self.input_tokens_per_minute
        if metric == "output_tokens":
            return self.output_tokens_per_minute
        return round(self.budget_usd * NANO_USD)

    def period(self, metric: Metric) -> Period:
        return self.budget_period if metric == "spend" else "minute"


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's allowances: the tenant's as a whole, and each proxy key's own (``keys``: key id
    -> the allowance of that key, instead of ``per_key``)."""

    tenant: Allowance = Allowance()
    per_key: Allowance = Allowance()
    keys: tuple[tuple[str, Allowance], ...] = ()

    @property
    def active(self) -> bool:
        return self.tenant.active or self.per_key.active or any(a.active for _, a in self.keys)

    def key_allowance(self, key_id: str) -> Allowance:
        """The allowance of the key whose id is ``key_id``."""
        return next((a for k, a in self.keys if k == key_id), self.per_key)

    @property
    def limits_keys(self) -> bool:
        """Whether any key has an allowance of its own (the key's id is then needed)."""
        return self.per_key.active or any(a.active for _, a in self.keys)


def window_of(period: Period, now_ms: int) -> tuple[int, int]:
    """The UTC window ``[start, end)`` (epoch ms) of ``period`` holding ``now_ms``."""
    if period == "minute":
        start = now_ms - now_ms % MINUTE_MS
        return start, start + MINUTE_MS
    if period == "day":
        start = now_ms - now_ms % DAY_MS
        return start, start + DAY_MS
    at = datetime.fromtimestamp(now_ms / 1000, UTC)
    first = datetime(at.year, at.month, 1, tzinfo=UTC)
    following = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return int(first.timestamp() * 1000), int(following.timestamp() * 1000)


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC text (``2026-12-04T10:21:00Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Counter:
    """One limit of one scope in one window, and what admission adds to it."""

    scope: str
    metric: Metric
    period: Period
    start_ms: int
    end_ms: int
    limit: int
    delta: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scope, self.metric, self.start_ms)


def _scopes(quota: Quota, key_id: str | None) -> list[tuple[str, Allowance]]:
    scopes = [(TENANT_SCOPE, quota.tenant)]
    if key_id is not None:
        allowance = quota.key_allowance(key_id)
        if allowance.active:
            scopes.append((f"key:{key_id}", allowance))
    return scopes


def admission(
    quota: Quota, key_id: str | None, now_ms: int, max_tokens: object
) -> tuple[Counter, ...]:
    """The counters a request checks, each with what admission adds (in key order: the store
    locks rows in this order, so concurrent admissions cannot deadlock). ``key_id``: the proxy
    key's id (``auth.mode: keys``), ``None`` otherwise."""
    reserve = (
        max_tokens
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
        else 0
    )
    counters: list[Counter] = []
    for scope, allowance in _scopes(quota, key_id):
        for metric in METRICS:
            limit = allowance.limit(metric)
            if limit <= 0:
                continue
            period = allowance.period(metric)
            start, end = window_of(period, now_ms)
            delta = 1 if metric == "requests" else min(reserve, limit) if metric == "output_tokens" else 0
            counters.append(Counter(scope, metric, period, start, end, limit, delta))
    counters.sort(key=lambda c: c.key)
    return tuple(counters)


@dataclass(frozen=True, slots=True)
class Standing:
    """A counter and its value (after admission's increment)."""

    counter: Counter
    used: int

    @property
    def remaining(self) -> int:
        return max(0, self.counter.limit - self.used)

    @property
    def over(self) -> bool:
        """Whether this counter refuses the request that made ``used``: requests when the
        request's own increment took it past the limit; the others when the window was already
        at the limit before it."""
        c = self.counter
        if c.metric == "requests":
            return self.used > c.limit
        return self.used - c.delta >= c.limit


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    standings: tuple[Standing, ...]
    refused: tuple[Standing, ...] = ()
    retry_after: int = 0  # seconds, on a refusal: until the last refusing window ends

    def message(self, tenant: str) -> str:
        """The 429's message: which limits, never another tenant's or key's figures."""
        parts = [_describe(s) for s in self.refused]
        return (
            f"rate limit exceeded for tenant {tenant}: {'; '.join(parts)}"
            f" (the proxy's own limits); retry after {self.retry_after}s"
        )


_NAMES = {
    "requests": "requests per minute",
    "input_tokens": "input tokens per minute",
    "output_tokens": "output tokens per minute",
}


def _describe(s: Standing) -> str:
    c = s.counter
    who = "per key" if c.scope.startswith("key:") else "tenant"
    if c.metric == "spend":
        return f"{who} budget of {budget_text(c.limit)} USD per {c.period} spent"
    return f"{who} {_NAMES[c.metric]} ({c.limit})"


def standings(counters: Sequence[Counter], values: Mapping[tuple[str, str, int], int]) -> tuple[Standing, ...]:
    """Each counter with its value (0 when the store has none)."""
    return tuple(Standing(c, int(values.get(c.key, 0))) for c in counters)


def decide(counters: Sequence[Counter], values: Mapping[tuple[str, str, int], int], now_ms: int) -> Decision:
    """Admit or refuse, from the values the store answered after admission's increments."""
    found = standings(counters, values)
    refused = tuple(s for s in found if s.over)
    if not refused:
        return Decision(True, found)
    wait = max(s.counter.end_ms for s in refused) - now_ms
    return Decision(False, found, refused, max(1, math.ceil(wait / 1000)))


def rate_headers(found: Iterable[Standing]) -> dict[str, str]:
    """The proxy's own allowance, per metric the tightest scope (least remaining):
    ``x-context-proxy-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}``
    and ``x-context-proxy-budget-{limit,remaining}-usd``, ``x-context-proxy-budget-reset``."""
    tightest: dict[str, Standing] = {}
    for one in found:
        best = tightest.get(one.counter.metric)
        if best is None or one.remaining < best.remaining:
            tightest[one.counter.metric] = one
    headers: dict[str, str] = {}
    for metric in METRICS:
        found_s = tightest.get(metric)
        if found_s is None:
            continue
        s, c = found_s, found_s.counter
        if metric == "spend":
            headers[f"{HEADER_PREFIX}budget-limit-usd"] = _usd(c.limit)
            headers[f"{HEADER_PREFIX}budget-remaining-usd"] = _usd(s.remaining)
            headers[f"{HEADER_PREFIX}budget-reset"] = iso_ms(c.end_ms)
            continue
        name = f"{HEADER_PREFIX}ratelimit-{metric.replace('_', '-')}"
        headers[f"{name}-limit"] = str(c.limit)
        headers[f"{name}-remaining"] = str(s.remaining)
        headers[f"{name}-reset"] = iso_ms(c.end_ms)
    return headers


def budget_text(nano: int) -> str:
    """A budget as configured: cents at least, every digit it was given (0.025 stays 0.025,
    3 reads 3.00); it is counted in nano-USD, so nine decimals at most."""
    whole, _, fraction = f"{nano / NANO_USD:.9f}".rstrip("0").partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def _usd(nano: int) -> str:
    return f"{nano / NANO_USD:.6f}"


@dataclass(frozen=True, slots=True)
class Charge:
    """What one upstream call counts against the limits."""

    input_tokens: int = 0  # uncached input + cache writes (the provider's own input limit: reads excluded)
    output_tokens: int = 0
    spend_nano: int = 0  # priced as the usage ledger prices the call


def charge_of(usage: Usage | None, price: Price | None) -> Charge:
    """An upstream call's billed ``usage`` (``proxy.core.provider_usage.billing``) as counted:
    the cost is the ledger's own (:func:`proxy.core.ledger.cost_of`: cache reads, 5-minute and
    1-hour writes each at their price); a model without a price costs 0."""
    if usage is None:
        return Charge()
    spend = 0
    if price is not None:
        sums = row_sums(
            kind="client", status=200, usage=usage, tokens_before=None, tokens_after=None,
            plan=None, summary=None, compaction_id=None,
        )  # fmt: skip
        spend = round(cost_of(sums, price).total * NANO_USD)
    return Charge(
        (usage.input_tokens or 0) + (usage.cache_creation_input_tokens or 0),
        usage.output_tokens or 0,
        spend,
    )


def settlement(
    counters: Sequence[Counter], charge: Charge, release_output: bool
) -> tuple[Counter, ...]:
    """The increments that count ``charge`` in the windows the request was admitted in
    (``release_output``: this is the client's call, whose output reservation it replaces)."""
    out: list[Counter] = []
    for c in counters:
        if c.metric == "input_tokens":
            delta = charge.input_tokens
        elif c.metric == "output_tokens":
            delta = charge.output_tokens - (c.delta if release_output else 0)
        elif c.metric == "spend":
            delta = charge.spend_nano
        else:
            continue
        if delta:
            out.append(Counter(c.scope, c.metric, c.period, c.start_ms, c.end_ms, c.limit, delta))
    return tuple(out)
