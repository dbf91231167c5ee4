"""The summary call without the SDK: what the upstream receives, the SDK's retry rules, one ledger
row per attempt, and that no proxy module loads ``anthropic`` to serve."""

from __future__ import annotations

import email.utils
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.core.ledger import LedgerEntry
from proxy.server.compaction import summary_client
from proxy.server.compaction.summary_client import (
    SummaryClient,
    SummaryFailed,
    retry_delay,
    should_retry,
)
from proxy.server.ledger import calls_for
from tests.harness import ListeningProcess, LoopThread
from tests.upstream import FakeUpstream, Hang, Reply, Reset, message_json

BODY = {"model": "claude-summary-test", "max_tokens": 300, "system": "Summarise.",
        "messages": [{"role": "user", "content": "the history"}]}
NOW = {"retry-after-ms": "1"}  # retry at once (the provider says so): the tests stay fast


class Rows:
    """Collects the ledger rows the client records (stands in for the LedgerRecorder's queue)."""

    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []

    def record(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)


def _call(
    loop_thread: LoopThread, url: str, auth: dict[str, str] | None = None, *, retries: int = 2,
    timeout: float = 10, rows: Rows | None = None,
) -> dict[str, Any]:
    client = SummaryClient(url, max_retries=retries, timeout_seconds=timeout)

    async def go() -> dict[str, Any]:
        try:
            with calls_for("acme", "s-1", rows):  # type: ignore[arg-type]
                return await client.create(BODY, auth or {"X-Api-Key": "sk-ant-1"})
        finally:
            await client.close()

    return loop_thread.run(go())


def test_the_request_carries_its_own_credentials_and_nothing_of_the_sdk(
    upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    answer = _call(loop_thread, upstream.url + "/prefix/", {"X-Api-Key": "sk-ant-only"})
    assert answer["type"] == "message" and answer["content"][0]["type"] == "text"
    (sent,) = upstream.requests
    assert (sent.method, sent.path) == ("POST", "/prefix/v1/messages")
    assert sent.headers["x-api-key"] == "sk-ant-only" and "authorization" not in sent.headers
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert orjson.loads(sent.body) == BODY

    _call(loop_thread, upstream.url, {"Authorization": "Bearer tok", "X-Api-Key": "sk-ant-2"})
    both = upstream.requests[-1].headers
    assert (both["authorization"], both["x-api-key"]) == ("Bearer tok", "sk-ant-2")


def test_retries_follow_the_provider_and_each_attempt_is_a_row(
    upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    ok = message_json("SUMMARY", model=BODY["model"], input_tokens=900)
    upstream.script(
        Reply({"type": "error"}, status=529, headers={**NOW, "request-id": "req_529"}),
        Reply({"type": "error"}, status=429, headers={**NOW, "request-id": "req_429"}),
        Reply(ok, headers={"request-id": "req_ok"}),
    )
    rows = Rows()
    assert _call(loop_thread, upstream.url, rows=rows)["content"] == ok["content"]
    assert len(upstream.requests) == 3
    got = [(e.kind, e.route, e.status, e.request_id, e.tenant, e.session, e.model) for e in rows.entries]
    assert got == [
        ("summary", "summary", 529, "req_529", "acme", "s-1", BODY["model"]),
        ("summary", "summary", 429, "req_429", "acme", "s-1", BODY["model"]),
        ("summary", "summary", 200, "req_ok", "acme", "s-1", BODY["model"]),
    ]
    assert [e.provider_usage for e in rows.entries] == [None, None, ok["usage"]]


@pytest.mark.parametrize(
    ("status", "headers", "attempts"),
    [
        (500, {"x-should-retry": "false"}, 1),  # the provider says no
        (400, {"x-should-retry": "true", **NOW}, 3),  # ... or yes
        (400, {}, 1),
        (401, {}, 1),
        (408, NOW, 3),
        (409, NOW, 3),
        (503, NOW, 3),
        (307, {"location": "/elsewhere"}, 1),  # never followed
    ],
)
def test_a_refused_call_fails_after_the_retries_it_deserves(
    upstream: FakeUpstream, loop_thread: LoopThread, status: int, headers: dict[str, str], attempts: int
) -> None:
    upstream.script(*[Reply({"type": "error"}, status=status, headers=headers)] * 3)
    rows = Rows()
    with pytest.raises(SummaryFailed) as failed:
        _call(loop_thread, upstream.url, rows=rows)
    assert failed.value.reason == f"status {status}"
    assert len(upstream.requests) == attempts
    assert [e.status for e in rows.entries] == [status] * attempts


def test_no_answer_is_a_502_row_per_attempt(upstream: FakeUpstream, loop_thread: LoopThread) -> None:
    upstream.script(Reset(), Reset())
    rows = Rows()
    with pytest.raises(SummaryFailed):
        _call(loop_thread, upstream.url, retries=1, rows=rows)
    assert [(e.status, e.usage) for e in rows.entries] == [(502, None), (502, None)]


def test_a_retried_connection_failure_can_still_succeed(upstream: FakeUpstream, loop_thread: LoopThread) -> None:
    upstream.script(Reset())
    rows = Rows()
    assert _call(loop_thread, upstream.url, retries=1, rows=rows)["type"] == "message"
    assert [e.status for e in rows.entries] == [502, 200]


def test_a_timeout_is_a_504_row(upstream: FakeUpstream, loop_thread: LoopThread) -> None:
    upstream.script(Hang())
    rows = Rows()
    with pytest.raises(SummaryFailed) as failed:
        _call(loop_thread, upstream.url, retries=0, timeout=0.2, rows=rows)
    assert failed.value.reason == "TimeoutError"
    assert [e.status for e in rows.entries] == [504]


def test_nothing_is_recorded_outside_a_call_context(upstream: FakeUpstream, loop_thread: LoopThread) -> None:
    client = SummaryClient(upstream.url, max_retries=0, timeout_seconds=5)

    async def go() -> dict[str, Any]:
        try:
            return await client.create(BODY, {"X-Api-Key": "k"})
        finally:
            await client.close()

    assert loop_thread.run(go())["type"] == "message"  # and no recorder was needed


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>not json</html>", "answer not JSON"),
        (b'["a list"]', "answer not a message"),
        (b'{"type": "message", "content": "text"}', "answer not a message"),
    ],
)
def test_an_unreadable_answer_fails(
    upstream: FakeUpstream, loop_thread: LoopThread, body: bytes, reason: str
) -> None:
    upstream.script(Reply(body))
    rows = Rows()
    with pytest.raises(SummaryFailed) as failed:
        _call(loop_thread, upstream.url, rows=rows)
    assert failed.value.reason == reason
    assert len(upstream.requests) == 1  # a 200 is not retried
    assert [(e.status, e.usage) for e in rows.entries] == [(200, None)]


