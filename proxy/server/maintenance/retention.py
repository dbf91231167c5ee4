"""The garbage collector: what ``retention:`` allows to be deleted, deleted in small batches.

* **Collectors.** :data:`COLLECTORS` is a list; each entry collects one kind for one tenant with
  that tenant's limits (``retention.<kind>``, the tenant's policy overriding the config's):
  ``max_age_days`` (older rows go) and ``max_rows`` (beyond the tenant's newest N, the oldest go),
  ``0`` meaning no limit. Table kinds are :class:`TableCollector` values (plans, summaries,
  manifests, calibration, transcripts, usage_ledger, source_audit); artifacts (files) are
  :class:`ArtifactCollector`. A new kind is one more entry.
* **What is never deleted.** A summary lease still held (``pending`` and not expired). A
  transcript event or an artifact that a durable item's source pointer names (any version in the
  session's history: the history is append-only and its pointers keep resolving). An artifact
  that a stored plan still names in a truncation marker, and every transcript event of the range
  a stored plan's bridge names (a live plan's view must keep its pointers redeemable by the
  retrieval tool). What a deletion costs otherwise: a deleted plan makes that conversation compact
  afresh on its next turn (one prompt-cache miss), a deleted summary is asked again if the same
  history is summarised again, a deleted manifest answers 404, a deleted calibration figure
  restarts from the default ratio, a deleted transcript event leaves a gap in the admin
  transcript (sequence numbers are never reused; the exported JSONL files under the tenant's
  transcript root are the tenant's source files and are not touched). A deleted event's
  idempotency key goes with it: a client that later re-sends that old message in a history that
  does not extend the session's recorded head (a rewind or an edit) records it again as a new
  event. Artifacts in a tenant's object store and their signed manifest rows are not collected
  (docs/operations/retention.md).
* **One runner at a time** across replicas: the store's ``gc_leases`` row (see
  :mod:`proxy.store.retention`), renewed between batches; a replica that loses it stops.
* **Never stalls the event loop:** every statement is small (``retention.batch_size`` rows),
  SQLite runs in the store's threads, files are listed and removed in a worker thread, and the
  collector yields between batches.
* The clock is injectable (``clock``: epoch seconds), so tests and the soak move time forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.config.retention import ArtifactRetention, KindRetention, RetentionConfig
from proxy.core.compaction.bridge import TranscriptRange
from proxy.core.pointers import ArtifactPointer, TranscriptPointer, parse_pointer
from proxy.server.appkeys import CONFIG, METRICS, STORE, TENANCY
from proxy.sources.layout import TOOL_RESULTS_DIR
from proxy.store.base import Store, StoreError
from proxy.store.retention import RetentionBackend, backend_for
from proxy.tenancy.tenants import Tenancy

__all__ = ["COLLECTORS", "RETENTION", "GcMetrics", "RetentionService", "RunReport", "retention_ctx"]

log = logging.getLogger("context_proxy.retention")

LEASE_NAME = "retention"
DAY = 86_400.0
# Pointers inside text (a JSON body, a truncation marker), by the grammar of proxy.core.pointers:
# a pointer followed by "." or "]" in prose is still found whole.
_COMPONENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"
_POINTER = re.compile(
    rf"transcript:{_COMPONENT}(?::{_COMPONENT})?:[1-9][0-9]{{0,17}}"
    rf"|artifact:{_COMPONENT}:{_COMPONENT}:(?:[0-9a-f]{{64}}|[0-9a-f]{{12}})",
    re.ASCII,
)


def iso(epoch: float) -> str:
    """The stored timestamp format (``proxy.store.clock.now_iso``) of ``epoch``."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds")


class LeaseLost(Exception):
    """Another replica holds the collector's lease now (ours expired): stop at once."""


