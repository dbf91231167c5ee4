"""The transcripts family: ``transcript_events`` and ``transcript_heads``, on both backends.

Each conversation (a session's main one, ``agent = ''``, or one of its agents', see
``proxy.store.agents``) numbers its events 1, 2, 3... under the session's lock
(``proxy.store.durable.lock_session``); its head row holds the last number and the recorded
prefix.

**Exactly once.** ``record_transcript`` appends only the events whose idempotency key the
conversation does not hold yet (nor an earlier event of the same batch), gives them the next
sequence numbers and records the new prefix: the same batch sent twice, by two replicas at once or
by a retry, is stored once, in the order of its first arrival. Keys are chosen by the caller
(``proxy.server.context.durable``: the position in the conversation and the prefix hash), so a key
means the same event on every replica. Rows written before migration 4 have no key (``NULL``:
never equal to a key, never in the way). ``append_transcript`` is the older, keyless append (the
main conversation only), refusing an event id already recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

import proxy.store.clock as clock
from proxy.store.agents import MAIN, note_agent
from proxy.store.checks import (
    DEFAULT_EVENT_LIMIT,
    MAX_BIGINT,
    check_event_range,
    check_keys,
    check_keys_list,
    check_prefix,
    check_storable,
    encode_events,
)
from proxy.store.durable import lock_session
from proxy.store.errors import DuplicateEvent, PrefixConflict
from proxy.store.sql import Jobs, Row, Tx
from proxy.store.values import (
    EMPTY_PREFIX,
    KeyedEvent,
    Prefix,
    Recorded,
    RecordedEvent,
    TranscriptEvent,
)

__all__ = ["TranscriptsFamily"]

_CHUNK = 500  # keys per query (SQLite's variable limit is far above)

_INSERT = (
    "INSERT INTO transcript_events (tenant, session, agent, seq, event_id, recorded_at, type,"
    " role, content, complete, prefix_count, prefix_hash, event_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SET_HEAD = (
    "INSERT INTO transcript_heads (tenant, session, agent, last_seq, prefix_count, prefix_hash)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session, agent) DO UPDATE"
    " SET last_seq = excluded.last_seq, prefix_count = excluded.prefix_count,"
    " prefix_hash = excluded.prefix_hash"
)


def _check_event_text(prefix_hash: str, events: Sequence[TranscriptEvent]) -> None:
    check_storable(
        [("prefix_hash", prefix_hash)]
        + [
            (f"events[{i}].{name}", value)
            for i, e in enumerate(events)
            for name, value in (("event_id", e.event_id), ("role", e.role))
        ]
    )


async def _head(tx: Tx, tenant: str, session: str, agent: str) -> tuple[int, Prefix]:
    """The conversation's last sequence number and recorded prefix (0, empty: none yet)."""
    row = await tx.row(
        "SELECT last_seq, prefix_count, prefix_hash FROM transcript_heads"
        " WHERE tenant = ? AND session = ? AND agent = ?",
        tenant,
        session,
        agent,
    )
    if row is None:
        return 0, EMPTY_PREFIX
    return int(row[0]), Prefix(int(row[1]), str(row[2]))


async def _append(
    tx: Tx,
    tenant: str,
    session: str,
    agent: str,
    after: int,
    events: Sequence[tuple[TranscriptEvent, bytes, str | None]],
    prefix: Prefix,
) -> int:
    """Insert ``events`` (event, its JSON content, its key) after sequence ``after``, and set the
    head; the conversation's last sequence number after them."""
    await tx.executemany(
        _INSERT,
        [
            (
                tenant, session, agent, after + n, e.event_id, e.recorded_at, e.type, e.role,
                content.decode(), e.complete, prefix.count, prefix.hash, key,
            )
            for n, (e, content, key) in enumerate(events, 1)
        ],
    )  # fmt: skip
    last = after + len(events)
    await tx.execute(_SET_HEAD, tenant, session, agent, last, prefix.count, prefix.hash)
    return last


async def _seqs(tx: Tx, tenant: str, session: str, agent: str, keys: Sequence[str]) -> dict[str, int]:
    """The sequence number of each of ``keys`` the conversation holds."""
    found: dict[str, int] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), _CHUNK):
        where, params = tx.dialect.any_of("event_key", unique[start : start + _CHUNK])
        rows = await tx.rows(
            "SELECT event_key, seq FROM transcript_events WHERE tenant = ? AND session = ?"
            f" AND agent = ? AND {where}",
            tenant,
            session,
            agent,
            *params,
        )
        found.update((str(r[0]), int(r[1])) for r in rows)
    return found


def _event(session: str, agent: str, row: Row) -> RecordedEvent:
    seq, event_id, recorded_at, type_, role, content, complete, prefix_count, prefix_hash = row
    event = TranscriptEvent(
        str(event_id), str(recorded_at), type_, str(role), orjson.loads(content), bool(complete)
    )
    return RecordedEvent(session, int(seq), event, int(prefix_count), str(prefix_hash), agent)


