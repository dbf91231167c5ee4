"""Shared summaries and calibration across replicas (both store backends): concurrent compactions
of the same history make ONE summary call; a crashed holder's lease expires; a failure is shared;
calibration measured on one replica is where another starts.

Replicas here are two proxy apps in this process that share nothing but the store (each has its
own plan cache, calibration and SDK client); ``tests/test_replicas.py`` runs separate processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.core.compaction import SummaryRequest
from proxy.core.tokens import TokenCounter
from proxy.server.appkeys import COMPACTION, METRICS, STORE
from proxy.server.compaction.summaries import summary_key
from proxy.tenancy.tenants import DEFAULT_TENANT
from tests.harness import LoopThread, ProxyServer
from tests.pg_server import fresh_schema
from tests.upstream import FakeUpstream, Hang, RecordedRequest, Reply, message_json

KEY = "sk-ant-lease-test-000111"
SUMMARY_MODEL = "claude-summary-lease"
SUMMARY = "SUMMARY: the user wants the migration finished"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'shared.db'}"



def _compaction(lease: float = 15, retries: int = 2) -> dict[str, Any]:
    return {
        "threshold": 20_000,
        "hard_limit": 60_000,
        "summary": {"model": SUMMARY_MODEL, "lease_seconds": lease, "max_retries": retries},
    }


def _turn(transcript: dict[str, Any], at_least: int) -> int:
    messages = transcript["messages"]
    return next(k for k in range(at_least, len(messages) + 1) if messages[k - 1]["role"] == "user")


def _body(transcript: dict[str, Any], k: int) -> bytes:
    return orjson.dumps(
        {"model": "claude-fake-1", "max_tokens": 100, "messages": transcript["messages"][:k], "tools": transcript["tools"]}
    )


def _summaries(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json()["model"] == SUMMARY_MODEL]


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json()["model"] != SUMMARY_MODEL]


def _script(upstream: FakeUpstream, summary: Reply) -> None:
    upstream.script(*[lambda r: summary if r.json()["model"] == SUMMARY_MODEL else Reply(message_json("ok"))] * 10)


def _post_together(targets: list[tuple[ProxyServer, bytes]]) -> list[httpx.Response]:
    """Send each body to its proxy at the same moment (one thread each)."""
    results: list[httpx.Response | None] = [None] * len(targets)
    start = threading.Barrier(len(targets))

    def send(i: int, proxy: ProxyServer, body: bytes) -> None:
        start.wait()
        results[i] = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=60)

    threads = [threading.Thread(target=send, args=(i, p, b)) for i, (p, b) in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _metric(proxy: ProxyServer, source: str) -> float:
    value = proxy.app[METRICS].registry.get_sample_value("context_proxy_summaries_total", {"source": source})
    return value or 0.0


def test_racing_replicas_make_one_summary_call_and_forward_the_same_bytes(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], store_url: str
) -> None:
    a = make_proxy(compaction=_compaction(), store={"url": store_url})
    b = make_proxy(compaction=_compaction(), store={"url": store_url})
    _script(upstream, Reply(message_json(SUMMARY), delay=0.6))  # a slow summary: the race is real
    body = _body(transcript, _turn(transcript, 90))

    answers = _post_together([(a, body), (b, body), (a, body), (b, body)])

    assert [r.status_code for r in answers] == [200] * 4
    assert len(_summaries(upstream)) == 1
    assert {r.headers["x-compaction-summary"] for r in answers} == {"ok"}
    assert len({r.headers["x-compaction-id"] for r in answers}) == 1
    forwarded = {r.body for r in _main(upstream)}
    assert len(_main(upstream)) == 4 and len(forwarded) == 1  # byte-identical views
    assert SUMMARY in forwarded.pop().decode()
    calls = a.app[COMPACTION].summary_calls + b.app[COMPACTION].summary_calls
    assert calls == 1
    assert _metric(a, "called") + _metric(b, "called") == 1
    assert _metric(a, "shared") + _metric(b, "shared") == 3


def test_a_crashed_holder_blocks_only_until_its_lease_expires(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], store_url: str, loop_thread: LoopThread
) -> None:
    body = _body(transcript, _turn(transcript, 90))
    # Learn the summary request of this history (what any replica will ask) from a throwaway run.
    probe = make_proxy(compaction=_compaction())  # its own store
    _script(upstream, Reply(message_json(SUMMARY)))
    httpx.post(probe.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=60)
    asked = _summaries(upstream)[-1].json()
    request = SummaryRequest(asked["model"], asked["max_tokens"], asked["system"], asked["messages"][0]["content"])
    # A replica took the lease (1.5 s) and died: it never renews, never settles.
    replica = make_proxy(compaction=_compaction(lease=1.5), store={"url": store_url})
    store = replica.app[STORE]
    claim = loop_thread.run(store.claim_summary(DEFAULT_TENANT, summary_key(request), "dead-replica:1", 1.5))
    assert claim.state == "acquired"
    calls_before = len(_summaries(upstream))

    started = time.monotonic()
    answer = httpx.post(replica.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=60)
    waited = time.monotonic() - started

    assert answer.status_code == 200 and answer.headers["x-compaction-summary"] == "ok"
    assert len(_summaries(upstream)) == calls_before + 1  # the waiter took over and called
    assert 1.0 < waited < 10
    again = loop_thread.run(store.claim_summary(DEFAULT_TENANT, summary_key(request), "late", 5))
    assert (again.state, again.text) == ("ok", SUMMARY)


def test_a_failed_summary_is_shared_not_retried_by_every_replica(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], store_url: str
) -> None:
    a = make_proxy(compaction=_compaction(retries=0), store={"url": store_url})
    b = make_proxy(compaction=_compaction(retries=0), store={"url": store_url})
    error = {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    _script(upstream, Reply(error, status=500, delay=0.5))
    body = _body(transcript, _turn(transcript, 90))

    answers = _post_together([(a, body), (b, body)])

    assert [r.status_code for r in answers] == [200, 200]
    assert len(_summaries(upstream)) == 1
    assert {r.headers["x-compaction-summary"] for r in answers} == {"failed"}
    main = _main(upstream)
    assert len(main) == 2 and main[0].body == main[1].body  # the same pruned view
    assert "boom" not in main[0].body.decode()


@pytest.mark.parametrize("model", ["cal-model", "vendor/cal-model"])
def test_calibration_measured_on_one_replica_starts_the_other(
    upstream: FakeUpstream, make_proxy: Any, store_url: str, loop_thread: LoopThread, model: str
) -> None:
    a = make_proxy(store={"url": store_url})
    b = make_proxy(store={"url": store_url})
    messages = [{"role": "user", "content": "calibrate " * 200}]
    body = orjson.dumps({"model": model, "max_tokens": 5, "messages": messages})
    estimate = TokenCounter().count_request(None, None, messages).total
    upstream.script(Reply(message_json("ok", input_tokens=2 * estimate)))
    first = httpx.post(a.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(first.headers["x-compaction-tokens-before"]) == estimate
    store = b.app[STORE]
    deadline = time.monotonic() + 10
    while loop_thread.run(store.get_calibration(DEFAULT_TENANT, model)) is None:
        assert time.monotonic() < deadline, "the calibration figure never reached the store"
        time.sleep(0.02)
    assert loop_thread.run(store.get_calibration(DEFAULT_TENANT, model)) == 2.0
    assert loop_thread.run(store.get_calibration("another-tenant", model)) is None

    on_b = httpx.post(b.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(on_b.headers["x-compaction-tokens-before"]) == 2 * estimate  # B's first request
    other_model = httpx.post(b.url + "/v1/messages", content=body.replace(model.encode(), b"other"), headers={"x-api-key": KEY})
    assert int(other_model.headers["x-compaction-tokens-before"]) == estimate


def test_a_store_failure_still_summarises(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], tmp_path: Path, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(compaction=_compaction(), store={"url": f"sqlite:///{tmp_path / 's.db'}"})
    loop_thread.run(proxy.app[STORE].close())  # every store call now fails: StoreUnavailable
    _script(upstream, Reply(message_json(SUMMARY)))
    answer = httpx.post(proxy.url + "/v1/messages", content=_body(transcript, _turn(transcript, 90)), headers={"x-api-key": KEY}, timeout=60)
    assert answer.status_code == 200 and answer.headers["x-compaction-summary"] == "ok"
    assert len(_summaries(upstream)) == 1



def test_a_holder_whose_client_leaves_hands_the_summary_over_at_once(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], store_url: str
) -> None:
    """A holds the lease (15 s) while its summary call hangs; its client gives up, so A lets the
    lease go: B, waiting for the same summary, takes over long before the lease would end."""
    a = make_proxy(compaction=_compaction(lease=15), store={"url": store_url})
    b = make_proxy(compaction=_compaction(lease=15), store={"url": store_url})
    asked: list[int] = []

    def answer(request: RecordedRequest) -> Reply | Hang:
        if request.json()["model"] != SUMMARY_MODEL:
            return Reply(message_json("ok"))
        asked.append(1)
        return Hang() if len(asked) == 1 else Reply(message_json(SUMMARY))

    upstream.script(*[answer] * 10)
    body = _body(transcript, _turn(transcript, 90))
    gone: list[BaseException] = []

    def impatient() -> None:
        try:
            httpx.post(a.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=1.5)
        except httpx.TimeoutException as exc:
            gone.append(exc)

    leaving = threading.Thread(target=impatient)
    leaving.start()
    deadline = time.monotonic() + 10
    while not asked:
        assert time.monotonic() < deadline, "A never made its summary call"
        time.sleep(0.01)
    started = time.monotonic()
    on_b = httpx.post(b.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=60)
    waited = time.monotonic() - started
    leaving.join()

    assert gone, "A's client was meant to give up"
    assert on_b.status_code == 200 and on_b.headers["x-compaction-summary"] == "ok"
    assert len(asked) == 2  # B made the call A abandoned
    assert waited < 8, f"B waited {waited:.1f} s: the lease was not let go"
    assert SUMMARY in _main(upstream)[-1].body.decode()
