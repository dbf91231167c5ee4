"""Memory stays bounded however many sessions pass through (issue 28), and nothing depends on a
cache hit.

Many distinct sessions (and agents, models, durable states, transcripts) are driven through the
real server, with the official SDK, against the fake upstream: once with the shipped bounds, once
with small bounds that every cache passes, once with none kept at all. Each cache's size, read from
``/metrics`` as an operator reads it, stays within its bound (and the small run shows it was
pushed out of its entries: evictions); and the upstream receives the very same bytes in every run,
the summary calls included, and the client the same answers: a miss only costs work."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.durable import Create, Fact
from proxy.core.pointers import PARSES, parse_pointer
from proxy.server.appkeys import COMPACTION, DURABLE, STORE, THINKING
from proxy.server.compaction.service import POLICIES
from proxy.server.context.durable import MAX_PENDING
from proxy.tenancy.tenants import DEFAULT_TENANT
from tests.harness import LoopThread, ProxyServer, cache_figures
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-memory-bounds-test-0028"
MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")
SESSIONS = 10
TURNS = 4
COMPACTION_SECTION = {"threshold": 6000, "hard_limit": 150_000, "keep_recent": 2}
SMALL = {
    "body_memo_bytes": 200_000,
    "token_memo_blocks": 12,
    "token_memo_messages": 8,
    "plan_cache_bytes": 20_000,
    "durable_states": 2,
    "transcript_exports": 3,
    "source_checks": 1,
    "calibration_keys": 2,
    "thinking_records": 2,
}
NONE = dict.fromkeys(SMALL, 0)


def _text(seed: str, size: int) -> str:
    line = f"{seed}: the handler parses the body, validates it and forwards it upstream.\n"
    return (line * (size // len(line) + 1))[:size]


def _session(i: int) -> str:
    return f"mem-{i:03d}"


def _conversations() -> Iterator[tuple[str, str, str, list[dict[str, Any]]]]:
    """(session, agent, model, messages) of every request, in the order they are sent: each
    conversation's turns interleaved with the others', some of them an agent's."""
    histories: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for turn in range(TURNS):
        for i in range(SESSIONS):
            agent = f"agent-{i}" if i % 3 == 0 else ""
            key = (_session(i), agent)
            history = histories.setdefault(key, [{"role": "user", "content": [
                {"type": "text", "text": _text(f"task {i} {agent}", 2000)},
            ]}])
            if turn:
                history.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {turn} of {i}."}]})
                # large turns: compaction removes the old ones; the body memo keeps bodies of 64 KiB
                history.append({"role": "user", "content": [
                    {"type": "text", "text": _text(f"turn {turn} of {i} {agent}", 30_000)}]})
            yield key[0], agent, MODELS[i % len(MODELS)], [dict(m) for m in history]


