"""The hidden rounds of one answer: the upstream calls the retrieval loop made after the client's.

A request whose view offers ``context_proxy_retrieve`` may take hidden rounds: the proxy answers
the model's calls and calls the provider again (``proxy.server.context.retrieval``). What those
calls were is kept here, in one value the loop fills and the others read once the answer is over:
the usage ledger (one row per call: ``proxy.server.ledger.ClientCall.record_rounds``), the traces
(one span per call: ``proxy.server.relay.call_span.answered``) and the transcript (each round's
calls, with the recorded answer). It names no type above it, so none of its readers depends on
the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.server.http import spans


@dataclass(slots=True)
class Continuation:
    """One hidden round's upstream call, for the usage ledger: its status (0 until it answered;
    502/504 when it could not be had), when it was sent and when its round ended."""

    sent_at: float  # time.time(), the ledger's row time
    sent: float  # time.perf_counter()
    ended: float | None = None
    status: int = 0
    span: spans.Span = spans.NO_SPAN  # its GenAI call span (ended by call_span.answered)

    @property
    def latency_ms(self) -> float:
        return ((self.ended or time.perf_counter()) - self.sent) * 1000


def _no_usages() -> list[dict[str, Any]]:
    return []


class HiddenRounds:
    """What the hidden rounds of one answer were (none until the model calls our tool)."""

    __slots__ = ("_usages", "continuations", "records", "starts")

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []  # one per hidden round: its calls and statuses
        # the hidden rounds' upstream calls (round 0, the client's own call, is not one)
        self.continuations: list[Continuation] = []
        self.starts: list[float] = []  # when each hidden round began (perf_counter)
        # every round's own usage, round 0 first (set by the relay that reads the rounds)
        self._usages: Callable[[], list[dict[str, Any]]] = _no_usages

    @property
    def count(self) -> int:
        return len(self.records)

    def read_usages(self, usages: Callable[[], list[dict[str, Any]]]) -> None:
        """Where each round's usage will be found once the answer is over."""
        self._usages = usages

    def usages(self) -> list[dict[str, Any]]:
        """Each round's own usage as the provider reported it (message_start's merged with the
        round's last message_delta), round 0 being the client's call; ``{}`` for a round that
        reported none. The last call's round ends here if nothing ended it before."""
        if self.continuations and self.continuations[-1].ended is None:
            self.continuations[-1].ended = time.perf_counter()
        return self._usages()

    def annotate(self, message: dict[str, Any] | None) -> dict[str, Any] | None:
        """The recorded answer, with the hidden rounds it took."""
        if message is None or not self.records:
            return message
        return {**message, "context_proxy_retrievals": self.records}
