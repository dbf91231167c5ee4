"""Forget what is kept per conversation or session once that conversation has gone idle.

The bounds (``limits:``, docs/operations/memory.md) cap what a replica holds whatever traffic it
has seen; but a bound is reached only by traffic, and then it stays full: a replica that served a
busy afternoon kept its bodies, plans and durable states of every conversation of that afternoon
through the night, and under a steady load its memory went on rising until the slowest cache
reached its bound (the plan cache's 8 MiB of plans, 17 minutes into the soak). Forgetting the
conversations idle for ``limits.cache_idle_seconds`` (10 minutes) makes memory follow the
conversations still going: it levels off once that much time has passed, and falls back when
they stop.

Each owner forgets under its own lock (:meth:`proxy.core.bounded.Bounded.forget_idle`): the body
memo, the compaction plans, the store's folded durable states, the transcript export marks. What
a forgotten entry costs is what a miss of that cache costs (a parse, one store read), never
another answer. Not forgotten: thinking records (a miss may cost a valid block its reasoning),
token counts and pointer parses (by content, shared by every conversation), source checks (by
file). What a sweep forgot is counted in ``ProxyState.forgotten``: when it is enough, the memory
release (``idle_trim.py``) treats it as a busy period and gives the memory back once nothing has
been in flight for two seconds, as after a burst.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from proxy.server.appkeys import ProxyState

log = logging.getLogger("context_proxy.memory")

Forget = Callable[[float, float], int]  # (now, idle seconds) -> entries forgotten


def sweep_interval(idle: float) -> float:
    """How often to sweep: a tenth of the idle time (idleness is measured to within it), between
    one second and a minute."""
    return min(60.0, max(1.0, idle / 10))


def sweep(forgets: Sequence[Forget], now: float, idle: float) -> int:
    """One sweep: each owner forgets what was idle at ``now``; the count forgotten in all."""
    return sum(forget(now, idle) for forget in forgets)


async def forget_when_idle(
    forgets: Sequence[Forget],
    idle: float,
    state: ProxyState,
    clock: Callable[[], float] = time.monotonic,
    interval: float | None = None,
) -> None:
    """Sweep every ``interval`` until cancelled (nothing when ``idle`` is 0), adding what each
    sweep forgot to ``state.forgotten``."""
    if idle <= 0:
        return
    every = sweep_interval(idle) if interval is None else interval
    while True:
        forgotten = sweep(forgets, clock(), idle)
        if forgotten:
            log.debug("forgot %d entries of conversations idle for %.0f s", forgotten, idle)
            state.forgotten += forgotten
        await asyncio.sleep(every)
