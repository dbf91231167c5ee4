"""The usage ledger and the provider's own compaction and notes, end to end: the official SDK (beta
messages) through a real proxy to the fake upstream, rows and sums read back through the admin API,
on SQLite and PostgreSQL.

Shapes, from the provider's docs and the SDK 2.16 types (``types/beta/beta_usage.py``,
``beta_iterations_usage.py``, ``beta_raw_message_delta_event.py``, ``beta_message.py``):

* ``usage.iterations[]``: ``{"type": "compaction" | "message", input_tokens,
  cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cache_creation?}``; "A
  `compaction` entry's tokens are not included in the top-level `usage` fields" (BetaUsage). The
  "Compaction at a token threshold" page's example: top-level 23,000 in / 1,000 out, a compaction
  entry of 180,000 / 3,500 and the message entry of 23,000 / 1,000. On-demand compaction
  (``compaction: {"type": "summarize"}``, beta ``compact-2026-09-04``): top-level 0, the cost in one
  compaction entry, ``stop_reason: "compaction"``.
* ``context_management.applied_edits`` on the Message, at the top level of ``message_delta`` in a
  stream; ``input_transformations`` a top-level array of the Message, in ``message_start``'s
  message in a stream (``{"type": "thinking_dropped", "path": "messages.3.content.0",
  "reason": "prefix_binding_mismatch"}``).

Expected costs are computed here from the provider's published Sonnet 4.5 prices (USD per million
tokens: input 3, 5-minute cache write 3.75, 1-hour cache write 6, cache read 0.30, output 15), not
from the code under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from proxy.server.appkeys import METRICS
from proxy.server.compaction.summary_client import SummaryClient
from proxy.server.ledger import LEDGER, ClientCall, calls_for, record_upstream_call
from tests.harness import LoopThread, ProxyServer
from tests.pg_server import fresh_schema
from tests.test_admin import A_API_KEY, A_TOKEN, _write_policies
from tests.upstream import FakeUpstream, Reply, Stream, frame, message_json

SONNET = "claude-sonnet-4-5"
# the provider's Sonnet 4.5 prices, USD per million tokens
PRICE = {"input": 3.0, "write_5m": 3.75, "write_1h": 6.0, "read": 0.30, "output": 15.0}
FIGURES = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


def usd(input: int = 0, write_5m: int = 0, write_1h: int = 0, read: int = 0, output: int = 0) -> dict[str, float]:
    parts = {
        "input": input * PRICE["input"] / 1e6,
        "cache_write": (write_5m * PRICE["write_5m"] + write_1h * PRICE["write_1h"]) / 1e6,
        "cache_read": read * PRICE["read"] / 1e6,
        "output": output * PRICE["output"] / 1e6,
    }
    return {**parts, "total": sum(parts.values())}


def added(*costs: dict[str, float]) -> dict[str, float]:
    return {k: sum(c[k] for c in costs) for k in costs[0]}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def keyed(make_proxy: Any, tmp_path: Path, store_url: str) -> ProxyServer:
    server: ProxyServer = make_proxy(
        auth={"mode": "keys"},
        policies_dir=str(_write_policies(tmp_path)),
        store={"url": store_url},
        ledger={"flush_seconds": 0.01},
    )
    return server


def _client(proxy: ProxyServer, session: str = "sess-p") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.url, api_key=A_API_KEY, max_retries=0, default_headers={"x-session-id": session}
    )


def _admin(proxy: ProxyServer, loop: LoopThread, path: str) -> Any:
    loop.run(proxy.app[LEDGER].flush(), timeout=10)
    answer = httpx.get(proxy.url + "/admin/v1" + path, headers={"Authorization": f"Bearer {A_TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _rows(proxy: ProxyServer, loop: LoopThread, query: str = "") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _admin(proxy, loop, "/usage" + query)["rows"]
    return rows


THRESHOLD_EDITS = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}]}
MESSAGES: list[Any] = [{"role": "user", "content": "go on"}]

# -- threshold compaction, JSON: the docs' example figures ------------------------------------------

DOCS_COMPACTION = {"type": "compaction", "input_tokens": 180000, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 0, "output_tokens": 3500}
DOCS_MESSAGE = {"type": "message", "input_tokens": 23000, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 1000}
DOCS_USAGE = {"input_tokens": 23000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
              "output_tokens": 1000, "iterations": [DOCS_COMPACTION, DOCS_MESSAGE]}
EDITS = [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 8, "cleared_input_tokens": 50000},
         {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 1200}]


def test_a_json_answer_is_billed_the_sum_of_its_iterations(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    body = message_json("Based on our conversation...", model=SONNET, content=[
        {"type": "compaction", "content": "Summary of the conversation: ..."},
        {"type": "text", "text": "Based on our conversation..."},
    ])
    body["usage"] = DOCS_USAGE
    body["context_management"] = {"applied_edits": EDITS}
    upstream.script(Reply(body))
    answer = _client(keyed).beta.messages.create(
        model=SONNET, max_tokens=2000, messages=MESSAGES, context_management=THRESHOLD_EDITS,  # type: ignore[arg-type]
        betas=["compact-2026-01-12"],
    )
    assert answer.usage.iterations is not None and len(answer.usage.iterations) == 2  # what the client saw

    (row,) = _rows(keyed, loop_thread)
    # every token once: 180,000 + 23,000 in and 3,500 + 1,000 out (not the top-level 23,000 / 1,000,
    # nor the top-level plus the message entry that repeats it)
    assert (row["input_tokens"], row["output_tokens"]) == (203000, 4500)
    assert (row["cache_read_input_tokens"], row["cache_creation_input_tokens"]) == (0, 0)
    assert row["provider_usage"] == DOCS_USAGE  # the provider's object, whole
    assert row["usage"]["input_tokens"] == 203000
    assert row["provider_compactions"] == 1
    assert (row["provider_compaction_input_tokens"], row["provider_compaction_output_tokens"]) == (180000, 3500)
    assert row["provider_compaction_cache_read_input_tokens"] == 0
    assert row["cost_usd"] == pytest.approx(usd(input=203000, output=4500))
    assert round(row["cost_usd"]["total"], 2) == 0.68  # $0.609 input + $0.0675 output
    assert row["provider_compaction_cost_usd"] == pytest.approx(usd(input=180000, output=3500))
    assert row["provider_notes"] == {"applied_edits": EDITS}
    assert row["thinking_blocks_dropped"] == 0 and row["agent"] is None
    metrics = keyed.app[METRICS].registry
    for kind, value in (("input", 203000), ("output", 4500)):
        labels = {"tenant": "acme", "model": SONNET, "type": kind}
        assert metrics.get_sample_value("context_proxy_usage_tokens_total", labels) == value


# -- threshold compaction, streamed: iterations in the last message_delta -----------------------------

STREAM_COMPACTION = {"type": "compaction", "input_tokens": 100, "cache_creation_input_tokens": 3000,
                     "cache_read_input_tokens": 150000, "output_tokens": 2500,
                     "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 3000}}
STREAM_MESSAGE = {"type": "message", "input_tokens": 5, "cache_creation_input_tokens": 2000,
                  "cache_read_input_tokens": 40000, "output_tokens": 800,
                  "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0}}
TRANSFORMATIONS = [
    {"type": "thinking_dropped", "path": "messages.3.content.0", "reason": "prefix_binding_mismatch"},
    {"type": "thinking_dropped", "path": "messages.3.content.1", "reason": "prefix_binding_mismatch"},
    {"type": "thinking_mismatch_allowed", "path": "messages.5.content.0", "reason": "prefix_binding_mismatch"},
]


def _stream(start: dict[str, Any], deltas: list[dict[str, Any]], content: list[dict[str, Any]]) -> list[bytes]:
    """``start``: message_start's message fields beyond the defaults; ``deltas``: each
    message_delta's top-level fields (``usage``, ``context_management``, ...)."""
    message = {**message_json("", model=SONNET, content=[]), "stop_reason": None, **start}
    events = [frame("message_start", {"type": "message_start", "message": message})]
    for index, block in enumerate(content):
        if block["type"] == "compaction":
            events.append(frame("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": {"type": "compaction", "content": None}}))
            events.append(frame("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "compaction_delta", "content": block["content"]}}))
        else:
            events.append(frame("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": {"type": "text", "text": ""}}))
            events.append(frame("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "text_delta", "text": block["text"]}}))
        events.append(frame("content_block_stop", {"type": "content_block_stop", "index": index}))
    for i, fields in enumerate(deltas):
        stop = "end_turn" if i == len(deltas) - 1 else None
        events.append(frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, **fields}))
    events.append(frame("message_stop", {"type": "message_stop"}))
    return events


def test_a_stream_is_billed_the_iterations_of_its_last_message_delta(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    start_usage = {"input_tokens": 5, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 40000,
                   "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0},
                   "output_tokens": 1}
    final_usage = {"output_tokens": 800, "input_tokens": 5, "cache_read_input_tokens": 40000,
                   "cache_creation_input_tokens": 2000, "iterations": [STREAM_COMPACTION, STREAM_MESSAGE]}
    upstream.script(Stream(_stream(
        {"usage": start_usage, "input_transformations": TRANSFORMATIONS},
        [{"usage": {"output_tokens": 300}},
         {"usage": final_usage, "context_management": {"applied_edits": EDITS[:1]}}],
        [{"type": "compaction", "content": "Summary: ..."}, {"type": "text", "text": "done"}],
    )))
    with _client(keyed).beta.messages.stream(
        model=SONNET, max_tokens=2000, messages=MESSAGES, context_management=THRESHOLD_EDITS,  # type: ignore[arg-type]
        betas=["compact-2026-01-12"],
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.iterations is not None and final.usage.output_tokens == 800

    (row,) = _rows(keyed, loop_thread)
    # 5 + 100 in, 40,000 + 150,000 read, 2,000 (5m) + 3,000 (1h) written, 800 + 2,500 out
    assert [row[k] for k in FIGURES] == [105, 5000, 190000, 3300]
    assert (row["cache_creation_5m"], row["cache_creation_1h"]) == (2000, 3000)
    assert row["cost_usd"] == pytest.approx(usd(input=105, write_5m=2000, write_1h=3000, read=190000, output=3300))
    assert round(row["cost_usd"]["total"], 2) == 0.13  # $0.132315
    assert row["provider_compaction_cost_usd"] == pytest.approx(usd(input=100, write_1h=3000, read=150000, output=2500))
    assert [row[f"provider_compaction_{k}"] for k in FIGURES] == [100, 3000, 150000, 2500]
    assert row["provider_compaction_cache_creation_1h"] == 3000
    assert row["provider_notes"] == {"applied_edits": EDITS[:1], "input_transformations": TRANSFORMATIONS}
    assert row["thinking_blocks_dropped"] == 2  # thinking_mismatch_allowed is not a drop


def test_without_iterations_the_top_level_figures_are_billed(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    usage = {"input_tokens": 40, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 9000, "output_tokens": 70}
    upstream.script(Stream(_stream({"usage": {**usage, "output_tokens": 1}}, [{"usage": {"output_tokens": 70}}],
                                   [{"type": "text", "text": "ok"}])))
    with _client(keyed).beta.messages.stream(model=SONNET, max_tokens=100, messages=MESSAGES) as stream:
        stream.get_final_message()
    (row,) = _rows(keyed, loop_thread)
    assert [row[k] for k in FIGURES] == [40, 0, 9000, 70]
    assert row["provider_compactions"] == 0 and row["provider_compaction_input_tokens"] is None
    assert row["provider_compaction_cost_usd"] is None and row["provider_notes"] is None
    assert row["cost_usd"] == pytest.approx(usd(input=40, read=9000, output=70))


# -- on-demand compaction: top-level 0, the whole cost in one compaction iteration -------------------

ON_DEMAND_ITERATION = {"type": "compaction", "input_tokens": 150000, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 20000, "output_tokens": 2000}


def test_an_on_demand_compaction_costs_what_its_iteration_says(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    body = message_json("", model=SONNET, stop_reason="compaction", content=[
        {"type": "compaction", "content": "Summary of the conversation so far.", "signature": "sig-1"},
    ])
    body["usage"] = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                     "output_tokens": 0, "iterations": [ON_DEMAND_ITERATION]}
    upstream.script(Reply(body))
    answer = _client(keyed).beta.messages.create(
        model=SONNET, max_tokens=4000, messages=MESSAGES, compaction={"type": "summarize"},
        betas=["compact-2026-09-04"],
    )
    assert answer.stop_reason == "compaction" and answer.usage.input_tokens == 0
    assert upstream.requests[-1].json()["compaction"] == {"type": "summarize"}  # forwarded as sent

    (row,) = _rows(keyed, loop_thread)
    assert [row[k] for k in FIGURES] == [150000, 0, 20000, 2000]
    assert row["cost_usd"] == pytest.approx(usd(input=150000, read=20000, output=2000))
    assert round(row["cost_usd"]["total"], 2) == 0.49  # $0.45 + $0.006 + $0.03
    assert row["provider_compaction_cost_usd"] == pytest.approx(row["cost_usd"])  # all of it
    assert row["provider_compactions"] == 1


# -- input transformations in a JSON answer; the sums -------------------------------------------------


def test_the_sums_count_compaction_and_dropped_thinking_per_session(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    docs = message_json("ok", model=SONNET)
    docs["usage"] = DOCS_USAGE
    dropped = message_json("ok", model=SONNET)
    dropped["usage"] = {"input_tokens": 900, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 30}
    dropped["input_transformations"] = TRANSFORMATIONS[:1]
    on_demand = message_json("", model=SONNET, stop_reason="compaction",
                             content=[{"type": "compaction", "content": "S", "signature": "sig"}])
    on_demand["usage"] = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                          "output_tokens": 0, "iterations": [ON_DEMAND_ITERATION]}
    upstream.script(Reply(docs), Reply(dropped), Reply(on_demand), Reply(dropped))
    client = _client(keyed, "sess-sums")
    for _ in range(4):
        client.beta.messages.create(model=SONNET, max_tokens=100, messages=MESSAGES)
    _client(keyed, "sess-other").beta.messages.create(model=SONNET, max_tokens=100, messages=MESSAGES)  # default answer

    rows = _rows(keyed, loop_thread, "?session=sess-sums")
    assert [r["thinking_blocks_dropped"] for r in rows] == [0, 1, 0, 1]
    assert rows[1]["provider_notes"] == {"input_transformations": TRANSFORMATIONS[:1]}
    expected_cost = added(usd(input=203000, output=4500), usd(input=900, output=30),
                          usd(input=150000, read=20000, output=2000), usd(input=900, output=30))
    expected_compaction = added(usd(input=180000, output=3500), usd(input=150000, read=20000, output=2000))
    (session,) = [s for s in _admin(keyed, loop_thread, "/usage/sessions")["sessions"] if s["session"] == "sess-sums"]
    totals = _admin(keyed, loop_thread, "/usage/summary?session=sess-sums")["totals"]
    for figures in (session, totals):
        assert figures["calls"] == 4
        assert figures["input_tokens"] == 203000 + 900 + 150000 + 900
        assert figures["output_tokens"] == 4500 + 30 + 2000 + 30
        assert figures["cache_read_input_tokens"] == 20000
        assert figures["provider_compactions"] == 2
        assert figures["provider_compaction_input_tokens"] == 330000
        assert figures["provider_compaction_cache_read_input_tokens"] == 20000
        assert figures["provider_compaction_output_tokens"] == 5500
        assert figures["thinking_blocks_dropped"] == 2
        assert figures["cost_usd"] == pytest.approx(expected_cost)
        assert figures["provider_compaction_cost_usd"] == pytest.approx(expected_compaction)
        assert "priced_5m_provider_compaction" not in figures
    everyone = _admin(keyed, loop_thread, "/usage/summary")["totals"]
    assert everyone["calls"] == 5 and everyone["thinking_blocks_dropped"] == 2


# -- the agent ------------------------------------------------------------------------------------------


def test_rows_carry_the_agent_they_are_given(
    upstream: FakeUpstream, keyed: ProxyServer, loop_thread: LoopThread
) -> None:
    """``ClientCall``, ``calls_for`` (the summary calls made within) and ``record_upstream_call``
    take the agent (the edge passes it once it reads one); without it, rows have none."""
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 2}
    recorder = keyed.app[LEDGER]
    summary = message_json("SUMMARY", model="claude-haiku-4-5")
    upstream.script(Reply(summary, headers={"request-id": "req_s1"}))

    async def record() -> None:
        body = {"model": SONNET, "messages": MESSAGES}
        ClientCall(recorder, "acme", "sess-a", body, {}, agent="agent-7f3").record(200, usage, "req_a1")
        ClientCall(recorder, "acme", "sess-a", body, {}).record(200, usage, "req_a2")
        summariser = SummaryClient(upstream.url, max_retries=0, timeout_seconds=10)
        try:
            with calls_for("acme", "sess-a", recorder, agent="agent-7f3"):
                await summariser.create({**body, "model": "claude-haiku-4-5", "max_tokens": 50}, {"X-Api-Key": "sk-ant-x"})
        finally:
            await summariser.close()
        record_upstream_call(recorder, tenant="acme", session="sess-a", model=SONNET, kind="retrieval",
                             route="retrieval", status=200, latency_ms=1.0, usage=usage, request_id="req_r1",
                             agent="agent-9")

    loop_thread.run(record())
    rows = _rows(keyed, loop_thread, "?session=sess-a")
    assert [(r["kind"], r["request_id"], r["agent"]) for r in rows] == [
        ("client", "req_a1", "agent-7f3"), ("client", "req_a2", None),
        ("summary", "req_s1", "agent-7f3"), ("retrieval", "req_r1", "agent-9"),
    ]