@dataclass
class GcMetrics:
    deleted: Counter
    runs: Counter
    last_completed: Gauge

    @classmethod
    def on(cls, registry: CollectorRegistry) -> GcMetrics:
        return cls(
            deleted=Counter(
                "context_proxy_gc_deleted",
                "Rows (or artifact files) the garbage collector deleted, by kind.",
                ["kind"],
                registry=registry,
            ),
            runs=Counter(
                "context_proxy_gc_runs",
                "Garbage collector runs by outcome: completed, skipped (another replica holds"
                " the lease), lost_lease, failed (the store was unavailable).",
                ["outcome"],
                registry=registry,
            ),
            last_completed=Gauge(
                "context_proxy_gc_last_completed_timestamp_seconds",
                "When this process last completed a garbage collector run (epoch seconds).",
                registry=registry,
            ),
        )


@dataclass
class RunReport:
    outcome: str
    deleted: dict[str, int] = field(default_factory=dict)


@dataclass
class _Protected:
    """Pointers the tenant's durable history names, and those its stored plans name."""

    # (session, agent, seq): agent "" is the session's main conversation
    transcripts: set[tuple[str, str, int]] = field(default_factory=set)
    artifacts: set[tuple[str, str]] = field(default_factory=set)
    # transcript runs a stored plan's bridge names ((session, agent) -> [(first, last)]): the
    # model may redeem any event of them with the retrieval tool
    ranges: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)

    def covers(self, session: str, agent: str, seq: int) -> bool:
        if (session, agent, seq) in self.transcripts:
            return True
        runs = self.ranges.get((session, agent), ())
        return any(first <= seq <= last for first, last in runs)

    def add_plan(self, text: str) -> None:
        """A stored plan's bridge ``"transcript"`` (``TranscriptRange.to_json``)."""
        try:
            bridge = orjson.loads(text).get("bridge") or {}
            named = TranscriptRange.from_json(bridge["transcript"])
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            return
        self.ranges.setdefault((named.session, named.agent), []).extend(named.runs)

    def add_text(self, text: str) -> None:
        for match in _POINTER.finditer(text):
            pointer = parse_pointer(match.group(0))
            if isinstance(pointer, TranscriptPointer):
                self.transcripts.add((pointer.session, pointer.agent, pointer.sequence))
            elif isinstance(pointer, ArtifactPointer):
                self.artifacts.add((pointer.session, pointer.name))


