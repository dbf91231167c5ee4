"""The source-check audit trail, written off the answer path.

:meth:`AuditLog.record` only appends to a bounded in-memory buffer; one background task writes
the buffer to the store in batches (every ``flush_seconds``, or at once when ``batch_size`` rows
are waiting). A request never waits for an audit write. If the store is down, the rows wait (up
to ``max_pending``; past that the oldest are dropped and counted in :attr:`dropped`, and a
warning is logged once per outage), and the next flush retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from proxy.store.base import StoreError
from proxy.store.source_records import AuditRow

__all__ = ["AuditLog"]

log = logging.getLogger("context_proxy.audit")

Writer = Callable[[Sequence[AuditRow]], Awaitable[None]]


class AuditLog:
    def __init__(
        self,
        write: Writer,
        *,
        batch_size: int = 200,
        flush_seconds: float = 0.5,
        max_pending: int = 20_000,
    ) -> None:
        self._write = write
        self._batch_size = batch_size
        self._flush_seconds = flush_seconds
        self._pending: deque[AuditRow] = deque()
        self._max_pending = max_pending
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._failing = False
        self.dropped = 0
        self.written = 0

    def record(self, rows: Sequence[AuditRow]) -> None:
        for row in rows:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(row)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    async def _run(self) -> None:
        while self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_seconds)
            self._wake.clear()
            await self.flush()
            if self._failing:
                await asyncio.sleep(self._flush_seconds)

    async def flush(self) -> None:
        """Write everything pending now (tests, shutdown)."""
        async with self._lock:
            while self._pending:
                count = min(self._batch_size, len(self._pending))
                batch = [self._pending.popleft() for _ in range(count)]
                try:
                    await self._write(batch)
                except StoreError as exc:
                    if not self._failing:
                        log.warning("[audit] source checks not recorded yet: %s", exc)
                    self._failing = True
                    self._pending.extendleft(reversed(batch))
                    while len(self._pending) > self._max_pending:
                        self._pending.popleft()
                        self.dropped += 1
                    return
                self.written += len(batch)
                self._failing = False

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
