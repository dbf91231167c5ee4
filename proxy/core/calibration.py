"""Calibration: the provider's real input size against our estimates (pure, thread-safe)."""

from __future__ import annotations

import threading


class Calibration:
    """Running real/estimate ratio per model: an exponential moving average (``ALPHA`` = 0.2) of
    clamped samples. The first observation of a model seeds its ratio (the 1.0 default is a prior,
    not a measurement; starting the average at 1.0 would take ~10 requests to learn a steady 1.3).
    Observations with ``estimate <= 0`` or ``real <= 0`` (no usage reported) are ignored."""

    ALPHA = 0.2
    MIN_RATIO = 0.5
    MAX_RATIO = 3.0

    __slots__ = ("_lock", "_ratios")

    def __init__(self) -> None:
        self._ratios: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, model: str, estimate: int, real: int) -> None:
        if estimate <= 0 or real <= 0:
            return
        sample = min(self.MAX_RATIO, max(self.MIN_RATIO, real / estimate))
        with self._lock:
            old = self._ratios.get(model)
            self._ratios[model] = sample if old is None else old + self.ALPHA * (sample - old)

    def seed(self, model: str, ratio: float) -> None:
        """Start from a figure measured elsewhere (another replica, via the store) unless this
        process has observed the model itself."""
        if not ratio > 0:
            return
        with self._lock:
            self._ratios.setdefault(model, min(self.MAX_RATIO, max(self.MIN_RATIO, ratio)))

    def known(self, model: str) -> bool:
        return model in self._ratios

    def ratio(self, model: str) -> float:
        return self._ratios.get(model, 1.0)

    def calibrated(self, model: str, estimate: int) -> int:
        return round(estimate * self.ratio(model))
