"""Acknowledged writes survive SIGKILL at any moment (SQLite backend).

A writer process (``crash_writer.py``) acknowledges facts, transcript batches and pending-item
updates as fast as it can and prints each one after the store returned. The test kills it with
SIGKILL at a random moment -- sometimes during start-up and migration, mostly in the middle of a
stream of writes -- restarts it on the same file, and after every kill checks:

* every acknowledged fact, event batch and pending version is there;
* no duplicate event ids, transcript seqs 1..N without a gap, history seqs without a gap, item
  versions consistent (``apply`` refuses anything else), the recorded prefix is the last batch's;
* ``PRAGMA integrity_check`` is ``ok``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy.store import Prefix, RecordedEvent, Store, open_store

REPO = Path(__file__).resolve().parents[2]
TENANT, SESSION = "crash", "s1"


@dataclass
class Acked:
    facts: set[str] = field(default_factory=set)
    batches: list[tuple[int, str, str]] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)

    def add(self, line: str) -> None:
        kind, *rest = line.split()
        if kind == "fact":
            self.facts.add(rest[0])
        elif kind == "events":
            self.batches.append((int(rest[0]), rest[1], rest[2]))
        elif kind == "pending":
            self.pending[rest[0]] = max(self.pending.get(rest[0], 0), int(rest[1]))
        else:
            raise AssertionError(f"unexpected writer output {line!r}")


@contextmanager
def writer_process(url: str, run: int, stderr_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """The crash writer (``tests.store.crash_writer``) running on ``url``, and the complete lines
    it has printed so far (each an acknowledged write); killed and reaped on the way out."""
    lines: list[str] = []
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.store.crash_writer", url, str(run)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                if line.endswith("\n"):  # a line cut by the kill was never acknowledged whole
                    lines.append(line.rstrip("\n"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield proc, lines
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            reader.join(10)
            stdout.close()


def wait_for_lines(proc: subprocess.Popen[str], lines: list[str], target: int) -> None:
    deadline = time.monotonic() + 30
    while len(lines) < target and proc.poll() is None:
        assert time.monotonic() < deadline, "the writer makes no progress"
        time.sleep(0.002)


def run_and_kill(url: str, run: int, rng: random.Random, stderr_path: Path) -> list[str]:
    """Start the writer, SIGKILL it at a random moment, return its complete output lines."""
    with writer_process(url, run, stderr_path) as (proc, lines):
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0.0, 0.5))  # maybe while importing, opening, migrating
        else:
            wait_for_lines(proc, lines, rng.randint(1, 60))
            time.sleep(rng.uniform(0.0, 0.01))
        proc.send_signal(signal.SIGKILL)
        returncode = proc.wait(10)
    errors = stderr_path.read_text(errors="replace")
    assert returncode == -signal.SIGKILL, f"the writer stopped by itself:\n{errors}"
    return lines


async def _all_events(store: Store) -> list[RecordedEvent]:
    events: list[RecordedEvent] = []
    while True:
        page = await store.transcript_events(TENANT, SESSION, after_seq=len(events), limit=5000)
        if not page:
            return events
        events += page


async def verify(url: str, acked: Acked) -> None:
    store = await open_store(url)
    try:
        state = await store.current_state(TENANT, SESSION)  # a fresh fold: apply() checks versions
        history = await store.history(TENANT, SESSION)
        events = await _all_events(store)
        prefix = await store.recorded_prefix(TENANT, SESSION)
    finally:
        await store.close()

    assert [h.seq for h in history] == list(range(1, len(history) + 1))
    assert acked.facts <= {f.id for f in state.facts}
    for item_id, version in acked.pending.items():
        record = state.record("pending", item_id)
        assert record is not None and record.version >= version, item_id

    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    ids = [e.event.event_id for e in events]
    assert len(ids) == len(set(ids))
    for first, id0, id1 in acked.batches:
        assert ids[first - 1 : first + 1] == [id0, id1]
    if events:
        last = events[-1]
        assert prefix == Prefix(last.prefix_count, last.prefix_hash)


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        (result,) = conn.execute("PRAGMA integrity_check").fetchone()
        return str(result)
    finally:
        conn.close()


def crash_loop(tmp_path: Path, kills: int) -> None:
    path = tmp_path / "crash.db"
    url = f"sqlite:///{path}"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    acked = Acked()
    for run in range(kills):
        for line in run_and_kill(url, run, rng, tmp_path / "writer.stderr"):
            acked.add(line)
        try:
            asyncio.run(verify(url, acked))
            assert integrity(path) == "ok"
        except AssertionError as exc:
            raise AssertionError(f"after kill {run + 1} (seed {seed}): {exc}") from exc
    # The kills landed in the middle of real work, not only before it.
    assert len(acked.facts) >= kills
    assert acked.batches


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    crash_loop(tmp_path, kills=15)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_acknowledged_writes_survive_sigkill_100_times(tmp_path: Path) -> None:
    crash_loop(tmp_path, kills=100)
