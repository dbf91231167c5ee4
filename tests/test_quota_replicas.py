"""Two proxy replicas (each on its own event loop thread) sharing one PostgreSQL store, against one
budget and one rate limit, with concurrent clients racing at the edge: requests are never admitted
over the limit; tokens and spend overshoot by at most what the requests in flight used (the bound
in docs/guides/limits.md); what is counted is exactly what the provider reported,
priced as the usage ledger prices it.

Needs PostgreSQL (``CONTEXT_PROXY_TEST_PG``; skipped without it)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.server.ledger import LEDGER
from proxy.server.quota import QUOTA
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.pg_server import fresh_schema
from tests.test_quota_edge import ACME_ADMIN, ACME_KEY, SONNET, Clock, write_policies
from tests.upstream import FakeUpstream, Reply, message_json

USAGE = {"input_tokens": 1000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 100}
CALL_USD = (1000 * 3 + 100 * 15) / 1e6  # Sonnet 4.5: 0.0045 USD a call
CLIENTS = 8


class Replicas:
    def __init__(self, proxies: list[ProxyServer], loops: list[LoopThread], clock: Clock) -> None:
        self.proxies, self.loops, self.clock = proxies, loops, clock

    def settle(self) -> None:
        for proxy, loop in zip(self.proxies, self.loops, strict=True):
            loop.run(proxy.app[QUOTA].drain(), timeout=10)
            loop.run(proxy.app[LEDGER].flush(), timeout=10)

    def admin(self, path: str) -> Any:
        self.settle()
        answer = httpx.get(
            self.proxies[1].url + "/admin/v1" + path, headers={"Authorization": f"Bearer {ACME_ADMIN}"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def used(self, metric: str) -> Any:
        return next(e["used"] for e in self.admin("/quota")["limits"] if e["metric"] == metric)


@pytest.fixture
def replicas_for(upstream: FakeUpstream, tmp_path: Path) -> Iterator[Any]:
    """Makes two replicas on one fresh PostgreSQL schema, sharing one clock."""
    made: list[tuple[ProxyServer, LoopThread]] = []
    stack = contextlib.ExitStack()

    def make(quota: dict[str, Any]) -> Replicas:
        url = stack.enter_context(fresh_schema())
        policies = write_policies(tmp_path, quota)
        clock = Clock("2026-12-04T10:21:00")
        for i in range(2):
            config = proxy_config(
                upstream.url, str(tmp_path / f"state-{i}"), auth={"mode": "keys"},
                policies_dir=str(policies), store={"url": url}, ledger={"flush_seconds": 0.01},
            )  # fmt: skip
            loop = LoopThread()
            proxy = ProxyServer(config)
            loop.run(proxy.start())
            proxy.app[QUOTA].clock = clock
            made.append((proxy, loop))
        return Replicas([p for p, _ in made], [lp for _, lp in made], clock)

    with stack:
        yield make
        for proxy, loop in made:
            loop.run(proxy.stop())
            loop.close()


def _post(url: str, max_tokens: int = 200) -> httpx.Response:
    body = {"model": SONNET, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/messages", content=orjson.dumps(body), headers={"x-api-key": ACME_KEY}, timeout=30)


def _answer(delay: float) -> Any:
    def reply(_request: Any) -> Reply:
        body = message_json("ok", model=SONNET)
        body["usage"] = USAGE
        return Reply(body, delay=delay)

    return reply


def test_two_replicas_never_admit_more_requests_than_the_limit(
    upstream: FakeUpstream, replicas_for: Any
) -> None:
    replicas: Replicas = replicas_for({"requests_per_minute": 10})
    upstream.script(*[_answer(0.3)] * 40)
    urls = itertools.cycle([p.url for p in replicas.proxies])
    targets = [next(urls) for _ in range(30)]
    with ThreadPoolExecutor(max_workers=30) as pool:
        statuses = sorted(r.status_code for r in pool.map(_post, targets))
    assert statuses.count(200) == 10 and statuses.count(429) == 20
    assert len([r for r in upstream.requests if r.path == "/v1/messages"]) == 10
    assert replicas.used("requests") == 10  # the refused requests' increments were taken back
    # both replicas admitted some: they count together, through the store
    replicas.clock.set("2026-12-04T10:22:00")
    assert {_post(p.url).status_code for p in replicas.proxies} == {200}


def test_spend_and_tokens_overshoot_by_at_most_the_requests_in_flight(
    upstream: FakeUpstream, replicas_for: Any
) -> None:
    """Each of CLIENTS clients sends requests one after another (alternating replicas) until it is
    refused. Admission needs the day's spend under the budget, so every admitted request saw less
    than the budget settled, with at most CLIENTS - 1 others in flight: the spend ends at most
    CLIENTS calls' worth over (and the input tokens likewise)."""
    budget = 0.1  # 22.2 calls
    replicas: Replicas = replicas_for(
        {"budget_usd": budget, "budget_period": "day", "input_tokens_per_minute": 10**9}
    )
    upstream.script(*[_answer(0.05)] * 200)

    def client(i: int) -> int:
        admitted = 0
        for n in itertools.count():
            response = _post(replicas.proxies[(i + n) % 2].url)
            if response.status_code == 429:
                assert response.json()["error"]["type"] == "rate_limit_error"
                assert response.headers["x-should-retry"] == "false"
                return admitted
            assert response.status_code == 200, response.text
            admitted += 1
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        admitted = sum(pool.map(client, range(CLIENTS)))
    calls = len([r for r in upstream.requests if r.path == "/v1/messages"])
    assert calls == admitted
    spent = replicas.used("spend_usd")
    assert spent == pytest.approx(admitted * CALL_USD, abs=1e-9)  # exactly what was reported
    assert replicas.used("input_tokens") == admitted * 1000
    assert spent >= budget  # it did reach the budget...
    assert spent - budget <= CLIENTS * CALL_USD  # ...and went over by at most the bound
    # the usage ledger, written by both replicas, prices the same calls the same way
    totals = replicas.admin("/usage/summary?since=2000-01-01T00:00:00Z")["totals"]
    assert totals["client_calls"] == admitted
    assert round(totals["cost_usd"]["total"], 2) == round(spent, 2)
    assert abs(totals["cost_usd"]["total"] - spent) < 1e-6
    # now settled and over: every replica refuses, until the day rolls over
    assert {_post(p.url).status_code for p in replicas.proxies} == {429}
    replicas.clock.set("2026-12-05T00:00:00")
    assert {_post(p.url).status_code for p in replicas.proxies} == {200}


