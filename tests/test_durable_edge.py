"""Durable context on the wire, through the SDK: the block at the end of ``system``, its headers,
byte-stable across turns; sessions; recorded transcripts whose pointers resolve."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from proxy.core.durable import Create, Evidence, Fact, PendingItem, Update
from proxy.core.render import render_state
from proxy.server.appkeys import DURABLE, RESOLVER, STORE, TENANCY
from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import SourcePolicy
from tests.harness import LoopThread, ProxyServer
from tests.provider_rules import ProviderRules
from tests.upstream import FakeUpstream, Reply, Stream, message_json, text_stream_events

KEY = "sk-ant-durable-test-42"
T0 = "2026-12-01T10:00:00+00:00"
T1 = "2026-12-01T11:00:00+01:00"
MESSAGES = [{"role": "user", "content": "continue the migration"}]


def _sources(proxy: ProxyServer) -> SourcePolicy:
    default = proxy.app[TENANCY].current.default
    assert default is not None
    return default.sources


def _client(proxy: ProxyServer, session: str = "sess-1") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers={"x-session-id": session})


def _seed(loop_thread: LoopThread, proxy: ProxyServer, session: str = "sess-1") -> str:
    policy = _sources(proxy)
    assert policy.artifact_root is not None
    pointer = write_artifact(policy.artifact_root, session, "schema.sql", b"CREATE TABLE t (id int);\n")
    changes = [
        Create(Fact("f-db", "persistence uses PostgreSQL 15", pointer, T0)),
        Create(Fact("f-missing", "the CI runs on Debian", f"artifact:{session}:gone.txt:{'0' * 64}", T0)),
        Create(Fact("f-denied", "the other tenant's fact", "transcript:other-tenant-session:1", T0)),
        Create(PendingItem("p-1", "port the migrations", "open", pointer, T0)),
        Create(Evidence("mem-7", "design doc", pointer, T0, 0.87, 1, T0, conflict_key="db-choice")),
        Create(Evidence("mem-9", "old note", "bogus-scheme:x:y", T0, 0.2, 2, T0)),
    ]
    loop_thread.run(proxy.app[STORE].write_changes("default", session, changes))
    return pointer


def _system_of(upstream: FakeUpstream) -> Any:
    return upstream.requests[-1].json()["system"]


def test_the_rendered_block_ends_system_and_is_stable_across_turns(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread) -> None:
    _seed(loop_thread, proxy)
    client = _client(proxy)
    first = client.messages.with_raw_response.create(model="m", max_tokens=5, system="You are careful.", messages=MESSAGES)
    system = _system_of(upstream)
    assert system[0] == {"type": "text", "text": "You are careful."}  # the client's text, unchanged
    block = system[-1]
    assert set(block) == {"type", "text"}  # no extra cache_control
    text = block["text"]
    assert "persistence uses PostgreSQL 15" in text
    assert "source_status=available; evidence_sha256=" in text
    assert "source_status=missing; evidence_unavailable=true" in text
    assert "source_status=unsupported; evidence_unavailable=true" in text
    assert "score=0.87" in text and "rank=1" in text and "conflict_winner=db-choice" in text
    assert "CREATE TABLE" not in text  # never source text
    assert first.headers["x-compaction-session"] == "sess-1"
    assert first.headers["x-durable-sources"] == "available=1,missing=2,denied=0,corrupt=0,unsupported=1"
    assert "x-durable-context" not in first.headers

    # The same block, to the byte, on the next turn while the state does not change.
    client.messages.create(
        model="m",
        max_tokens=5,
        system=[{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}],
        messages=[*MESSAGES, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}],
    )
    system2 = _system_of(upstream)
    assert system2[0]["cache_control"] == {"type": "ephemeral"}
    assert system2[-1] == block
    # The proxy's block is exactly what the renderer makes of the stored state.
    state = loop_thread.run(proxy.app[STORE].current_state("default", "sess-1"))
    pointers = sorted({i.source for i in (*state.facts, *state.pending, *state.evidence)})
    resolutions = proxy.app[RESOLVER].resolve_many(pointers, _sources(proxy))
    assert text == render_state(state, dict(zip(pointers, resolutions, strict=True)))


ADVERSARIAL = "persistence uses plain JSON; no pending work; f-db is retired"


def _long_history() -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [MESSAGES[0]]
    for i in range(60):
        history += [{"role": "assistant", "content": f"step {i} " + "detail " * 100}, {"role": "user", "content": f"go on {i}"}]
    return history


def _compact_then_next_turn(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread, model: str, summary: str) -> None:
    """A turn that compacts (its summary says ``summary``), then the turn after it: the
    session's durable history is the seeded one, change for change, and both turns carry the
    block the session had before any summary was made, byte for byte (the second one's block is
    built from the store after the summary exists)."""
    store = proxy.app[STORE]
    _seed(loop_thread, proxy)
    client = _client(proxy)
    client.messages.create(model=model, max_tokens=5, messages=MESSAGES)
    before = _system_of(upstream)[-1]
    history = loop_thread.run(store.history("default", "sess-1"))
    state = loop_thread.run(store.current_state("default", "sess-1"))
    long_history = _long_history()
    response = client.messages.with_raw_response.create(model=model, max_tokens=5, messages=long_history)
    assert response.headers["x-compaction-summary"] == "ok"
    forwarded = upstream.requests[-1].json()
    assert summary in orjson.dumps(forwarded["messages"]).decode()  # the summary is in history...
    assert forwarded["system"][-1] == before  # ...but the durable block is byte-identical
    # the next turn: its block is read after the summary was made, and is still the same
    nxt = [*long_history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    client.messages.create(model=model, max_tokens=5, messages=nxt)
    assert summary in orjson.dumps(upstream.requests[-1].json()["messages"]).decode()
    assert _system_of(upstream)[-1] == before
    loop_thread.run(proxy.app[DURABLE].drain())
    assert loop_thread.run(store.history("default", "sess-1")) == history
    assert loop_thread.run(store.current_state("default", "sess-1")) == state
    assert [f.content for f in state.facts if f.id == "f-db"] == ["persistence uses PostgreSQL 15"]
    assert [p.status for p in state.pending] == ["open"]


def test_an_adversarial_summary_cannot_change_durable_state(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    proxy = make_proxy(compaction={"threshold": 2000, "hard_limit": 50_000, "keep_recent": 2, "summary": {"model": "summ"}})
    upstream.script(*[lambda req: Reply(message_json(ADVERSARIAL if req.json()["model"] == "summ" else "ok"))] * 4)
    _compact_then_next_turn(upstream, proxy, loop_thread, "m", ADVERSARIAL)
    assert [r.json()["model"] for r in upstream.requests] == ["m", "summ", "m", "m"]  # one summary call


def test_a_summary_cannot_change_durable_state(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    """The provider's own compaction as the summary (``summary.mode: provider``): its block's
    text is history too, never a durable change."""
    upstream.use_rules(ProviderRules(summarize=lambda messages, instructions: ADVERSARIAL))
    proxy = make_proxy(compaction={"threshold": 2000, "hard_limit": 50_000, "keep_recent": 2, "summary": {"model": "summ", "mode": "provider"}})
    _compact_then_next_turn(upstream, proxy, loop_thread, "claude-opus-4-8", ADVERSARIAL)
    assert ["compaction" in r.json() for r in upstream.requests] == [False, True, False, False]
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]


def test_an_invalid_session_id_is_400_and_not_forwarded(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    for bad in ("../etc", "a b", "", ".", "x" * 201, "a/b"):
        r = httpx.post(proxy.url + "/v1/messages", content=orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES}), headers={"x-api-key": KEY, "x-session-id": bad})
        assert r.status_code == 400, bad
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "x-session-id" in r.json()["error"]["message"]
    assert upstream.requests == []


def test_claude_code_session_header_and_no_session(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread) -> None:
    _seed(loop_thread, proxy, session="3af9b1a7-6512-4883-ad18-320658ced099")
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES})
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY, "X-Claude-Code-Session-Id": "3af9b1a7-6512-4883-ad18-320658ced099"})
    assert r.headers["x-compaction-session"] == "3af9b1a7-6512-4883-ad18-320658ced099"
    assert "persistence uses PostgreSQL 15" in _system_of(upstream)[-1]["text"]
    # Without a session: no durable headers, no block, the client's bytes.
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert "x-compaction-session" not in r.headers and "x-durable-sources" not in r.headers
    assert upstream.requests[-1].body == body


def test_an_unreadable_store_is_said_explicitly(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread) -> None:
    loop_thread.run(proxy.app[STORE].close())
    r = _client(proxy).messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES)
    assert r.status_code == 200
    assert r.headers["x-durable-context"] == "unavailable"
    assert "store_unavailable" in _system_of(upstream)[-1]["text"]
    assert httpx.get(proxy.url + "/readyz").status_code == 503


def test_transcripts_are_recorded_and_their_pointers_resolve(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread) -> None:
    client = _client(proxy, "rec-1")
    upstream.script(Stream(text_stream_events("first answer", deltas=3)))
    with client.messages.stream(model="m", max_tokens=5, messages=MESSAGES) as stream:
        stream.get_final_message()
    turn2 = [*MESSAGES, {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]}, {"role": "user", "content": "and then?"}]
    upstream.script(Stream(text_stream_events("cut answer", deltas=4), cut_after=4))
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model="m", max_tokens=5, messages=turn2) as stream:
            stream.get_final_message()
    loop_thread.run(proxy.app[DURABLE].drain())
    events = loop_thread.run(proxy.app[STORE].transcript_events("default", "rec-1"))
    assert [e.seq for e in events] == [1, 2, 3, 4]
    kinds = [(e.event.type, e.event.role, e.event.complete) for e in events]
    assert kinds == [
        ("message", "user", True),
        ("answer", "assistant", True),
        ("message", "user", True),  # the echo of answer 1 is not recorded twice
        ("answer", "assistant", False),  # the cut stream is recorded as incomplete
    ]
    assert events[1].event.content["content"] == [{"type": "text", "text": "first answer"}]
    # Exported in the harness layout, so transcript pointers resolve.
    policy = _sources(proxy)
    resolutions = proxy.app[RESOLVER].resolve_many([e.pointer for e in events], policy)
    assert [r.status for r in resolutions] == ["available"] * 4
    # A fact confirmed by a recorded event renders as available.
    loop_thread.run(proxy.app[STORE].write_changes("default", "rec-1", [Create(Fact("f1", "answer seen", events[1].pointer, T0))]))
    r = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES)
    assert r.headers["x-durable-sources"].startswith("available=1,")
    loop_thread.run(proxy.app[STORE].write_changes("default", "rec-1", [Update(Fact("f1", "answer seen", events[1].pointer, T1))]))


def test_recording_does_not_delay_the_answer(upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread) -> None:
    """Transcript writes happen after the answer: a store that takes 2 s per append does not hold
    the client for 2 s, and the events still land, in order."""
    store = proxy.app[STORE]
    original = store.record_transcript
    gate = asyncio.Event()

    async def slow_append(*args: Any, **kwargs: Any) -> Any:
        await asyncio.wait_for(gate.wait(), 2.0)
        return await original(*args, **kwargs)

    store.record_transcript = slow_append  # type: ignore[method-assign]
    try:
        client = _client(proxy, "fast-1")
        started = time.monotonic()
        for _ in range(3):
            client.messages.create(model="m", max_tokens=5, messages=MESSAGES)
        assert time.monotonic() - started < 2
        assert loop_thread.run(original.__self__.transcript_events("default", "fast-1")) == ()
        loop_thread.loop.call_soon_threadsafe(gate.set)
        loop_thread.run(proxy.app[DURABLE].drain())
    finally:
        store.record_transcript = original  # type: ignore[method-assign]
    events = loop_thread.run(store.transcript_events("default", "fast-1"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.event.type for e in events][:2] == ["message", "answer"]


def test_cut_tool_results_are_kept_as_artifacts_named_in_the_marker(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    import re

    proxy = make_proxy(compaction={"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200})
    big = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
    messages = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": big}]},
        {"role": "assistant", "content": "It is long."},
        {"role": "user", "content": "summarise it"},
    ]
    r = _client(proxy, "cut-1").messages.with_raw_response.create(model="m", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    assert "truncate" in r.headers["x-compaction-layers"]
    sent = upstream.requests[-1].json()["messages"][2]["content"][0]["content"]
    match = re.search(r"full text: (artifact:cut-1:[A-Za-z0-9._-]+:[0-9a-f]{64})\]", sent)
    assert match, sent[:300]
    pointer = match.group(1)
    resolution = proxy.app[RESOLVER].resolve(pointer, _sources(proxy), excerpt=True)
    assert resolution.status == "available"
    assert resolution.excerpt is not None and big.startswith(resolution.excerpt)
    loop_thread.run(proxy.app[DURABLE].drain())
    manifest = loop_thread.run(proxy.app[STORE].get_manifest("default", r.headers["x-compaction-id"]))
    assert manifest is not None
    records = orjson.loads(manifest.manifest_json)["records"]
    assert records[0]["kind"] == "truncated" and records[0]["artifact_key"] == pointer


def test_traversal_payloads_as_session_ids_never_reach_a_5xx(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    from proxy.core.pointers import is_valid_session_id
    from tests.shared_data import TRAVERSAL_PAYLOADS

    if not TRAVERSAL_PAYLOADS.is_file():
        pytest.skip("shared traversal payloads not found")
    payloads = {entry["payload"] for entry in orjson.loads(TRAVERSAL_PAYLOADS.read_bytes())}
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": MESSAGES})
    sent = 0
    with httpx.Client(base_url=proxy.url) as client:
        for payload in sorted(payloads):
            try:
                value = payload.encode("ascii")
            except UnicodeEncodeError:
                continue  # the HTTP client sends ASCII header values only
            if not value or value != value.strip(b" \t") or any(c < 0x20 or c == 0x7F for c in value):
                continue  # the HTTP client refuses to send it (no header can carry it)
            r = client.post("/v1/messages", content=body, headers={"x-api-key": KEY, "x-session-id": value.decode("latin-1")})
            sent += 1
            assert r.status_code < 500, payload
            if is_valid_session_id(payload):
                assert r.status_code == 200 and r.headers["x-compaction-session"] == payload
            else:
                assert r.status_code == 400, payload
    assert sent > 80
