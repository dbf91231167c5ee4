"""Memory goes back to the system when the proxy goes idle after a burst (proxy/server/idle_trim)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from proxy.server import idle_trim
from proxy.server.appkeys import ProxyState
from proxy.server.idle_trim import TrimSchedule, release_memory, release_when_idle
from tests.harness import LoopThread


def _run(schedule: TrimSchedule, inflight: list[int]) -> list[int]:
    """The polls (by index) at which ``schedule`` releases."""
    return [i for i, n in enumerate(inflight) if schedule.tick(n)]


def test_a_burst_is_released_once_idle_then_once_more_later() -> None:
    schedule = TrimSchedule(busy=32, quiet=2, late=65)
    polls = [5, 40, 1000, 12, 0, 0, 0] + [0] * 70
    assert _run(schedule, polls) == [5, 3 + 65]
    assert _run(schedule, [0] * 200) == []  # nothing more until the next burst


def test_a_quiet_proxy_never_releases() -> None:
    schedule = TrimSchedule(busy=32, quiet=2, late=65)
    assert _run(schedule, [1, 0, 31, 0, 0, 5] + [0] * 100) == []


def test_activity_postpones_the_release() -> None:
    schedule = TrimSchedule(busy=32, quiet=2, late=65)
    # busy, then single quiet polls between requests: no release until two quiet polls in a row
    assert _run(schedule, [64, 0, 3, 0, 1, 0, 0]) == [6]
    # the late release waits for 65 quiet polls in a row as well
    assert _run(schedule, [0] * 30 + [2] + [0] * 64) == []
    assert _run(schedule, [0]) == [0]


def test_a_new_burst_starts_over() -> None:
    schedule = TrimSchedule(busy=32, quiet=2, late=65)
    assert _run(schedule, [100, 0, 0]) == [2]
    assert _run(schedule, [0] * 10 + [50, 0, 0]) == [12]  # released again; its late one pending
    assert _run(schedule, [0] * 64) == [62]


def test_release_collects_garbage_and_trims() -> None:
    class Node:
        pass

    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    alive = weakref.ref(node)
    del node
    gc.disable()
    try:
        assert release_memory() is (idle_trim._TRIM is not None)
        assert alive() is None
    finally:
        gc.enable()
    assert idle_trim._TRIM is not None  # glibc (the test machines, the Docker image)


def test_the_poll_releases_after_a_burst(loop_thread: LoopThread) -> None:
    state = ProxyState()
    released = asyncio.Event()

    async def go() -> None:
        task = asyncio.create_task(
            release_when_idle(state, TrimSchedule(busy=3, quiet=2, late=1000), released.set, 0.001)
        )
        try:
            state.inflight = 2
            await asyncio.sleep(0.05)
            assert not released.is_set()  # not busy enough: no release when it ends
            state.inflight = 0
            await asyncio.sleep(0.05)
            assert not released.is_set()
            state.inflight = 5
            await asyncio.sleep(0.01)
            state.inflight = 0
            await asyncio.wait_for(released.wait(), 10)
        finally:
            task.cancel()

    loop_thread.run(go())
