"""PostgreSQL stopped in the middle of a session, under load, and started again.

A ``context-proxy serve`` child process on a private PostgreSQL server (``PrivateServer``: its
own cluster, stopped with ``pg_ctl stop -m fast`` and started again), the fake upstream in the
test process, clients sending turns with a session id from several threads:

* while the server is down, every answer still comes (200, ``x-durable-context: unavailable``)
  and ``/readyz`` is 503 (``problems: ["store"]``), from the requests' own failed reads while
  they come, and from its probe once the replica is idle;
* once the server is back, ``/readyz`` stays 503 until a session read through the proxy works,
  and is 200 at once after it; the session's transcript is whole again after the next turn;
* the log holds no traceback and no asyncpg line; each kind of store line appears at most once
  per 10 s, and what was held back is counted (``N similar lines suppressed``).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml

from tests.pg_server import PrivateServer
from tests.test_cli import ServeProcess
from tests.upstream import FakeUpstream

TOKEN = "cpa-outage-admin-token-5d1c0e7a9b"
SESSION = "outage-1"
INTERVAL = 10.0  # proxy.store.health.INTERVAL_SECONDS
PROBE_AFTER = 5.0  # proxy.server.http.readiness.PROBE_AFTER_SECONDS
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+) (.*)$")


def _turn(n: int) -> bytes:
    messages: list[dict[str, Any]] = []
    for k in range(n):
        messages.append({"role": "user", "content": f"step {k}"})
        if k < n - 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "Hello from the fake upstream."}]})
    return orjson.dumps({"model": "claude-fake-1", "max_tokens": 16, "messages": messages})


@pytest.fixture
def served(tmp_path: Path, upstream: FakeUpstream) -> Iterator[tuple[ServeProcess, PrivateServer]]:
    server = PrivateServer()
    try:
        server.start()
        policies = tmp_path / "policies"
        policies.mkdir()
        policy = {
            "name": "default",
            "provider": {"mode": "passthrough"},
            "admin_tokens_sha256": [hashlib.sha256(TOKEN.encode()).hexdigest()],
        }
        (policies / "default.yaml").write_text(yaml.safe_dump(policy))
        config = tmp_path / "proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "upstream": {"base_url": upstream.url},
                    "store": {"url": server.url},
                    "state_dir": str(tmp_path / "state"),
                    "policies_dir": str(policies),
                    "ledger": {"flush_seconds": 0.05},
                }
            )
        )
        proxy = ServeProcess(config)
        try:
            yield proxy, server
        finally:
            proxy.stop()
    finally:
        server.remove()


def _records(lines: list[str]) -> list[tuple[float, str, str, str]]:
    out = []
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, match.group(2), match.group(3), match.group(4)))
    return out


def test_the_store_stopped_and_started_again_under_load(
    served: tuple[ServeProcess, PrivateServer], upstream: FakeUpstream
) -> None:
    proxy, server = served
    http = httpx.Client(base_url=proxy.url, timeout=30, trust_env=False)
    headers = {"x-api-key": "sk-ant-outage", "x-session-id": SESSION, "content-type": "application/json"}

    def send(n: int) -> httpx.Response:
        return http.post("/v1/messages", content=_turn(n), headers=headers)

    def ready() -> httpx.Response:
        return http.get("/readyz")

    with http:
        first = send(1)
        assert first.status_code == 200 and "x-durable-context" not in first.headers
        assert ready().status_code == 200

        server.stop()
        stop_at = time.monotonic()
        answers: list[httpx.Response] = []
        readyz: list[tuple[float, int]] = []
        stop_load = threading.Event()

        def load(worker: int) -> None:
            with httpx.Client(base_url=proxy.url, timeout=30, trust_env=False) as own:
                while not stop_load.is_set():
                    answers.append(own.post("/v1/messages", content=_turn(2), headers=headers))

        with ThreadPoolExecutor(6) as pool:
            workers = [pool.submit(load, w) for w in range(6)]
            while time.monotonic() - stop_at < 2.0:
                readyz.append((time.monotonic() - stop_at, ready().status_code))
                time.sleep(0.05)
            stop_load.set()
            for w in workers:
                w.result()
        assert len(answers) > 50
        assert {r.status_code for r in answers} == {200}  # the answers go on
        assert {r.headers.get("x-durable-context") for r in answers[5:]} == {"unavailable"}
        # 200 until the first request's read fails (the store was fine as requests saw it),
        # then 503, never 200 again while the server is down
        statuses = [status for _at, status in readyz]
        first = statuses.index(503)
        assert set(statuses[first:]) == {503} and readyz[first][0] < 1.0, readyz
        down = ready()
        assert (down.status_code, down.json()) == (503, {"status": "not ready", "problems": ["store"]})

        # Idle: no request reads the store, so /readyz probes it (and finds it still down).
        time.sleep(PROBE_AFTER + 0.5)
        assert ready().status_code == 503

        # A request just before the server returns: the last session read failed, freshly.
        assert send(2).headers["x-durable-context"] == "unavailable"
        server.start()
        assert ready().status_code == 503  # nothing has read the store since it came back
        back = send(3)
        assert back.status_code == 200 and "x-durable-context" not in back.headers
        assert ready().status_code == 200  # ready as soon as a session read worked
        back_at = time.monotonic()

        # The transcript heals: the next turn records what the outage missed, once each.
        assert send(4).status_code == 200
        deadline = time.monotonic() + 10
        while True:
            listed = http.get(
                f"/admin/v1/sessions/{SESSION}/transcript", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            # 404 until the recorder's first write lands (the turn before the stop may not have)
            assert listed.status_code in (200, 404), listed.text
            events = listed.json()["events"] if listed.status_code == 200 else []
            if len(events) >= 8 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [e["seq"] for e in events] == list(range(1, 9))  # no gap, no duplicate
        assert [e["role"] for e in events] == ["user", "assistant"] * 4
        assert [e["content"] for e in events[::2]] == [f"step {k}" for k in range(4)]

        # Let every interval that held lines back end, so its count is written.
        time.sleep(max(0.0, INTERVAL + 0.5 - (time.monotonic() - stop_at)))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - back_at)))

    log = "".join(proxy.lines)
    assert "Traceback" not in log and "asyncpg" not in log, log[-3000:]
    records = _records(proxy.lines)
    store_lines = [(at, level, msg) for at, level, name, msg in records if name == "context_proxy.store"]
    assert store_lines, log[-3000:]
    by_kind: dict[str, list[float]] = {}
    suppressed: dict[str, int] = {}
    for at, _level, msg in store_lines:
        counted = re.match(r"(\d+) similar lines suppressed in the last 10s: (.+)$", msg)
        if counted:
            suppressed[counted.group(2)] = suppressed.get(counted.group(2), 0) + int(counted.group(1))
            continue
        kind = re.match(r"(store (?:unavailable|busy|refused an operation|available again) for [^:;]+?)(?::| after)", msg)
        assert kind, msg
        by_kind.setdefault(kind.group(1), []).append(at)
    for kind, times in by_kind.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap >= INTERVAL - 0.01 for gap in gaps), (kind, times)
    assert "store unavailable for session reads" in by_kind
    assert "store available again for session reads" in by_kind
    assert "store unavailable for durable context" in by_kind
    assert suppressed.get("store unavailable for durable context", 0) > 20, suppressed
    # Every answer that said "unavailable" is a line or a count: nothing unaccounted, nothing more.
    # (the answers under load, and the turn sent just before the server came back)
    unavailable = sum(1 for r in answers if r.headers.get("x-durable-context") == "unavailable") + 1
    said = len(by_kind["store unavailable for durable context"]) + suppressed["store unavailable for durable context"]
    assert said == unavailable, (said, unavailable)
    assert len(store_lines) < 40, store_lines
