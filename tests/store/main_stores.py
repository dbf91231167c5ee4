"""Stores made by an earlier release, and what they hold: the upgrade fixtures' two halves.

:func:`populate` writes, through the store's own API, one of everything a store keeps (two
tenants sharing a session id, durable state with every kind and op, the main conversation's
transcript and two agents', a transcript appended the old way (no keys), compaction manifests,
plans, summaries in every state, calibration, usage rows with and without the provider's figures,
quota counters, signed artifact manifests, audit rows, the collector's lease). It is run once,
with the code of the release the fixture stands for (``make_main_stores.py``).

:func:`snapshot` reads all of it back through the ``Store`` protocol (and the source records'
functions), as JSON values; :func:`table_rows` reads every row of every table with the database's
own driver, bypassing the proxy. The maker records both; the test (``test_upgrade_fixtures.py``)
opens the fixture with today's code and compares.

Only names both releases have are used (``proxy.store``'s protocol and the modules
``proxy.store.usage`` / ``proxy.store.source_records``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Mapping
from typing import Any

TENANTS = ("acme", "globex")
# (tenant, session, agent): the conversations the fixture records
CONVERSATIONS = (
    ("acme", "s1", ""),
    ("acme", "s1", "agent-a"),
    ("acme", "s1", "agent-b"),
    ("globex", "s1", ""),
)
OLD_STYLE = ("acme", "s2")  # appended with append_transcript (no event keys)
COMPACTIONS = ("cmp-1", "cmp-2")
ANCHORS = ("anchor-1", "anchor-2")
SUMMARY_KEYS = ("sum-ok", "sum-failed", "sum-held")
MODELS = ("claude-sonnet-4-5", "claude-opus-4-1")
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
QUOTA_START, QUOTA_END = T0_MS, T0_MS + 60_000
ARTIFACTS = ("a.txt", "b.txt")
LONG = 10 * 365 * 86400.0  # a lease or retry that outlives the fixture


def jsonable(value: Any) -> Any:
    """Dataclasses, tuples and mappings as plain JSON values (for comparison)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out["__type__"] = type(value).__name__
        return out
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = [jsonable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, frozenset | set) else items
    return value


def _event(n: int, role: str, text: str, type_: str = "message") -> Any:
    from proxy.store import TranscriptEvent

    return TranscriptEvent(
        f"evt-{n}", f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}+00:00", type_,  # type: ignore[arg-type]
        role, [{"type": "text", "text": text}], n % 7 != 3,
    )  # fmt: skip


