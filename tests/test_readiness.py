"""``/readyz`` answers from the store as requests see it (proxy/server/http/readiness.py): not ready
while requests' session reads fail, even when a probe of its own would succeed; ready again
once a session read works; and it reads the store itself only when nothing else has read for a
while, once for every ``/readyz`` waiting meanwhile.

The outage itself (a PostgreSQL server stopped and started again under load) is in
``tests/test_store_outage.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx2 as httpx
import orjson

from proxy.server.appkeys import STATE, STORE
from proxy.server.http.readiness import StoreReadiness
from proxy.store import SQLiteStore
from tests.harness import LoopThread
from tests.pg_server import fresh_schema
from tests.upstream import FakeUpstream

BODY = orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})


def _turn(url: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/messages",
        content=BODY,
        headers={"x-api-key": "sk-ant-ready", "x-session-id": "ready-1", "content-type": "application/json"},
        timeout=30,
    )


def _readiness(proxy: Any) -> StoreReadiness:
    (check,) = [c for c in proxy.app[STATE].readiness_checks if isinstance(c, StoreReadiness)]
    return check


async def _execute(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def test_not_ready_while_session_reads_fail_though_the_database_answers(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    """The session reads' table is gone (a bad migration, a DBA's slip): every request's
    durable-context read fails while a connection (and a ping) would work. Before, ``/readyz``
    pinged and said 200."""
    with fresh_schema("ready") as url:
        proxy = make_proxy(store={"url": url})
        readiness = _readiness(proxy)
        assert "x-durable-context" not in _turn(proxy.url).headers
        assert httpx.get(proxy.url + "/readyz").status_code == 200

        loop_thread.run(_execute(url, "ALTER TABLE durable_changes RENAME TO durable_changes_away"))
        assert loop_thread.run(proxy.app[STORE].list_sessions("default")) == ("ready-1",)  # it answers
        assert _turn(proxy.url).headers["x-durable-context"] == "unavailable"
        r = httpx.get(proxy.url + "/readyz")
        assert (r.status_code, r.json()) == (503, {"status": "not ready", "problems": ["store"]})

        loop_thread.run(_execute(url, "ALTER TABLE durable_changes_away RENAME TO durable_changes"))
        assert httpx.get(proxy.url + "/readyz").status_code == 503  # no session read yet
        assert "x-durable-context" not in _turn(proxy.url).headers
        assert httpx.get(proxy.url + "/readyz").status_code == 200
        assert readiness.probes == 0  # requests kept it informed: /readyz never read the store


async def test_an_idle_store_is_probed_once_for_every_readyz_waiting(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    now = [1000.0]
    try:
        readiness = StoreReadiness(store, probe_after=5.0, clock=lambda: now[0])
        store.health.clock = lambda: now[0]
        await store.current_state("t", "s")  # a session read, just now
        await store.current_state("t", "s")
        assert await readiness() is True and readiness.probes == 0
        now[0] += 6.0  # nothing read for 6 s
        answers = await asyncio.gather(*(readiness() for _ in range(20)))
        assert answers == [True] * 20 and readiness.probes == 1
        assert await readiness() is True and readiness.probes == 1  # the probe's read is fresh
        await store.close()
        now[0] += 6.0
        assert await readiness() is False and readiness.probes == 2
    finally:
        await store.close()
