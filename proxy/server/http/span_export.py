"""Ended spans to the collector, off the request path: a bounded queue and one exporter thread.

Why not the SDK's ``BatchSpanProcessor``: its drops (queue full) and failed exports are only
visible through the SDK's own metrics pipeline and a log line per span; the proxy counts both in
``/metrics`` (``context_proxy_trace_spans_total{outcome}``) and logs nothing per span. The rules
are the same: ``on_end`` never waits (a full queue drops the span, counted), the thread sends a
batch when ``batch_size`` spans wait or ``flush_seconds`` after the last send, an export that
fails or passes ``tracing.export_timeout`` (the exporter's own deadline, retries included)
drops its batch, counted. A dead or slow collector costs requests nothing.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("context_proxy.tracing")

Count = Callable[[str, int], None]


class BoundedExport(SpanProcessor):
    """Queues ended spans (bounded) for one exporter thread."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        queue_size: int,
        batch_size: int,
        flush_seconds: float,
        grace: float,
        count: Count,
    ) -> None:
        self._exporter = exporter
        self._max = queue_size
        self._batch = batch_size
        self._interval = flush_seconds
        self._count = count
        self._grace = grace
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Condition(self._lock)
        self._asked = 0  # flushes asked for / carried out, under the lock
        self._flushed = 0
        self._stopping = False
        self._failing = False  # the last export failed (logged once per outage)
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._lock:
            if self._stopping or len(self._queue) >= self._max:
                full = True
            else:
                full = False
                self._queue.append(span)
                if len(self._queue) >= self._batch:
                    self._wake.set()
        if full:
            self._count("dropped_queue_full", 1)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            with self._lock:
                asked = self._asked
                stopping = self._stopping
            self._drain()
            with self._lock:
                self._flushed = max(self._flushed, asked)
                self._done.notify_all()
            if stopping:
                return

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
                stopping = self._stopping
            if not batch:
                return
            if not self._send(batch) and stopping:  # shutting down, collector failing: no wait
                with self._lock:
                    rest = len(self._queue)
                    self._queue.clear()
                if rest:
                    self._count("dropped_export_failed", rest)
                return

    def _send(self, batch: Sequence[ReadableSpan]) -> bool:
        try:
            result = self._exporter.export(batch)
        except Exception as exc:  # the exporter's own failure: never the proxy's
            log.warning("[tracing] span export raised %s", type(exc).__name__)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._count("exported", len(batch))
            if self._failing:
                self._failing = False
                log.info("[tracing] spans are exported again")
            return True
        self._count("dropped_export_failed", len(batch))
        if not self._failing:
            self._failing = True
            log.warning("[tracing] span export failed: spans dropped until the collector answers")
        return False

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export what waits now; ``False`` if that took longer than ``timeout_millis``."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            self._asked += 1
            wanted = self._asked
            self._wake.set()
            while self._flushed < wanted:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._done.wait(left)
        return True

    def shutdown(self) -> None:
        """Send what waits, for at most ``grace`` seconds; then the exporter is shut down (its
        retries end) and the thread given ``grace`` more (a daemon: it never holds the exit)."""
        with self._lock:
            self._stopping = True
            self._wake.set()
        self._thread.join(self._grace)
        self._exporter.shutdown()
        self._thread.join(self._grace)