class _Run:
    """One collector run: the backend, the lease, the clock, the batch size, the totals."""

    def __init__(
        self,
        backend: RetentionBackend,
        holder: str,
        now: float,
        config: RetentionConfig,
        metrics: GcMetrics | None,
    ) -> None:
        self.backend = backend
        self.holder = holder
        self.now = now
        self.config = config
        self.batch = config.batch_size
        self.metrics = metrics
        self.deleted: dict[str, int] = {}
        self._durable: dict[str, _Protected] = {}

    async def checkpoint(self) -> None:
        """Between batches: let the event loop run, and keep (or lose) the lease."""
        await asyncio.sleep(0)
        if not await self.backend.take_lease(
            LEASE_NAME, self.holder, self.now, self.config.lease_seconds
        ):
            raise LeaseLost

    def count(self, kind: str, n: int) -> None:
        if n:
            self.deleted[kind] = self.deleted.get(kind, 0) + n
            if self.metrics is not None:
                self.metrics.deleted.labels(kind).inc(n)

    async def durable_pointers(self, tenant: str) -> _Protected:
        """Every pointer in the tenant's durable history (read in batches)."""
        if tenant in self._durable:
            return self._durable[tenant]
        protected = _Protected()
        after: tuple[object, ...] = ("", 0)
        while True:
            rows = await self.backend.query(
                "SELECT session, seq, body FROM durable_changes WHERE tenant = ?"
                " AND (session, seq) > (?, ?) ORDER BY session, seq LIMIT ?",
                (tenant, *after, self.batch),
            )
            for _session, _seq, body in rows:
                protected.add_text(str(body))
            if len(rows) < self.batch:
                break
            after = (rows[-1][0], rows[-1][1])
            await asyncio.sleep(0)
        await self._plan_ranges(tenant, protected)
        self._durable[tenant] = protected
        return protected

    async def _plan_ranges(self, tenant: str, protected: _Protected) -> None:
        """The transcript ranges the tenant's stored plans name in their bridges."""
        after = ""
        while True:
            rows = await self.backend.query(
                "SELECT prefix_hash, plan_json FROM plans WHERE tenant = ? AND prefix_hash > ?"
                """ AND (plan_json LIKE '%"transcript":[%' OR plan_json LIKE '%"transcript":{%')"""
                " ORDER BY prefix_hash LIMIT ?",
                (tenant, after, self.batch),
            )
            for _key, text in rows:
                protected.add_plan(str(text))
            if len(rows) < self.batch:
                return
            after = str(rows[-1][0])
            await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class TableCollector:
    """Collects the rows of one table, oldest first, by age and by count per tenant."""

    kind: str  # the metric label and the key under ``retention:``
    table: str
    time_column: str  # ISO 8601 text as the store writes it, or epoch ms (``time_in_ms``)
    keys: tuple[str, ...]  # the primary key after ``tenant``
    live: str = ""  # SQL: rows matching it are never deleted; one ``?`` = now (epoch seconds)
    time_in_ms: bool = False
    optional: bool = False  # the table may not exist (another feature's)
    protect_transcripts: bool = False  # keys are (session, agent, seq)

    @staticmethod
    def protected_key(row: Sequence[object]) -> tuple[str, str, int]:
        """``(session, agent, seq)`` of a transcript row read as ``(time, *keys)``."""
        seq = row[3]
        assert isinstance(seq, int)
        return str(row[1]), str(row[2]), seq

    async def tenants(self, run: _Run) -> list[str]:
        if self.optional and not await run.backend.has_table(self.table):
            return []
        rows = await run.backend.query(f"SELECT DISTINCT tenant FROM {self.table}", ())
        return sorted(str(t) for (t,) in rows)

    def _cutoff(self, limits: KindRetention, now: float) -> object | None:
        if limits.max_age_days <= 0:
            return None
        at = now - limits.max_age_days * DAY
        return int(at * 1000) if self.time_in_ms else iso(at)

    async def collect(self, run: _Run, tenant: str, policy: RetentionConfig) -> None:
        limits = getattr(policy, self.kind)
        assert isinstance(limits, KindRetention)
        cutoff = self._cutoff(limits, run.now)
        live_sql = f" AND NOT ({self.live})" if self.live else ""
        live_params: tuple[object, ...] = (run.now,) if self.live else ()
        excess = 0
        if limits.max_rows > 0:
            ((count,),) = await run.backend.query(
                f"SELECT count(*) FROM {self.table} WHERE tenant = ?", (tenant,)
            )
            excess = max(0, int(count) - limits.max_rows)
        if cutoff is None and excess == 0:
            return
        protected = await run.durable_pointers(tenant) if self.protect_transcripts else None
        columns = (self.time_column, *self.keys)
        order = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        delete_sql = (
            f"DELETE FROM {self.table} WHERE tenant = ? AND "
            + " AND ".join(f"{c} = ?" for c in columns)
            + live_sql
        )
        after: tuple[object, ...] | None = None
        while True:
            where = f" AND ({order}) > ({marks})" if after is not None else ""
            rows = await run.backend.query(
                f"SELECT {order} FROM {self.table} WHERE tenant = ?{where}{live_sql}"
                f" ORDER BY {order} LIMIT ?",
                (tenant, *(after or ()), *live_params, run.batch),
            )
            victims: list[tuple[object, ...]] = []
            done = len(rows) < run.batch
            for row in rows:
                old = cutoff is not None and row[0] < cutoff
                if not old and excess <= 0:
                    done = True
                    break
                if protected is not None and protected.covers(*self.protected_key(row)):
                    continue
                victims.append((tenant, *row, *live_params))
                excess -= 1
            if victims:
                run.count(self.kind, await run.backend.delete(delete_sql, victims))
            await run.checkpoint()
            if done or not rows:
                return
            after = tuple(rows[-1])