async def populate(store: Any) -> None:
    """One of everything, through the API (``store``: an open store of the release)."""
    from proxy.core.durable import Create, Evidence, Fact, PendingItem, Retire, Update
    from proxy.core.ledger import LedgerEntry, usage_from
    from proxy.core.provider_notes import ProviderNotes
    from proxy.core.provider_usage import Usage
    from proxy.core.quota import Counter
    from proxy.sources.manifests import SigningKeys, sign_entry
    from proxy.store import Prefix
    from proxy.store.source_records import AuditRow, append_audit, put_artifact_manifest

    try:
        from proxy.store import KeyedEvent
    except ImportError:  # the release the fixtures stand for kept it here
        from proxy.store.transcript_keys import KeyedEvent  # type: ignore[no-redef]

    src = "transcript:s1:1"
    for tenant in TENANTS:
        await store.write_changes(tenant, "s1", [
            Create(Fact("f1", f"{tenant}: the store is SQLite", src, "2026-01-01T00:00:00Z")),
            Create(PendingItem("p1", "write the upgrade page", "open", src, "2026-01-01T00:00:00Z")),
            Create(Evidence("m1", "a memory", src, "2026-01-01T00:00:00Z", 0.75, 1,
                            "2026-01-01T00:00:00Z", None)),
        ])  # fmt: skip
        await store.write_changes(tenant, "s1", [
            Update(Fact("f1", f"{tenant}: the store is PostgreSQL", src, "2026-01-01T00:01:00Z")),
            Update(PendingItem("p1", "write the upgrade page", "done", src, "2026-01-01T00:02:00Z")),
            Create(Fact("f2", "retired soon", src, "2026-01-01T00:02:00Z")),
        ])  # fmt: skip
        await store.write_changes(tenant, "s1", [Retire("fact", "f2", src, "2026-01-01T00:03:00Z")])

    n = 0
    for tenant, session, agent in CONVERSATIONS:
        parent = "agent-a" if agent == "agent-b" else ""
        for turn in range(3):
            n += 1
            question = KeyedEvent(f"m{turn * 2}:{agent}", _event(n, "user", f"{tenant}/{agent} q{turn}"))
            await store.record_transcript(
                tenant, session, [question], Prefix(turn * 2 + 1, f"h{turn * 2 + 1}"),
                agent=agent, parent=parent,
            )  # fmt: skip
            n += 1
            answer = KeyedEvent(f"a{turn * 2 + 1}:{agent}", _event(n, "assistant", f"a{turn}", "answer"))
            await store.record_transcript(
                tenant, session, [answer], Prefix(turn * 2 + 2, f"h{turn * 2 + 2}"),
                agent=agent, parent=parent,
            )  # fmt: skip
    tenant, session = OLD_STYLE
    await store.append_transcript(tenant, session, [_event(900, "user", "old 1")], 1, "o1")
    await store.append_transcript(
        tenant, session, [_event(901, "assistant", "old 2", "answer"), _event(902, "user", "old 3")],
        3, "o3", expected_prefix=Prefix(1, "o1"),
    )  # fmt: skip

    for i, cid in enumerate(COMPACTIONS):
        await store.put_manifest("acme", cid, "s1", f'{{"compaction_id": "{cid}", "records": [{i}]}}')
    for i, anchor in enumerate(ANCHORS):
        for length in (4, 8):
            await store.put_plan(
                "acme", anchor, f"{anchor}-p{length}", length, f'{{"plan": {i}, "len": {length}}}'
            )
    await store.claim_summary("acme", "sum-ok", "replica-1", 30.0)
    await store.settle_summary("acme", "sum-ok", "replica-1", "the summary text", 60.0)
    await store.claim_summary("acme", "sum-failed", "replica-1", 30.0)
    await store.settle_summary("acme", "sum-failed", "replica-1", None, LONG)
    await store.claim_summary("acme", "sum-held", "replica-2", LONG)
    for i, model in enumerate(MODELS):
        await store.put_calibration("acme", model, 1.25 + i / 8)

    usage = {
        "input_tokens": 12, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000,
        "cache_creation": {"ephemeral_5m_input_tokens": 60, "ephemeral_1h_input_tokens": 40},
        "output_tokens": 5, "service_tier": "standard",
    }  # fmt: skip
    entries = []
    for k in range(6):
        at_ms = T0_MS + k * 61_000
        entries.append(
            LedgerEntry(
                at=f"2026-01-01T00:{k:02d}:{k:02d}.000+00:00", at_ms=at_ms,
                tenant=TENANTS[k % 2], session=None if k == 5 else "s1", model=MODELS[k % 2],
                route="messages", kind=("client", "summary", "retrieval")[k % 3],
                status=529 if k == 4 else 200, latency_ms=10.5 + k,
                request_id=f"req_{k}", tokens_before=2000 + k, tokens_after=1000,
                layers="prune,summarize", plan="new" if k % 2 else "reused", summary="ok",
                compaction_id=f"cmp-{k}",
                usage=None if k == 4 else usage_from(usage),
                provider_usage=None if k == 4 else usage,
                provider_compaction=Usage(5, 0, None, None, 7, 3) if k == 1 else None,
                provider_compactions=1 if k == 1 else 0,
                provider_notes=ProviderNotes(({"type": "clear"},), None, 1, 0, 2) if k == 2 else None,
                agent="agent-a" if k == 3 else None,
            )
        )  # fmt: skip
    await store.record_usage(entries)

    counters = [
        Counter("tenant", "requests", "minute", QUOTA_START, QUOTA_END, 100, 3),
        Counter("tenant", "input_tokens", "minute", QUOTA_START, QUOTA_END, 10**6, 1234),
        Counter("key:" + "ab" * 8, "requests", "minute", QUOTA_START, QUOTA_END, 10, 1),
    ]
    await store.quota_add("acme", counters)
    await store.quota_add("acme", counters[:1])

    keys = SigningKeys("k1", {"k1": b"k" * 32})
    for name in ARTIFACTS:
        await put_artifact_manifest(
            store, sign_entry(keys, "acme", "s1", name, 5, "b" * 64, "2026-01-01T00:00:00.000000+00:00")
        )  # fmt: skip
    await append_audit(store, [
        AuditRow("acme", "s1", f"artifact:s1:{name}:" + "b" * 64, status, "b" * 64 if status == "available" else None,
                 "local", detail, 1.5, f"request:chk_{i}", f"2026-01-01T00:00:0{i}.000000+00:00")
        for i, (name, status, detail) in enumerate(
            [("a.txt", "available", ""), ("b.txt", "corrupt", "signature"), ("c.txt", "missing", "")]
        )
    ])  # fmt: skip
    from proxy.store.retention import backend_for

    retention = backend_for(store)
    assert retention is not None
    assert await retention.take_lease("retention", "replica-1", 1_767_225_600.0, 60.0)


