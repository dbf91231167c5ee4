"""Two ``context-proxy serve`` processes on one PostgreSQL, a real Claude Code transcript replayed
turn by turn with the requests alternating between them, against a single process replaying the
same turns:

* the upstream receives byte-identical bodies from the pair as from the single process;
* exactly one summary call per compaction event (no replica summarises what the other did);
* the prefix-stable share (tokens of each forwarded request in the longest block-level prefix it
  shares with the previous one, over all forwarded tokens) is at least 90 %.

Needs PostgreSQL: ``bash .ci/pg start && . .ci/pg.env`` (skipped without CONTEXT_PROXY_TEST_PG).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.core.tokens import TokenCounter
from proxy.replay.runner import request_units, shared_prefix_tokens
from tests.pg_server import SKIP_REASON, fresh_schema
from tests.test_cli import ServeProcess
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

SUMMARY_MODEL = "claude-summary-replicas"
SESSION = "replay-replicas-1"
HEADERS = {"x-api-key": "sk-ant-replicas-replay-1", "anthropic-version": "2023-06-01", "x-session-id": SESSION}



def _config(path: Path, upstream_url: str, store_url: str, state_dir: Path) -> Path:
    data = {
        "upstream": {"base_url": upstream_url},
        "store": {"url": store_url},
        "state_dir": str(state_dir),
        "shutdown": {"grace_seconds": 5},
        "compaction": {"threshold": 40_000, "hard_limit": 120_000, "summary": {"model": SUMMARY_MODEL}},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _replay(
    replicas: list[ServeProcess], transcript: dict[str, Any], upstream: FakeUpstream
) -> tuple[list[RecordedRequest], list[RecordedRequest], list[httpx.Response]]:
    """Every user turn in order, turn i to ``replicas[i % len(replicas)]``."""
    messages = transcript["messages"]
    ends = [k for k in range(1, len(messages) + 1) if messages[k - 1]["role"] == "user"]
    start = len(upstream.requests)
    answers = []
    for turn, k in enumerate(ends):
        body = {"model": "claude-fake-1", "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}
        r = httpx.post(
            replicas[turn % len(replicas)].url + "/v1/messages",
            content=orjson.dumps(body),
            headers=HEADERS,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        answers.append(r)
    received = upstream.requests[start:]
    main = [r for r in received if r.json()["model"] != SUMMARY_MODEL]
    summaries = [r for r in received if r.json()["model"] == SUMMARY_MODEL]
    return main, summaries, answers


def _share(bodies: list[bytes]) -> float:
    counter = TokenCounter()
    shared = total = 0
    previous = None
    for body in bodies:
        request = orjson.loads(body)
        units = request_units(request.get("system"), request.get("tools"), request["messages"], counter)
        shared += shared_prefix_tokens(previous, units)
        total += sum(tokens for _, tokens in units)
        previous = units
    return shared / total


def test_alternating_replicas_forward_what_one_process_would(
    tmp_path: Path, upstream: FakeUpstream, transcript: dict[str, Any]
) -> None:
    if not os.environ.get("CONTEXT_PROXY_TEST_PG"):
        pytest.skip(SKIP_REASON)

    def answer(request: RecordedRequest) -> Reply:
        if request.json()["model"] == SUMMARY_MODEL:
            text = request.json()["messages"][0]["content"]
            return Reply(message_json(f"SUMMARY of {len(text)} characters: keep porting the proxy"))
        return Reply(message_json("ok"))

    upstream.script(*[answer] * 1000)

    with fresh_schema("single") as single_url:
        single = ServeProcess(_config(tmp_path / "single.yaml", upstream.url, single_url, tmp_path / "single"))
        try:
            main_single, summaries_single, answers_single = _replay([single], transcript, upstream)
        finally:
            single.stop()

    with fresh_schema("pair") as pair_url:
        config = _config(tmp_path / "pair.yaml", upstream.url, pair_url, tmp_path / "shared-volume")
        pair = [ServeProcess(config)]
        try:
            pair.append(ServeProcess(config))
            main_pair, summaries_pair, answers_pair = _replay(pair, transcript, upstream)
        finally:
            for replica in pair:
                replica.stop()

    plans = [r.headers["x-compaction-plan"] for r in answers_pair]
    # A compaction event that summarised: a new plan whose summary call succeeded.
    summarized = [r for r in answers_pair if r.headers["x-compaction-plan"] == "new" and r.headers["x-compaction-summary"] == "ok"]
    assert len(summarized) >= 2
    # Both replicas forwarded reused plans (made by either of them).
    assert {i % 2 for i, plan in enumerate(plans) if plan == "reused"} == {0, 1}
    # Exactly one summary call per compaction event, the same calls as the single process made.
    assert len(summaries_pair) == len(summarized)
    assert [r.body for r in summaries_pair] == [r.body for r in summaries_single]
    # Byte-identical bodies to the single process, turn by turn.
    assert len(main_pair) == len(main_single) == len(answers_pair)
    for turn, (a, b) in enumerate(zip(main_pair, main_single, strict=True)):
        assert a.body == b.body, f"turn {turn}: the pair forwarded other bytes than one process"
    assert [r.headers.get("x-compaction-id") for r in answers_pair] == [
        r.headers.get("x-compaction-id") for r in answers_single
    ]
    # The prompt cache survives: >= 90 % of forwarded tokens sit in a prefix shared with the
    # previous request.
    share = _share([r.body for r in main_pair])
    assert share >= 0.90, f"prefix-stable share {share:.3f}"
