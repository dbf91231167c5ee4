"""The ledger's writer: rows are written in batches, one wait per batch (not one wake-up per
row), a full batch at once, and ``flush`` writes what is queued without waiting for more.
Against a real SQLite store; the batches it was handed are noted on the way through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from proxy.core.ledger import LedgerEntry
from proxy.server.http.metrics import new_metrics
from proxy.server.ledger import LedgerRecorder, record_upstream_call
from proxy.store import Store, open_store
from proxy.store.usage import UsageQuery
from tests.harness import proxy_config


class NotingStore:
    """The real store, noting the size of every batch handed to ``record_usage``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batches: list[int] = []

    async def record_usage(self, entries: Sequence[LedgerEntry]) -> None:
        self.batches.append(len(entries))
        await self.store.record_usage(entries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[NotingStore]:
    real = await open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        yield NotingStore(real)
    finally:
        await real.close()


def _recorder(store: NotingStore, tmp_path: Path, **ledger: Any) -> LedgerRecorder:
    config = proxy_config("http://127.0.0.1:9", str(tmp_path / "state"), ledger=ledger)
    recorder = LedgerRecorder(store, new_metrics(), config)  # type: ignore[arg-type]
    recorder.start()
    return recorder


def _row(recorder: LedgerRecorder, i: int) -> None:
    record_upstream_call(
        recorder, tenant="acme", session=None, model="claude-x", kind="client",
        status=200, latency_ms=1.0, usage={"input_tokens": i, "output_tokens": 1},
        request_id=f"req_{i}",
    )


async def _stored(store: NotingStore) -> int:
    rows = await store.store.usage_rows("acme", UsageQuery(limit=1000))
    return len(rows)


async def test_rows_arriving_within_the_flush_window_are_one_batch(
    store: NotingStore, tmp_path: Path
) -> None:
    recorder = _recorder(store, tmp_path, flush_seconds=0.3, batch_size=50)
    try:
        for i in range(5):
            _row(recorder, i)
            await asyncio.sleep(0.01)  # the writer runs in between: it must not write each row
        await asyncio.sleep(0.6)
        assert store.batches == [5]
        assert await _stored(store) == 5
    finally:
        await recorder.close()


async def test_a_full_batch_is_written_without_waiting_for_the_window(
    store: NotingStore, tmp_path: Path
) -> None:
    recorder = _recorder(store, tmp_path, flush_seconds=30, batch_size=4)
    try:
        for i in range(4):
            _row(recorder, i)
        await asyncio.wait_for(_until(lambda: store.batches == [4]), 5)
        assert await _stored(store) == 4
    finally:
        await recorder.close()


async def test_flush_writes_what_is_queued_at_once(store: NotingStore, tmp_path: Path) -> None:
    recorder = _recorder(store, tmp_path, flush_seconds=30, batch_size=500)
    try:
        for i in range(3):
            _row(recorder, i)
        await asyncio.wait_for(recorder.flush(), 5)  # not the 30 s window
        assert sum(store.batches) == 3
        assert await _stored(store) == 3
    finally:
        await recorder.close()


async def _until(done: Any) -> None:
    while not done():  # noqa: ASYNC110 -- polls what the writer handed the store
        await asyncio.sleep(0.01)
