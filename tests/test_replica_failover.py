"""One replica dies in the middle of a stream; the other carries the session on.

Two ``context-proxy serve`` replicas (child processes) share one PostgreSQL store (a fresh schema
on the server ``.ci/pg start`` started; skipped without ``CONTEXT_PROXY_TEST_PG``) and one state
folder; the fake upstream runs in the test process. The session (``x-session-id``) has durable
context written through the admin API, and the conversation (a real Claude Code transcript) is
long enough for compaction to make a plan with a summary (the fake upstream answers the summary
model with a fixed text). Turn 1 goes to replica A and streams slowly; A is then stopped:

a. the way an orchestrator starts: SIGTERM with a short grace period. The client gets the events
   so far, then one ``event: error`` (``overloaded_error``) and never a ``message_stop``;
b. SIGKILL. The client gets the events so far, then the connection drops without the chunked
   body's terminator: httpx raises ``RemoteProtocolError``; no ``message_stop``, no error event.

Then the client retries turn 1 on replica B, and sends turn 2 there: B forwards the retry with
exactly the bytes A forwarded, and turn 2 with A's compacted prefix byte for byte
(``x-compaction-plan: reused``, A's ``x-compaction-id``) and the same durable-context block at
the end of ``system``; the summary model is called once in all.
"""

from __future__ import annotations

import hashlib
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.sources.artifact_files import write_artifact
from tests.pg_server import fresh_schema
from tests.test_cli import ServeProcess
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    text_stream_events,
)

TENANT = "failover"
TOKEN = "cpa-failover-admin-token-3e9d51b0c7a24f88"
API_KEY = "sk-ant-failover-client-key-000111"
SUMMARY_MODEL = "claude-summary-test"
SUMMARY_TEXT = "SUMMARY: the goal was X; files a.py and b.py were changed; tests pass."
MODEL = "claude-fake-1"
SYSTEM = "You are the agent under test."
SMALL = {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}
GRACE = 0.5
T0 = "2025-01-01T00:00:00Z"
EVENTS_BEFORE_STOP = 4  # complete events the client has read when replica A is stopped
SLOW = text_stream_events("cut " * 120, deltas=120)  # ~6 s at 0.05 s per event



def _turns(transcript: dict[str, Any], at_least: int) -> tuple[int, int]:
    """Two consecutive turn ends (message counts ending with a user message)."""
    messages = transcript["messages"]
    ends = [k for k in range(at_least, len(messages) + 1) if messages[k - 1]["role"] == "user"]
    return ends[0], ends[1]


@dataclass
class Cluster:
    a: ServeProcess
    b: ServeProcess
    session: str
    artifact_root: Path


def _write_config(tmp_path: Path, upstream_url: str, store_url: str) -> tuple[Path, Path]:
    shared = tmp_path / "shared-state"  # the volume both replicas mount
    roots = shared / "sources"
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = {
        "name": TENANT,
        "provider": {"mode": "passthrough"},
        "sources": {
            "transcript_root": str(roots / "transcripts"),
            "artifact_root": str(roots / "artifacts"),
        },
        "admin_tokens_sha256": [hashlib.sha256(TOKEN.encode()).hexdigest()],
    }
    (policies / f"{TENANT}.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "upstream": {"base_url": upstream_url},
        "store": {"url": store_url},
        "state_dir": str(shared),
        "policies_dir": str(policies),
        "compaction": SMALL,
        "shutdown": {"grace_seconds": GRACE},
    }
    path = tmp_path / "replica.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, roots / "artifacts"


@pytest.fixture
def cluster(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Cluster]:
    with fresh_schema("failover") as store_url:
        config, artifact_root = _write_config(tmp_path, upstream.url, store_url)
        with ThreadPoolExecutor(2) as pool:  # start-up is mostly imports: overlap the two
            starting = [pool.submit(ServeProcess, config) for _ in range(2)]
            replicas = [f.result() for f in starting]
        try:
            a, b = replicas
            yield Cluster(a, b, f"failover-{secrets.token_hex(4)}", artifact_root)
        finally:
            for replica in replicas:
                replica.stop()


def _admin(url: str) -> httpx.Client:
    return httpx.Client(
        base_url=url, timeout=30, trust_env=False, headers={"Authorization": f"Bearer {TOKEN}"}
    )


