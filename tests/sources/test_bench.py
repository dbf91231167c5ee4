"""Warm-turn latency of a 50-pointer state: timed only with ``--run-slow``.

python -m pytest tests/sources/test_bench.py --run-slow -s
"""

from __future__ import annotations

import statistics
import time

import pytest

from proxy.sources.resolver import SourceResolver
from tests.sources.conftest import Tenant, fifty_pointers

ROUNDS = 300


def _p50_ms(run: object, rounds: int = ROUNDS) -> float:
    assert callable(run)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        run()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e6


@pytest.mark.slow
def test_warm_fifty_pointer_resolve_p50(tenant_a: Tenant) -> None:
    pointers = fifty_pointers(tenant_a)
    policy = tenant_a.policy
    resolver = SourceResolver()

    cold_start = time.perf_counter_ns()
    cold = resolver.resolve_many(pointers, policy)
    cold_ms = (time.perf_counter_ns() - cold_start) / 1e6
    assert all(r.status == "available" for r in cold)

    warm_many = _p50_ms(lambda: resolver.resolve_many(pointers, policy))
    warm_single = _p50_ms(lambda: [resolver.resolve(p, policy) for p in pointers])
    uncached = _p50_ms(lambda: SourceResolver().resolve_many(pointers, policy), rounds=30)
    print(
        f"\n50 pointers (25 transcript events, 25 x 3.6 KB artifacts): cold {cold_ms:.2f} ms, "
        f"uncached p50 {uncached:.2f} ms, warm resolve_many p50 {warm_many:.3f} ms, "
        f"warm 50 x resolve p50 {warm_single:.3f} ms"
    )
    assert resolver.hits >= ROUNDS * 100
    assert warm_many <= 5.0
