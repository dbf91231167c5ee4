"""What a budget counts is what the usage ledger bills: a session whose calls write the cache (5
minutes and 1 hour) and read it, and whose compaction calls the summary model (the tenant's call:
counted to it), on SQLite and PostgreSQL. The spend counter and the ledger's total agree to the
cent (to a millionth of a dollar, in fact)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from tests.harness import LoopThread
from tests.pg_server import fresh_schema
from tests.test_quota_edge import ACME_KEY, SONNET, Clock, limited, quota_json, used
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

SUMMARY_MODEL = "claude-haiku-4-5"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'quota.db'}"


def _usage(turn: int) -> dict[str, Any]:
    return {
        "input_tokens": 20 + turn,
        "cache_creation_input_tokens": 4000 + 100 * turn,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000 + 100 * turn, "ephemeral_1h_input_tokens": 3000},
        "cache_read_input_tokens": 60_000 + 1000 * turn,
        "output_tokens": 700 + turn,
    }


SUMMARY_USAGE = {
    "input_tokens": 15_000,
    "cache_creation_input_tokens": 2000,
    "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0},
    "cache_read_input_tokens": 0,
    "output_tokens": 900,
}


def test_spend_matches_the_ledger_to_the_cent_summaries_included(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, transcript: dict[str, Any],
    loop_thread: LoopThread, store_url: str,
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(
        make_proxy, tmp_path, {"budget_usd": 100, "budget_period": "month"}, clock,
        store={"url": store_url},
        compaction={"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}},
    )  # fmt: skip
    turn = iter(range(1000))

    def answer(r: RecordedRequest) -> Reply:
        model = r.json()["model"]
        body = message_json("SUMMARY: go on" if model == SUMMARY_MODEL else "ok", model=model)
        body["usage"] = SUMMARY_USAGE if model == SUMMARY_MODEL else _usage(next(turn))
        return Reply(body)

    upstream.script(*[answer] * 40)
    messages = transcript["messages"]
    ends = [k for k in range(60, len(messages) + 1) if messages[k - 1]["role"] == "user"][:6]
    for k in ends:
        response = httpx.post(
            proxy.url + "/v1/messages",
            content=orjson.dumps({"model": SONNET, "max_tokens": 100, "messages": messages[:k], "tools": transcript["tools"]}),
            headers={"x-api-key": ACME_KEY, "x-session-id": "cached-1"}, timeout=60,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert "x-context-proxy-budget-remaining-usd" in response.headers
    spent = used(quota_json(proxy, loop_thread), "spend_usd")
    ledger = httpx.get(
        proxy.url + "/admin/v1/usage/summary?since=2000-01-01T00:00:00Z",
        headers={"Authorization": "Bearer cpa-acme-quota-admin-0001"}, timeout=10,
    ).json()["totals"]  # fmt: skip
    assert ledger["client_calls"] == len(ends) and ledger["summary_calls"] >= 1
    assert ledger["cache_creation_1h_input_tokens"] > 0 and ledger["cache_read_input_tokens"] > 0
    summary_usd = ledger["summary_calls"] * (15_000 * 1 + 2000 * 1.25 + 900 * 5) / 1e6
    assert summary_usd > 0.02  # leaving the summaries out would miss by more than a cent
    assert round(spent, 2) == round(ledger["cost_usd"]["total"], 2)
    assert spent == pytest.approx(ledger["cost_usd"]["total"], abs=1e-6)
