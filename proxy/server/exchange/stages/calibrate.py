"""Calibration: the provider's real input size against the proxy's estimate of what it sent."""

from __future__ import annotations

from proxy.server.compaction.service import CompactionService
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage


class Calibrate(Stage):
    """Once a complete 200 answer is out: ``CompactionService.observe`` (per tenant and model;
    shared with the other replicas through the store, in the background). Not after hidden
    retrieval rounds (the figure is then the rounds' sum, not the forwarded view's)."""

    name = "calibrate"

    def __init__(self, service: CompactionService) -> None:
        self.service = service

    def end(self, ex: Exchange) -> None:
        outcome, prepared, usage = ex.outcome, ex.prepared, ex.usage
        if (
            ex.ended != "answered"
            or outcome is None
            or not outcome.completed
            or outcome.status != 200
            or prepared is None
            or usage is None
            or ex.hidden_rounds
        ):
            return
        self.service.observe(prepared.calibration_key, prepared.estimate, usage.input_tokens)