def _write_durable_state(cluster: Cluster) -> str:
    """Facts and a pending item through A's admin API; returns the block B would inject."""
    session = cluster.session
    available = write_artifact(
        str(cluster.artifact_root), session, "deploy-notes.txt", b"deploy with make release\n"
    )
    changes = [
        {
            "op": "create",
            "kind": "fact",
            "item": {
                "id": "build",
                "content": "the build uses uv",
                "source": available,
                "last_confirmed_at": T0,
            },
        },
        {
            "op": "create",
            "kind": "pending",
            "item": {
                "id": "flaky",
                "content": "fix the flaky test",
                "status": "open",
                "source": f"transcript:{session}:999",  # missing, and stays so in this test
                "last_confirmed_at": T0,
            },
        },
    ]
    with _admin(cluster.a.url) as http:
        r = http.post(f"/admin/v1/sessions/{session}/changes", json={"changes": changes})
        assert r.status_code == 200, r.text
    with _admin(cluster.b.url) as http:
        preview = http.get(f"/admin/v1/sessions/{session}/preview").json()
    assert preview["counts"]["available"] == 1 and preview["counts"]["missing"] == 1
    block = preview["block"]
    assert isinstance(block, str) and "the build uses uv" in block
    return block


def _script(upstream: FakeUpstream) -> None:
    """Summary calls get a fixed text; the first main request the slow stream, later ones a
    quick complete one."""
    mains: list[RecordedRequest] = []

    def answer(req: RecordedRequest) -> Reply | Stream:
        data = req.json()
        if data["model"] == SUMMARY_MODEL:
            return Reply(message_json(SUMMARY_TEXT, model=SUMMARY_MODEL))
        mains.append(req)
        if len(mains) == 1:
            return Stream(SLOW, pace=0.05)
        if data.get("stream"):
            return Stream(text_stream_events(f"answer {len(mains)}"))
        return Reply(message_json(f"answer {len(mains)}"))

    upstream.script(*[answer] * 20)


def _body(transcript: dict[str, Any], k: int, stream: bool = True) -> bytes:
    # ``system`` and ``tools`` before ``messages``: the forwarded head then carries the block.
    return orjson.dumps(
        {
            "model": MODEL,
            "max_tokens": 100,
            "system": SYSTEM,
            "tools": transcript["tools"],
            "messages": transcript["messages"][:k],
            "stream": stream,
        }
    )


def _headers(session: str) -> dict[str, str]:
    return {
        "x-api-key": API_KEY,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "x-session-id": session,
    }


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [
        r
        for r in upstream.requests
        if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL
    ]


