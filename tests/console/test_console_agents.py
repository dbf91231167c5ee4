"""The console's session page with agents: the conversations tree (parent -> child), each
conversation's transcript, and an agent's compaction whose removed messages open that agent's
own events. Seeded through the real proxy with the official SDK, as Claude Code sends them
(one ``x-claude-code-session-id``; a subagent's ``x-claude-code-agent-id``, a nested one's
``x-claude-code-parent-agent-id``); driven in Debian's chromium."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
import yaml

from proxy.server.appkeys import DURABLE
from proxy.server.ledger import LEDGER
from tests.console.browser import open_watched, screenshot
from tests.console.conftest import _long_history
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream, Reply, message_json

TOKEN = "cpa-agents-console-admin-token-0001"
SESSION = "cc-agents-console-1"


@pytest.fixture(scope="module")
def agents_proxy(loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("console-agents")
    policies = tmp / "policies"
    policies.mkdir()
    policy = {
        "name": "team",
        "provider": {"mode": "passthrough"},
        "admin_tokens_sha256": [hashlib.sha256(TOKEN.encode()).hexdigest()],
    }
    (policies / "team.yaml").write_text(yaml.safe_dump(policy))
    upstream = FakeUpstream()
    loop_thread.run(upstream.start())
    config = proxy_config(
        upstream.url,
        str(tmp / "state"),
        policies_dir=str(policies),
        compaction={"threshold": 3000, "hard_limit": 100_000, "keep_recent": 2,
                    "summary": {"model": "claude-summary-test", "max_tokens": 200}},
        ledger={"flush_seconds": 0.01},
    )
    proxy = ProxyServer(config)
    url = loop_thread.run(proxy.start())

    def client(**headers: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=url, api_key="sk-ant-team", max_retries=0,
            default_headers={"x-claude-code-session-id": SESSION, **headers},
        )

    try:
        with client() as main:
            main.messages.create(model="claude-sonnet-4-5", max_tokens=16,
                                 messages=[{"role": "user", "content": "main: spawn a helper"}])
        # the subagent's conversation is long: it is compacted (summarised) on its first request
        upstream.script(Reply(message_json("SUMMARY: the helper's work so far.", model="claude-summary-test")))
        with client(**{"x-claude-code-agent-id": "a1"}) as sub:
            raw = sub.messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=16, messages=_long_history()  # type: ignore[arg-type]
            )
        assert "summarize" in raw.headers["x-compaction-layers"], dict(raw.headers)
        with client(**{"x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"}) as nested:
            nested.messages.create(model="claude-sonnet-4-5", max_tokens=16,
                                   messages=[{"role": "user", "content": "nested: look deeper"}])
        loop_thread.run(proxy.app[DURABLE].drain())
        loop_thread.run(proxy.app[LEDGER].flush())
        yield url, raw.headers["x-compaction-id"]
    finally:
        loop_thread.run(proxy.stop())
        loop_thread.run(upstream.stop())


def test_the_conversations_tree_and_an_agents_compaction(browser: Any, agents_proxy: tuple[str, str]) -> None:
    from playwright.sync_api import expect

    url, compaction_id = agents_proxy
    context, page, watch = open_watched(browser, url)
    try:
        page.goto("/console/")
        page.get_by_label("Admin token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        page.goto(f"/console/sessions/{SESSION}")
        tree = page.get_by_role("list", name="Conversations of this session")
        main = tree.locator('li[data-agent=""]')
        expect(main).to_contain_text("main conversation · 2 events")
        a1 = main.locator('li[data-agent="a1"]')  # a child of the main conversation
        expect(a1.locator("button").first).to_have_text("agent a1")
        a2 = a1.locator('li[data-agent="a2"]')  # a child of a1
        expect(a2).to_contain_text("agent a2 · 2 events")

        transcript = page.get_by_role("region", name="Transcript")
        expect(transcript.locator('[data-figure="conversation"]')).to_have_text("The main conversation")
        expect(transcript.get_by_role("article")).to_have_count(2)
        expect(transcript.get_by_role("article").first).to_contain_text("main: spawn a helper")
        a2.locator("button").first.click()
        expect(transcript.locator('[data-figure="conversation"]')).to_have_text("Agent a2")
        expect(transcript.get_by_role("article").first).to_contain_text("nested: look deeper")
        a1.locator("button").first.click()
        expect(transcript.locator('[data-figure="conversation"]')).to_have_text("Agent a1")
        expect(transcript.get_by_role("article").first).to_contain_text("start the long one")

        # the subagent's compaction: its removed messages open the subagent's own events
        article = page.get_by_role("article", name=f"Compaction {compaction_id}")
        expect(article).to_contain_text("of agent a1")
        manifest = page.request.get(f"/admin/v1/manifests/{compaction_id}").json()["manifest"]
        assert manifest["agent"] == "a1" and manifest["events"], manifest
        (summary,) = [r for r in manifest["records"] if r["kind"] == "summarized"]
        first = summary["message_indices"][0]
        article.locator("summary").click()  # a compaction opens on demand
        article.locator('li[data-record="summarized"]').get_by_role(
            "button", name=f"Show message {first}", exact=True
        ).click()
        source = page.get_by_role("region", name="Source")
        expect(source).to_contain_text(f"transcript:{SESSION}:a1:{manifest['events'][str(first)]}")
        expect(source).to_contain_text("available")
        screenshot(page, "session-agents")
    finally:
        context.close()
    watch.assert_clean()
