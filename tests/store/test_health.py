"""The store's health (proxy/store/health.py): outcomes by start time, one line per kind per
interval, the held-back count at the interval's end; and both backends reporting into it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from proxy.core.durable import FieldError, InvalidWrite
from proxy.store import SQLiteStore, StoreBusy, StoreUnavailable
from proxy.store.health import Outcomes, StoreHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _health(clock: Clock) -> tuple[StoreHealth, list[str]]:
    logger = logging.getLogger(f"test.health.{id(clock)}")
    logger.propagate = False
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    logger.handlers[:] = [Keep()]
    logger.setLevel(logging.INFO)
    return StoreHealth(interval=10.0, clock=clock, logger=logger), lines


DOWN = StoreUnavailable("the store failed (ConnectionRefusedError)")


@pytest.mark.parametrize(
    ("events", "ok"),
    [
        ([], True),
        ([(1, 2, "x")], False),
        ([(1, 2, "x"), (3, 4, None)], True),
        # a read that started before the newest success and fails after it: still up
        ([(1, 5, "x"), (2, 3, None)], True),
        # and the other way round: an old success cannot hide a newer failure
        ([(2, 3, "x"), (1, 4, None)], False),
        ([(1, 2, None), (3, 4, "x"), (5, 6, "x")], False),
    ],
)
def test_the_most_recently_started_operation_decides(
    events: list[tuple[float, float, str | None]], ok: bool
) -> None:
    outcomes = Outcomes()
    for started, now, error in events:
        outcomes.record(started, now, error)
    assert outcomes.ok is ok


def test_failures_are_counted_until_a_success() -> None:
    outcomes = Outcomes()
    for t in range(3):
        outcomes.record(t, t, "x")
    outcomes.record(-5, 10, "late")  # an older one, ending late: counted, not deciding
    assert (outcomes.ok, outcomes.failures, outcomes.why) == (False, 4, "late")
    assert outcomes.record(11, 12, None) is True
    assert (outcomes.ok, outcomes.failures) == (True, 0)
    assert outcomes.fresh(13, 5.0) and not outcomes.fresh(17.5, 5.0)


def test_one_line_per_kind_per_interval_then_the_count() -> None:
    clock = Clock()
    health, lines = _health(clock)
    for _ in range(50):
        health.lost("transcripts", DOWN, "recorded from the session's next request")
        health.lost("the usage ledger", DOWN)
        clock.now += 0.1  # 5 s in all
    assert lines == [
        "WARNING store unavailable for transcripts: the store failed (ConnectionRefusedError);"
        " recorded from the session's next request",
        "WARNING store unavailable for the usage ledger: the store failed (ConnectionRefusedError)",
    ]
    clock.now += 5.5
    health.flush()  # the interval ended: what was held back, once per kind
    assert lines[2:] == [
        "WARNING 49 similar lines suppressed in the last 10s: store unavailable for transcripts",
        "WARNING 49 similar lines suppressed in the last 10s: store unavailable for the usage ledger",
    ]
    health.flush()
    assert len(lines) == 4
    health.lost("transcripts", DOWN)  # a new interval: a line again
    assert len(lines) == 5 and lines[4].startswith("WARNING store unavailable for transcripts")


def test_busy_and_refused_are_their_own_kinds() -> None:
    clock = Clock()
    health, lines = _health(clock)
    health.lost("transcripts", StoreBusy("the store is busy (LockNotAvailableError 55P03)"))
    health.lost("transcripts", InvalidWrite([FieldError("events[0].role", "too long")]))
    health.lost("transcripts", ValueError("some content that must not be logged"))
    assert lines == [
        "WARNING store busy for transcripts: the store is busy (LockNotAvailableError 55P03)",
        "WARNING store refused an operation for transcripts: events[0].role: too long",
    ]
    assert "content" not in " ".join(lines)


def test_changes_of_state_are_said_once_each() -> None:
    clock = Clock()
    health, lines = _health(clock)
    started = health.begin()
    health.ended("session reads", started, None)
    assert lines == [] and health.ready
    for _ in range(20):
        health.ended("session reads", health.begin(), DOWN)
        clock.now += 0.1
    assert not health.ready
    clock.now += 4.0
    health.ended("session reads", health.begin(), None)
    assert health.ready
    assert lines == [
        "WARNING store unavailable for session reads: the store failed (ConnectionRefusedError)",
        "INFO store available again for session reads after 6.0s (20 operations failed)",
    ]
    for kind in ("writes", "reads"):
        health.ended(kind, health.begin(), DOWN)  # type: ignore[arg-type]
        assert health.ready  # requests' session reads still work
        assert lines[-1] == f"WARNING store unavailable for {kind}: the store failed (ConnectionRefusedError)"


async def test_what_is_held_back_is_said_when_the_interval_ends_without_another_line() -> None:
    clock = Clock()
    health, lines = _health(clock)
    health.interval = 0.05
    health.lost("transcripts", DOWN)
    health.lost("transcripts", DOWN)
    clock.now += 1.0  # the clock the limiter reads; the timer runs on the loop's
    await asyncio.sleep(0.2)
    assert lines[-1] == "WARNING 1 similar lines suppressed in the last 0.05s: store unavailable for transcripts"


async def test_sqlite_reports_reads_writes_and_busy(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db", busy_timeout_ms=50)
    try:
        outcomes = store.health.outcomes
        assert await store.list_sessions("t") == ()
        assert outcomes["reads"].at > float("-inf") and outcomes["session reads"].at == float("-inf")
        await store.current_state("t", "s")
        assert outcomes["session reads"].at > float("-inf") and store.health.ready
        await store.put_calibration("t", "m", 1.1)
        assert outcomes["writes"].at > float("-inf")
        # Another process holds the write lock past the busy timeout: busy, and the store up.
        other = await SQLiteStore.open(tmp_path / "s.db", busy_timeout_ms=50)
        try:
            hold = other._conn
            assert hold is not None
            await asyncio.get_running_loop().run_in_executor(
                other._executor, lambda: hold.execute("BEGIN IMMEDIATE")
            )
            with pytest.raises(StoreBusy):
                await store.put_calibration("t", "m", 1.2)
            assert outcomes["writes"].ok
            await asyncio.get_running_loop().run_in_executor(
                other._executor, lambda: hold.execute("ROLLBACK")
            )
        finally:
            await other.close()
    finally:
        await store.close()
    assert not store.health.ready  # closed: not ready, whatever came before
    assert await store.ping() is False