def test_an_oversized_answer_is_cut_off(
    upstream: FakeUpstream, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary_client, "MAX_ANSWER_BYTES", 1000)
    upstream.script(*[Reply(message_json("x" * 5000))] * 3)
    with pytest.raises(SummaryFailed) as failed:
        _call(loop_thread, upstream.url, retries=0)
    assert failed.value.reason == "answer too large"


def test_retry_delays_are_the_sdks() -> None:
    assert [retry_delay(k, rand=lambda: 0.0) for k in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert retry_delay(1, rand=lambda: 1.0) == 0.75  # up to 25 % jitter, never more
    assert retry_delay(0, {"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_delay(0, {"retry-after": "2"}) == 2.0
    assert retry_delay(0, {"retry-after": "1.5"}) == 1.5
    date = email.utils.formatdate(1_000_005.0, usegmt=True)
    assert retry_delay(0, {"retry-after": date}, now=1_000_000.0) == 5.0
    # not short, not positive, not readable: the usual backoff
    for headers in ({"retry-after": "120"}, {"retry-after": "0"}, {"retry-after-ms": "-5"},
                    {"retry-after": "soon"}, {}):
        assert retry_delay(2, headers, rand=lambda: 0.0) == 2.0


@pytest.mark.parametrize(
    ("status", "hint", "retry"),
    [(408, None, True), (409, None, True), (429, None, True), (500, None, True), (529, None, True),
     (400, None, False), (404, None, False), (413, None, False), (500, "false", False),
     (404, "true", True), (429, "maybe", True)],
)
def test_which_answers_are_retried(status: int, hint: str | None, retry: bool) -> None:
    assert should_retry(status, {"x-should-retry": hint} if hint else {}) is retry


def test_serving_never_loads_the_anthropic_sdk(
    tmp_path: Path, upstream: FakeUpstream, transcript: dict[str, Any]
) -> None:
    """``python -m proxy serve`` up to and through a compacted request with a summary call,
    with every import reported (PYTHONPROFILEIMPORTTIME): ``anthropic`` is not among them."""
    config = tmp_path / "proxy.yaml"
    config.write_text(json.dumps({
        "upstream": {"base_url": upstream.url}, "state_dir": str(tmp_path),
        "compaction": {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": BODY["model"]}},
    }))
    process = ListeningProcess(["serve", "--config", str(config), "--port", "0"],
                               env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        messages = transcript["messages"]
        k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
        response = httpx.post(
            process.url + "/v1/messages", headers={"x-api-key": "sk-ant-1"}, timeout=60,
            content=orjson.dumps({"model": "claude-fake-1", "max_tokens": 10, "messages": messages[:k],
                                  "tools": transcript["tools"]}),
        )
        assert response.status_code == 200 and response.headers["x-compaction-summary"] == "ok"
    finally:
        process.stop(graceful=True)
    imported = {line.rsplit("|", 1)[1].strip() for line in process.lines if line.startswith("import time:")}
    assert "proxy.server.compaction.summary_client" in imported and "aiohttp" in imported  # it reports imports
    assert not {name for name in imported if name.split(".")[0] in ("anthropic", "httpx", "pydantic")}
