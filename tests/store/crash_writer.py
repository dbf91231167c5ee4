"""A writer for the crash-safety test: acknowledges writes as fast as it can until it is killed.

Usage: ``python -m tests.store.crash_writer <store-url> <run>``. Two stores (two connections to
the same file, so the write lock is contended) each loop over: create a fact, append a batch of
two transcript events, update the writer's own pending item. After each call *returns* it prints
one line and flushes, so every line on stdout is a write the store acknowledged::

    fact <id>
    events <first_seq> <event_id> <event_id>
    pending <id> <version>
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

from proxy.core.durable import Create, Fact, PendingItem, Update
from proxy.store import Store, TranscriptEvent, open_store

TENANT = "crash"
SESSION = "s1"
SOURCE = "transcript:s1:1"
BASE = datetime(2025, 1, 1, tzinfo=UTC)


def ack(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def writer(store: Store, run: int, worker: int) -> None:
    pending_id = f"p-{run}-{worker}"
    await store.write_changes(
        TENANT,
        SESSION,
        [Create(PendingItem(pending_id, "start", "open", SOURCE, BASE.isoformat()))],
    )
    ack(f"pending {pending_id} 1")
    n = 0
    while True:
        n += 1
        fact_id = f"f-{run}-{worker}-{n}"
        await store.write_changes(
            TENANT, SESSION, [Create(Fact(fact_id, f"fact {n}", SOURCE, BASE.isoformat()))]
        )
        ack(f"fact {fact_id}")

        ids = [f"e-{run}-{worker}-{n}-{k}" for k in (0, 1)]
        events = [
            TranscriptEvent(i, BASE.isoformat(), "message", "user", {"n": n, "id": i}, True)
            for i in ids
        ]
        first = await store.append_transcript(TENANT, SESSION, events, n, f"{run}-{worker}-{n}")
        ack(f"events {first} {ids[0]} {ids[1]}")

        at = (BASE + timedelta(seconds=n)).isoformat()
        (version,) = await store.write_changes(
            TENANT, SESSION, [Update(PendingItem(pending_id, f"step {n}", "open", SOURCE, at))]
        )
        ack(f"pending {pending_id} {version}")


async def main(url: str, run: int) -> None:
    stores = [await open_store(url), await open_store(url)]
    await asyncio.gather(*(writer(s, run, w) for w, s in enumerate(stores)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
