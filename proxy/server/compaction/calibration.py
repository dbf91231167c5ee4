"""Calibration shared between replicas: each tenant and model's real/estimate token ratio
(:class:`proxy.core.calibration.Calibration`, pure) read from the store the first time this
process sees the pair, and written back there (in the background, at most once per
:data:`WRITE_SECONDS` per pair) as the provider's usage refines it.

Both caches are bounded (``limits.calibration_keys``): a pair pushed out forgets its ratio too,
and the next request with it reads the store again (the default ratio when the store has none).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from proxy.core.bounded import Bounded, CacheView
from proxy.core.durable import InvalidWrite
from proxy.core.tokens import Calibration
from proxy.server.http.metrics import Metrics
from proxy.store import Store, StoreError

log = logging.getLogger("context_proxy.compaction")

# Calibration figures go to the store at most this often per tenant and model.
WRITE_SECONDS = 5.0
# Memory per looked-up pair (measured: tests/test_bounded_caches.py).
KEY_BYTES = 450

Background = Callable[[Coroutine[Any, Any, object]], None]


class CalibrationKey:
    """A tenant and model whose calibration this process looked up (the store asked once) and
    when it last wrote the figure there."""

    __slots__ = ("model", "tenant", "written")

    def __init__(self, tenant: str, model: str) -> None:
        self.tenant = tenant
        self.model = model
        self.written = -WRITE_SECONDS


class SharedCalibration:
    """The ratios, and the pairs looked up in the store (``background`` runs the writes that
    nobody waits for)."""

    def __init__(self, max_keys: int, metrics: Metrics, background: Background) -> None:
        self.ratios = Calibration(max_keys)
        self.metrics = metrics
        self._background = background
        # the keys ("tenant/model") this process has looked up, their tenant and model, and when
        # their figure was last written; one pushed out forgets its ratio too
        self.keys: Bounded[str, CalibrationKey] = Bounded(
            "calibration_keys",
            max_keys,
            entry_bytes=KEY_BYTES,
            on_evict=lambda key, _seen: self.ratios.forget(key),
        )

    def caches(self) -> tuple[CacheView, ...]:
        return (self.ratios.cache, self.keys)

    async def ratio(self, store: Store | None, tenant: str, model: str, key: str) -> float:
        """The calibration ratio for ``key``; the first time this process sees the key, the
        figure other replicas measured (the store) is the starting point."""
        if store is not None and self.keys.get(key) is None:
            self.keys.put(key, CalibrationKey(tenant, model))
            if not self.ratios.known(key):
                try:
                    stored = await store.get_calibration(tenant, model)
                except (StoreError, InvalidWrite) as exc:
                    store.health.lost("calibration", exc, "starts from the default ratio")
                    stored = None
                if stored is not None:
                    self.ratios.seed(key, stored)
        return self.ratios.ratio(key)

    def observe(self, store: Store | None, key: str, estimate: int | None, real: int | None) -> None:
        """Calibrate: the provider's real input size against our estimate of what we sent.

        The figure goes to the store (in the background, at most once per :data:`WRITE_SECONDS`
        per tenant and model) for the other replicas."""
        if not (estimate and real):
            return
        used = self.ratios.observe(key, estimate, real)
        if used is None:
            return
        self.metrics.calibration_samples.labels("used" if used else "discarded").inc()
        if not used:
            log.warning(
                "[calibrate] implausible provider usage discarded: real %d vs estimate %d",
                real, estimate,
            )
            return
        seen = self.keys.peek(key)
        if store is None or seen is None:
            return
        now = asyncio.get_running_loop().time()
        if now - seen.written < WRITE_SECONDS:
            return
        seen.written = now
        self._background(self._write(store, seen.tenant, seen.model, key))

    async def _write(self, store: Store, tenant: str, model: str, key: str) -> None:
        try:
            await store.put_calibration(tenant, model, self.ratios.ratio(key))
        except (StoreError, InvalidWrite) as exc:
            store.health.lost("calibration", exc, "a figure not shared")
