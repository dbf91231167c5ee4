"""The usage ledger end to end: the official SDK through a real proxy to the fake upstream, rows
read back through the admin API (``/admin/v1/usage...``), on SQLite and PostgreSQL.

Usage bodies are the provider's shapes (``/work/shared/reference/anthropic-protocol.md`` §4-5):
``usage`` with ``cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}``, a
stream's ``message_start`` usage and its cumulative ``message_delta`` usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from proxy.core.catalogue import price_of
from proxy.core.ledger import cost_of, row_sums, usage_from
from proxy.server.appkeys import METRICS, STORE
from proxy.server.ledger import LEDGER, record_upstream_call
from proxy.server.maintenance.retention import RETENTION
from proxy.store.usage import UsageQuery
from tests.harness import LoopThread, ProxyServer
from tests.pg_server import fresh_schema
from tests.test_admin import A_API_KEY, A_TOKEN, B_API_KEY, B_TOKEN, _write_policies
from tests.upstream import FakeUpstream, RecordedRequest, Reply, Reset, Stream, frame, message_json

SONNET = "claude-sonnet-4-5"
SUMMARY_MODEL = "claude-haiku-4-5"

CACHED_USAGE = {  # a call that read a cached prefix and wrote a new breakpoint, split 5m/1h
    "input_tokens": 12,
    "cache_creation_input_tokens": 3000,
    "cache_read_input_tokens": 40000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    "output_tokens": 250,
    "service_tier": "standard",
    "server_tool_use": {"web_search_requests": 0},
}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def keyed(make_proxy: Any, tmp_path: Path, store_url: str) -> ProxyServer:
    """A proxy with two tenants (acme, globex; ``auth.mode: keys``) and a fast ledger flush."""
    server: ProxyServer = make_proxy(
        auth={"mode": "keys"},
        policies_dir=str(_write_policies(tmp_path)),
        store={"url": store_url},
        ledger={"flush_seconds": 0.01},
    )
    return server


def _client(proxy: ProxyServer, key: str = A_API_KEY, session: str = "sess-1") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.url, api_key=key, max_retries=0, default_headers={"x-session-id": session}
    )


def _admin(proxy: ProxyServer, loop: LoopThread, path: str, token: str = A_TOKEN) -> httpx.Response:
    loop.run(proxy.app[LEDGER].flush(), timeout=10)
    return httpx.get(proxy.url + "/admin/v1" + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _rows(proxy: ProxyServer, loop: LoopThread, query: str = "", token: str = A_TOKEN) -> list[dict[str, Any]]:
    answer = _admin(proxy, loop, "/usage" + query, token)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["rows"]
    return rows


def _usage_stream(start_usage: dict[str, Any], delta_usages: list[dict[str, Any]], model: str = SONNET) -> list[bytes]:
    msg = message_json("", model=model, content=[])
    msg["stop_reason"] = None
    msg["usage"] = start_usage
    events = [
        frame("message_start", {"type": "message_start", "message": msg}),
        frame("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        frame("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "event: message_delta"}}),
        frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    for i, usage in enumerate(delta_usages):
        stop = "end_turn" if i == len(delta_usages) - 1 else None
        events.append(frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage}))
    events.append(frame("message_stop", {"type": "message_stop"}))
    return events


def test_a_json_answer_is_recorded_with_the_usage_exactly_as_returned(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    body = message_json("hi", model=SONNET)
    body["usage"] = CACHED_USAGE
    upstream.script(Reply(body))
    answer = _client(keyed).messages.create(model=SONNET, max_tokens=10, messages=[{"role": "user", "content": "hi"}])

    (row,) = _rows(keyed, loop_thread)
    assert row["provider_usage"] == CACHED_USAGE
    assert row["usage"] == {
        "input_tokens": 12,
        "cache_creation_input_tokens": 3000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
        "cache_read_input_tokens": 40000,
        "output_tokens": 250,
    }
    assert (row["input_tokens"], row["cache_creation_5m"], row["cache_creation_1h"]) == (12, 1000, 2000)
    assert row["tenant"] == "acme" and row["session"] == "sess-1" and row["kind"] == "client"
    assert row["model"] == SONNET and row["route"] == "messages" and row["status"] == 200
    assert row["request_id"] == answer._request_id and row["request_id"].startswith("req_")
    assert row["plan"] == "none" and row["layers"] == "none" and row["at"].endswith("+00:00")
    assert row["total_input_tokens"] == 43012
    assert row["cache_hit_ratio"] == pytest.approx(40000 / 43012)
    # Sonnet 4.5: $3 input, $3.75 5m write, $6 1h write, $0.30 read, $15 output per million
    assert row["cost_usd"] == pytest.approx(
        {
            "input": 12 * 3 / 1e6,
            "cache_write": (1000 * 3.75 + 2000 * 6) / 1e6,
            "cache_read": 40000 * 0.30 / 1e6,
            "output": 250 * 15 / 1e6,
            "total": (12 * 3 + 1000 * 3.75 + 2000 * 6 + 40000 * 0.30 + 250 * 15) / 1e6,
        }
    )
    assert row["savings_usd"] == 0  # nothing was compacted
    metrics = keyed.app[METRICS].registry
    for kind, value in (("input", 12), ("cache_read", 40000), ("cache_creation", 3000), ("output", 250)):
        labels = {"tenant": "acme", "model": SONNET, "type": kind}
        assert metrics.get_sample_value("context_proxy_usage_tokens_total", labels) == value


def test_a_stream_records_the_final_usage(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    start = {"input_tokens": 20, "cache_creation_input_tokens": 500, "cache_read_input_tokens": 9000,
             "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 0}, "output_tokens": 1}
    deltas = [{"output_tokens": 30}, {"output_tokens": 77, "input_tokens": 20, "cache_read_input_tokens": 9000}]
    upstream.script(Stream(_usage_stream(start, deltas)))
    with _client(keyed).messages.stream(model=SONNET, max_tokens=100, messages=[{"role": "user", "content": "go"}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens == 77  # what the SDK saw is what the ledger keeps

    (row,) = _rows(keyed, loop_thread)
    assert row["usage"] == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 500,
        "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 0},
        "cache_read_input_tokens": 9000,
        "output_tokens": 77,
    }
    assert row["cost_usd"]["cache_write"] == pytest.approx(500 * 3.75 / 1e6)


def test_upstream_errors_are_recorded_without_usage(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    bad = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}
    upstream.script(Reply(error, status=529), Reply(bad, status=400))
    client = _client(keyed)
    for status in (529, 400):
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model=SONNET, max_tokens=10, messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == status

    rows = _rows(keyed, loop_thread)
    assert [(r["status"], r["usage"], r["output_tokens"]) for r in rows] == [(529, None, None), (400, None, None)]
    assert all(r["cost_usd"]["total"] == 0 for r in rows)
    summary = _admin(keyed, loop_thread, "/usage/summary").json()
    assert summary["totals"]["errors"] == 2 and summary["totals"]["calls"] == 2


def test_an_unreachable_upstream_is_recorded_as_a_502(make_proxy: Any, tmp_path: Path, loop_thread: LoopThread) -> None:
    proxy = make_proxy(
        upstream_url="http://127.0.0.1:9", auth={"mode": "keys"}, policies_dir=str(_write_policies(tmp_path)),
        ledger={"flush_seconds": 0.01},
    )
    with pytest.raises(anthropic.APIStatusError):
        _client(proxy).messages.create(model=SONNET, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    (row,) = _rows(proxy, loop_thread)
    assert (row["status"], row["usage"], row["request_id"]) == (502, None, None)


def test_summary_calls_are_recorded_with_their_own_usage(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, transcript: dict[str, Any],
    loop_thread: LoopThread, store_url: str,
) -> None:
    proxy = make_proxy(
        auth={"mode": "keys"}, policies_dir=str(_write_policies(tmp_path)), store={"url": store_url},
        ledger={"flush_seconds": 0.01},
        compaction={"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}},
    )
    summary_usage = {"input_tokens": 15000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 900}
    main_usage = {"input_tokens": 18000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 40}

    def answer(r: RecordedRequest) -> Reply:
        usage = summary_usage if r.json()["model"] == SUMMARY_MODEL else main_usage
        body = message_json("SUMMARY: keep going" if usage is summary_usage else "ok", model=r.json()["model"])
        body["usage"] = usage
        return Reply(body)

    upstream.script(*[answer] * 4)
    messages = transcript["messages"]
    k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
    response = httpx.post(
        proxy.url + "/v1/messages",
        content=orjson.dumps({"model": SONNET, "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}),
        headers={"x-api-key": A_API_KEY, "x-session-id": "long-1"}, timeout=60,
    )
    assert response.status_code == 200 and response.headers["x-compaction-summary"] == "ok"

    rows = _rows(proxy, loop_thread)
    assert [r["kind"] for r in rows] == ["summary", "client"]
    summary, client = rows
    assert summary["model"] == SUMMARY_MODEL and summary["session"] == "long-1" and summary["tenant"] == "acme"
    assert summary["provider_usage"] == summary_usage and summary["route"] == "summary"
    assert client["plan"] == "new" and client["compaction_id"] == response.headers["x-compaction-id"]
    assert client["tokens_before"] == int(response.headers["x-compaction-tokens-before"])
    assert client["tokens_after"] == int(response.headers["x-compaction-tokens-after"])
    assert client["layers"] == response.headers["x-compaction-layers"]
    # savings: removed tokens (scaled to the provider's count) at the input price (nothing cached)
    removed = (client["tokens_before"] - client["tokens_after"]) * 18000 / client["tokens_after"]
    assert client["savings_usd"] == pytest.approx(removed * 3 / 1e6)
    answer = _admin(proxy, loop_thread, "/usage/summary").json()
    assert answer["tenant"] == "acme"  # whose figures these are (the token's tenant)
    totals = answer["totals"]
    assert (totals["summary_calls"], totals["client_calls"], totals["compaction_events"]) == (1, 1, 1)
    assert totals["cost_usd"]["total"] == pytest.approx((15000 * 1 + 900 * 5) / 1e6 + (18000 * 3 + 40 * 15) / 1e6)
    saved = client["tokens_before"] - client["tokens_after"]
    assert totals["tokens_saved"] == saved > 0
    assert totals["tokens_saved_ratio"] == pytest.approx(saved / client["tokens_before"])
    assert totals["unpriced_models"] == [] and totals["unpriced_note"] is None
    # /metrics: the tokens saved, per tenant, and never a series per session
    metrics = proxy.app[METRICS].registry
    assert metrics.get_sample_value("context_proxy_tokens_saved_total", {"tenant": "acme"}) == saved
    exposed = httpx.get(proxy.url + "/metrics", timeout=10).text
    assert 'context_proxy_tokens_saved_total{tenant="acme"}' in exposed
    assert "long-1" not in exposed and 'session="' not in exposed


def test_tenants_see_only_their_own_usage(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    _client(keyed, A_API_KEY, "acme-s").messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "a"}])
    _client(keyed, B_API_KEY, "globex-s").messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "b"}])
    assert [r["session"] for r in _rows(keyed, loop_thread, "", A_TOKEN)] == ["acme-s"]
    assert [r["session"] for r in _rows(keyed, loop_thread, "", B_TOKEN)] == ["globex-s"]
    assert _rows(keyed, loop_thread, "?session=globex-s", A_TOKEN) == []
    sessions = _admin(keyed, loop_thread, "/usage/sessions", A_TOKEN).json()
    assert [s["session"] for s in sessions["sessions"]] == ["acme-s"] and sessions["total"] == 1
    assert _admin(keyed, loop_thread, "/usage/summary", B_TOKEN).json()["totals"]["calls"] == 1
    assert _admin(keyed, loop_thread, "/usage", "not-a-token").status_code == 401


def test_paging_ranges_and_bad_parameters(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    client = _client(keyed)
    for i in range(5):
        client.messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": str(i)}])
    ids: list[int] = []
    after = 0
    while True:
        page = _admin(keyed, loop_thread, f"/usage?limit=2&after={after}").json()
        ids += [r["id"] for r in page["rows"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert len(ids) == 5 and ids == sorted(ids)
    all_rows = _rows(keyed, loop_thread)
    third = all_rows[2]["at"]
    ranged = _rows(keyed, loop_thread, f"?since={third.replace('+00:00', 'Z')}")
    assert [r["id"] for r in ranged] == [r["id"] for r in all_rows if r["at"] >= third]
    assert _rows(keyed, loop_thread, "?until=2000-01-01T00:00:00Z") == []
    for bad in ("?since=yesterday", "?since=2026-01-01T00:00:00", "?limit=0", "?limit=5000", "?after=-1",
                "?kind=other", "?session=../x", "?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z"):
        answer = _admin(keyed, loop_thread, "/usage" + bad)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert _admin(keyed, loop_thread, "/usage/summary?bucket=1&since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00Z").status_code == 400
    assert _admin(keyed, loop_thread, "/usage/sessions?sort=cheapest").status_code == 400


def test_summary_buckets_cover_the_range(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    body = message_json("hi", model=SONNET)
    body["usage"] = CACHED_USAGE
    upstream.script(Reply(body), Reply(body))
    client = _client(keyed)
    for _ in range(2):
        client.messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    now = time.time()
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600))
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600))
    summary = _admin(keyed, loop_thread, f"/usage/summary?since={since}&until={until}&bucket=600").json()
    assert summary["bucket_seconds"] == 600 and len(summary["series"]) == 12
    assert sum(b["calls"] for b in summary["series"]) == 2 == summary["totals"]["calls"]
    assert summary["totals"]["cache_read_input_tokens"] == 80000
    assert summary["totals"]["cache_creation_1h_input_tokens"] == 4000
    assert summary["totals"]["cache_hit_ratio"] == pytest.approx(40000 / 43012)
    price = price_of(SONNET)
    assert price is not None
    one = row_sums(kind="client", status=200, usage=usage_from(CACHED_USAGE), tokens_before=0, tokens_after=0,
                   plan="none", summary="skipped", compaction_id=None)
    assert summary["totals"]["cost_usd"]["total"] == pytest.approx(2 * cost_of(one, price).total)


def test_recording_does_not_delay_the_answer(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    """A store that stalls on every ledger write holds no answer; the rows land once it recovers."""
    store = keyed.app[STORE]
    original = store.record_usage
    gate = asyncio.Event()

    async def stalled(*args: Any, **kwargs: Any) -> None:
        await gate.wait()
        await original(*args, **kwargs)

    store.record_usage = stalled  # type: ignore[method-assign]
    try:
        client = _client(keyed, session="stall-1")
        for _ in range(3):
            client.messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        # every answer arrived while the write is stuck: nothing is in the store yet
        assert loop_thread.run(original.__self__.usage_rows("acme", UsageQuery())) == ()
        loop_thread.loop.call_soon_threadsafe(gate.set)
        loop_thread.run(keyed.app[LEDGER].flush(), timeout=10)
    finally:
        store.record_usage = original  # type: ignore[method-assign]
    rows = loop_thread.run(store.usage_rows("acme", UsageQuery(session="stall-1")))
    assert len(rows) == 3


def test_retrieval_calls_recorded_through_record_upstream_call(keyed: ProxyServer, loop_thread: LoopThread) -> None:
    """The function a proxy-made continuation (kind retrieval) calls; counted apart from client calls."""
    usage = {"input_tokens": 700, "cache_read_input_tokens": 30000, "cache_creation_input_tokens": 0, "output_tokens": 60}

    async def record() -> None:
        record_upstream_call(keyed.app, tenant="acme", session="r-1", model=SONNET, kind="retrieval",
                             route="retrieval", status=200, latency_ms=80.0, usage=usage, request_id="req_r1")

    loop_thread.run(record())
    (row,) = _rows(keyed, loop_thread, "?kind=retrieval")
    assert (row["kind"], row["session"], row["provider_usage"]) == ("retrieval", "r-1", usage)
    totals = _admin(keyed, loop_thread, "/usage/summary").json()["totals"]
    assert (totals["retrieval_calls"], totals["client_calls"], totals["calls"]) == (1, 0, 1)


def test_rows_past_the_retention_are_deleted(keyed: ProxyServer, loop_thread: LoopThread) -> None:
    old_ms = int((time.time() - 200 * 86400) * 1000)  # retention.usage_ledger: 90 days by default
    old = (time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(old_ms / 1000)), old_ms)

    async def record() -> int:
        for started, rid in ((old, "req_old"), (None, "req_new")):
            record_upstream_call(keyed.app, tenant="acme", session="k-1", model=SONNET, kind="client",
                                 status=200, latency_ms=1.0, usage=None, request_id=rid, started=started)
        await keyed.app[LEDGER].flush()
        report = await keyed.app[RETENTION].run_once()  # the one garbage collector
        return report.deleted.get("usage_ledger", 0)

    assert loop_thread.run(record()) == 1
    assert [r["request_id"] for r in _rows(keyed, loop_thread)] == ["req_new"]


def test_a_full_queue_drops_rows_and_never_the_answer(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(auth={"mode": "keys"}, policies_dir=str(_write_policies(tmp_path)),
                       ledger={"queue_size": 1, "batch_size": 1, "flush_seconds": 0.01})
    store = proxy.app[STORE]
    gate = asyncio.Event()
    original = store.record_usage

    async def stalled(*args: Any, **kwargs: Any) -> None:
        await gate.wait()
        await original(*args, **kwargs)

    store.record_usage = stalled  # type: ignore[method-assign]
    try:
        client = _client(proxy)
        for _ in range(4):
            client.messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        loop_thread.loop.call_soon_threadsafe(gate.set)
        loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    finally:
        store.record_usage = original  # type: ignore[method-assign]
    registry = proxy.app[METRICS].registry
    dropped = registry.get_sample_value("context_proxy_ledger_rows_total", {"outcome": "dropped"}) or 0
    written = registry.get_sample_value("context_proxy_ledger_rows_total", {"outcome": "written"}) or 0
    assert dropped >= 1 and written + dropped == 4
    assert len(_rows(proxy, loop_thread)) == written


def test_sessions_filter_sort_and_page(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reply(input_tokens: int) -> Reply:
        body = message_json("ok", model=SONNET)
        body["usage"] = {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
        return Reply(body)

    error = Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, status=500)
    upstream.script(reply(1000), reply(5000), reply(3000), error)
    for session in ("cheap", "dear", "middle", "middle"):
        try:
            _client(keyed, session=session).messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        except anthropic.InternalServerError:
            pass

    def sessions(query: str) -> list[str]:
        answer = _admin(keyed, loop_thread, "/usage/sessions" + query)
        assert answer.status_code == 200, answer.text
        return [s["session"] for s in answer.json()["sessions"]]

    assert sessions("?sort=cost") == ["dear", "middle", "cheap"]
    assert sessions("") == ["middle", "dear", "cheap"]  # most recent first
    assert sessions("?status=error") == ["middle"]
    assert sessions("?status=ok&sort=cost") == ["dear", "cheap"]
    assert sessions("?sort=cost&limit=1&offset=1") == ["middle"]
    middle = _admin(keyed, loop_thread, "/usage/sessions?status=error").json()["sessions"][0]
    assert (middle["calls"], middle["errors"], middle["models"]) == (2, 1, [SONNET])
    assert middle["cost_usd"]["total"] == pytest.approx(3000 * 3 / 1e6 + 15 / 1e6)
    # an answer never holds part of a range: too many groups is a 400
    monkeypatch.setattr("proxy.store.usage.MAX_GROUPS", 2)
    monkeypatch.setattr("proxy.server.admin.usage.MAX_GROUPS", 2)
    assert _admin(keyed, loop_thread, "/usage/sessions").status_code == 400


def test_newest_first_paging(upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread) -> None:
    client = _client(keyed)
    for i in range(5):
        client.messages.create(model=SONNET, max_tokens=5, messages=[{"role": "user", "content": str(i)}])
    ascending = [r["id"] for r in _rows(keyed, loop_thread)]
    seen: list[int] = []
    query = "?order=desc&limit=2"
    while True:
        page = _admin(keyed, loop_thread, "/usage" + query).json()
        seen += [r["id"] for r in page["rows"]]
        assert page["next_after"] is None
        if page["next_before"] is None:
            break
        query = f"?order=desc&limit=2&before={page['next_before']}"
    assert seen == ascending[::-1]
    assert _admin(keyed, loop_thread, "/usage?order=desc&after=1").status_code == 400
    assert _admin(keyed, loop_thread, "/usage?before=3").status_code == 400


def test_a_stream_cut_by_the_upstream_is_recorded_with_what_arrived(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    start = {"input_tokens": 50, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 800, "output_tokens": 1}
    upstream.script(Stream(_usage_stream(start, [{"output_tokens": 40}]), cut_after=3))
    with pytest.raises(anthropic.APIError):
        with _client(keyed).messages.stream(model=SONNET, max_tokens=100, messages=[{"role": "user", "content": "go"}]) as s:
            s.get_final_message()
    (row,) = _rows(keyed, loop_thread)
    assert row["status"] == 200  # the status the upstream sent; the body was cut after it
    assert row["usage"]["cache_read_input_tokens"] == 800 and row["output_tokens"] == 1  # message_start's


def test_a_summary_call_without_an_answer_is_a_502_row(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, transcript: dict[str, Any], loop_thread: LoopThread
) -> None:
    proxy = make_proxy(
        auth={"mode": "keys"}, policies_dir=str(_write_policies(tmp_path)), ledger={"flush_seconds": 0.01},
        compaction={"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL, "max_retries": 0}},
    )
    upstream.script(lambda r: Reset() if r.json()["model"] == SUMMARY_MODEL else Reply(message_json("ok")),
                    lambda r: Reply(message_json("ok")))
    messages = transcript["messages"]
    k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
    response = httpx.post(
        proxy.url + "/v1/messages",
        content=orjson.dumps({"model": SONNET, "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}),
        headers={"x-api-key": A_API_KEY, "x-session-id": "long-2"}, timeout=60,
    )
    assert response.status_code == 200 and response.headers["x-compaction-summary"] == "failed"
    summary, client = _rows(proxy, loop_thread)
    assert (summary["kind"], summary["status"], summary["usage"], summary["session"]) == ("summary", 502, None, "long-2")
    assert client["summary"] == "failed"
    totals = _admin(proxy, loop_thread, "/usage/summary").json()["totals"]
    assert (totals["errors"], totals["summary_failures"]) == (1, 1)


def test_any_model_field_the_client_sends_is_a_storable_row(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    client = _client(keyed)
    for model in ("m" * 5000, "nul\u0000model", "tab\tmodel"):
        client.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert [r["model"] for r in _rows(keyed, loop_thread)] == ["m" * 200, "(unprintable)", "(unprintable)"]
    series = keyed.app[METRICS].registry.get_sample_value(
        "context_proxy_ledger_rows_total", {"outcome": "dropped"}
    )
    assert not series
