"""Incremental summaries never take durable state into account.

A real Claude Code transcript is replayed turn by turn through the proxy, in a session that has
durable context (facts, a pending item, evidence) and, for comparison, in the same session with
none. The later compactions summarise the previous summary plus the newly dropped turns; the
durable block is in ``system`` on every turn. (Its size counts toward the threshold, so where a
compaction cuts may differ from a session without it; what it says never enters the summaries.)
What must hold:

* every summary request after the first starts from the previous summary (incremental);
* no summary request and no forwarded message contains any durable text: durable state lives in
  ``system`` only, whole on every turn (a write between turns shows from that turn on);
* a summary never writes durable state: only its own write API does.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import httpx2 as httpx
import orjson

from proxy.core.durable import Create, Fact, PendingItem
from proxy.server.appkeys import STORE
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-incremental-000111"
SESSION = "sess-incremental-1"
SUMMARY_MODEL = "claude-summary-incremental"
COMPACTION = {"threshold": 16_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}
T0 = "2026-12-01T10:00:00+00:00"
DURABLE_TEXTS = ["DURABLE-FACT deploys go through blue-green", "DURABLE-PENDING rotate the signing key"]
LATE_FACT = "DURABLE-LATE the staging database is read-only"



def _summary_of(request: RecordedRequest) -> str:
    """What the fake summary model answers: a function of what it was asked."""
    digest = hashlib.sha256(request.json()["messages"][0]["content"].encode()).hexdigest()[:12]
    return f"SUMMARY-{digest} goal: port the proxy\nFACT: deploys go straight to production"


def _summarizer(upstream: FakeUpstream) -> None:
    def answer(request: RecordedRequest) -> Reply:
        if request.json()["model"] == SUMMARY_MODEL:
            return Reply(message_json(_summary_of(request)))
        return Reply(message_json("ok"))

    upstream.script(*[answer] * 1000)


def _replay(
    proxy: ProxyServer, transcript: dict[str, Any], upstream: FakeUpstream, between: Any = None
) -> tuple[list[RecordedRequest], list[RecordedRequest]]:
    """POST every user turn in order; return (main requests, summary requests) received."""

    messages = transcript["messages"]
    ends = [k for k in range(1, len(messages) + 1) if messages[k - 1]["role"] == "user"]
    start = len(upstream.requests)
    for turn, k in enumerate(ends):
        if between is not None:
            between(turn)
        body = {"model": "claude-fake-1", "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}
        r = httpx.post(
            proxy.url + "/v1/messages",
            content=orjson.dumps(body),
            headers={"x-api-key": KEY, "x-session-id": SESSION},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    received = upstream.requests[start:]
    main = [r for r in received if r.json()["model"] != SUMMARY_MODEL]
    summaries = [r for r in received if r.json()["model"] == SUMMARY_MODEL]
    return main, summaries


def _seed(loop_thread: LoopThread, proxy: ProxyServer) -> None:
    changes = [
        Create(Fact("f-deploy", DURABLE_TEXTS[0], f"transcript:{SESSION}:1", T0)),
        Create(PendingItem("p-key", DURABLE_TEXTS[1], "open", f"transcript:{SESSION}:2", T0)),
    ]
    loop_thread.run(proxy.app[STORE].write_changes("default", SESSION, changes))


def test_incremental_summaries_never_see_durable_state(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], loop_thread: LoopThread
) -> None:
    proxy = make_proxy(compaction=COMPACTION)
    store = proxy.app[STORE]
    _seed(loop_thread, proxy)
    _summarizer(upstream)
    turns = sum(1 for m in transcript["messages"] if m["role"] == "user")
    half = turns // 2

    def write_late_fact(turn: int) -> None:
        if turn == half:
            fact = Create(Fact("f-late", LATE_FACT, f"transcript:{SESSION}:3", T0))
            loop_thread.run(store.write_changes("default", SESSION, [fact]))

    main, summaries = _replay(proxy, transcript, upstream, between=write_late_fact)

    # Several compaction events, each later one incremental: it starts from the previous summary.
    assert len(summaries) >= 2
    for previous, request in itertools.pairwise(summaries):
        text = request.json()["messages"][0]["content"]
        assert text.startswith(f"<previous_summary>\n{_summary_of(previous)}\n"), text[:200]
    # Durable state takes no part in summarising: no summary request carries any of it, and no
    # forwarded message does (it lives in ``system`` only, never in the compacted history).
    for request in summaries:
        assert "DURABLE-" not in request.body.decode()
    for request in main:
        assert "DURABLE-" not in orjson.dumps(request.json()["messages"]).decode()
    # The durable block is in ``system`` on every turn, whole; the late write shows from its turn.
    systems = [orjson.dumps(r.json().get("system")).decode() for r in main]
    assert all(DURABLE_TEXTS[0] in s and DURABLE_TEXTS[1] in s for s in systems)
    assert [LATE_FACT in s for s in systems] == [i >= half for i in range(len(main))]
    # Summaries never write durable state (the fake summary even reads like a fact): the history
    # is exactly the three writes made through the write API.
    history = loop_thread.run(store.history("default", SESSION))
    assert [entry.event.change.item.id for entry in history] == ["f-deploy", "p-key", "f-late"]
