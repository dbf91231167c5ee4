"""A summary chain on the wire: when what a compaction removes is over the summariser's input
budget, the proxy makes a bounded chain of calls (each within the budget, each reading the
previous summary), reports how many, and replicas racing on the same history share every call
through its own lease (each chain call is its own key: the same history gives the same chain)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.core.tokens import TokenCounter
from proxy.server.appkeys import COMPACTION
from tests.harness import ProxyServer
from tests.pg_server import fresh_schema
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-chain-test-000333"
SUMMARY_MODEL = "claude-summary-chain"
BUDGET = 4_000
LABEL = re.compile(r"^\[#(\d+)\] (?:USER|ASSISTANT|SYSTEM):", re.MULTILINE)
COMPACTION_CONFIG = {
    "threshold": 20_000,
    "hard_limit": 60_000,
    "summary": {"model": SUMMARY_MODEL, "input_budget": BUDGET, "max_tokens": 300, "max_calls": 8},
}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'shared.db'}"


def _summaries(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json()["model"] == SUMMARY_MODEL]


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json()["model"] != SUMMARY_MODEL]


def _answer(request: RecordedRequest) -> Reply:
    body = request.json()
    if body["model"] != SUMMARY_MODEL:
        return Reply(message_json("ok"))
    labels = LABEL.findall(body["messages"][0]["content"])
    # deterministic per call; slow, so that racing replicas really wait on each other's lease
    return Reply(message_json(f"SUMMARY of messages {labels[0]}-{labels[-1]}"), delay=0.3)


def _post_together(targets: list[tuple[ProxyServer, bytes]]) -> list[httpx.Response]:
    results: list[httpx.Response | None] = [None] * len(targets)
    start = threading.Barrier(len(targets))

    def send(i: int, proxy: ProxyServer, body: bytes) -> None:
        start.wait()
        results[i] = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY}, timeout=120)

    threads = [threading.Thread(target=send, args=(i, p, b)) for i, (p, b) in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def test_racing_replicas_share_every_call_of_a_chain(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], store_url: str
) -> None:
    a = make_proxy(compaction=COMPACTION_CONFIG, store={"url": store_url})
    b = make_proxy(compaction=COMPACTION_CONFIG, store={"url": store_url})
    upstream.script(*[_answer] * 40)
    messages = transcript["messages"]
    k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
    body = orjson.dumps(
        {"model": "claude-fake-1", "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}
    )

    answers = _post_together([(a, body), (b, body), (a, body), (b, body)])

    assert [r.status_code for r in answers] == [200] * 4
    calls = _summaries(upstream)
    assert 1 < len(calls) <= 8  # a chain, bounded, made once for all four requests
    assert {r.headers["x-compaction-summary-calls"] for r in answers} == {str(len(calls))}
    assert {r.headers["x-compaction-summary"] for r in answers} == {"ok"}
    counter = TokenCounter()
    seen: list[int] = []
    for i, call in enumerate(calls):
        text = call.json()["messages"][0]["content"]
        assert counter.count_text(text) <= BUDGET
        labels = [int(x) for x in LABEL.findall(text)]
        if i:  # each call reads what the previous one wrote
            previous = calls[i - 1].json()["messages"][0]["content"]
            first, last = LABEL.findall(previous)[0], LABEL.findall(previous)[-1]
            assert f"<previous_summary>\nSUMMARY of messages {first}-{last}\n</previous_summary>" in text
        seen += labels
    assert seen == sorted(set(seen)) and len(seen) > 50  # every removed message, once, in order
    forwarded = {r.body for r in _main(upstream)}
    assert len(_main(upstream)) == 4 and len(forwarded) == 1  # byte-identical views
    last = LABEL.findall(calls[-1].json()["messages"][0]["content"])
    assert f"SUMMARY of messages {last[0]}-{last[-1]}" in forwarded.pop().decode()
    assert a.app[COMPACTION].summary_calls + b.app[COMPACTION].summary_calls == len(calls)
