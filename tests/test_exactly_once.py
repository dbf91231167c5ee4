"""One record of truth (issue 9): every transcript event exactly once, whatever the replicas, and a
pointer that can only ever verify the event the store numbered.

Real ``context-proxy serve`` processes on one store (SQLite file and PostgreSQL), a real fake
upstream. One process and two and three replicas (alternating with no pause, racing on a turn, a
client retry of a turn) record the same events; every ``transcript:`` pointer resolves, through a
running replica, to the SHA-256 of the event the store holds at that sequence number; the JSONL
export equals the store's projection after a SIGKILL, a deleted, truncated or wrong file, and a
2 MB message.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.core.durable import Create, Fact
from proxy.sources.pointer_resolver import PointerResolver
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.sources.transcript_records import record_bytes, record_sha256
from proxy.store import RecordedEvent, open_store
from tests.harness import LoopThread
from tests.pg_server import fresh_schema
from tests.test_cli import ServeProcess
from tests.upstream import FakeUpstream

T0 = "2026-12-01T10:00:00+00:00"
HEADERS = {"x-api-key": "sk-ant-once-1", "anthropic-version": "2023-06-01"}
TURNS = 8


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _store(request.param, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def export_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The export is the same code on either store: PostgreSQL only with --run-slow."""
    yield from _store(request.param, tmp_path)


def _store(param: str, tmp_path: Path) -> Iterator[str]:
    if param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
    else:
        with fresh_schema("once") as url:
            yield url