def test_two_serve_processes_share_one_rate_limit(upstream: FakeUpstream, tmp_path: Path) -> None:
    """The same race against two real ``context-proxy serve`` processes (their own clocks: the
    wall clock) on one PostgreSQL schema."""
    import time

    from tests.test_cli import ServeProcess

    with fresh_schema("quota") as url:
        config = tmp_path / "replica.yaml"
        config.write_text(
            orjson.dumps(
                {
                    "upstream": {"base_url": upstream.url},
                    "auth": {"mode": "keys"},
                    "policies_dir": str(write_policies(tmp_path, {"requests_per_minute": 10})),
                    "store": {"url": url},
                    "state_dir": str(tmp_path / "state"),
                    "shutdown": {"grace_seconds": 5},
                }
            ).decode()  # JSON is YAML
        )
        replicas = [ServeProcess(config)]
        try:
            replicas.append(ServeProcess(config))
            upstream.script(*[_answer(0.3)] * 40)
            if time.time() % 60 > 50:  # the race must fit in one minute window
                time.sleep(60.5 - time.time() % 60)
            urls = itertools.cycle([r.url for r in replicas])
            with ThreadPoolExecutor(max_workers=30) as pool:
                answers = list(pool.map(_post, [next(urls) for _ in range(30)]))
            statuses = sorted(r.status_code for r in answers)
            assert statuses.count(200) == 10 and statuses.count(429) == 20
            assert len([r for r in upstream.requests if r.path == "/v1/messages"]) == 10
            refusal = next(r for r in answers if r.status_code == 429)
            assert refusal.json()["error"]["type"] == "rate_limit_error"
            assert 1 <= int(refusal.headers["retry-after"]) <= 60
            quota = httpx.get(
                replicas[0].url + "/admin/v1/quota", headers={"Authorization": f"Bearer {ACME_ADMIN}"}, timeout=10
            ).json()
            assert [(e["metric"], e["used"], e["remaining"]) for e in quota["limits"]] == [("requests", 10, 0)]
        finally:
            for replica in replicas:
                replica.stop()
