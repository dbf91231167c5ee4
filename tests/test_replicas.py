"""What docker-compose.yml describes, run directly (no Docker engine): the demo upstream
(``context-proxy demo-upstream``) and TWO ``context-proxy serve`` replicas sharing one PostgreSQL
store, configured like the compose file's demo replicas (examples/docker-demo.yaml with the local
addresses). Requests of one session alternate between the replicas.

Needs PostgreSQL: ``bash .ci/pg start && . .ci/pg.env`` (skipped without CONTEXT_PROXY_TEST_PG).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.store import RecordedEvent, open_store
from tests.harness import ListeningProcess
from tests.pg_server import fresh_schema
from tests.test_cli import ServeProcess

ROOT = Path(__file__).resolve().parent.parent
HEADERS = {"x-api-key": "sk-demo-not-a-real-key", "anthropic-version": "2023-06-01"}


class DemoUpstream(ListeningProcess):
    """``python -m proxy demo-upstream --port 0``, its address read from its log."""

    def __init__(self) -> None:
        super().__init__(["demo-upstream", "--port", "0"], what="demo upstream")


@pytest.fixture
def demo_upstream() -> Iterator[DemoUpstream]:
    process = DemoUpstream()
    yield process
    process.stop(graceful=True)


def test_the_demo_upstream_answers_like_the_provider(demo_upstream: DemoUpstream) -> None:
    body = {
        "model": "claude-demo-1",
        "max_tokens": 50,
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "twelve chars"}]},
        ],
    }
    url = demo_upstream.url
    plain = httpx.post(url + "/v1/messages", json=body, timeout=10)
    assert plain.status_code == 200
    message = plain.json()
    assert message["type"] == "message" and message["role"] == "assistant"
    text = message["content"][0]["text"]
    assert "12 characters" in text and "3 messages" in text
    again = httpx.post(url + "/v1/messages", json=body, timeout=10).json()
    assert again == message  # deterministic, id included
    streamed = httpx.post(url + "/v1/messages", json={**body, "stream": True}, timeout=10)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [block for block in streamed.text.split("\n\n") if block]
    assert events[0].startswith("event: message_start") and events[-1].startswith(
        "event: message_stop"
    )
    deltas = [
        orjson.loads(block.split("data: ", 1)[1])["delta"]["text"]
        for block in events
        if block.startswith("event: content_block_delta")
    ]
    assert "".join(deltas) == text
    count = httpx.post(url + "/v1/messages/count_tokens", json=body, timeout=10).json()
    assert count == {"input_tokens": len(orjson.dumps(body)) // 4}
    models = httpx.get(url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["claude-demo-1"]
    bad = httpx.post(url + "/v1/messages", content=b"not json", timeout=10)
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert demo_upstream.stop(graceful=True) == 0  # SIGTERM: a clean exit


def _replica_config(tmp_path: Path, upstream_url: str, store_url: str) -> Path:
    """examples/docker-demo.yaml (the compose file's demo replicas) with local addresses."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "docker-demo.yaml").read_text())
    data["listen"]["host"] = "127.0.0.1"
    data["upstream"]["base_url"] = upstream_url
    data["store"]["url"] = store_url
    data["state_dir"] = str(tmp_path / "shared-state")  # the shared volume
    data["shutdown"]["grace_seconds"] = 5
    path = tmp_path / "replica.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def _transcript(store_url: str, session: str) -> tuple[RecordedEvent, ...]:
    store = await open_store(store_url)
    try:
        return await store.transcript_events("default", session)
    finally:
        await store.close()


def _wait_for_transcript(
    store_url: str, session: str, texts: list[str]
) -> tuple[RecordedEvent, ...]:
    """The session's transcript once every text in ``texts`` is recorded (writes are async)."""
    deadline = time.monotonic() + 15
    while True:
        events = asyncio.run(_transcript(store_url, session))
        recorded = orjson.dumps([e.event.content for e in events]).decode()
        if all(text in recorded for text in texts) or time.monotonic() > deadline:
            return events
        time.sleep(0.05)


def test_two_replicas_share_one_postgres_store(tmp_path: Path, demo_upstream: DemoUpstream) -> None:
    if not os.environ.get("CONTEXT_PROXY_TEST_PG"):
        pytest.skip(
            "the replica test needs PostgreSQL: `bash .ci/pg start && . .ci/pg.env` "
            "sets CONTEXT_PROXY_TEST_PG (and `bash .ci/pg stop` after)"
        )
    with fresh_schema("replicas") as store_url:
        config = _replica_config(tmp_path, demo_upstream.url, store_url)
        replicas = [ServeProcess(config)]
        try:
            replicas.append(ServeProcess(config))
            for replica in replicas:
                ready = httpx.get(replica.url + "/readyz", timeout=10)
                assert ready.status_code == 200, ready.text

            session = f"replicas-{secrets.token_hex(4)}"
            messages: list[dict[str, Any]] = []
            said: list[str] = []
            for turn in range(6):
                replica = replicas[turn % 2]
                text = f"turn {turn} sent to replica {turn % 2 + 1}"
                said.append(text)
                messages.append({"role": "user", "content": text})
                body = {
                    "model": "claude-demo-1",
                    "max_tokens": 64,
                    "messages": messages,
                    "stream": turn % 3 == 1,
                }
                r = httpx.post(
                    replica.url + "/v1/messages",
                    content=orjson.dumps(body),
                    headers={
                        **HEADERS,
                        "content-type": "application/json",
                        "x-session-id": session,
                    },
                    timeout=30,
                )
                assert r.status_code == 200, r.text
                if body["stream"]:
                    deltas = [
                        orjson.loads(line[len("data: ") :])["delta"].get("text", "")
                        for line in r.text.splitlines()
                        if line.startswith("data: ") and '"content_block_delta"' in line
                    ]
                    answer = "".join(deltas)
                else:
                    answer = r.json()["content"][0]["text"]
                assert f"{len(text)} characters" in answer and f"{len(messages)} messages" in answer
                messages.append({"role": "assistant", "content": answer})
                # Let this replica's (asynchronous) recording land before the other one goes on.
                _wait_for_transcript(store_url, session, [text, answer])

            events = _wait_for_transcript(store_url, session, said)
            seqs = [e.seq for e in events]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # contiguous, no gap
            users = [e.event.content for e in events if e.event.role == "user"]
            assert users == said  # every turn once, in order: written by replica 1, 2, 1, 2, ...
            assert any("replica 1" in u for u in users) and any("replica 2" in u for u in users)
            # Each answer once, right after its question, though the next request (carrying it
            # back) went to the other replica.
            assert [e.event.role for e in events] == ["user", "assistant"] * len(said)
            answers = [e for e in events if e.event.role == "assistant"]
            assert all(e.event.complete for e in answers)
            replied = [m["content"] for m in messages if m["role"] == "assistant"]
            assert [e.event.content["content"][0]["text"] for e in answers] == replied

            for replica in replicas:  # both still ready, and either one serves the transcript
                assert httpx.get(replica.url + "/readyz", timeout=10).status_code == 200
        finally:
            for replica in replicas:
                replica.stop()