def _config(tmp_path: Path, upstream_url: str, store_url: str) -> Path:
    path = tmp_path / "proxy.yaml"
    data = {
        "upstream": {"base_url": upstream_url},
        "store": {"url": store_url},
        "state_dir": str(tmp_path / "shared-volume"),
        "shutdown": {"grace_seconds": 2},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _start(config: Path, n: int) -> list[ServeProcess]:
    """``n`` replicas on one config, one after the other (started at once, they can outlast the
    harness's start timeout on a busy 2-core box); one that started is stopped if a later fails."""
    started: list[ServeProcess] = []
    try:
        for _ in range(n):
            started.append(ServeProcess(config))
    except BaseException:
        for replica in started:
            replica.stop()
        raise
    return started


def _transcripts(tmp_path: Path) -> Path:
    return tmp_path / "shared-volume" / "sources" / "transcripts"


def _policy(tmp_path: Path) -> SourcePolicy:
    base = tmp_path / "shared-volume" / "sources"
    return SourcePolicy(
        frozenset({"transcript", "artifact"}), ("*",), str(base / "transcripts"), str(base / "artifacts")
    )


def _answer_content(response: httpx.Response, stream: bool) -> list[Any]:
    """What a client appends as the assistant turn (the answer's content blocks)."""
    if not stream:
        return list(response.json()["content"])
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data:"):
            event = orjson.loads(line[5:])
            if event.get("type") == "content_block_delta":
                text += event["delta"].get("text", "")
    return [{"type": "text", "text": text}]


def _post(url: str, session: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    r = httpx.post(
        url + "/v1/messages",
        content=orjson.dumps(body),
        headers={**HEADERS, "x-session-id": session, **headers},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r


def _chat(urls: list[str], session: str, *, race: tuple[int, ...] = (), retry: tuple[int, ...] = ()) -> None:
    """``TURNS`` turns, turn t to ``urls[t % len(urls)]``, each sent as soon as the previous
    answer arrived; on ``race`` turns the same request goes to every url at once, on ``retry``
    turns it is sent again (to the next url) after its answer, as a client that retries does."""
    messages: list[dict[str, Any]] = []
    for t in range(TURNS):
        messages.append({"role": "user", "content": f"turn {t}: " + "words " * (t + 1)})
        stream = t % 2 == 1
        body = {"model": "claude-fake-1", "max_tokens": 50, "messages": list(messages), "stream": stream}
        if t in race:
            results: list[httpx.Response] = []

            def send(url: str, body: dict[str, Any] = body, results: list[httpx.Response] = results) -> None:
                results.append(_post(url, session, body))

            threads = [threading.Thread(target=send, args=(u,)) for u in urls]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            response = results[0]
        else:
            response = _post(urls[t % len(urls)], session, body)
            if t in retry:
                response = _post(urls[(t + 1) % len(urls)], session, body)
        messages.append({"role": "assistant", "content": _answer_content(response, stream)})


def _events(loop: LoopThread, store_url: str, session: str, expected: int | None = None) -> list[RecordedEvent]:
    """The session's events as the store holds them (waiting, up to 15 s, for ``expected``:
    answers are recorded just after they are relayed)."""

    async def read() -> list[RecordedEvent]:
        store = await open_store(store_url)
        try:
            return list(await store.transcript_events("default", session, 0, 1000))
        finally:
            await store.close()

    deadline = time.monotonic() + 15
    while True:
        events = loop.run(read())
        if expected is None or len(events) >= expected or time.monotonic() > deadline:
            time.sleep(0.3 if expected is not None else 0)  # nothing more lands after it
            events = loop.run(read())
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            return events
        time.sleep(0.05)


def _shape(events: list[RecordedEvent]) -> list[tuple[str, str, Any, bool]]:
    """What must be equal between runs: everything but ids and times (each answer has its own
    message id from the upstream)."""
    out = []
    for e in events:
        content = e.event.content
        if e.event.type == "answer" and isinstance(content, dict):
            content = {k: v for k, v in content.items() if k != "id"}
        out.append((e.event.type, e.event.role, content, e.event.complete))
    return out


def _export_lines(tmp_path: Path, session: str) -> list[bytes]:
    path = _transcripts(tmp_path) / f"{session}.jsonl"
    return path.read_bytes().split(b"\n")[:-1] if path.exists() else []


def _wait_export(tmp_path: Path, session: str, events: list[RecordedEvent]) -> None:
    want = [record_bytes(e) for e in events]
    deadline = time.monotonic() + 15
    while _export_lines(tmp_path, session) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _export_lines(tmp_path, session) == want, "the export is not the store's projection"


def test_replicas_record_each_event_once_and_pointers_name_the_stored_event(
    tmp_path: Path, upstream: FakeUpstream, loop_thread: LoopThread, store_url: str
) -> None:
    config = _config(tmp_path, upstream.url, store_url)
    replicas: list[ServeProcess] = []
    try:
        replicas.extend(_start(config, 3))
        urls = [r.url for r in replicas]
        # the same conversation: one process, two and three replicas alternating without a
        # pause; racing turns and a client retry included (the same in every run)
        runs = {"one": urls[:1], "two": urls[:2], "three": urls}
        for session, targets in runs.items():
            _chat(targets, session, race=(3, 6), retry=(5,))
        single = _events(loop_thread, store_url, "one", 2 * TURNS)
        assert len(single) == 2 * TURNS
        assert [e.event.type for e in single] == ["message", "answer"] * TURNS
        for session in ("two", "three"):
            events = _events(loop_thread, store_url, session, 2 * TURNS)
            assert _shape(events) == _shape(single), f"{session}: not what one process records"
            _wait_export(tmp_path, session, events)

        # Every pointer, verified by a running replica, names the event the store holds there.
        events = _events(loop_thread, store_url, "three")
        facts = [Create(Fact(f"f{e.seq}", f"event {e.seq}", e.pointer, T0)) for e in events]
        facts.append(Create(Fact("beyond", "no such event", "transcript:three:999", T0)))

        async def write() -> None:
            store = await open_store(store_url)
            try:
                await store.write_changes("default", "three", facts)
            finally:
                await store.close()

        loop_thread.run(write())
        before = len(upstream.requests)
        body = {"model": "claude-fake-1", "max_tokens": 5, "messages": [{"role": "user", "content": "check"}]}
        for url in urls:
            r = _post(url, "three", body)
            assert r.headers["x-durable-sources"] == f"available={len(events)},missing=1,denied=0,corrupt=0,unsupported=0"
        for sent in upstream.requests[before:]:
            block = sent.json()["system"][-1]["text"]
            found = dict(re.findall(r"source=(transcript:three:\d+) source_status=available; evidence_sha256=([0-9a-f]{64})", block))
            assert found == {e.pointer: record_sha256(e) for e in events}
        for replica in replicas:
            assert not [line for line in replica.lines if "Traceback" in line or "not recorded" in line]
    finally:
        for replica in replicas:
            replica.stop()


def test_export_is_repaired_from_the_store_after_sigkill_deletion_truncation_and_a_wrong_line(
    tmp_path: Path, upstream: FakeUpstream, loop_thread: LoopThread, export_store_url: str
) -> None:
    store_url = export_store_url
    config = _config(tmp_path, upstream.url, store_url)
    session = "crashy"
    path = _transcripts(tmp_path) / f"{session}.jsonl"
    messages: list[dict[str, Any]] = []
    replicas = _start(config, 2)
    turn = killed = 0

    def step(target: ServeProcess, text: str = "", **headers: str) -> None:
        nonlocal turn
        messages.append({"role": "user", "content": text or f"turn {turn}"})
        r = _post(target.url, session, {"model": "claude-fake-1", "max_tokens": 5, "messages": list(messages)}, **headers)
        messages.append({"role": "assistant", "content": r.json()["content"]})
        turn += 1

    def settled() -> list[RecordedEvent]:
        events = _events(loop_thread, store_url, session, 2 * turn)
        assert len(events) == 2 * turn and [e.event.role for e in events] == ["user", "assistant"] * turn
        # every answer is an ``answer`` event, except one a SIGKILL took before it was stored:
        # then the client's copy of it, sent back with the next turn, stands for it (once)
        assert [e.event.type for e in events if e.event.role == "assistant"].count("message") <= killed
        _wait_export(tmp_path, session, events)
        return events

    damages: list[Callable[[], None]] = [
        lambda: path.write_bytes(b"\n".join(path.read_bytes().split(b"\n")[:-3]) + b'\n{"schema_version":1,"seq'),
        lambda: path.unlink(),
        lambda: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
        # a complete last line that is not the store's event at that sequence
        lambda: path.write_bytes(
            b"\n".join([*path.read_bytes().split(b"\n")[:-2], path.read_bytes().split(b"\n")[0]]) + b"\n"
        ),
    ]
    try:
        for _ in range(3):
            step(replicas[turn % 2])
        settled()
        # SIGKILL right after an answer (its store write and export may or may not be done),
        # then the file as a kill mid-export leaves it: lines missing and a partial last one.
        step(replicas[0])
        replicas[0].proc.kill()
        killed = 1
        replicas[0].stop()
        replicas[0] = ServeProcess(config)
        for damage in damages:
            damage()
            step(replicas[turn % 2])
            settled()
        # a 2 MB message: recorded whole, exported whole, its pointer verifies
        step(replicas[1], "x" * (2 << 20), **{"x-compaction": "off"})
        events = settled()
        assert len(record_bytes(events[-2])) > 2 << 20
        resolver = _resolver_for(loop_thread, store_url, tmp_path)
        for e, line in zip(events, _export_lines(tmp_path, session), strict=True):
            resolution = resolver(e.pointer)
            assert resolution.status == "available"
            assert resolution.evidence_sha256 == hashlib.sha256(line).hexdigest() == record_sha256(e)
        assert resolver(f"transcript:{session}:{len(events) + 1}").status == "missing"
    finally:
        for replica in replicas:
            replica.stop()


def _resolver_for(loop: LoopThread, store_url: str, tmp_path: Path) -> Callable[[str], Any]:
    policy = _policy(tmp_path)

    def resolve(pointer: str) -> Any:
        async def run() -> Any:
            store = await open_store(store_url)
            try:
                return await PointerResolver(store, SourceResolver()).resolve("default", policy, pointer)
            finally:
                await store.close()

        return loop.run(run())

    return resolve


# --- in one process: nesting, plans across sessions -------------------------------------------


def _nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _tool_result_tower(levels: int) -> list[Any]:
    """A tool_result whose content nests tool_result blocks ``levels`` deep (what broke marker
    stripping with a RecursionError)."""
    content: list[Any] = [{"type": "text", "text": "bottom", "cache_control": {"type": "ephemeral"}}]
    for i in range(levels):
        content = [{"type": "tool_result", "tool_use_id": f"toolu_n{i}", "content": content}]
    return content


def _deep_bodies(depth: int) -> dict[str, dict[str, Any]]:
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"v": 1}}]}
    base = [{"role": "user", "content": "go"}, use]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    return {
        "system.0.citations.0": {"system": [{"type": "text", "text": "s", "citations": _nested(depth)}], "messages": [{"role": "user", "content": "go"}]},
        "tools.0.input_schema.properties.0": {"tools": [{"name": "t", "input_schema": {"type": "object", "properties": _nested(depth, {})}}], "messages": [{"role": "user", "content": "go"}]},
        "messages.0.content.0.extra.0": {"messages": [{"role": "user", "content": [{"type": "text", "text": "go", "extra": _nested(depth)}]}]},
        "messages.1.content.0.input.v.0": {"messages": [{"role": "user", "content": "go"}, {**use, "content": [{**use["content"][0], "input": {"v": _nested(depth)}}]}, {"role": "user", "content": [result]}]},  # type: ignore[index, dict-item]
        "messages.2.content.0.content.0.content.0": {"messages": [*base, {"role": "user", "content": [{**result, "content": _tool_result_tower(depth // 2)}]}]},
    }


@pytest.mark.parametrize("depth", [150, 600, 1100])
def test_deep_nesting_anywhere_is_a_clear_400_and_nothing_is_half_done(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    from proxy.server.appkeys import DURABLE, STORE

    proxy = make_proxy()
    for position, extra in _deep_bodies(depth).items():
        before = len(upstream.requests)
        body = {"model": "m", "max_tokens": 5, **extra}
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(proxy.url + path, content=orjson.dumps(body) if depth < 250 else _dump_deep(body), headers={**HEADERS, "x-session-id": "deep-1"})
            assert r.status_code == 400, (position, r.text[:300])
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "nested deeper than 128 levels" in error["message"], error["message"][:300]
            if depth < 1000:  # orjson itself refuses over 1024 levels: no path then
                assert error["message"].startswith(position), (position, error["message"][:100])
        assert len(upstream.requests) == before, f"{position}: forwarded"
    loop_thread.run(proxy.app[DURABLE].drain())
    assert loop_thread.run(proxy.app[STORE].transcript_events("default", "deep-1")) == ()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or "not recorded" in r.getMessage()]


def _dump_deep(value: Any) -> bytes:
    """JSON deeper than orjson writes (254 levels), by hand (test code may recurse)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        return _dump(value)
    finally:
        sys.setrecursionlimit(limit)


def _dump(value: Any) -> bytes:
    if isinstance(value, dict):
        return b"{" + b",".join([orjson.dumps(k) + b":" + _dump(v) for k, v in value.items()]) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join([_dump(v) for v in value]) + b"]"
    return orjson.dumps(value)


def test_nesting_up_to_the_bound_is_forwarded_and_recorded(upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread) -> None:
    from proxy.server.appkeys import DURABLE, STORE

    proxy = make_proxy()
    # body 1, messages 2, message 3, content 4, block 5, "extra" list 6 ... level 128
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "go", "extra": _nested(122)}]}]}
    raw = orjson.dumps(body)
    r = httpx.post(proxy.url + "/v1/messages", content=raw, headers={**HEADERS, "x-session-id": "deep-ok"})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].body == raw
    loop_thread.run(proxy.app[DURABLE].drain())
    events = loop_thread.run(proxy.app[STORE].transcript_events("default", "deep-ok"))
    assert [e.event.type for e in events] == ["message", "answer"]
    assert events[0].event.content == body["messages"][0]["content"]  # type: ignore[index]


def test_a_plan_reused_across_sessions_names_only_the_new_sessions_artifacts(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    from proxy.server.appkeys import DURABLE, TENANCY

    proxy = make_proxy(compaction={"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200})
    big = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
    messages = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": big}]},
        {"role": "assistant", "content": "It is long."},
        {"role": "user", "content": "summarise it"},
    ]
    default = proxy.app[TENANCY].current.default
    assert default is not None
    sources = default.sources
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": messages})
    seen = {}
    for session in ("sA", "sB", "sB"):
        r = httpx.post(proxy.url + "/v1/messages", content=body, headers={**HEADERS, "x-session-id": session})
        assert r.status_code == 200, r.text
        sent = upstream.requests[-1].body.decode()
        pointers = set(re.findall(r"artifact:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[0-9a-f]{64}", sent))
        assert pointers and all(p.startswith(f"artifact:{session}:") for p in pointers), (session, pointers)
        for pointer in pointers:
            assert proxy.app[DURABLE].resolver.resolve(pointer, sources).status == "available"
        seen.setdefault(session, []).append(r.headers["x-compaction-plan"])
    # sB does not reuse sA's plan (its view would name sA); its second turn reuses its own
    assert seen == {"sA": ["new"], "sB": ["new", "reused"]}


# --- soak: the real Claude Code session through two replicas ----------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_real_session_through_two_replicas_is_recorded_as_one_process_records_it(
    tmp_path: Path, upstream: FakeUpstream, loop_thread: LoopThread, transcript: dict[str, Any]
) -> None:
    """The shared Claude Code transcript, every user turn in order (as its client sent them: the
    recorded assistant turns come back in the next request), once through one process and once
    alternating between two replicas on PostgreSQL with no pause: the same events."""
    with fresh_schema("soak") as url:
        replicas = _start(_config(tmp_path, upstream.url, url), 2)
        try:
            messages = transcript["messages"]
            ends = [k for k in range(1, len(messages) + 1) if messages[k - 1]["role"] == "user"]
            for session, targets in (("soak-one", replicas[:1]), ("soak-two", replicas)):
                for turn, k in enumerate(ends):
                    body = {"model": "claude-fake-1", "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}
                    _post(targets[turn % len(targets)].url, session, body)
            # one event per message the client sent (through its last user turn), and the
            # answer to the last request: each turn's answer and the client's next copy of it
            # share one slot (whichever is recorded first stands)
            expected = ends[-1] + 1
            one = _events(loop_thread, url, "soak-one", expected)
            two = _events(loop_thread, url, "soak-two", expected)
            assert len(one) == expected == len(two)
            assert [e.event.role for e in one[:-1]] == [m["role"] for m in messages[: ends[-1]]]
            assert (one[-1].event.type, one[-1].event.role) == ("answer", "assistant")
            assert _shape(two) == _shape(one)
        finally:
            for replica in replicas:
                replica.stop()
