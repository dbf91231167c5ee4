"""The worker threads of ``asyncio.to_thread`` are all started at start-up (issue 28: under a
steady load Python started the last ones minutes in, each a step in RSS): the count of threads
is flat from the first request on, on a bare loop and in a real proxy process driven by the
official SDK with requests that compact in those threads."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic

from proxy.server.http.runner import start_worker_threads, worker_count
from tests.harness import ListeningProcess
from tests.upstream import FakeUpstream, Reply, message_json


def test_every_worker_thread_is_started_at_once_and_no_call_starts_another() -> None:
    async def run() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        before = threading.active_count()
        executor = start_worker_threads(loop, 5)
        started = threading.active_count()
        # twenty calls at once, each holding its thread a moment: Python's executor would start
        # a thread per call that finds none idle
        await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.02) for _ in range(20)))
        after = threading.active_count()
        executor.shutdown()
        return before, started, after

    before, started, after = asyncio.run(run())
    assert started == before + 5
    assert after == started


def test_the_default_count_is_python_s_own() -> None:
    executor = ThreadPoolExecutor()  # what asyncio's default executor would have been
    try:
        assert worker_count() == executor._max_workers
    finally:
        executor.shutdown()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_a_proxy_process_has_its_threads_from_the_start(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\n"
        "compaction: {threshold: 4000, keep_recent: 2}\n"
    )
    process = ListeningProcess(["serve", "--config", str(config), "--port", "0"])
    try:
        at_start = _threads(process.proc.pid)
        assert at_start >= worker_count() + 1  # the loop's thread and every worker
        upstream.script(*([Reply(message_json("ok"))] * 200))

        async def load() -> None:
            client = anthropic.AsyncAnthropic(base_url=process.url, api_key="sk-ant-test-threads",
                                              max_retries=0)
            turns = []
            for i in range(24):  # over the threshold: compaction, large ones in a worker thread
                history = [{"role": "user" if j % 2 == 0 else "assistant",
                            "content": f"{i}-{j} " + "words of the turn " * 400} for j in range(9)]
                turns.append(client.messages.create(model="claude-sonnet-4-5", max_tokens=32,
                                                    messages=history,  # type: ignore[arg-type]
                                                    extra_headers={"x-session-id": f"threads-{i}"}))
            answers = await asyncio.gather(*turns)
            assert all(a.content[0].text == "ok" for a in answers)  # type: ignore[union-attr]
            await client.close()

        asyncio.run(load())
        assert _threads(process.proc.pid) == at_start
    finally:
        process.stop()
    assert len(upstream.requests) >= 24
