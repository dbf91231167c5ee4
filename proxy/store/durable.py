"""The durable-state family: ``sessions`` and ``durable_changes``, on both backends.

A session's durable state is the fold of its append-only history (``proxy.core.durable.apply``),
with a gap-free ``seq`` per session; the store keeps the fold of recently used sessions
(``proxy.store.folding.StateCache``) and reads only the rows after the last ``seq`` it folded.

**The session's lock.** Every write about a session (durable changes, transcripts, manifests)
begins its transaction with :func:`lock_session`: the upsert of the session's ``sessions`` row.
On PostgreSQL that row stays locked until commit, so it is the per-session head lock: everything
the transaction reads after it (``READ COMMITTED``) is what the previous holder committed, and
concurrent appenders in any number of processes get contiguous sequence numbers; each write locks
one session row only, so there is no lock cycle. On SQLite the transaction already holds the
file's write lock (``BEGIN IMMEDIATE``); the upsert is then just the row's ``updated_at``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import proxy.store.clock as clock
from proxy.core.durable import Change, ChangeEvent, DurableState, apply, prepare_changes
from proxy.store.checks import check_keys
from proxy.store.folding import StateCache, change_rows, decode_change
from proxy.store.sql import Jobs, Tx
from proxy.store.values import HistoryEntry

__all__ = ["DurableFamily", "history_rows", "lock_session"]


async def lock_session(tx: Tx, tenant: str, session: str, now: str) -> None:
    """Create or update the session's row: the first statement of a write about the session."""
    await tx.execute(
        "INSERT INTO sessions (tenant, session, created_at, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant, session) DO UPDATE SET updated_at = excluded.updated_at",
        tenant,
        session,
        now,
        now,
    )


async def history_rows(
    tx: Tx, tenant: str, session: str, after_seq: int
) -> list[tuple[int, str, ChangeEvent]]:
    rows = await tx.rows(
        "SELECT seq, recorded_at, version, body FROM durable_changes"
        " WHERE tenant = ? AND session = ? AND seq > ? ORDER BY seq",
        tenant,
        session,
        after_seq,
    )
    return [(int(seq), str(at), decode_change(version, body)) for seq, at, version, body in rows]


class DurableFamily(Jobs):
    """``write_changes``, ``current_state``, ``history``, ``list_sessions``."""

    def __init__(self) -> None:
        # (tenant, session) -> (last folded seq, state); SQLite's two threads share it.
        self.states = StateCache()
        self._states_lock = threading.Lock()

    async def _state(self, tx: Tx, tenant: str, session: str) -> tuple[int, DurableState]:
        """The session's folded state and the last ``seq`` folded into it."""
        with self._states_lock:
            base = self.states.get(tenant, session)
        rows = await history_rows(tx, tenant, session, base[0])
        with self._states_lock:
            return self.states.fold(tenant, session, base, rows)

    def forget_idle_states(self, now: float, idle: float) -> int:
        """Forget the folded states of sessions not read or written for ``idle`` seconds (their
        next read folds their history again); the count forgotten."""
        with self._states_lock:
            return self.states.cache.forget_idle(now, idle)

    def _forget_states(self) -> None:
        with self._states_lock:
            self.states.clear()

    async def write_changes(
        self, tenant: str, session: str, changes: Sequence[Change]
    ) -> tuple[int, ...]:
        check_keys(tenant, session)
        changes = tuple(changes)

        async def job(tx: Tx) -> tuple[int, ...]:
            async with tx.transaction():
                now = clock.now_iso()
                await lock_session(tx, tenant, session, now)
                seq, state = await self._state(tx, tenant, session)
                events = prepare_changes(state, changes)
                await tx.executemany(
                    "INSERT INTO durable_changes (tenant, session, seq, kind, item_id, version,"
                    " op, body, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    change_rows(tenant, session, seq, events, now),
                )
            with self._states_lock:
                self.states.remember(tenant, session, seq + len(events), apply(events, state))
            return tuple(e.version for e in events)

        return await self._run(job)

    async def current_state(self, tenant: str, session: str) -> DurableState:
        check_keys(tenant, session)

        async def job(tx: Tx) -> DurableState:
            return (await self._state(tx, tenant, session))[1]

        return await self._read(job, "session reads")

    async def history(self, tenant: str, session: str) -> tuple[HistoryEntry, ...]:
        check_keys(tenant, session)

        async def job(tx: Tx) -> tuple[HistoryEntry, ...]:
            rows = await history_rows(tx, tenant, session, 0)
            return tuple(HistoryEntry(seq, at, event) for seq, at, event in rows)

        return await self._read(job, "session reads")

    async def list_sessions(self, tenant: str) -> tuple[str, ...]:
        check_keys(tenant)

        async def job(tx: Tx) -> tuple[str, ...]:
            rows = await tx.rows(
                "SELECT session FROM sessions WHERE tenant = ? ORDER BY session", tenant
            )
            return tuple(str(session) for (session,) in rows)

        return await self._read(job)
