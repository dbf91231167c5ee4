"""The garbage collector (issue 11 #5) on both backends: what it deletes, what it never deletes,
one runner at a time across replicas, and bounded growth under an injectable clock.

Rows are written through the store's own API; the collector's clock is moved forward (and, in the
growth tests, the store's own timestamps follow the same clock: ``now_iso`` is the store's clock).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.config.retention import ArtifactRetention, KindRetention, RetentionConfig
from proxy.config.settings import parse_config
from proxy.core.durable import Create, Fact
from proxy.core.ledger import LedgerEntry
from proxy.server.maintenance.retention import DAY, GcMetrics, RetentionService, iso
from proxy.sources.artifact_files import write_artifact
from proxy.store import Store, TranscriptEvent, open_store
from proxy.store.retention import backend_for
from proxy.store.source_records import AuditQuery, AuditRow, append_audit, list_audit
from proxy.store.usage import UsageQuery
from proxy.tenancy.policies import load_tenancy
from proxy.tenancy.tenants import DEFAULT_TENANT, Tenancy

NOW = time.time()
OK = '{"kind": "plan"}'


def _config(**kinds: Any) -> RetentionConfig:
    return dataclasses.replace(RetentionConfig(), **kinds)


def _tenancy(tmp_path: Path) -> Tenancy:
    return load_tenancy(parse_config({"state_dir": str(tmp_path)}, "<test>"), environ={})


def _service(
    store: Store, config: RetentionConfig, tenancy: Tenancy, clock: Callable[[], float], **kw: Any
) -> RetentionService:
    return RetentionService(store, config, lambda: tenancy, clock=clock, **kw)


def _event(n: int, at: float) -> TranscriptEvent:
    return TranscriptEvent(f"e{n}", iso(at), "message", "user", [{"type": "text", "text": "x"}], True)


async def _counts(store: Store, tables: tuple[str, ...]) -> dict[str, int]:
    backend = backend_for(store)
    assert backend is not None
    out = {}
    for table in tables:
        ((n,),) = await backend.query(f"SELECT count(*) FROM {table}", ())
        out[table] = int(n)
    return out


async def test_deletes_by_age_and_keeps_what_a_durable_pointer_names(
    store: Store, tmp_path: Path
) -> None:
    t = DEFAULT_TENANT
    await store.put_plan(t, "anchor", "h1", 2, OK)
    await store.put_plan(t, "anchor", "h2", 4, OK)
    await store.claim_summary(t, "k1", "me", 15)
    await store.settle_summary(t, "k1", "me", "the summary", 1)
    await store.put_manifest(t, "c1", "s1", "{}")
    await store.put_calibration(t, "claude-x", 1.1)
    await store.append_transcript(t, "s1", [_event(n, NOW) for n in (1, 2, 3)], 3, "h")
    fact = Fact("f", "named by a pointer", "transcript:s1:2", iso(NOW))
    await store.write_changes(t, "s1", [Create(fact)])
    clock = [NOW + 40 * DAY]
    service = _service(store, RetentionConfig(), _tenancy(tmp_path), lambda: clock[0])

    report = await service.run_once()  # 40 days later: plans and summaries (30 days) go
    assert report.outcome == "completed"
    assert report.deleted == {"plans": 2, "summaries": 1}
    assert await store.plans_for(t, "anchor") == ()
    assert await store.get_manifest(t, "c1") is not None
    assert await store.get_calibration(t, "claude-x") == 1.1
    claim = await store.claim_summary(t, "k1", "other", 15)
    assert claim.state == "acquired"  # asked again: the stored text is gone

    clock[0] = NOW + 100 * DAY  # 100 days: manifests, calibration, transcripts (90 days)
    report = await service.run_once()
    # (the lease "other" took above has expired by then: it goes too)
    assert report.deleted == {"summaries": 1, "manifests": 1, "calibration": 1, "transcripts": 2}
    assert await store.get_manifest(t, "c1") is None
    assert await store.get_calibration(t, "claude-x") is None
    kept = await store.transcript_events(t, "s1")
    assert [e.seq for e in kept] == [2]  # the fact's source pointer still resolves
    # The sequence goes on after the gap: numbers are never reused.
    assert await store.append_transcript(t, "s1", [_event(4, NOW)], 4, "h4") == 4
    assert (await store.current_state(t, "s1")).facts  # durable state is never collected


async def test_a_summary_lease_still_held_is_never_deleted(store: Store, tmp_path: Path) -> None:
    t = DEFAULT_TENANT
    await store.claim_summary(t, "held", "a-replica", 600)  # pending for ten minutes
    await store.claim_summary(t, "done", "a-replica", 600)
    await store.settle_summary(t, "done", "a-replica", "text", 1)
    config = _config(summaries=KindRetention(max_age_days=1 / DAY, max_rows=0))  # one second
    service = _service(store, config, _tenancy(tmp_path), lambda: time.time() + 5)
    report = await service.run_once()
    assert report.deleted == {"summaries": 1}
    assert (await store.claim_summary(t, "held", "someone-else", 15)).state == "held"


async def test_max_rows_keeps_the_newest_in_batches(store: Store, tmp_path: Path) -> None:
    for n in range(10):
        await store.put_plan("acme", f"a{n}", f"h{n:02d}", 1, OK)
        await store.put_plan("globex", f"a{n}", f"h{n:02d}", 1, OK)
    config = _config(plans=KindRetention(max_age_days=0, max_rows=3), batch_size=2)
    tenancy = _tenancy(tmp_path)
    gc_metrics = GcMetrics.on(__import__("prometheus_client").CollectorRegistry())
    service = _service(store, config, tenancy, time.time, metrics=gc_metrics)
    report = await service.run_once()
    assert report.deleted == {"plans": 14}
    for tenant in ("acme", "globex"):
        kept = [n for n in range(10) if await store.plans_for(tenant, f"a{n}")]
        assert kept == [7, 8, 9]
    assert gc_metrics.deleted.labels("plans")._value.get() == 14
    assert gc_metrics.runs.labels("completed")._value.get() == 1


async def test_a_tenant_policy_overrides_the_config(tmp_path: Path, store_url: str) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, days, digit in (("acme", 1, "a"), ("globex", None, "b")):
        text = f"name: {name}\nprovider: {{mode: passthrough}}\napi_keys_sha256: ['{digit * 64}']\n"
        if days is not None:
            text += f"retention:\n  plans: {{max_age_days: {days}}}\n"
        (policies / f"{name}.yaml").write_text(text)
    config = parse_config(
        {"auth": {"mode": "keys"}, "policies_dir": str(policies), "state_dir": str(tmp_path)}
    )
    tenancy = load_tenancy(config, environ={})
    store = await open_store(store_url)
    try:
        for tenant in ("acme", "globex"):
            await store.put_plan(tenant, "a", "h", 1, OK)
        service = _service(store, config.retention, tenancy, lambda: NOW + 2 * DAY)
        assert (await service.run_once()).deleted == {"plans": 1}
        assert await store.plans_for("acme", "a") == ()
        assert await store.plans_for("globex", "a") != ()  # the config's 30 days
    finally:
        await store.close()


async def test_one_runner_at_a_time_across_replicas(store_url: str, tmp_path: Path) -> None:
    first, second = await open_store(store_url), await open_store(store_url)
    try:
        tenancy = _tenancy(tmp_path)
        clock = [NOW]
        a = _service(first, RetentionConfig(), tenancy, lambda: clock[0], holder="replica-a")
        b = _service(second, RetentionConfig(), tenancy, lambda: clock[0], holder="replica-b")
        backend = backend_for(first)
        assert backend is not None
        # replica-a is in the middle of a run (it holds the lease): replica-b skips.
        assert await backend.take_lease("retention", "replica-a", clock[0], 300)
        assert (await b.run_once()).outcome == "skipped"
        assert (await a.run_once()).outcome == "completed"  # its own lease: renewed, released
        assert (await b.run_once()).outcome == "completed"  # released: b may run now
        # A crashed holder: its lease expires after lease_seconds, then another replica runs.
        assert await backend.take_lease("retention", "replica-a", clock[0], 300)
        assert (await b.run_once()).outcome == "skipped"
        clock[0] += 301
        assert (await b.run_once()).outcome == "completed"
    finally:
        await first.close()
        await second.close()


async def test_artifacts_by_age_and_size_keep_what_a_plan_or_pointer_names(
    store: Store, tmp_path: Path
) -> None:
    tenancy = _tenancy(tmp_path)
    root = tenancy.tenants[0].sources.artifact_root
    pointers = {
        name: write_artifact(root, "s1", name, name.encode() * 100)
        for name in ("old", "in-plan", "in-fact", "new")
    }
    for name in ("old", "in-plan", "in-fact"):
        path = os.path.join(root, "s1", "tool-results", name)
        os.utime(path, (NOW - 100 * DAY, NOW - 100 * DAY))
    marker = f"[cut: the full result is {pointers['in-plan']}.]"
    await store.put_plan(DEFAULT_TENANT, "a", "h", 1, '{"marker": "' + marker + '"}')
    fact = Fact("f", "x", pointers["in-fact"], iso(NOW))
    await store.write_changes(DEFAULT_TENANT, "s1", [Create(fact)])
    service = _service(store, RetentionConfig(), tenancy, lambda: NOW)
    assert (await service.run_once()).deleted == {"artifacts": 1}
    left = sorted(os.listdir(os.path.join(root, "s1", "tool-results")))
    assert left == ["in-fact", "in-plan", "new"]
    # By size: the oldest unnamed files go until the tenant is under max_bytes.
    config = _config(artifacts=ArtifactRetention(max_age_days=0, max_bytes=1))
    service = _service(store, config, tenancy, lambda: NOW)
    assert (await service.run_once()).deleted == {"artifacts": 1}
    assert sorted(os.listdir(os.path.join(root, "s1", "tool-results"))) == ["in-fact", "in-plan"]


# -- bounded growth ------------------------------------------------------------------------------


@pytest.fixture
def store_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The store's own timestamps (``now_iso``) follow a clock the test moves."""
    clock = [NOW]
    monkeypatch.setattr("proxy.store.clock.now_iso", lambda: iso(clock[0]))
    yield clock