@dataclass(frozen=True, slots=True)
class _ArtifactFile:
    mtime: float
    size: int
    session: str
    name: str
    path: str


def _list_artifacts(root: str) -> list[_ArtifactFile]:
    """Every ``<root>/<session>/tool-results/<name>`` regular file, oldest first (a thread)."""
    found: list[_ArtifactFile] = []
    try:
        sessions = list(os.scandir(root))
    except OSError:
        return []
    for session in sessions:
        if not session.is_dir(follow_symlinks=False):
            continue
        folder = os.path.join(session.path, TOOL_RESULTS_DIR)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(
                    _ArtifactFile(info.st_mtime, info.st_size, session.name, entry.name, entry.path)
                )
    found.sort(key=lambda f: (f.mtime, f.session, f.name))
    return found


def _unlink(paths: Iterable[str]) -> int:
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            continue  # already gone (another replica's collector, or the tenant): nothing to do
    return removed


@dataclass(frozen=True, slots=True)
class ArtifactCollector:
    """Artifact files under the tenant's ``artifact_root``, by age (mtime) and total size."""

    kind: str = "artifacts"

    async def collect(
        self, run: _Run, tenant: str, policy: RetentionConfig, root: str | None
    ) -> None:
        limits: ArtifactRetention = policy.artifacts
        if root is None or (limits.max_age_days <= 0 and limits.max_bytes <= 0):
            return
        files = await asyncio.to_thread(_list_artifacts, root)
        cutoff = run.now - limits.max_age_days * DAY if limits.max_age_days > 0 else None
        excess = 0
        if limits.max_bytes > 0:
            excess = max(0, sum(f.size for f in files) - limits.max_bytes)
        candidates = []
        for f in files:
            old = cutoff is not None and f.mtime < cutoff
            if not old and excess <= 0:
                break
            candidates.append(f)
            excess -= f.size
        if not candidates:
            return
        protected = await run.durable_pointers(tenant)
        in_plans = await self._named_by_plans(run, tenant)
        victims = [
            f.path
            for f in candidates
            if (f.session, f.name) not in protected.artifacts
            and (f.session, f.name) not in in_plans
        ]
        for start in range(0, len(victims), run.batch):
            batch = victims[start : start + run.batch]
            run.count(self.kind, await asyncio.to_thread(_unlink, batch))
            await run.checkpoint()

    @staticmethod
    async def _named_by_plans(run: _Run, tenant: str) -> set[tuple[str, str]]:
        named = _Protected()
        after = ""
        while True:
            rows = await run.backend.query(
                "SELECT prefix_hash, plan_json FROM plans WHERE tenant = ? AND prefix_hash > ?"
                " AND plan_json LIKE '%artifact:%' ORDER BY prefix_hash LIMIT ?",
                (tenant, after, run.batch),
            )
            for _key, text in rows:
                named.add_text(str(text))
            if len(rows) < run.batch:
                return named.artifacts
            after = str(rows[-1][0])
            await asyncio.sleep(0)


COLLECTORS: tuple[TableCollector, ...] = (
    TableCollector("plans", "plans", "created_at", ("prefix_hash",)),
    TableCollector(
        "summaries",
        "summaries",
        "updated_at",
        ("summary_key",),
        live="state = 'pending' AND expires_at > ?",
    ),
    TableCollector("manifests", "manifests", "stored_at", ("compaction_id",)),
    TableCollector("calibration", "calibration", "updated_at", ("model",)),
    TableCollector(
        "transcripts",
        "transcript_events",
        "recorded_at",
        ("session", "agent", "seq"),
        protect_transcripts=True,
    ),
    # The usage ledger (its own branch: table ``usage_ledger``, time ``at_ms``), when it exists.
    TableCollector(
        "usage_ledger", "usage_ledger", "at_ms", ("id",), time_in_ms=True, optional=True
    ),
    # The source-check audit trail (``source_audit``, time ``checked_at``).
    TableCollector("source_audit", "source_audit", "checked_at", ("id",), optional=True),
)
ARTIFACTS = ArtifactCollector()


