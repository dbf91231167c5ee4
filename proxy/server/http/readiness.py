"""``/readyz``'s store check: the store as requests see it, without hammering it.

The store reports the outcome of every operation (``Store.health``, :mod:`proxy.store.health`).
The check answers from the *session reads* (the durable-state read every request with a session
makes before it is forwarded: when it fails, the request gets the "store unavailable" block):
ready while the most recently started one that ended worked, not ready while they fail —
whatever a fresh connection would say (a pool still holding connections that died with the
server, a table the session reads cannot use). It reads the store itself only when no session
read has ended for ``probe_after`` seconds (an idle replica, or one its load balancer took out
of rotation: without a probe it could never be seen to recover): then one ping, a read of the
same table, shared by every ``/readyz`` that arrives meanwhile, and recorded like any session
read. Under traffic, ``/readyz`` costs the store nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.store.base import Store

__all__ = ["PROBE_AFTER_SECONDS", "StoreReadiness"]

PROBE_AFTER_SECONDS = 5.0


class StoreReadiness:
    """A readiness check (``ProxyState.readiness_checks``) named ``store``."""

    __name__ = "store"

    def __init__(
        self,
        store: Store,
        probe_after: float = PROBE_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.probe_after = probe_after
        self.clock = clock
        self.probes = 0  # pings made (for tests)
        self._probe: asyncio.Task[bool] | None = None

    async def __call__(self) -> bool:
        reads = self.store.health.outcomes["session reads"]
        if not reads.fresh(self.clock(), self.probe_after):
            if self._probe is None:
                self.probes += 1
                self._probe = asyncio.get_running_loop().create_task(self.store.ping())
                self._probe.add_done_callback(self._probed)
            # shielded: a /readyz whose client left does not cancel the others' probe
            await asyncio.shield(self._probe)
        return self.store.health.ready

    def _probed(self, task: asyncio.Task[bool]) -> None:
        if self._probe is task:
            self._probe = None
