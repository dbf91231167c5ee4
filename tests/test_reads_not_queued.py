"""Reads never queue behind writes (issue 11 #4).

Another process holds the SQLite write lock (``BEGIN IMMEDIATE``) while the proxy has background
transcript writes queued, each waiting up to the busy timeout for that lock. An admin read over
real HTTP, and the readiness ping, must answer while the lock is still held, with what was
committed before; the queued writes then complete once the lock is released.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

from proxy.core.durable import Create, Fact
from proxy.store import TranscriptEvent
from tests.test_admin import (
    T0,
    Admin,
    admin,  # noqa: F401 (the fixture)
)

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("released", flush=True)
"""


def _event(n: int) -> TranscriptEvent:
    return TranscriptEvent(f"e{n}", T0, "message", "user", [{"type": "text", "text": "hi"}], True)


def test_admin_read_answers_while_another_process_holds_the_write_lock(
    admin: Admin,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    tenant = admin.acme.name
    fact = Fact("build", "the build uses uv", "transcript:s1:1", T0)
    admin.run(admin.store.write_changes(tenant, "s1", [Create(fact)]))
    db = tmp_path / "state" / "store.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"

        async def queue_writes() -> list[asyncio.Future[int]]:
            # What the proxy's background transcript recording does: appends, not awaited.
            return [
                asyncio.ensure_future(
                    admin.store.append_transcript(tenant, "s1", [_event(n)], n, f"h{n}")
                )
                for n in (1, 2, 3)
            ]

        writes = admin.run(queue_writes())
        time.sleep(0.3)
        assert not any(w.done() for w in writes)  # they wait for the other process's lock

        started = time.monotonic()
        r = admin.call(
            "GET", "/admin/v1/sessions/s1/state", timeout=httpx.Timeout(5.0)
        )
        elapsed = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert [f["id"] for f in r.json()["facts"]] == ["build"]
        assert admin.run(admin.store.ping()) is True
        r = admin.call("GET", "/admin/v1/sessions/s1/transcript")
        assert r.status_code == 200 and r.json()["events"] == []  # nothing committed yet
        # Still held: the reads did not wait for the lock, nor for the writes queued before them.
        assert holder.poll() is None
        assert not any(w.done() for w in writes)
        assert elapsed < 1.0, elapsed

        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"

        async def finish() -> list[int]:
            return list(await asyncio.gather(*writes))

        assert admin.run(finish()) == [1, 2, 3]
        r = admin.call("GET", "/admin/v1/sessions/s1/transcript")
        assert [e["seq"] for e in r.json()["events"]] == [1, 2, 3]
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(5)
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()
