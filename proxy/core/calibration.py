"""Calibration: the provider's real input size against our estimates (pure, thread-safe)."""

from __future__ import annotations

import threading

from proxy.core.bounded import Bounded

# Memory one model's ratio takes (measured: tests/test_bounded_caches.py): its key ("tenant/model")
# and a float in an LRU.
RATIO_BYTES = 270


class Calibration:
    """Running real/estimate ratio per model: an exponential moving average (``ALPHA`` = 0.2) of
    clamped samples. The first observation of a model seeds its ratio (the 1.0 default is a prior,
    not a measurement; starting the average at 1.0 would take ~10 requests to learn a steady 1.3).
    Observations with ``estimate <= 0`` or ``real <= 0`` (no usage reported) are ignored.

    Implausible samples are discarded, not clamped: the estimate counts with cl100k (within ~30%
    of Claude's tokenizer on text) and prices images and documents by the provider's formulas, so
    a provider figure more than ``PLAUSIBLE`` (4) times above or below it is not about the text we
    counted (a usage figure of another request, a truncating hop in between, a provider bug).
    Clamped into [0.5, 3], one such figure would still move the average by a fifth of the way to
    the clamp (a first one would *be* the ratio: every estimate halved)."""

    ALPHA = 0.2
    MIN_RATIO = 0.5
    MAX_RATIO = 3.0
    # real/estimate outside [1/PLAUSIBLE, PLAUSIBLE]: the sample is discarded
    PLAUSIBLE = 4.0

    __slots__ = ("_lock", "_ratios")

    def __init__(self, max_models: int = 1024) -> None:
        # bounded (``calibration`` in the metrics): a model pushed out starts again from the
        # default ratio (or the store's figure, which the edge reads for a key it does not know)
        self._ratios: Bounded[str, float] = Bounded("calibration", max_models, entry_bytes=RATIO_BYTES)
        self._lock = threading.Lock()

    @property
    def cache(self) -> Bounded[str, float]:
        return self._ratios

    def observe(self, model: str, estimate: int, real: int) -> bool | None:
        """Learn from one request: True when the sample was used, False when it was discarded
        as implausible, None when there was nothing to learn from (no usage, no estimate)."""
        if estimate <= 0 or real <= 0:
            return None
        raw = real / estimate
        if not 1 / self.PLAUSIBLE <= raw <= self.PLAUSIBLE:
            return False
        sample = min(self.MAX_RATIO, max(self.MIN_RATIO, raw))
        with self._lock:
            old = self._ratios.get(model)
            self._ratios.put(model, sample if old is None else old + self.ALPHA * (sample - old))
        return True

    def seed(self, model: str, ratio: float) -> None:
        """Start from a figure measured elsewhere (another replica, via the store) unless this
        process has observed the model itself."""
        if not ratio > 0:
            return
        with self._lock:
            if model not in self._ratios:
                self._ratios.put(model, min(self.MAX_RATIO, max(self.MIN_RATIO, ratio)))

    def known(self, model: str) -> bool:
        return model in self._ratios

    def forget(self, model: str) -> None:
        with self._lock:
            self._ratios.pop(model)

    def ratio(self, model: str) -> float:
        with self._lock:
            found = self._ratios.get(model)
        return 1.0 if found is None else found

    def calibrated(self, model: str, estimate: int) -> int:
        return round(estimate * self.ratio(model))
