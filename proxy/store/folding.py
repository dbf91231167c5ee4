"""Durable history as both backends store it, and the folded state they keep of it (pure).

A session's durable state is the fold of its append-only history (``proxy.core.durable.apply``).
Each backend keeps the fold of recently used sessions in a :class:`StateCache` and reads only
the history rows after the last ``seq`` it folded. Rows are written and read the same way on
SQLite and PostgreSQL: :func:`change_rows` and :func:`decode_change` (``proxy.store.durable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson

from proxy.core.bounded import Bounded
from proxy.core.durable import (
    EMPTY_STATE,
    ChangeEvent,
    DurableState,
    apply,
)
from proxy.core.durable_json import change_from_json, change_to_json

__all__ = ["StateCache", "change_rows", "decode_change"]

HistoryRow = tuple[int, str, ChangeEvent]  # seq, recorded_at, event


def decode_change(version: int, body: str | bytes) -> ChangeEvent:
    """A ``durable_changes`` row's event, from its ``version`` and JSON ``body``."""
    return ChangeEvent(int(version), change_from_json(orjson.loads(body)))


def change_rows(
    tenant: str, session: str, seq: int, events: Sequence[ChangeEvent], now: str
) -> list[tuple[str, str, int, str, str, int, str, str, str]]:
    """The ``durable_changes`` rows of ``events`` appended after ``seq``, in column order:
    tenant, session, seq, kind, item_id, version, op, body, recorded_at."""
    return [
        (
            tenant,
            session,
            seq + n,
            e.kind,
            e.item_id,
            e.version,
            e.op,
            orjson.dumps(change_to_json(e.change)).decode(),
            now,
        )
        for n, e in enumerate(events, start=1)
    ]


# Memory one session's fold takes (measured: tests/test_bounded_caches.py, a state of a few
# items): the key, the last seq and the DurableState's records.
STATE_BYTES = 2500


class StateCache:
    """The folded state of the ``sessions`` most recently used sessions, with the last ``seq``
    folded into each (``durable_states`` in the metrics). A session pushed out costs its next read
    its whole history, read and folded again. Not locked: its owner (``proxy.store.durable``)
    holds a lock around each call (SQLite's two worker threads share it)."""

    def __init__(self, sessions: int = 512) -> None:
        self.cache: Bounded[tuple[str, str], tuple[int, DurableState]] = Bounded(
            "durable_states", sessions, entry_bytes=STATE_BYTES, idle_forget=True
        )

    def get(self, tenant: str, session: str) -> tuple[int, DurableState]:
        """The cached fold: the last ``seq`` folded and the state (``0``: nothing cached)."""
        return self.cache.get((tenant, session)) or (0, EMPTY_STATE)

    def fold(
        self,
        tenant: str,
        session: str,
        base: tuple[int, DurableState],
        rows: Iterable[HistoryRow],
    ) -> tuple[int, DurableState]:
        """``base`` (what ``get`` gave before the rows were read: another call may have cached a
        newer fold since) with ``rows``, the history after its ``seq``, folded in; remembered."""
        seq, state = base
        rows = list(rows)
        if rows:
            seq, state = rows[-1][0], apply((event for _, _, event in rows), state)
        self.remember(tenant, session, seq, state)
        return seq, state

    def remember(self, tenant: str, session: str, seq: int, state: DurableState) -> None:
        """Keep ``state`` as the fold up to ``seq`` unless a newer fold is kept (calls of one
        store interleave; the history only grows)."""
        key = (tenant, session)
        kept = self.cache.peek(key)
        if seq == 0 or (kept is not None and kept[0] > seq):
            return
        self.cache.put(key, (seq, state))

    def clear(self) -> None:
        self.cache.clear()