def _summaries(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [
        r
        for r in upstream.requests
        if r.path == "/v1/messages" and r.json().get("model") == SUMMARY_MODEL
    ]


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@dataclass
class CutStream:
    headers: httpx.Headers
    body: bytes
    error: Exception | None


def _stream_and_stop(url: str, body: bytes, session: str, stop: Callable[[], None]) -> CutStream:
    """Stream turn 1; once ``EVENTS_BEFORE_STOP`` whole events arrived, call ``stop``; read on
    until the stream ends (or the connection breaks)."""
    chunks: list[bytes] = []
    error: Exception | None = None
    stopped = False
    with httpx.Client(timeout=30, trust_env=False) as http:
        with http.stream(
            "POST", url + "/v1/messages", content=body, headers=_headers(session)
        ) as r:
            assert r.status_code == 200, r.read()
            headers = r.headers
            try:
                for chunk in r.iter_raw():
                    chunks.append(chunk)
                    if not stopped and b"".join(chunks).count(b"\n\n") >= EVENTS_BEFORE_STOP:
                        stopped = True
                        stop()
            except httpx.HTTPError as exc:
                error = exc
    assert stopped, "the stream ended before replica A was stopped"
    return CutStream(headers, b"".join(chunks), error)


def _events(body: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in body.split(b"\n\n") if e]


def _messages_prefix(body: bytes) -> bytes:
    """The forwarded bytes of the messages array up to its last element (the cached part)."""
    messages = orjson.loads(body)["messages"]
    return orjson.dumps(messages[:-1])[:-1]


def _continue_on_b(
    cluster: Cluster,
    upstream: FakeUpstream,
    transcript: dict[str, Any],
    first: CutStream,
    sent_a: bytes,
    block: str,
) -> None:
    """The retry of turn 1 and turn 2, both on B: A's plan and durable block, byte for byte."""
    k1, k2 = _turns(transcript, 90)
    plan_id = first.headers["x-compaction-id"]
    head_a = sent_a[: sent_a.index(b'"messages":')]
    assert orjson.loads(head_a + b'"messages":[]}')["system"] == [
        {"type": "text", "text": SYSTEM},
        {"type": "text", "text": block},
    ]
    with httpx.Client(base_url=cluster.b.url, timeout=60, trust_env=False) as http:
        retry = http.post(
            "/v1/messages", content=_body(transcript, k1), headers=_headers(cluster.session)
        )
        assert retry.status_code == 200, retry.text
        assert _events(retry.content)[-1].startswith(b"event: message_stop\n")
        assert retry.headers["x-compaction-plan"] == "reused"
        assert retry.headers["x-compaction-id"] == plan_id
        assert retry.headers["x-durable-sources"] == first.headers["x-durable-sources"]
        sent_retry = _main(upstream)[-1].body
        assert sent_retry == sent_a  # the very bytes A forwarded: the provider's cache hits

        turn2 = http.post(
            "/v1/messages",
            content=_body(transcript, k2, stream=False),
            headers=_headers(cluster.session),
        )
        assert turn2.status_code == 200, turn2.text
        assert turn2.json()["content"][0]["text"] == "answer 3"
        assert turn2.headers["x-compaction-plan"] == "reused"
        assert turn2.headers["x-compaction-id"] == plan_id
        assert turn2.headers["x-compaction-session"] == cluster.session
        sent_b = _main(upstream)[-1].body
    # Turn 2's head (model, max_tokens, system with the durable block, tools) and its messages
    # up to turn 1's last one are A's bytes; then the new messages, as the client sent them.
    prefix = _messages_prefix(sent_a)
    head_b = sent_b[: sent_b.index(b'"messages":')]
    assert head_b == head_a
    assert sent_b[len(head_b) :].startswith(b'"messages":' + prefix)
    view_a = orjson.loads(sent_a)["messages"]
    view_b = orjson.loads(sent_b)["messages"]
    assert view_b[len(view_a) - 1 :] == transcript["messages"][k1 - 1 : k2]
    assert orjson.loads(sent_b)["system"][-1] == {"type": "text", "text": block}
    assert len(_summaries(upstream)) == 1  # B never summarised again
    assert len(_main(upstream)) == 3


def _turn_one(
    cluster: Cluster, upstream: FakeUpstream, transcript: dict[str, Any], stop: Callable[[], None]
) -> tuple[CutStream, bytes, str]:
    block = _write_durable_state(cluster)
    _script(upstream)
    k1, _k2 = _turns(transcript, 90)
    first = _stream_and_stop(cluster.a.url, _body(transcript, k1), cluster.session, stop)
    assert first.headers["x-compaction-plan"] == "new"
    assert "summarize" in first.headers["x-compaction-layers"]
    assert first.headers["x-compaction-summary"] == "ok"
    assert first.headers["x-compaction-session"] == cluster.session
    assert first.headers["x-durable-sources"].startswith("available=1,missing=1,")
    assert len(_summaries(upstream)) == 1
    (sent_a,) = _main(upstream)
    assert orjson.loads(sent_a.body)["system"][-1] == {"type": "text", "text": block}
    # The upstream request A made is cancelled, not left running.
    _wait_for("the upstream stream to be cancelled", lambda: upstream.cancelled == 1)
    assert upstream.active == 0 and upstream.completed == 1  # the summary call only
    return first, sent_a.body, block


def _relayed(body: bytes) -> int:
    """How many whole events of the upstream's stream ``body`` starts with (checked bytes)."""
    events = _events(body)
    assert len(events) < len(SLOW), "the stream was not cut"
    assert b"".join(events) == body  # whole events only
    assert events == SLOW[: len(events)]  # relayed untouched, in order
    return len(events)


def _text_of(body: bytes) -> str:
    """The text of the ``text_delta`` events in an SSE body."""
    text = ""
    for event in _events(body):
        if event.startswith(b"event: content_block_delta\n"):
            text += orjson.loads(event.split(b"data: ", 1)[1])["delta"]["text"]
    return text


def test_sigterm_mid_stream_ends_it_with_an_error_and_b_continues_the_session(
    cluster: Cluster, upstream: FakeUpstream, transcript: dict[str, Any]
) -> None:
    first, sent_a, block = _turn_one(
        cluster, upstream, transcript, lambda: cluster.a.proc.send_signal(signal.SIGTERM)
    )
    # What the client got: the events so far, then the proxy's error event, then the end.
    body = first.body
    assert b"message_stop" not in body
    *relayed, last = _events(body)
    assert _relayed(b"".join(relayed)) >= EVENTS_BEFORE_STOP
    assert last.startswith(b"event: error\ndata: ")
    error = orjson.loads(last[len(b"event: error\ndata: ") :])
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"
    # The proxy wrote its last chunk, then closed without the chunked terminator.
    assert isinstance(first.error, httpx.RemoteProtocolError), repr(first.error)
    assert cluster.a.proc.wait(20) == 0  # a clean exit after the grace period
    log = "".join(cluster.a.lines)
    assert "grace period over: ending 1 stream(s)" in log
    # Drained: A recorded turn 1 and the cut answer (incomplete: the text relayed so far), and
    # the compaction's manifest, before it exited; B serves them from the shared store.
    k1, _k2 = _turns(transcript, 90)
    with _admin(cluster.b.url) as http:
        recorded = http.get(f"/admin/v1/sessions/{cluster.session}/transcript?limit=1000").json()
        manifest = http.get(f"/admin/v1/manifests/{first.headers['x-compaction-id']}")
    events = recorded["events"]
    assert [e["seq"] for e in events] == list(range(1, k1 + 2))
    assert [e["content"] for e in events[:k1]] == [
        m["content"] for m in transcript["messages"][:k1]
    ]
    answer = events[-1]
    assert (answer["type"], answer["role"], answer["complete"]) == ("answer", "assistant", False)
    assert answer["content"]["content"] == [{"type": "text", "text": _text_of(b"".join(relayed))}]
    assert manifest.status_code == 200, manifest.text
    assert manifest.json()["session"] == cluster.session
    assert "summarize" in manifest.json()["manifest"]["layers"]

    _continue_on_b(cluster, upstream, transcript, first, sent_a, block)


def test_sigkill_mid_stream_cuts_the_connection_and_b_continues_the_session(
    cluster: Cluster, upstream: FakeUpstream, transcript: dict[str, Any]
) -> None:
    first, sent_a, block = _turn_one(
        cluster, upstream, transcript, lambda: cluster.a.proc.send_signal(signal.SIGKILL)
    )
    # What the client got: the events so far, whole, and nothing after them: no message_stop,
    # no error event (nobody is left to write one); httpx reports the cut chunked body.
    assert _relayed(first.body) >= EVENTS_BEFORE_STOP
    assert b"message_stop" not in first.body and b"event: error" not in first.body
    assert isinstance(first.error, httpx.RemoteProtocolError), repr(first.error)
    assert cluster.a.proc.wait(20) == -signal.SIGKILL

    _continue_on_b(cluster, upstream, transcript, first, sent_a, block)

    # The transcript in the shared store: turn 1's messages exactly once (recorded by A before
    # it died, or else by B on the retry), no answer from A (it died before the end), B's two.
    k1, _k2 = _turns(transcript, 90)
    events: list[dict[str, Any]] = []

    def settled() -> bool:
        nonlocal events
        with _admin(cluster.b.url) as http:
            url = f"/admin/v1/sessions/{cluster.session}/transcript?limit=1000"
            events = http.get(url).json()["events"]
        last = events[-1] if events else {}
        content = last.get("content") if last.get("type") == "answer" else None
        return isinstance(content, dict) and content["content"][0]["text"] == "answer 3"

    _wait_for("B's records", settled)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["content"] for e in events[:k1]] == [
        m["content"] for m in transcript["messages"][:k1]
    ]
    answers = [e for e in events if e["type"] == "answer"]
    assert [a["complete"] for a in answers] == [True, True]