class RetentionService:
    """Runs the collectors every ``retention.interval_seconds`` while holding the store lease."""

    def __init__(
        self,
        store: Store,
        config: RetentionConfig,
        tenancy: Callable[[], Tenancy],
        *,
        metrics: GcMetrics | None = None,
        clock: Callable[[], float] = time.time,
        holder: str | None = None,
    ) -> None:
        self.config = config
        self._backend = backend_for(store)
        self._tenancy = tenancy
        self._metrics = metrics
        self._clock = clock
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None

    def _policy(self, tenancy: Tenancy, tenant: str) -> tuple[RetentionConfig, str | None]:
        known = tenancy.by_name(tenant)
        if known is None:
            return self.config, None
        return known.retention or self.config, known.sources.artifact_root or None

    async def run_once(self) -> RunReport:
        """One collection if this replica gets the lease; ``skipped`` otherwise."""
        backend = self._backend
        if backend is None:
            return RunReport("skipped")
        now = self._clock()
        run = _Run(backend, self.holder, now, self.config, self._metrics)
        try:
            if not await backend.take_lease(
                LEASE_NAME, self.holder, now, self.config.lease_seconds
            ):
                return self._report(RunReport("skipped"))
            try:
                await self._collect(run)
            finally:
                await backend.release_lease(LEASE_NAME, self.holder)
        except LeaseLost:
            log.warning("[retention] the lease was taken over by another replica: stopped")
            return self._report(RunReport("lost_lease", run.deleted))
        except StoreError as exc:
            log.warning("[retention] the store is unavailable: %s", exc)
            return self._report(RunReport("failed"))
        if self._metrics is not None:
            self._metrics.last_completed.set(now)
        if run.deleted:
            log.info("[retention] deleted %s", run.deleted)
        return self._report(RunReport("completed", run.deleted))

    def _report(self, report: RunReport) -> RunReport:
        if self._metrics is not None:
            self._metrics.runs.labels(report.outcome).inc()
        return report

    async def _collect(self, run: _Run) -> None:
        tenancy = self._tenancy()
        for collector in COLLECTORS:
            for tenant in await collector.tenants(run):
                policy, _root = self._policy(tenancy, tenant)
                if policy.enabled:
                    await collector.collect(run, tenant, policy)
        for known in tenancy.tenants:
            policy, root = self._policy(tenancy, known.name)
            if policy.enabled:
                await ARTIFACTS.collect(run, known.name, policy, root)

    # -- the background task ------------------------------------------------------------------

    def start(self) -> None:
        if self.config.enabled and self._task is None:
            self._task = asyncio.create_task(self._forever(), name="retention")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # its cancellation is the end asked for here, not a failure to report
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _forever(self) -> None:
        interval = self.config.interval_seconds
        # The first run at a random moment of the first interval: replicas started together do
        # not all try at once, and a short-lived process does not scan the store at start-up.
        await asyncio.sleep(interval * random.uniform(0.1, 1.0))
        while True:
            try:
                await self.run_once()
            except Exception:  # a bug must not end the loop, nor the process
                log.exception("[retention] run failed")
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))


RETENTION = web.AppKey("retention", RetentionService)


async def retention_ctx(app: web.Application) -> AsyncIterator[None]:
    """The app's collector: started after the store opened, stopped before it closes."""
    service = RetentionService(
        app[STORE],
        app[CONFIG].retention,
        lambda: app[TENANCY].current,
        metrics=GcMetrics.on(app[METRICS].registry),
    )
    app[RETENTION] = service
    service.start()
    try:
        yield
    finally:
        await service.stop()