def _drive(proxy: ProxyServer, loop_thread: LoopThread) -> list[str]:
    """Every request through the SDK; the answers' text and compaction reports."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    for i in range(SESSIONS):  # a durable fact in each session: its state is read every turn
        fact = Fact(f"fact-{i}", f"Session {i} fixes the handler.", f"transcript:elsewhere-{i}:1",
                    "2026-12-01T00:00:00Z")
        loop_thread.run(proxy.app[STORE].write_changes(DEFAULT_TENANT, _session(i), [Create(fact)]))
    seen: list[str] = []
    for session, agent, model, messages in _conversations():
        headers = {"x-session-id": session, **({"x-agent-id": agent} if agent else {})}
        raw = client.messages.with_raw_response.create(
            model=model, max_tokens=256, messages=messages, extra_headers=headers  # type: ignore[arg-type]
        )
        answer = raw.parse()
        report = {k: v for k, v in raw.headers.items() if k.startswith("x-compaction-") and k != "x-compaction-ms"}
        seen.append(orjson.dumps([answer.content[0].model_dump(), sorted(report.items())]).decode())
    loop_thread.run(proxy.app[DURABLE].drain())  # the transcripts recorded and exported
    return seen


def _received(upstream: FakeUpstream, start: int) -> list[tuple[str, bytes]]:
    return [(r.path, r.body) for r in upstream.requests[start:]]


@pytest.fixture
def answers(upstream: FakeUpstream) -> Iterator[None]:
    """Every Messages call answered alike (no usage: calibration learns nothing, as without it)."""

    def reply(recorded: RecordedRequest) -> Reply:
        return Reply(message_json("Summary: the handler was fixed." if b"elsewhere" not in recorded.body else "Done."))

    upstream.script(*([reply] * 2000))
    yield


def test_every_cache_stays_within_its_bound_and_no_answer_depends_on_a_hit(
    make_proxy: Any, upstream: FakeUpstream, loop_thread: LoopThread, answers: None
) -> None:
    runs: dict[str, tuple[list[str], list[tuple[str, bytes]], dict[str, dict[str, float]]]] = {}
    conversations_with_plans: dict[str, int] = {}
    for name, limits in (("shipped", {}), ("small", SMALL), ("none", NONE)):
        start = len(upstream.requests)
        proxy = make_proxy(limits=limits, compaction=COMPACTION_SECTION)
        seen = _drive(proxy, loop_thread)
        runs[name] = (seen, _received(upstream, start), cache_figures(proxy.url))
        conversations_with_plans[name] = len(proxy.app[COMPACTION].plans._groups)
    shipped, small, none = runs["shipped"], runs["small"], runs["none"]
    # the same answers and reports, and byte for byte the same requests upstream (summaries too)
    assert len(shipped[1]) > SESSIONS * TURNS  # compaction made summary calls
    assert small[0] == shipped[0] and none[0] == shipped[0]
    assert small[1] == shipped[1] and none[1] == shipped[1]
    assert any("summarize" in s or "prune" in s for s in shipped[0])  # compaction did run
    for name, run in runs.items():
        for cache, figures in run[2].items():
            assert figures["entries"] <= figures["max_entries"], (name, cache, figures)
            if "max_weight_bytes" in figures:
                # the conversation served last keeps its plans, whatever their size
                assert figures["weight_bytes"] <= figures["max_weight_bytes"] or (
                    cache == "compaction_plans" and conversations_with_plans[name] == 1
                ), (name, cache, figures)
    caches = small[2]
    for cache, bound in SMALL.items():
        name = {"body_memo_bytes": "body_memo", "token_memo_blocks": "token_blocks",
                "token_memo_messages": "token_messages", "plan_cache_bytes": "compaction_plans"}.get(cache, cache)
        if name in ("source_checks", "thinking_records"):
            continue  # no local artifact pointer here, no binding model: below
        figures = caches[name]
        assert figures["evictions"] > 0, (name, figures)  # the traffic went past the bound
        if name != "compaction_plans":
            assert figures.get("weight_bytes", figures["entries"]) <= bound, (name, figures)
    assert caches["calibration"]["entries"] <= SMALL["calibration_keys"]
    for name in ("body_memo", "token_blocks", "token_messages", "durable_states",
                 "transcript_exports", "calibration_keys"):
        assert none[2][name]["entries"] == 0, name
    assert conversations_with_plans["none"] == 1 < conversations_with_plans["shipped"]


def test_distinct_models_and_pointers_never_grow_the_memos_past_their_bounds(make_proxy: Any) -> None:
    """What clients choose freely (model names, betas, pointers) keys memos too: driven past
    their bounds, they stay there."""
    proxy = make_proxy()
    service = proxy.app[COMPACTION]
    for i in range(POLICIES + 500):
        service._request_policy(service.config, f"claude-made-up-{i}", "", 1024 + i)  # its own limits
    texts = [f"transcript:s-{i}:{i + 1}" for i in range(PARSES.max_entries + 500)]
    assert all(parse_pointer(t).session == f"s-{i}" for i, t in enumerate(texts))  # type: ignore[union-attr]
    caches = cache_figures(proxy.url)
    for name in ("compaction_policies", "request_policies", "pointer_parses"):
        assert caches[name]["entries"] == caches[name]["max_entries"], name
        assert caches[name]["evictions"] >= 500, name


def test_thinking_records_stay_within_their_bound_on_a_binding_model(
    make_proxy: Any, upstream: FakeUpstream
) -> None:
    """Each answer's thinking block is recorded (what it was made under); past the bound the
    oldest records go, and a request whose block's record went is still answered (its block is
    judged as one made elsewhere: the client's own prefix, unchanged here, keeps it valid)."""
    proxy = make_proxy(limits={"thinking_records": 3})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)

    def thinking_reply(recorded: RecordedRequest) -> Reply:
        n = len(orjson.loads(recorded.body)["messages"])
        return Reply(message_json(content=[
            {"type": "thinking", "thinking": f"step {n}", "signature": f"sig-{n}-{recorded.body[-40:].hex()}"},
            {"type": "text", "text": f"answer {n}"},
        ]))

    upstream.script(*([thinking_reply] * 40))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for turn in range(8):
        answer = client.messages.create(model="claude-opus-5-5", max_tokens=256, messages=messages)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": [b.model_dump() for b in answer.content]},
                     {"role": "user", "content": f"go on {turn}"}]
    records = proxy.app[THINKING].records
    deadline = time.monotonic() + 5
    while records.cache.evictions < 5 and time.monotonic() < deadline:
        time.sleep(0.01)  # the last answer is learnt just after it was sent
    assert len(records) == 3 and records.cache.evictions == 5
    caches = cache_figures(proxy.url)
    assert caches["thinking_records"]["entries"] == 3 and caches["thinking_records"]["evictions"] == 5
    # every request reached the provider as sent: nothing was stale, nothing dropped
    assert all(b"drop_block" not in r.body for r in upstream.requests)


