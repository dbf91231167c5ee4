"""Claude Code itself against a tenant's budget: the proxy's 429 is one Claude Code understands.

A spent budget is answered ``429 rate_limit_error`` with ``x-should-retry: false`` and
``retry-after`` to the period's end (12 hours here). Claude Code 2.1.197 must stop at once with the
proxy's own words (seen: ``API Error: Request rejected (429) · rate limit exceeded for tenant
acme: tenant budget of 3.00 USD per day spent ...``), one 429 and no retry, and nothing reaches the
provider; under the budget it works as usual.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.harness import LoopThread
from tests.test_claude_code import RUN_TIMEOUT, _clean_env, find_claude
from tests.test_quota_edge import ACME_KEY, CACHED, Clock, answer_with, create, limited, settle
from tests.upstream import FakeUpstream

MODEL = "claude-sonnet-4-5-20250929"  # a priced model: the spend counts


def _run(claude: str, work: Path, home: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = _clean_env(home, url)
    env["ANTHROPIC_API_KEY"] = ACME_KEY
    return subprocess.run(
        [claude, "-p", "Say hello.", "--model", MODEL, "--output-format", "json"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RUN_TIMEOUT,
    )  # fmt: skip


@pytest.mark.claude_code
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_claude_code_stops_at_a_spent_budget_with_the_proxys_words(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found: set CLAUDE_BIN")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    proxy = limited(
        make_proxy, tmp_path, {"budget_usd": 3, "budget_period": "day"}, Clock("2026-12-04T12:00:00")
    )
    # under the budget: Claude Code runs as usual
    ok = _run(claude, work, home, proxy.url)
    context = f"exit {ok.returncode}\n{ok.stdout[-3000:]}\n{ok.stderr[-3000:]}"
    assert ok.returncode == 0, context
    assert json.loads(ok.stdout).get("is_error") is False, context
    assert upstream.requests, context
    # the budget spent by two costly calls (2.03 USD each, the second admitted under 3 USD)
    upstream.script(answer_with(CACHED), answer_with(CACHED))
    create(proxy)
    settle(proxy, loop_thread)
    create(proxy)
    settle(proxy, loop_thread)
    before = len(upstream.requests)
    started = time.monotonic()
    refused = _run(claude, work, home, proxy.url)
    took = time.monotonic() - started
    context = f"exit {refused.returncode}\n{refused.stdout[-3000:]}\n{refused.stderr[-3000:]}"
    assert len(upstream.requests) == before, context  # nothing reached the provider
    assert refused.returncode != 0 or json.loads(refused.stdout).get("is_error") is True, context
    assert "budget of 3.00 USD per day spent" in refused.stdout + refused.stderr, context
    # one refusal, not retried: the proxy answered exactly one 429, and Claude Code gave up at once
    assert _answered(proxy, "429") == 1, context
    assert took < RUN_TIMEOUT / 2, context


def _answered(proxy: Any, status: str) -> float:
    text = urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10).read().decode()
    prefix = f'context_proxy_requests_total{{route="messages",status="{status}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))