async def snapshot(store: Any) -> dict[str, Any]:
    """Everything :func:`populate` wrote, read back through the API, as JSON values."""
    from proxy.store.source_records import AuditQuery, get_artifact_manifest, list_audit
    from proxy.store.usage import UsageQuery

    out: dict[str, Any] = {}
    out["migrations"] = [[m.version, m.name] for m in await store.applied_migrations()]
    for tenant in TENANTS:
        out[f"sessions/{tenant}"] = list(await store.list_sessions(tenant))
        out[f"state/{tenant}"] = jsonable(await store.current_state(tenant, "s1"))
        out[f"history/{tenant}"] = jsonable(await store.history(tenant, "s1"))
        out[f"agents/{tenant}"] = jsonable(await store.session_agents(tenant, "s1"))
        out[f"usage/{tenant}"] = jsonable(await store.usage_rows(tenant, UsageQuery(limit=1000)))
        out[f"usage-sessions/{tenant}"] = jsonable(
            await store.usage_groups(tenant, UsageQuery(), "session")
        )
        out[f"usage-buckets/{tenant}"] = jsonable(
            await store.usage_groups(tenant, UsageQuery(since_ms=T0_MS), "bucket", 120_000)
        )
        out[f"quota/{tenant}"] = jsonable(await store.quota_current(tenant, QUOTA_START + 1))
        out[f"audit/{tenant}"] = [
            r.to_json() for r in await list_audit(store, AuditQuery(tenant, limit=1000))
        ]
    for tenant, session, agent in (*CONVERSATIONS, (*OLD_STYLE, "")):
        where = f"{tenant}/{session}/{agent}"
        events = await store.transcript_events(tenant, session, agent=agent)
        out[f"transcript/{where}"] = jsonable(events)
        out[f"pointers/{where}"] = [e.pointer for e in events]
        out[f"prefix/{where}"] = jsonable(await store.recorded_prefix(tenant, session, agent=agent))
        keys = [f"m{t * 2}:{agent}" for t in range(3)] + [f"a{t * 2 + 1}:{agent}" for t in range(3)]
        out[f"seqs/{where}"] = await store.transcript_seqs(tenant, session, keys, agent=agent)
        out[f"held/{where}"] = sorted(await store.transcript_keys_held(tenant, session, keys, agent=agent))
    for cid in COMPACTIONS:
        out[f"manifest/{cid}"] = jsonable(await store.get_manifest("acme", cid))
    for anchor in ANCHORS:
        out[f"plans/{anchor}"] = list(await store.plans_for("acme", anchor))
    for key in SUMMARY_KEYS:  # claims that change nothing: stored text, a failure, another's lease
        claim = await store.claim_summary("acme", key, "reader", 1.0)
        out[f"summary/{key}"] = [claim.state, claim.text]
    for model in MODELS:
        out[f"calibration/{model}"] = await store.get_calibration("acme", model)
    for name in ARTIFACTS:
        out[f"artifact/{name}"] = jsonable(await get_artifact_manifest(store, "acme", "s1", name))
    return out


# -- every row, read with the database's own driver ------------------------------------------


def sqlite_rows(path: str) -> dict[str, list[list[Any]]]:
    """Every table's rows (``schema_migrations``' ``applied_at`` included), in a stable order."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " ORDER BY name"
            )
        ]
        return {
            table: sorted(([*row] for row in conn.execute(f'SELECT * FROM "{table}"')), key=repr)
            for table in tables
        }
    finally:
        conn.close()


async def postgres_rows(url: str) -> dict[str, list[list[Any]]]:
    """:func:`sqlite_rows` for the schema of ``url``'s ``search_path``."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        tables = [
            str(r["tablename"])
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " ORDER BY tablename"
            )
        ]
        return {
            table: sorted(
                ([*row.values()] for row in await conn.fetch(f'SELECT * FROM "{table}"')), key=repr
            )
            for table in tables
        }
    finally:
        await conn.close()
