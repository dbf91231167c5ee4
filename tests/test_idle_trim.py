"""Memory goes back to the system when the proxy goes idle after a burst
(proxy/server/maintenance/idle_trim.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from proxy.config.settings import Config
from proxy.core.catalogue_data import REPLAY_MODEL
from proxy.server.appkeys import ProxyState
from proxy.server.http.metrics import new_metrics
from proxy.server.ledger import LedgerRecorder
from proxy.server.maintenance import idle_trim
from proxy.server.maintenance.idle_trim import TrimSchedule, release_memory, release_when_idle
from proxy.store import open_store
from proxy.store.usage import UsageQuery
from tests.harness import ListeningProcess, LoopThread
from tests.upstream import FakeUpstream, Reply, Stream, message_json, text_stream_events

ROOT = Path(__file__).resolve().parent.parent


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


def test_a_steady_load_that_never_peaks_is_released_once_idle() -> None:
    """A few requests in flight at every poll for a while (a soak, not a burst): once idle, the
    release, and the late one; the same few polls spread over a quiet period: nothing."""
    schedule = TrimSchedule(busy=32, quiet=2, late=65, busy_polls=30)
    assert _run(schedule, [3] * 29 + [0] * 80) == []
    assert _run(schedule, [2] * 30 + [0] * 70) == [31, 30 + 64]  # the 2nd and the 65th quiet polls
    assert _run(schedule, ([1] + [0] * 5) * 29 + [0] * 70) == []  # 29 active polls since


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


def test_release_collects_garbage_and_trims(caplog: pytest.LogCaptureFixture) -> None:
    class Node:
        pass

    gc.collect()
    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    alive = weakref.ref(node)
    del node
    gc.disable()
    try:
        with caplog.at_level(logging.INFO, logger="context_proxy.memory"):
            assert release_memory() is (idle_trim._TRIM is not None)
        assert alive() is None
    finally:
        gc.enable()
    # the one line it logs says what RSS came back and how much garbage the collection found
    (line,) = [r.getMessage() for r in caplog.records if r.name == "context_proxy.memory"]
    assert line.startswith("memory released after a busy period: RSS ")
    found = int(line.rsplit(", ", 1)[1].split()[0])
    assert found >= 1  # the node (its attributes inline)
    assert idle_trim._TRIM is not None  # glibc (the test machines, the Docker image)


def test_the_poll_releases_after_a_burst(loop_thread: LoopThread) -> None:
    state = ProxyState()
    released = asyncio.Event()

    async def go() -> None:
        task = asyncio.create_task(
            release_when_idle(
                state, TrimSchedule(busy=3, quiet=2, late=1000, busy_polls=10**6), released.set, 0.001
            )
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


def test_written_ledger_rows_are_not_kept(tmp_path: Path, loop_thread: LoopThread) -> None:
    """After a burst, the ledger keeps none of the rows it wrote (they would pin the memory the
    burst used until the next request)."""
    from tests.store.test_usage_store import entry

    async def go() -> list[object]:
        store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
        recorder = LedgerRecorder(store, new_metrics(), dataclasses.replace(
            Config(), ledger=dataclasses.replace(Config().ledger, flush_seconds=0.01)))
        recorder.start()
        try:
            rows = [entry(n) for n in range(5)]
            for row in rows:
                recorder.record(row)
            del row
            async with asyncio.timeout(10):
                await recorder.flush()
            assert len(await store.usage_rows("acme", UsageQuery())) == 5
            mine = [rows]
            return [r for r in gc.get_referrers(*rows) if r is not rows and r is not mine]
        finally:
            await recorder.close()
            await store.close()

    assert loop_thread.run(go()) == []


def _allocator_in(env: dict[str, str]) -> str:
    """What ``small_object_allocator`` says in a fresh interpreter with ``env``."""
    out = subprocess.run(
        [sys.executable, "-c", "from proxy.server.maintenance.idle_trim import small_object_allocator as a; print(a())"],
        capture_output=True, text=True, check=True, env=env, cwd=ROOT,
    )
    return out.stdout.strip()


def _allocator_under(pythonmalloc: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    if pythonmalloc is not None:
        env["PYTHONMALLOC"] = pythonmalloc
    return _allocator_in(env)


def _jemalloc_env() -> dict[str, str]:
    """This environment with jemalloc preloaded and ``PYTHONMALLOC=malloc``, as the image runs."""
    from bench.servers import JEMALLOC

    assert Path(JEMALLOC).exists(), "Debian's libjemalloc2 is needed (.ci/run installs it)"
    return {**os.environ, "PYTHONMALLOC": "malloc", "LD_PRELOAD": JEMALLOC}


def test_the_allocator_in_use_is_read_from_the_interpreter() -> None:
    assert _allocator_under(None) == "pymalloc"
    assert _allocator_under("malloc") == "malloc"
    assert _allocator_under("pymalloc") == "pymalloc"
    assert _allocator_in(_jemalloc_env()) == "jemalloc"
    # jemalloc preloaded but Python's own arenas in front of it: small objects are pymalloc's
    assert _allocator_in({k: v for k, v in _jemalloc_env().items() if k != "PYTHONMALLOC"}) == "pymalloc"


_RELEASE_UNDER_JEMALLOC = """
import time
from proxy.server.maintenance.idle_trim import release_memory, rss_bytes
base = rss_bytes()
garbage = [str(i) * 20 for i in range(1_500_000)]
peak = rss_bytes()
del garbage
time.sleep(0.2)
freed = rss_bytes()
print(base, peak, freed, release_memory(), rss_bytes())
"""


def test_the_release_hands_jemalloc_s_free_pages_back() -> None:
    """Under jemalloc, ``malloc_trim`` would see none of the heap: the release purges jemalloc's
    arenas, and the freed pages (which jemalloc would otherwise keep for its decay time, or, with
    nothing allocating, indefinitely) go back at once."""
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_UNDER_JEMALLOC],
        capture_output=True, text=True, check=True, env=_jemalloc_env(), cwd=ROOT,
    )
    base, peak, freed, released, after = out.stdout.split()
    grown = int(peak) - int(base)
    assert grown > 100 * 2**20
    assert int(freed) - int(base) > grown // 2  # freed, but still resident
    assert released == "True"
    assert int(after) - int(base) < grown // 5


def test_the_bench_starts_a_proxy_under_the_allocator_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench.servers.allocator_env``: what bench_proxy (``--allocator``, ``--baseline-allocator``)
    and bench_memory start their proxies with, whatever this process's own setting."""
    from bench.servers import allocator_env

    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    for allocator in ("pymalloc", "malloc", "jemalloc"):
        assert _allocator_in(allocator_env(allocator)) == allocator