async def soak(store: Store, tmp_path: Path, clock: list[float], days: int, per_day: int) -> None:
    """``days`` days of traffic, the collector once a day; every kind stays under its bound."""
    age = 3
    config = _config(
        plans=KindRetention(age, 0),
        summaries=KindRetention(age, 0),
        manifests=KindRetention(age, 0),
        calibration=KindRetention(age, 0),
        transcripts=KindRetention(age, 0),
        artifacts=ArtifactRetention(age, 0),
        batch_size=7,
    )
    tenancy = _tenancy(tmp_path)
    root = tenancy.tenants[0].sources.artifact_root
    service = _service(store, config, tenancy, lambda: clock[0])
    t = DEFAULT_TENANT
    tables = ("plans", "summaries", "manifests", "calibration", "transcript_events")
    written = 0
    for day in range(days):
        for n in range(per_day):
            key = f"d{day}n{n}"
            await store.put_plan(t, key, key, 1, OK)
            await store.claim_summary(t, key, "me", 15)
            await store.settle_summary(t, key, "me", "text", 1)
            await store.put_manifest(t, key, f"s{day}", "{}")
            await store.put_calibration(t, f"model-{day}-{n}", 1.0)
            await store.append_transcript(
                t, f"s{day}", [_event(day * per_day + n, clock[0])], n + 1, key
            )
            path = write_artifact(root, f"s{day}", key, b"x" * 10)
            name = path.split(":")[2]
            os.utime(os.path.join(root, f"s{day}", "tool-results", name), (clock[0], clock[0]))
            written += 1
        clock[0] += DAY
        assert (await service.run_once()).outcome == "completed"
        counts = await _counts(store, tables)
        files = sum(len(files) for _, _, files in os.walk(root))
        bound = per_day * age  # rows of the last `age` days
        assert all(n <= bound for n in counts.values()), (day, counts)
        assert files <= bound, (day, files)
    assert written == days * per_day
    assert min((await _counts(store, tables)).values()) == per_day * min(days, age)