def test_a_stalled_store_never_queues_more_recordings_than_the_bound_and_nothing_is_lost(
    make_proxy: Any, upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    """Another process holds the SQLite file's write lock while sessions keep talking: the
    recordings queued for it stop at the bound (the rest skipped, as when the store fails), and
    once the lock is gone every conversation's next turn records what was skipped: each
    transcript holds every message, once, in order."""
    proxy = make_proxy()
    durable = proxy.app[DURABLE]
    durable.max_pending = 4
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    sessions = [f"stall-{i}" for i in range(12)]
    histories = {s: [{"role": "user", "content": f"task of {s}"}] for s in sessions}

    def turn(session: str) -> None:
        answer = client.messages.create(model="m", max_tokens=64, messages=histories[session],  # type: ignore[arg-type]
                                        extra_headers={"x-session-id": session})
        histories[session] = [*histories[session], {"role": "assistant", "content": answer.content[0].text},  # type: ignore[union-attr]
                              {"role": "user", "content": f"go on, {session} {len(histories[session])}"}]

    lock = sqlite3.connect(Path(proxy.config.state_dir) / "context-proxy.db", timeout=10)
    lock.execute("BEGIN IMMEDIATE")  # another process's write: the proxy's writer waits
    try:
        for session in sessions:
            turn(session)
            assert len(durable._tasks) <= durable.max_pending
    finally:
        lock.rollback()
        lock.close()
    assert durable.skipped > 0
    loop_thread.run(durable.drain())
    durable.max_pending = MAX_PENDING
    for session in sessions:  # the next turn of each
        turn(session)
    loop_thread.run(durable.drain())
    store = proxy.app[STORE]
    for session in sessions:
        events = loop_thread.run(store.transcript_events(DEFAULT_TENANT, session))
        got = [(e.event.role, e.event.content) for e in events]
        sent = histories[session][:-1]  # the last user message is the one not yet sent
        want = [(m["role"], m["content"]) for m in sent]
        assert [role for role, _ in got] == [role for role, _ in want], session
        # the answers recorded from the stream, or from the client's copy: the same text
        assert [str(content) for _, content in got][0::2] == [str(content) for _, content in want][0::2]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
