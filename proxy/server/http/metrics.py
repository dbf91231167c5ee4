"""Prometheus metrics, on a registry owned by one app (tests run many apps in one process).

Labels never carry request content, paths of passthrough calls or credentials: ``route`` is one of
a fixed set (messages, count_tokens, passthrough, health, admin, other). Never a series per
session, conversation or key: the only open-ended labels are tenants (bounded by the policies),
models (at most 50, then ``other``) and caches (the fixed set the app watches). Tenant names are
labels, so ``/metrics`` is for the operator's scraper, not the public (``listen.admin_port``
serves it apart from the client port).

The bounded caches (``proxy.core.bounded``) are read when scraped, not on the request path:
``context_proxy_cache_entries``, ``_max_entries``, ``_weight_bytes`` / ``_max_weight_bytes`` (the
caches bounded by the bytes of text they hold), ``_bound_bytes`` (the documented memory at the
bound), ``_evictions_total`` and ``_expired_total`` (forgotten when idle), each by ``cache``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.core.bounded import CacheView

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)
_ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5)
_BYTES_BUCKETS = (1e3, 1e4, 1e5, 5e5, 1e6, 4e6, 16e6, 32e6)

CONTENT_TYPE = CONTENT_TYPE_LATEST

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    upstream_latency: Histogram
    added_latency: Histogram
    request_bytes: Histogram
    active_streams: Gauge
    upstream_errors: Counter
    compactions: Counter
    summaries: Counter
    calibration_samples: Counter
    open_connections: Gauge
    connections_closed: Counter
    usage_tokens: Counter
    tokens_saved: Counter
    ledger_rows: Counter
    quota_refusals: Counter
    trace_spans: Counter
    # the bounded caches exposed (``watch``), read at each scrape
    cache_metrics: CacheMetrics
    # (metric, label values) -> its labelled child (see ``child``)
    _children: dict[tuple[int, tuple[str, ...]], Any] = field(
        default_factory=dict, repr=False, compare=False
    )

    def watch(self, *caches: CacheView) -> None:
        """Expose these caches' sizes, bounds and evictions (each name once)."""
        watched = self.cache_metrics.caches
        names = {c.name for c in watched}
        for cache in caches:
            if cache.name in names:
                raise ValueError(f"a cache named {cache.name!r} is already watched")
            names.add(cache.name)
            watched.append(cache)

    def child(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, looked up once per label values: a labelled child stays
        the same object for the metric's life (the proxy never removes one), and ``labels``
        validates and locks on every call. For the per-request metrics; their label values
        are a small fixed set (routes, statuses, outcomes; tenants and at most 51 models)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = cast(Any, metric).labels(*values)
        return cast(M, found)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class CacheMetrics:
    """The watched caches' figures, read when the registry is scraped (a collector)."""

    def __init__(self) -> None:
        self.caches: list[CacheView] = []

    def _families(
        self,
    ) -> tuple[
        GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily,
    ]:
        return (
            GaugeMetricFamily("context_proxy_cache_entries", "Entries a bounded cache holds now.",
                              labels=["cache"]),
            GaugeMetricFamily("context_proxy_cache_max_entries", "The bound on a cache's entries.",
                              labels=["cache"]),
            GaugeMetricFamily("context_proxy_cache_weight_bytes",
                              "Bytes of text a cache bounded by bytes holds now.", labels=["cache"]),
            GaugeMetricFamily("context_proxy_cache_max_weight_bytes",
                              "The bound on the bytes of text a cache holds.", labels=["cache"]),
            GaugeMetricFamily("context_proxy_cache_bound_bytes",
                              "The memory a cache takes at its bounds (the documented estimate).",
                              labels=["cache"]),
            CounterMetricFamily("context_proxy_cache_evictions",
                                "Entries a cache dropped to stay within its bounds.", labels=["cache"]),
            CounterMetricFamily("context_proxy_cache_expired",
                                "Entries a cache forgot because their conversation went idle"
                                " (limits.cache_idle_seconds).", labels=["cache"]),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        entries, max_entries, weight, max_weight, bound, evictions, expired = families
        for cache in self.caches:
            label = [cache.name]
            entries.add_metric(label, len(cache))
            max_entries.add_metric(label, cache.max_entries)
            if cache.max_weight is not None:
                weight.add_metric(label, cache.weight)
                max_weight.add_metric(label, cache.max_weight)
            bound.add_metric(label, cache.bound_bytes)
            evictions.add_metric(label, cache.evictions)
            expired.add_metric(label, cache.expired)
        return iter(families)


def new_metrics() -> Metrics:
    registry = CollectorRegistry(auto_describe=True)
    cache_metrics = CacheMetrics()
    registry.register(cache_metrics)
    return Metrics(
        cache_metrics=cache_metrics,
        registry=registry,
        requests=Counter(
            "context_proxy_requests",
            "Requests answered, by route and HTTP status.",
            ["route", "status"],
            registry=registry,
        ),
        upstream_latency=Histogram(
            "context_proxy_upstream_latency_seconds",
            "Time from sending the request upstream to receiving its response headers.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ),
        added_latency=Histogram(
            "context_proxy_added_latency_seconds",
            "Time the proxy itself adds: before forwarding, plus from upstream headers to client headers.",
            ["route"],
            buckets=_ADDED_BUCKETS,
            registry=registry,
        ),
        request_bytes=Histogram(
            "context_proxy_request_bytes",
            "Size of request bodies received from clients.",
            ["route"],
            buckets=_BYTES_BUCKETS,
            registry=registry,
        ),
        active_streams=Gauge(
            "context_proxy_active_streams",
            "Responses currently being relayed to clients.",
            registry=registry,
        ),
        upstream_errors=Counter(
            "context_proxy_upstream_errors",
            "Upstream failures by kind: refused, timeout, reset, midstream.",
            ["kind"],
            registry=registry,
        ),
        summaries=Counter(
            "context_proxy_summaries",
            "L4 summaries by source: called (this process made the model call), shared (another"
            " caller's, from the store), failed (a call or a shared call that failed).",
            ["source"],
            registry=registry,
        ),
        compactions=Counter(
            "context_proxy_compactions",
            "Compaction outcomes on /v1/messages, by plan status (new, reused, none, deferred, off).",
            ["plan"],
            registry=registry,
        ),
        calibration_samples=Counter(
            "context_proxy_calibration_samples",
            "Provider usage figures offered to calibration: used, or discarded (real/estimate"
            " outside [1/4, 4]: implausible, not learnt from).",
            ["outcome"],
            registry=registry,
        ),
        open_connections=Gauge(
            "context_proxy_open_connections",
            "Client connections open now.",
            registry=registry,
        ),
        connections_closed=Counter(
            "context_proxy_connections_closed",
            "Client connections the proxy closed, by reason: header_timeout, body_timeout, limit"
            " (limits.max_connections), bad_request (malformed HTTP).",
            ["reason"],
            registry=registry,
        ),
        usage_tokens=Counter(
            "context_proxy_usage_tokens",
            "Tokens the provider reported for upstream calls, by tenant, model and type (input,"
            " cache_read, cache_creation, output). Models beyond the first 50 seen, or with odd"
            " names, are counted as model=\"other\".",
            ["tenant", "model", "type"],
            registry=registry,
        ),
        tokens_saved=Counter(
            "context_proxy_tokens_saved",
            "Tokens compaction removed from client requests before they were forwarded, by tenant"
            " (the proxy's count: x-compaction-tokens-before minus x-compaction-tokens-after)."
            " Dollars saved: the admin API's /admin/v1/usage/summary (savings_usd).",
            ["tenant"],
            registry=registry,
        ),
        ledger_rows=Counter(
            "context_proxy_ledger_rows",
            "Usage ledger rows by outcome: queued, written, dropped (queue full or store failing).",
            ["outcome"],
            registry=registry,
        ),
        quota_refusals=Counter(
            "context_proxy_quota_refusals",
            "Requests refused with 429 by a budget or rate limit of the tenant's policy, by tenant"
            " and limit (requests, input_tokens, output_tokens, spend; several when several refused).",
            ["tenant", "limit"],
            registry=registry,
        ),
        trace_spans=Counter(
            "context_proxy_trace_spans",
            "Trace spans by outcome (tracing on): exported, dropped_queue_full (the export queue"
            " was full), dropped_export_failed (the collector failed or timed out).",
            ["outcome"],
            registry=registry,
        ),
    )