async def test_growth_is_bounded_short(store: Store, tmp_path: Path, store_clock: list[float]) -> None:
    await soak(store, tmp_path, store_clock, days=8, per_day=5)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_growth_is_bounded_soak(store: Store, tmp_path: Path, store_clock: list[float]) -> None:
    await soak(store, tmp_path, store_clock, days=60, per_day=20)


async def test_the_usage_ledger_is_collected_by_age(store: Store, tmp_path: Path) -> None:
    """The ledger's only retention: ``retention.usage_ledger`` (90 days by default), collected
    under the GC lease like every other kind, per tenant (both backends)."""

    def entry(tenant: str, days: float, request_id: str) -> LedgerEntry:
        at = NOW - days * DAY
        return LedgerEntry(
            at=iso(at), at_ms=int(at * 1000), tenant=tenant, session="s1", model="m",
            route="messages", kind="client", status=200, latency_ms=1.0, request_id=request_id,
        )  # fmt: skip

    await store.record_usage(
        [entry("acme", d, f"a{d}") for d in (0, 0.5, 2, 3)] + [entry("globex", 3, "g3")]
    )
    assert RetentionConfig().usage_ledger == KindRetention(90.0, 0)
    service = _service(
        store, _config(usage_ledger=KindRetention(1, 0)), _tenancy(tmp_path), lambda: NOW
    )
    assert (await service.run_once()).deleted == {"usage_ledger": 3}
    kept = await store.usage_rows("acme", UsageQuery())
    assert sorted(r.entry.request_id or "" for r in kept) == ["a0", "a0.5"]
    assert await store.usage_rows("globex", UsageQuery()) == ()