def test_the_image_takes_small_objects_from_jemalloc() -> None:
    """After a burst Python's arenas keep ~1.3x the memory (bench/bench_memory.py), and under a
    steady load glibc's heap fragments (bench/bench_soak.py): the image the proxy ships in must
    keep ``PYTHONMALLOC=malloc`` and preload jemalloc, from the package it installs, by the link
    it makes."""
    text = (ROOT / "Dockerfile").read_text()
    lines = text.splitlines()
    assert "ENV PYTHONMALLOC=malloc" in lines
    preload = [line for line in lines if line.startswith("ENV LD_PRELOAD=")]
    assert preload == ["ENV LD_PRELOAD=/usr/local/lib/libjemalloc.so.2"]
    assert "apt-get install -y --no-install-recommends libjemalloc2" in text
    assert 'ln -s "$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2)" /usr/local/lib/libjemalloc.so.2' in text


def test_the_poll_says_which_allocator_runs(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        task = asyncio.create_task(release_when_idle(ProxyState(), poll_seconds=3600))
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger="context_proxy.memory"):
        loop_thread.run(go())
    said = [r.getMessage() for r in caplog.records if r.name == "context_proxy.memory"]
    assert len(said) == 1
    assert said[0].startswith(f"small objects from {idle_trim.small_object_allocator()}")


def test_the_official_sdk_through_a_proxy_running_as_the_image_runs_it(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The image's allocator is process-wide: the proxy started with the image's environment
    (``PYTHONMALLOC=malloc``, jemalloc preloaded) answers the anthropic SDK, a message and a
    stream, with the bytes the upstream sent, forwards the client's body, and says at start-up
    that jemalloc runs."""
    import anthropic

    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\n")
    env = {k: v for k, v in _jemalloc_env().items() if k in ("PYTHONMALLOC", "LD_PRELOAD")}
    process = ListeningProcess(["serve", "--config", str(config), "--port", "0"], env=env)
    try:
        upstream.script(Reply(message_json("answered under jemalloc")), Stream(text_stream_events("streamed")))
        client = anthropic.Anthropic(base_url=process.url, api_key="sk-ant-test-jemalloc", max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        message = client.messages.create(model=REPLAY_MODEL, max_tokens=64, messages=messages)  # type: ignore[arg-type]
        with client.messages.stream(model=REPLAY_MODEL, max_tokens=64, messages=messages) as stream:  # type: ignore[arg-type]
            streamed = "".join(stream.text_stream)
        client.close()
    finally:
        process.stop()
    assert [b.text for b in message.content if b.type == "text"] == ["answered under jemalloc"]
    assert streamed == "streamed"
    sent = [r.json() for r in upstream.requests]
    assert [(s["model"], s["messages"]) for s in sent] == [(REPLAY_MODEL, messages)] * 2
    assert any("small objects from jemalloc" in line for line in process.lines), process.lines
