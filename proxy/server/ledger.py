"""Recording the usage ledger: one row per upstream call, written off the answer path.

The edge calls :meth:`LedgerRecorder.record` (never awaited: it only queues) when an upstream
call ends, whatever its outcome: client calls (``/v1/messages``) from the handler, summary calls
from :mod:`proxy.server.compaction.summary_client` (every attempt, retries too), and retrieval
continuations through :func:`record_upstream_call`. A background task writes the queue to the store in
batches (``ledger.batch_size`` rows, or ``ledger.flush_seconds`` after the first one). A slow or
failing store never delays an answer: when the queue is full, new rows are dropped and counted
(``context_proxy_ledger_rows{outcome="dropped"}``); a failed batch is retried twice, then
dropped and counted. The Prometheus token counters (the provider's usage by tenant, model and
type; the tokens compaction saved by tenant) are updated at record time.

Which tenant and session a summary call belongs to is taken from :data:`CALL_CONTEXT`, set by the
messages handler around compaction (the summariser runs in that request's task).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

from proxy.config.models import catalogue_of
from proxy.config.settings import Config
from proxy.core.catalogue import Catalogue
from proxy.core.durable import InvalidWrite
from proxy.core.ledger import Kind, LedgerEntry, ProviderNotes, Usage, billing
from proxy.server.http.metrics import Metrics
from proxy.store.base import Store, StoreError
from proxy.store.usage import check_entry

__all__ = [
    "CALL_CONTEXT",
    "LEDGER",
    "CallContext",
    "ClientCall",
    "LedgerRecorder",
    "calls_for",
    "now_ms",
    "record_upstream_call",
]

log = logging.getLogger("context_proxy.ledger")

MAX_METRIC_MODELS = 50
MAX_MODEL_CHARS = 200
_MODEL_LABEL = re.compile(r"[A-Za-z0-9._:@/\-]{1,100}")
RETRIES = 2
_TOKEN_TYPES = (
    ("input", "input_tokens"),
    ("cache_read", "cache_read_input_tokens"),
    ("cache_creation", "cache_creation_input_tokens"),
    ("output", "output_tokens"),
)


def now_ms() -> tuple[str, int]:
    """The current instant as ISO 8601 UTC text and epoch milliseconds."""
    now = datetime.now(UTC)
    return now.isoformat(timespec="milliseconds"), int(now.timestamp() * 1000)


class Charged(Protocol):
    """Where an upstream call's usage is also counted: the budgets and rate limits of the
    request it serves (:class:`proxy.server.quota.Ticket`)."""

    def charge(self, kind: str, model: str, usage: Usage | None) -> None: ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """Whose request the current task serves (for the calls the proxy makes on its behalf)."""

    tenant: str
    session: str | None
    recorder: LedgerRecorder | None
    agent: str | None = None
    quota: Charged | None = None


CALL_CONTEXT: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "context_proxy_call", default=None
)


@contextlib.contextmanager
def calls_for(
    tenant: str,
    session: str | None,
    recorder: LedgerRecorder | None,
    agent: str | None = None,
    quota: Charged | None = None,
) -> Iterator[None]:
    """Within: the upstream calls the proxy makes (summaries) are the tenant's and session's (and
    the agent's, when known), and count to the request's budgets and rate limits (``quota``)."""
    token = CALL_CONTEXT.set(CallContext(tenant, session, recorder, agent, quota))
    try:
        yield
    finally:
        CALL_CONTEXT.reset(token)


class LedgerRecorder:
    """Queues ledger rows and writes them to the store in the background."""

    def __init__(
        self, store: Store, metrics: Metrics, config: Config, catalogue: Catalogue | None = None
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.config = config.ledger
        self.prices = catalogue or catalogue_of(config)  # the models' prices
        self._queue: asyncio.Queue[LedgerEntry] = asyncio.Queue(self.config.queue_size)
        self._models: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # set when a batch is full or a flush is asked for: the writer stops waiting for more
        self._full = asyncio.Event()

    # -- recording (sync, never blocks) -----------------------------------------------------

    def record(self, entry: LedgerEntry) -> None:
        if not self.config.enabled:
            return
        problems = check_entry(entry)
        if problems:  # the edge builds entries: a bug, never the client's doing
            log.warning("[ledger] row not recorded: %s", ", ".join(p.field for p in problems))
            self.metrics.ledger_rows.labels("dropped").inc()
            return
        self._count_tokens(entry)
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self.metrics.ledger_rows.labels("dropped").inc()
            return
        self._idle.clear()
        if self._queue.qsize() >= self.config.batch_size - 1:
            self._full.set()
        self.metrics.child(self.metrics.ledger_rows, "queued").inc()

    def _count_tokens(self, entry: LedgerEntry) -> None:
        before, after = entry.tokens_before, entry.tokens_after
        if before is not None and after is not None and before > after:
            self.metrics.child(self.metrics.tokens_saved, entry.tenant).inc(before - after)
        usage = entry.usage
        if usage is None:
            return
        model = entry.model
        if model not in self._models:
            if len(self._models) < MAX_METRIC_MODELS and _MODEL_LABEL.fullmatch(model):
                self._models.add(model)
            else:
                model = "other"
        for label, name in _TOKEN_TYPES:
            value = getattr(usage, name)
            if value:
                self.metrics.child(self.metrics.usage_tokens, entry.tenant, model, label).inc(value)

    # -- the writer ---------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._write_loop())

    async def _next_batch(self) -> list[LedgerEntry]:
        """The rows queued within ``flush_seconds`` of the first one (at most ``batch_size``):
        one wait per batch, not one wake-up per row."""
        batch = [await self._queue.get()]
        if self._queue.qsize() + 1 < self.config.batch_size and not self._full.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.flush_seconds):
                    await self._full.wait()
        self._full.clear()
        while len(batch) < self.config.batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    async def _write_loop(self) -> None:
        while True:
            batch = await self._next_batch()
            await self._write(batch)
            for _ in range(len(batch)):
                self._queue.task_done()
            # not kept while waiting for the next row: after a burst, the last batch's rows
            # (up to batch_size, allocated all through it) would pin the memory it used
            del batch
            if self._queue.empty():
                self._idle.set()

    async def _write(self, batch: list[LedgerEntry]) -> None:
        for attempt in range(RETRIES + 1):
            try:
                await self.store.record_usage(batch)
            except (StoreError, InvalidWrite) as exc:
                if attempt < RETRIES and isinstance(exc, StoreError):
                    await asyncio.sleep(0.2 * 4**attempt)
                    continue
                # the rows dropped are counted: context_proxy_ledger_rows_total{outcome="dropped"}
                self.store.health.lost("the usage ledger", exc, "rows dropped, counted in metrics")
                self.metrics.ledger_rows.labels("dropped").inc(len(batch))
                return
            self.metrics.ledger_rows.labels("written").inc(len(batch))
            return

    async def flush(self) -> None:
        """Wait until every queued row was written (or dropped). Bound it with
        ``asyncio.timeout``."""
        if not self._idle.is_set():
            self._full.set()  # write what is queued now, without waiting for more
        await self._idle.wait()

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Write what is queued (for at most ``grace_seconds``), then stop."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_seconds):
                    await self.flush()
        for task in (self._task,):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


LEDGER = web.AppKey("ledger", LedgerRecorder)


def _model_text(model: str) -> str:
    """The client's model field as stored: at most 200 characters of storable text (a model id
    the provider refuses is still a row, with its 4xx)."""
    model = model[:MAX_MODEL_CHARS]
    if "\x00" in model or not model.isprintable():
        return "(unprintable)"
    try:
        model.encode("utf-8")
    except UnicodeEncodeError:
        return "(unprintable)"
    return model


def record_upstream_call(
    recorder: LedgerRecorder | web.Application | None,
    *,
    tenant: str,
    session: str | None,
    model: str,
    kind: Kind,
    status: int,
    latency_ms: float,
    usage: Mapping[str, Any] | None,
    request_id: str | None = None,
    route: str = "messages",
    started: tuple[str, int] | None = None,
    tokens_before: int | None = None,
    tokens_after: int | None = None,
    layers: str | None = None,
    plan: str | None = None,
    summary: str | None = None,
    compaction_id: str | None = None,
    notes: ProviderNotes | None = None,
    agent: str | None = None,
    quota: Charged | None = None,
) -> None:
    """Record one upstream call in the ledger (queued; returns at once, never raises).

    ``usage`` is the provider's ``usage`` object exactly as returned (for a stream: message_start's
    merged with the last message_delta's, :func:`proxy.core.ledger.merge_usage`), ``None`` when
    the call failed or reported none; the row bills what it says
    (:func:`proxy.core.provider_usage.billing`: ``usage.iterations`` summed when present).
    ``notes``: the answer's applied edits and input transformations
    (:attr:`proxy.server.relay.usage.UsageTap.notes`). ``agent``: the client's agent, when known.
    ``started``: :func:`now_ms` taken when the call was sent (default: now). For
    ``kind="retrieval"`` (a continuation the proxy makes itself) pass the tenant and session of
    the client request it serves. ``quota``: the request's budgets and rate limits, charged
    with the same billed figures (whether the ledger is on or not)."""
    if isinstance(recorder, web.Application):
        recorder = recorder.get(LEDGER)
    if recorder is None and quota is None:
        return
    billed = billing(usage)
    if quota is not None:
        try:
            quota.charge(kind, _model_text(model), billed.usage)
        except Exception:  # counting must never break the call it describes
            log.exception("[quota] call not charged")
    if recorder is None:
        return
    at, at_ms = started or now_ms()
    entry = LedgerEntry(
        at=at,
        at_ms=at_ms,
        tenant=tenant,
        session=session,
        model=_model_text(model),
        route=route,
        kind=kind,
        status=status,
        latency_ms=latency_ms,
        request_id=request_id,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        layers=layers,
        plan=plan,
        summary=summary,
        compaction_id=compaction_id,
        usage=billed.usage,
        provider_usage=dict(usage) if isinstance(usage, Mapping) else None,
        provider_compaction=billed.compaction,
        provider_compactions=billed.compactions,
        provider_notes=notes,
        agent=agent,
    )
    try:
        recorder.record(entry)
    except Exception:  # recording must never break the call it describes
        log.exception("[ledger] row not recorded")


class ClientCall:
    """The ledger row of one client call to ``/v1/messages``, once its outcome is known."""

    __slots__ = (
        "_agent", "_body", "_quota", "_recorder", "_report", "_session", "_started", "_t0",
        "_tenant",
    )  # fmt: skip

    def __init__(
        self,
        recorder: LedgerRecorder | None,
        tenant: str,
        session: str | None,
        body: Mapping[str, Any],
        report: Mapping[str, str],
        *,
        agent: str | None = None,
        quota: Charged | None = None,
        sent: tuple[tuple[str, int], float] | None = None,
    ) -> None:
        """``sent``: when the call was sent, as ``now_ms()`` and ``time.perf_counter()`` (default:
        now): the row's time and the start of its latency."""
        self._recorder = recorder
        self._quota = quota
        self._tenant = tenant
        self._session = session
        self._agent = agent
        self._body = body
        self._report = report
        self._started, self._t0 = sent if sent is not None else (now_ms(), time.perf_counter())

    def record(
        self,
        status: int,
        usage: Mapping[str, Any] | None,
        request_id: str | None,
        *,
        notes: ProviderNotes | None = None,
    ) -> None:
        if self._recorder is None and self._quota is None:
            return
        report = self._report
        model = self._body.get("model")

        def count(name: str) -> int | None:
            value = report.get(name, "")
            return int(value) if value.isdigit() else None

        record_upstream_call(
            self._recorder,
            tenant=self._tenant,
            session=self._session,
            model=model if isinstance(model, str) else "",
            kind="client",
            status=status,
            latency_ms=(time.perf_counter() - self._t0) * 1000,
            usage=usage,
            request_id=request_id,
            started=self._started,
            tokens_before=count("x-compaction-tokens-before"),
            tokens_after=count("x-compaction-tokens-after"),
            layers=report.get("x-compaction-layers"),
            plan=report.get("x-compaction-plan"),
            summary=report.get("x-compaction-summary"),
            compaction_id=report.get("x-compaction-id"),
            notes=notes,
            agent=self._agent,
            quota=self._quota,
        )


    def record_rounds(
        self,
        status: int,
        usages: Sequence[Mapping[str, Any]],
        continuations: Sequence[HiddenRound],
        request_id: str | None,
        *,
        notes: ProviderNotes | None = None,
    ) -> None:
        """An answer that took hidden retrieval rounds: one row per upstream call. The client's
        own call carries round 0's usage (and ``notes``, those of the answer the client got:
        its first round's input transformations, its last round's applied edits); each
        continuation is a ``kind="retrieval"`` row with its round's usage (``None`` when the
        round reported none or its call failed)."""
        if self._recorder is None and self._quota is None:
            return
        self.record(status, (usages[0] or None) if usages else None, request_id, notes=notes)
        model = self._body.get("model")
        for i, hidden in enumerate(continuations, start=1):
            usage = usages[i] if i < len(usages) else None
            at = datetime.fromtimestamp(hidden.sent_at, UTC)
            record_upstream_call(
                self._recorder,
                tenant=self._tenant,
                session=self._session,
                model=model if isinstance(model, str) else "",
                kind="retrieval",
                status=hidden.status or 502,
                latency_ms=hidden.latency_ms,
                usage=usage or None,
                started=(at.isoformat(timespec="milliseconds"), int(hidden.sent_at * 1000)),
                agent=self._agent,
                quota=self._quota,
            )


class HiddenRound(Protocol):
    """A retrieval continuation as :class:`proxy.server.relay.rounds.Continuation` describes
    it."""

    @property
    def sent_at(self) -> float: ...
    @property
    def status(self) -> int: ...
    @property
    def latency_ms(self) -> float: ...