async def test_transcript_events_a_stored_plan_names_are_kept(store: Store, tmp_path: Path) -> None:
    """A plan's bridge names the removed turns ``transcript:s1:2 .. transcript:s1:4`` for the
    retrieval tool: while the plan is stored, every event of that range stays; the others go."""
    t = DEFAULT_TENANT
    await store.append_transcript(t, "s1", [_event(n, NOW) for n in range(1, 7)], 6, "h")
    bridge = {"summary": "s", "carried": [], "transcript": ["s1", 2, 4]}
    await store.put_plan(t, "anchor", "h1", 2, orjson.dumps({"bridge": bridge}).decode())
    config = _config(plans=KindRetention(0, 0))  # the plan itself is kept
    service = _service(store, config, _tenancy(tmp_path), lambda: NOW + 100 * DAY)
    assert (await service.run_once()).deleted == {"transcripts": 3}
    assert [e.seq for e in await store.transcript_events(t, "s1")] == [2, 3, 4]


async def test_the_source_audit_trail_is_collected_by_age(store: Store, tmp_path: Path) -> None:
    def row(tenant: str, days: float) -> AuditRow:
        return AuditRow(tenant, "s1", "transcript:s1:1", "missing", None, "store", "", 0.1,
                        "request:chk", iso(NOW - days * DAY))  # fmt: skip

    await append_audit(store, [row("acme", 0), row("acme", 100), row("globex", 95)])
    assert RetentionConfig().source_audit == KindRetention(90.0, 0)
    service = _service(store, RetentionConfig(), _tenancy(tmp_path), lambda: NOW)
    assert (await service.run_once()).deleted == {"source_audit": 2}
    assert len(await list_audit(store, AuditQuery("acme"))) == 1
    assert await list_audit(store, AuditQuery("globex")) == ()
