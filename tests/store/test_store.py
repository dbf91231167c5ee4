"""The store contract, run against every backend (see ``conftest.BACKENDS``).

Nothing here knows which database is underneath: only the ``Store`` protocol and ``open_store``.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import orjson
import pytest

from proxy.core.durable import (
    Create,
    DurableState,
    Evidence,
    Fact,
    InvalidWrite,
    PendingItem,
    Retire,
    Update,
    apply,
)
from proxy.core.render import render_state
from proxy.store import (
    EMPTY_PREFIX,
    DuplicateEvent,
    ManifestConflict,
    Prefix,
    PrefixConflict,
    Store,
    StoreUnavailable,
    TranscriptEvent,
    open_store,
)
from proxy.store.migrations import MIGRATIONS

T0 = "2025-03-01T10:00:00Z"
T0_OTHER_ZONE = "2025-03-01T11:00:00+01:00"  # the same instant as T0
T1 = "2025-03-01T10:05:00Z"
T2 = "2025-03-01T10:10:00+00:00"
SRC = "transcript:s1:1"
SRC2 = "transcript:s1:2"


def fact(item_id: str, content: str = "the store is SQLite", at: str = T0) -> Fact:
    return Fact(item_id, content, SRC, at)


def todo(item_id: str, status: str = "open", at: str = T0, source: str = SRC) -> PendingItem:
    return PendingItem(item_id, f"do {item_id}", status, source, at)  # type: ignore[arg-type]


def evidence(item_id: str, rank: int = 1, score: float = 0.5) -> Evidence:
    return Evidence(item_id, f"memory {item_id}", SRC, T0, score, rank, T0, None)


def event(event_id: str, content: object = None, type_: str = "message") -> TranscriptEvent:
    return TranscriptEvent(
        event_id,
        T0,
        type_,  # type: ignore[arg-type]
        "user" if type_ == "message" else "assistant",
        content if content is not None else [{"type": "text", "text": event_id}],
        True,
    )


# -- migrations -------------------------------------------------------------------------------


async def test_migrations_recorded_and_idempotent(store_url: str) -> None:
    first = await open_store(store_url)
    applied = await first.applied_migrations()
    assert [m.version for m in applied] == [m.version for m in MIGRATIONS]  # every one, in order
    assert all(m.name and m.applied_at for m in applied)
    await first.write_changes("t", "s1", [Create(fact("f1"))])
    await first.close()

    for _ in range(2):
        again = await open_store(store_url)
        assert await again.applied_migrations() == applied  # same rows, same applied_at
        assert [f.id for f in (await again.current_state("t", "s1")).facts] == ["f1"]
        await again.close()


async def test_concurrent_first_opens_migrate_once(store_url: str) -> None:
    stores = await asyncio.gather(*(open_store(store_url) for _ in range(4)))
    try:
        results = [await s.applied_migrations() for s in stores]
        assert all(r == results[0] for r in results)
        assert len({m.version for m in results[0]}) == len(results[0])
    finally:
        for s in stores:
            await s.close()


# -- validation: all or nothing ----------------------------------------------------------------


async def test_validation_names_every_bad_field_and_writes_nothing(store: Store) -> None:
    changes = [
        Create(fact("f-ok")),
        Create(Fact("f-bad", "", SRC, "2025-03-01T10:00:00")),  # empty content, no offset
        Create(Evidence("m1", "t", "transcript:s1:0", T0, 1.5, 0, T0)),  # bad pointer/score/rank
        Create(fact("f-ok")),  # the same id again, in the same batch
    ]
    with pytest.raises(InvalidWrite) as caught:
        await store.write_changes("t", "s1", changes)
    fields = [e.field for e in caught.value.errors]
    assert fields == [
        "changes[1].item.content",
        "changes[1].item.last_confirmed_at",
        "changes[2].item.score",
        "changes[2].item.rank",
        "changes[2].item.source",
        "changes[3].item.id",
    ]
    assert await store.history("t", "s1") == ()
    assert await store.current_state("t", "s1") == DurableState()
    assert await store.list_sessions("t") == ()


async def test_bad_tenant_or_session_rejected(store: Store) -> None:
    for tenant, session in (("", "s1"), ("t", ""), ("t", "../x"), ("t", "a b")):
        with pytest.raises(InvalidWrite):
            await store.write_changes(tenant, session, [Create(fact("f1"))])
        with pytest.raises(InvalidWrite):
            await store.transcript_events(tenant, session)
    assert await store.list_sessions("t") == ()


# -- versioned history -----------------------------------------------------------------------------


async def test_every_change_is_versioned_and_the_view_is_derived(store: Store) -> None:
    assert await store.write_changes("t", "s1", [Create(fact("f1", "v1"))]) == (1,)
    assert await store.write_changes("t", "s1", [Update(fact("f1", "v2", T1))]) == (2,)
    assert await store.write_changes(
        "t", "s1", [Update(fact("f1", "v3", T2)), Create(fact("f2")), Update(fact("f2", "x"))]
    ) == (3, 1, 2)
    assert await store.write_changes("t", "s1", [Retire("fact", "f1", SRC2, T2)]) == (4,)

    history = await store.history("t", "s1")
    assert [h.seq for h in history] == [1, 2, 3, 4, 5, 6]
    assert [(h.event.item_id, h.event.version, h.event.op) for h in history] == [
        ("f1", 1, "create"),
        ("f1", 2, "update"),
        ("f1", 3, "update"),
        ("f2", 1, "create"),
        ("f2", 2, "update"),
        ("f1", 4, "retire"),
    ]
    state = await store.current_state("t", "s1")
    assert state == apply(h.event for h in history)
    assert state.facts == (fact("f2", "x"),)
    record = state.record("fact", "f1")
    assert record is not None and record.retired and record.version == 4

    # A retired id stays taken; changing it is refused.
    for change in (Create(fact("f1")), Update(fact("f1", "v5", T2))):
        with pytest.raises(InvalidWrite) as caught:
            await store.write_changes("t", "s1", [change])
        assert [e.field for e in caught.value.errors] == ["changes[0].item.id"]
    assert len(await store.history("t", "s1")) == 6


async def test_state_seen_by_another_store_on_the_same_database(store_url: str) -> None:
    a, b = await open_store(store_url), await open_store(store_url)
    try:
        await a.write_changes("t", "s1", [Create(fact("f1"))])
        assert [f.id for f in (await b.current_state("t", "s1")).facts] == ["f1"]
        await b.write_changes("t", "s1", [Update(fact("f1", "from b", T1))])
        assert (await a.current_state("t", "s1")).facts == (fact("f1", "from b", T1),)
        assert await a.write_changes("t", "s1", [Update(fact("f1", "from a", T2))]) == (3,)
    finally:
        await a.close()
        await b.close()


# -- pending transitions -------------------------------------------------------------------------


async def test_allowed_pending_transitions(store: Store) -> None:
    await store.write_changes("t", "s1", [Create(todo("p1"))])
    assert await store.write_changes("t", "s1", [Update(todo("p1", "blocked", T0))]) == (2,)
    assert await store.write_changes("t", "s1", [Update(todo("p1", "open", T0))]) == (3,)
    done = todo("p1", "done", T1, SRC2)
    assert await store.write_changes("t", "s1", [Update(done)]) == (4,)
    assert (await store.current_state("t", "s1")).pending == (done,)

    await store.write_changes("t", "s1", [Create(todo("p2", "blocked"))])
    assert await store.write_changes("t", "s1", [Update(todo("p2", "done", T1, SRC2))]) == (2,)


@pytest.mark.parametrize(
    ("start", "change", "field", "message_part"),
    [
        pytest.param(None, Create(todo("p1", "done")), "status", "open or blocked", id="born-done"),
        pytest.param("done", Update(todo("p1", "open", T2)), "status", "final", id="reopen-done"),
        pytest.param("done", Update(todo("p1", "done", T2)), "status", "final", id="update-done"),
        pytest.param(
            "open", Update(todo("p1", "done", T1, "")), "source", "empty", id="done-no-pointer"
        ),
        pytest.param(
            "open",
            Update(todo("p1", "done", T0)),
            "last_confirmed_at",
            "later",
            id="done-same-time",
        ),
        pytest.param(
            "open",
            Update(todo("p1", "done", T0_OTHER_ZONE)),
            "last_confirmed_at",
            "later",
            id="done-same-instant-other-zone",
        ),
        pytest.param(
            "open",
            Update(todo("p1", "blocked", "2025-03-01T09:00:00Z")),
            "last_confirmed_at",
            "earlier",
            id="back-in-time",
        ),
        pytest.param(
            "open", Update(todo("p1", "finished", T1)), "status", "one of", id="unknown-status"
        ),
    ],
)
async def test_forbidden_pending_transitions(
    store: Store, start: str | None, change: Update | Create, field: str, message_part: str
) -> None:
    if start is not None:
        await store.write_changes("t", "s1", [Create(todo("p1"))])
        if start == "done":
            await store.write_changes("t", "s1", [Update(todo("p1", "done", T1, SRC2))])
    before = await store.history("t", "s1")
    with pytest.raises(InvalidWrite) as caught:
        await store.write_changes("t", "s1", [change])
    assert [e.field for e in caught.value.errors] == [f"changes[0].item.{field}"]
    assert message_part in caught.value.errors[0].message
    assert await store.history("t", "s1") == before


# -- tenant isolation ------------------------------------------------------------------------------


async def test_same_session_id_in_two_tenants_never_leaks(store: Store) -> None:
    await store.write_changes("acme", "s1", [Create(fact("f1", "acme secret")), Create(todo("p1"))])
    await store.append_transcript("acme", "s1", [event("e1"), event("e2")], 2, "acme-hash")
    await store.put_manifest("acme", "c1", "s1", '{"owner": "acme"}')

    assert await store.current_state("globex", "s1") == DurableState()
    assert await store.history("globex", "s1") == ()
    assert await store.transcript_events("globex", "s1") == ()
    assert await store.recorded_prefix("globex", "s1") == EMPTY_PREFIX
    assert await store.get_manifest("globex", "c1") is None
    assert await store.list_sessions("globex") == ()

    # The other tenant uses the same ids independently: its own versions, seqs and manifests.
    assert await store.write_changes("globex", "s1", [Create(fact("f1", "globex"))]) == (1,)
    assert await store.append_transcript("globex", "s1", [event("e1")], 1, "globex-hash") == 1
    await store.put_manifest("globex", "c1", "s1", '{"owner": "globex"}')

    acme_state = await store.current_state("acme", "s1")
    assert [f.content for f in acme_state.facts] == ["acme secret"]
    assert [f.content for f in (await store.current_state("globex", "s1")).facts] == ["globex"]
    assert [e.seq for e in await store.transcript_events("acme", "s1")] == [1, 2]
    assert [e.seq for e in await store.transcript_events("globex", "s1")] == [1]
    assert await store.recorded_prefix("acme", "s1") == Prefix(2, "acme-hash")
    assert await store.recorded_prefix("globex", "s1") == Prefix(1, "globex-hash")
    acme_manifest = await store.get_manifest("acme", "c1")
    globex_manifest = await store.get_manifest("globex", "c1")
    assert acme_manifest is not None and acme_manifest.manifest_json == '{"owner": "acme"}'
    assert globex_manifest is not None and globex_manifest.manifest_json == '{"owner": "globex"}'
    assert await store.list_sessions("acme") == ("s1",)
    assert await store.list_sessions("globex") == ("s1",)
    assert len(await store.history("acme", "s1")) == 2
    assert len(await store.history("globex", "s1")) == 1


async def test_list_sessions(store: Store) -> None:
    assert await store.list_sessions("t") == ()
    await store.write_changes("t", "s2", [Create(fact("f1"))])
    await store.append_transcript("t", "s1", [event("e1")], 1, "h")
    await store.put_manifest("t", "c1", "s3", "{}")
    await store.append_transcript("t", "s1", [event("e2")], 2, "h2")
    assert await store.list_sessions("t") == ("s1", "s2", "s3")


# -- transcripts -----------------------------------------------------------------------------------


async def test_transcript_append_read_and_prefix(store: Store) -> None:
    assert await store.recorded_prefix("t", "s1") == EMPTY_PREFIX
    first = [event("e1", {"role": "user", "content": "hi"}), event("e2", "plain text")]
    assert await store.append_transcript("t", "s1", first, 2, "h2") == 1
    cut = TranscriptEvent("e3", T0_OTHER_ZONE, "answer", "assistant", [{"type": "text"}], False)
    assert await store.append_transcript("t", "s1", [cut], 3, "h3") == 3
    assert await store.recorded_prefix("t", "s1") == Prefix(3, "h3")

    recorded = await store.transcript_events("t", "s1")
    assert [r.seq for r in recorded] == [1, 2, 3]
    assert [r.event for r in recorded] == [*first, cut]
    assert [r.pointer for r in recorded] == [f"transcript:s1:{n}" for n in (1, 2, 3)]
    assert [(r.prefix_count, r.prefix_hash) for r in recorded] == [(2, "h2"), (2, "h2"), (3, "h3")]
    assert recorded[2].event.complete is False

    assert [r.seq for r in await store.transcript_events("t", "s1", after_seq=1, limit=1)] == [2]
    assert await store.transcript_events("t", "s1", after_seq=3) == ()
    with pytest.raises(InvalidWrite):
        await store.transcript_events("t", "s1", limit=0)


async def test_transcript_expected_prefix(store: Store) -> None:
    await store.append_transcript("t", "s1", [event("e1")], 1, "h1", expected_prefix=EMPTY_PREFIX)
    with pytest.raises(PrefixConflict) as caught:
        await store.append_transcript(
            "t", "s1", [event("e2")], 2, "h2", expected_prefix=EMPTY_PREFIX
        )
    assert caught.value.current == Prefix(1, "h1")
    assert (
        await store.append_transcript(
            "t", "s1", [event("e2")], 2, "h2", expected_prefix=Prefix(1, "h1")
        )
        == 2
    )
    assert [r.event.event_id for r in await store.transcript_events("t", "s1")] == ["e1", "e2"]


async def test_transcript_rejects_duplicates_and_bad_events(store: Store) -> None:
    await store.append_transcript("t", "s1", [event("e1")], 1, "h1")
    with pytest.raises(DuplicateEvent):
        await store.append_transcript("t", "s1", [event("e2"), event("e1")], 3, "h3")
    bad = TranscriptEvent("", "2025-03-01 10:00", "note", "", {1: object()}, "yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidWrite) as caught:
        await store.append_transcript("t", "s1", [event("e9"), bad, event("e9")], -1, "h")
    assert [e.field for e in caught.value.errors] == [
        "prefix_count",
    ]
    with pytest.raises(InvalidWrite) as caught:
        await store.append_transcript("t", "s1", [event("e9"), bad, event("e9")], 3, "h")
    assert [e.field for e in caught.value.errors] == [
        "events[1].event_id",
        "events[1].recorded_at",
        "events[1].type",
        "events[1].role",
        "events[1].complete",
        "events[1].content",
        "events[2].event_id",
    ]
    with pytest.raises(InvalidWrite):
        await store.append_transcript("t", "s1", [], 1, "h1")
    assert [r.seq for r in await store.transcript_events("t", "s1")] == [1]
    assert await store.recorded_prefix("t", "s1") == Prefix(1, "h1")


def _check_contiguous(recorded_ids: list[str], batches: list[tuple[int, list[str]]]) -> None:
    assert len(recorded_ids) == len(set(recorded_ids)), "duplicate events"
    expected = sorted(itertools.chain.from_iterable(ids for _, ids in batches))
    assert sorted(recorded_ids) == expected, "lost or foreign events"
    for first_seq, ids in batches:  # each batch landed whole and in order at its first_seq
        assert recorded_ids[first_seq - 1 : first_seq - 1 + len(ids)] == ids


async def _all_events(store: Store, tenant: str, session: str) -> list[str]:
    recorded = await store.transcript_events(tenant, session, limit=10_000)
    assert [r.seq for r in recorded] == list(range(1, len(recorded) + 1)), "gap in the sequence"
    return [r.event.event_id for r in recorded]


async def test_concurrent_appenders_in_tasks(store: Store) -> None:
    batches: list[tuple[int, list[str]]] = []

    async def appender(worker: int) -> None:
        rng = random.Random(worker)
        for n in range(15):
            ids = [f"w{worker}-{n}-{k}" for k in range(rng.randint(1, 3))]
            first = await store.append_transcript(
                "t", "s1", [event(i) for i in ids], n, f"h{worker}-{n}"
            )
            batches.append((first, ids))

    await asyncio.gather(*(appender(w) for w in range(12)))
    _check_contiguous(await _all_events(store, "t", "s1"), batches)


async def test_concurrent_appenders_in_threads_with_their_own_stores(store_url: str) -> None:
    # Sized to stay well inside the store's busy timeout on a loaded 2-core CI machine.
    WORKERS, ROUNDS = 4, 12
    batches: list[tuple[int, list[str]]] = []

    def appender(worker: int) -> None:
        async def run() -> None:
            own = await open_store(store_url)
            try:
                rng = random.Random(worker)
                for n in range(ROUNDS):
                    ids = [f"w{worker}-{n}-{k}" for k in range(rng.randint(1, 3))]
                    first = await own.append_transcript("t", "s1", [event(i) for i in ids], n, "h")
                    batches.append((first, ids))
                    await own.write_changes("t", "s1", [Create(fact(f"f-{worker}-{n}"))])
            finally:
                await own.close()

        asyncio.run(run())

    await asyncio.gather(*(asyncio.to_thread(appender, w) for w in range(WORKERS)))
    reader = await open_store(store_url)
    try:
        _check_contiguous(await _all_events(reader, "t", "s1"), batches)
        history = await reader.history("t", "s1")
        assert [h.seq for h in history] == list(range(1, WORKERS * ROUNDS + 1))
        assert len((await reader.current_state("t", "s1")).facts) == WORKERS * ROUNDS
    finally:
        await reader.close()


async def test_concurrent_updates_of_one_item_get_distinct_versions(store_url: str) -> None:
    stores = [await open_store(store_url) for _ in range(4)]
    try:
        await stores[0].write_changes("t", "s1", [Create(todo("p1"))])

        async def updater(s: Store, worker: int) -> list[int]:
            versions: list[int] = []
            for n in range(10):
                item = PendingItem("p1", f"w{worker} n{n}", "open", SRC, T0)
                versions += await s.write_changes("t", "s1", [Update(item)])
            return versions

        results = await asyncio.gather(*(updater(s, w) for w, s in enumerate(stores)))
        all_versions = sorted(itertools.chain.from_iterable(results))
        assert all_versions == list(range(2, 42))
        record = (await stores[1].current_state("t", "s1")).record("pending", "p1")
        assert record is not None and record.version == 41
    finally:
        for s in stores:
            await s.close()


# -- manifests ----------------------------------------------------------------------------------


async def test_manifests(store: Store) -> None:
    manifest = orjson.dumps({"records": [{"kind": "truncated", "tokens_before": 9000}]}).decode()
    await store.put_manifest("t", "c1", "s1", manifest)
    await store.put_manifest("t", "c1", "s1", manifest)  # identical again: a no-op
    stored = await store.get_manifest("t", "c1")
    assert stored is not None
    assert (stored.compaction_id, stored.session, stored.manifest_json) == ("c1", "s1", manifest)
    with pytest.raises(ManifestConflict):
        await store.put_manifest("t", "c1", "s1", "{}")
    with pytest.raises(ManifestConflict):
        await store.put_manifest("t", "c1", "s2", manifest)
    with pytest.raises(InvalidWrite) as caught:
        await store.put_manifest("t", "", "s1", "{not json")
    assert [e.field for e in caught.value.errors] == ["compaction_id", "manifest_json"]
    assert await store.get_manifest("t", "c2") is None
    after = await store.get_manifest("t", "c1")
    assert after is not None and after.manifest_json == manifest


# -- model output cannot change durable state ------------------------------------------------------


async def test_recorded_answers_and_summaries_do_not_change_durable_state(store: Store) -> None:
    await store.write_changes(
        "t", "s1", [Create(fact("f1", "persistence uses SQLite")), Create(todo("p1"))]
    )
    before = await store.current_state("t", "s1")
    rendered = render_state(before, {})
    summary = "persistence uses plain JSON; no pending work"
    await store.append_transcript(
        "t", "s1", [event("a1", [{"type": "text", "text": summary}], "answer")], 2, "h"
    )
    await store.put_manifest("t", "c1", "s1", orjson.dumps({"summary": summary}).decode())
    after = await store.current_state("t", "s1")
    assert after == before
    assert render_state(after, {}) == rendered
    assert [h.event.item_id for h in await store.history("t", "s1")] == ["f1", "p1"]


# -- lifecycle -----------------------------------------------------------------------------------


async def test_ping_and_close(store_url: str) -> None:
    opened = await open_store(store_url)
    assert await opened.ping() is True
    await opened.close()
    await opened.close()  # idempotent
    assert await opened.ping() is False
    with pytest.raises(StoreUnavailable):
        await opened.current_state("t", "s1")
    with pytest.raises(StoreUnavailable):
        await opened.append_transcript("t", "s1", [event("e1")], 1, "h")


@pytest.mark.parametrize(
    "url", ["", "mysql://x/y", "postgresql://user:secret@db:notaport/x", "sqlite://", "sqlite:///"]
)
async def test_unusable_urls(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        await open_store(url)
    assert "secret" not in str(caught.value)
