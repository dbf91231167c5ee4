"""The source-check audit trail, written off the answer path.

:meth:`AuditLog.record` only appends to a bounded in-memory buffer; one background task writes
the buffer to the store in batches (every ``flush_seconds``, or at once when ``batch_size`` rows
are waiting). A request never waits for an audit write. If the store is down, the rows wait (up
to ``max_pending``; past that the oldest are dropped and counted in :attr:`dropped`, and a
warning is logged once per outage), and the next flush retries. No task lives between flushes
(a timer arms the next one), so an idle log holds nothing open.
"""

from __future__ import annotations

import asyncio
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
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._failing = False
        self._closed = False
        self.dropped = 0
        self.written = 0

    def record(self, rows: Sequence[AuditRow]) -> None:
        """Queue ``rows``; a flush follows within ``flush_seconds`` (at once for a full batch)."""
        for row in rows:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(row)
        if len(self._pending) >= self._batch_size:
            self._kick()
        else:
            self._arm()

    def _arm(self) -> None:
        if self._timer is None and self._pending and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self._flush_seconds, self._kick)

    def _kick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = asyncio.get_running_loop().create_task(self._flush_then_rearm())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_then_rearm(self) -> None:
        await self.flush()
        self._arm()  # rows that came in meanwhile, or a batch that failed: try again later

    async def flush(self) -> None:
        """Write everything pending now (tests, shutdown, the admin audit route)."""
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
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.flush()