class TranscriptsFamily(Jobs):
    """``append_transcript``, ``record_transcript``, ``transcript_keys_held``,
    ``transcript_seqs``, ``transcript_events``, ``recorded_prefix``."""

    async def append_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[TranscriptEvent],
        prefix_count: int,
        prefix_hash: str,
        *,
        expected_prefix: Prefix | None = None,
    ) -> int:
        check_keys(tenant, session)
        check_prefix(prefix_count, prefix_hash)
        events = tuple(events)
        contents = encode_events(events)
        _check_event_text(prefix_hash, events)
        ids = [e.event_id for e in events]

        async def job(tx: Tx) -> int:
            async with tx.transaction():
                await lock_session(tx, tenant, session, clock.now_iso())
                last_seq, current = await _head(tx, tenant, session, MAIN)
                if expected_prefix is not None and expected_prefix != current:
                    raise PrefixConflict(current)
                where, params = tx.dialect.any_of("event_id", ids)
                if await tx.row(
                    "SELECT 1 FROM transcript_events WHERE tenant = ? AND session = ?"
                    f" AND agent = ? AND {where}",
                    tenant,
                    session,
                    MAIN,
                    *params,
                ):
                    raise DuplicateEvent("an event id is already recorded in this session")
                batch = [(e, c, None) for e, c in zip(events, contents, strict=True)]
                prefix = Prefix(prefix_count, prefix_hash)
                await _append(tx, tenant, session, MAIN, last_seq, batch, prefix)
            return last_seq + 1

        return await self._run(job)

    async def record_transcript(
        self,
        tenant: str,
        session: str,
        events: Sequence[KeyedEvent],
        prefix: Prefix,
        *,
        agent: str = "",
        parent: str = "",
    ) -> Recorded:
        check_keys(tenant, session, agent)
        check_keys(tenant, None, parent)
        check_prefix(prefix.count, prefix.hash)
        events = tuple(events)
        check_keys_list(k.key for k in events)
        contents = encode_events([k.event for k in events])
        _check_event_text(prefix.hash, [k.event for k in events])

        async def job(tx: Tx) -> Recorded:
            async with tx.transaction():
                now = clock.now_iso()
                await lock_session(tx, tenant, session, now)
                last_seq, _ = await _head(tx, tenant, session, agent)
                seen = set(await _seqs(tx, tenant, session, agent, [k.key for k in events]))
                todo = []
                for keyed, content in zip(events, contents, strict=True):
                    if keyed.key not in seen:  # not held, and the first of its key in the batch
                        seen.add(keyed.key)
                        todo.append((keyed.event, content, keyed.key))
                last = await _append(tx, tenant, session, agent, last_seq, todo, prefix)
                if agent:
                    await note_agent(tx, tenant, session, agent, parent, now)
            return Recorded(tuple(range(last_seq + 1, last + 1)), last)

        return await self._run(job)

    async def transcript_keys_held(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> frozenset[str]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)

        async def job(tx: Tx) -> frozenset[str]:
            return frozenset(await _seqs(tx, tenant, session, agent, keys))

        # on the write connection: after this store's queued writes (the recorder's chain asks
        # whether the answer it is waiting for was recorded)
        return await self._run(job)

    async def transcript_seqs(
        self, tenant: str, session: str, keys: Sequence[str], *, agent: str = ""
    ) -> dict[str, int]:
        check_keys(tenant, session, agent)
        keys = tuple(keys)
        check_keys_list(keys)

        async def job(tx: Tx) -> dict[str, int]:
            return await _seqs(tx, tenant, session, agent, keys)

        return await self._read(job)

    async def transcript_events(
        self,
        tenant: str,
        session: str,
        after_seq: int = 0,
        limit: int = DEFAULT_EVENT_LIMIT,
        *,
        agent: str = "",
    ) -> tuple[RecordedEvent, ...]:
        check_keys(tenant, session, agent)
        check_event_range(after_seq, limit)
        if after_seq > MAX_BIGINT:
            return ()

        async def job(tx: Tx) -> tuple[RecordedEvent, ...]:
            rows = await tx.rows(
                "SELECT seq, event_id, recorded_at, type, role, content, complete, prefix_count,"
                " prefix_hash FROM transcript_events WHERE tenant = ? AND session = ?"
                " AND agent = ? AND seq > ? ORDER BY seq LIMIT ?",
                tenant,
                session,
                agent,
                after_seq,
                limit,
            )
            return tuple(_event(session, agent, row) for row in rows)

        return await self._read(job)

    async def recorded_prefix(self, tenant: str, session: str, *, agent: str = "") -> Prefix:
        check_keys(tenant, session, agent)

        async def job(tx: Tx) -> Prefix:
            return (await _head(tx, tenant, session, agent))[1]

        return await self._read(job)
