"""bench/store_sqlalchemy.py, the SQLAlchemy Core prototype bench/bench_store.py measures against
the store's own query layer, does the same work: what it writes, proxy.store reads back exactly as
what proxy.store itself wrote (the comparison is of two ways to do one thing)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from proxy.core.quota import Counter
from proxy.store import KeyedEvent, Prefix, Store, TranscriptEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from store_sqlalchemy import SQLAlchemyStore


def _event(n: int, role: str) -> TranscriptEvent:
    content: Any = [{"type": "text", "text": f"turn {n} é ✓"}, {"type": "tool_use", "id": f"t{n}", "input": {"n": n}}]
    return TranscriptEvent(f"evt-{n}", "2026-01-01T00:00:00+00:00", "message" if role == "user" else "answer", role, content, n % 3 != 0)


async def _turns(store: Any, tenant: str) -> list[object]:
    seen: list[object] = []
    for n in range(1, 5):
        agent = "a1" if n > 2 else ""
        batch = [KeyedEvent(f"m{n}", _event(n, "user")), KeyedEvent(f"m{n}", _event(n + 100, "user"))]
        seen.append(await store.record_transcript(tenant, "s", batch, Prefix(n, f"h{n}"), agent=agent))
        answer = [KeyedEvent(f"a{n}", _event(n + 50, "assistant"))]
        seen.append(await store.record_transcript(tenant, "s", answer, Prefix(n + 1, f"h{n + 1}")))
        seen.append(await store.transcript_keys_held(tenant, "s", [f"a{n}", "zz"]))
        seen.append(await store.recorded_prefix(tenant, "s"))
        seen.append(await store.current_state(tenant, "s"))
    counters = [
        Counter("tenant", "requests", "minute", 60_000, 120_000, 10, 1),
        Counter(f"key:{'ab' * 4}", "input_tokens", "minute", 60_000, 120_000, 10, 7),
    ]
    seen.append(await store.quota_add(tenant, counters))
    seen.append(await store.quota_add(tenant, counters))
    return seen


async def test_the_prototype_writes_what_the_store_writes(store: Store, store_url: str) -> None:
    own = await _turns(store, "own")
    prototype = SQLAlchemyStore(store_url)
    try:
        other = await _turns(prototype, "proto")
    finally:
        await prototype.close()
    assert other == own
    assert own[-1] == {("tenant", "requests", 60_000): 2, ("key:abababab", "input_tokens", 60_000): 14}
    for agent in ("", "a1"):
        mine = await store.transcript_events("own", "s", agent=agent)
        theirs = await store.transcript_events("proto", "s", agent=agent)
        assert [(e.seq, e.event, e.prefix_count, e.prefix_hash) for e in theirs] == [
            (e.seq, e.event, e.prefix_count, e.prefix_hash) for e in mine
        ]
        assert mine
    agents = {t: [(a.agent, a.parent, a.events) for a in await store.session_agents(t, "s")] for t in ("own", "proto")}
    assert agents["proto"] == agents["own"] == [("", "", 6), ("a1", "", 2)]
