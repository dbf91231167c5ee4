"""How long a store read waits while another process holds the SQLite write lock and this store
has background writes queued (issue 11 #4). Rerun: ``python bench/bench_store_reads.py``.

A child process takes ``BEGIN IMMEDIATE`` on the store's file and keeps it; the store gets
``--writes`` transcript records (as the proxy's background recording does), each waiting up to
the busy timeout (5 s) for that lock; then the bench times ``current_state`` +
``transcript_events`` (what the admin ``/state`` and ``/transcript`` routes read), with the lock
still held, and prints the figure. ``--impl sqlalchemy``: the same against the SQLAlchemy Core
prototype of ``bench/store_sqlalchemy.py`` (``pip install -e '.[bench]'``); ``--impl both``: each,
``--runs`` times, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.store import KeyedEvent, Prefix, TranscriptEvent, open_store

BENCH = str(Path(__file__).resolve().parent)
HOLDER = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "sys.stdin.readline()\n"
    "c.execute('COMMIT')\n"
)


async def measure(writes: int, impl: str = "own") -> tuple[float, bool]:
    folder = tempfile.mkdtemp(prefix="bench-store-reads-")
    db = os.path.join(folder, "store.db")
    store: Any = await open_store(f"sqlite:///{db}")
    if impl == "sqlalchemy":
        sys.path.insert(0, BENCH)
        from store_sqlalchemy import SQLAlchemyStore

        await store.close()
        store = SQLAlchemyStore(f"sqlite:///{db}")
    holder = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is timed)
        [sys.executable, "-c", HOLDER, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdout.readline()

    def event(n: int) -> TranscriptEvent:
        return TranscriptEvent(f"e{n}", "2026-01-01T00:00:00+00:00", "message", "user", "x", True)

    queued = [
        asyncio.ensure_future(
            store.record_transcript("t", "s", [KeyedEvent(f"k{n}", event(n))], Prefix(n, "h"))
        )
        for n in range(1, writes + 1)
    ]
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    try:
        await store.current_state("t", "s")
        await store.transcript_events("t", "s")
        elapsed = time.perf_counter() - started
        still_held = holder.poll() is None
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
        await asyncio.gather(*queued, return_exceptions=True)
        await store.close()
    return elapsed, still_held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=3, help="background writes queued (3)")
    parser.add_argument("--impl", choices=("own", "sqlalchemy", "both"), default="own")
    parser.add_argument("--runs", type=int, default=1, help="measurements per implementation")
    args = parser.parse_args()
    impls = ("own", "sqlalchemy") if args.impl == "both" else (args.impl,)
    for _ in range(args.runs):
        for impl in impls:
            elapsed, held = asyncio.run(measure(args.writes, impl))
            print(f"{impl}: read answered in {elapsed:.3f} s with {args.writes} writes queued;"
                  f" the other process still held the lock: {held}")


if __name__ == "__main__":
    main()
