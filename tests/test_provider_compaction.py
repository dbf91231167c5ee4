"""The provider's own compaction, through the proxy, against the published rules.

The provider is ``tests/provider_rules`` (its docstring quotes the pages): on-demand compaction
(beta ``compact-2026-09-04``, top-level ``compaction: {"type": "summarize"}``) answers one signed
``compaction`` block; "Put the block first in `messages` [...] in place of the messages it
summarizes"; an altered, misplaced or doubled block is a 400; the beta is needed on every
request that carries the block; 529 ``compaction_unavailable`` when it cannot compact.

1. A client that compacts with the provider itself: its requests (the compaction request, then
   every later one carrying the block) reach the provider with their messages untouched, even
   over the proxy's threshold (``deferred``).
2. ``compaction.summary.mode: provider``: the proxy's L4 summary is the provider's compaction on
   the request's own model; the block leads the view, byte for byte, on every later turn and on
   another replica; a refused compaction (529) falls back to the proxy's own summary.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.compaction.bridge import PROVIDER_TEXT
from proxy.core.compaction.provider import COMPACT_BETA
from proxy.server.appkeys import DURABLE
from proxy.server.ledger import LEDGER
from proxy.store.usage import UsageQuery
from tests.harness import LoopThread, ProxyServer
from tests.provider_rules import ProviderRules, Turn
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

MODEL = "claude-opus-4-8"
SUMMARY_MODEL = "claude-summary-test"
SESSION = "provider-compaction-1"
FILLER = "a line of the file " * 150
TOOLS: list[dict[str, Any]] = [
    {"name": "read", "description": "read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
]


@pytest.fixture
def rules(upstream: FakeUpstream) -> ProviderRules:
    provider = ProviderRules()
    upstream.use_rules(provider)
    return provider


def _proxy(make_proxy: Any, mode: str, state_dir: Path | None = None) -> ProxyServer:
    sections: dict[str, Any] = {
        "compaction": {
            "threshold": 5000, "hard_limit": 400_000, "keep_recent": 4, "tool_result_cap": 100_000,
            "summary": {"model": SUMMARY_MODEL, "mode": mode},
        },
        "ledger": {"flush_seconds": 0.01},
    }
    if state_dir is not None:
        sections["state_dir"] = str(state_dir)
    return make_proxy(**sections)  # type: ignore[no-any-return]


def _turn(k: int) -> Any:
    def answer(req: RecordedRequest) -> Reply | Turn:
        if req.json().get("model") == SUMMARY_MODEL:
            return Reply(message_json("SUMMARY by the proxy's summary model.", model=SUMMARY_MODEL))
        return Turn(text=f"reading f{k}", tool_use=("read", {"path": f"f{k}"}))

    return answer


class Agent:
    """A faithful client: answers appended, long tool results, its one marker on the newest
    message (moved every turn)."""

    def __init__(self, client: anthropic.Anthropic, upstream: FakeUpstream, betas: list[str] | None = None) -> None:
        self.client = client
        self.upstream = upstream
        self.betas = betas or []
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Read the files."}]}]
        self.headers: list[dict[str, str]] = []

    def params(self, **more: Any) -> dict[str, Any]:
        messages = copy.deepcopy(self.messages)
        last = messages[-1]["content"][-1]
        if last.get("type") != "compaction":
            last["cache_control"] = {"type": "ephemeral"}
        params = {"model": MODEL, "max_tokens": 1024, "tools": TOOLS, "messages": messages, **more}
        if self.betas:
            params["betas"] = self.betas
        return params

    def step(self, k: int) -> dict[str, Any]:
        self.upstream.script(*([_turn(k)] * 3))
        raw = self.client.beta.messages.with_raw_response.create(**self.params())
        self.upstream._script.clear()
        answer: dict[str, Any] = orjson.loads(raw.http_response.content)
        self.headers.append(dict(raw.headers))
        self.messages.append({"role": "assistant", "content": answer["content"]})
        (use,) = [b for b in answer["content"] if b["type"] == "tool_use"]
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": f"{use['input']['path']}: {FILLER}"}
        ]})
        return answer


def _client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-provider-compaction", max_retries=0,
                               default_headers={"x-session-id": SESSION})


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    """The conversation's own requests (not the compaction requests, nor the summary calls)."""
    return [
        r for r in upstream.requests
        if r.path == "/v1/messages" and r.json().get("model") == MODEL and "compaction" not in r.json()
    ]


def test_a_clients_own_compaction_block_reaches_the_provider_untouched(
    make_proxy: Any, upstream: FakeUpstream, rules: ProviderRules
) -> None:
    proxy = _proxy(make_proxy, "proxy")
    agent = Agent(_client(proxy), upstream, betas=[COMPACT_BETA])
    for k in range(3):
        agent.step(k)
    # the client compacts with the provider itself (the request carries `compaction`)
    compacted = agent.client.beta.messages.with_raw_response.create(**agent.params(compaction={"type": "summarize"}))
    assert compacted.headers["x-compaction-layers"] == "deferred"
    (block,) = orjson.loads(compacted.http_response.content)["content"]
    assert block["type"] == "compaction"
    agent.messages = [{"role": "assistant", "content": [block]}, {"role": "user", "content": [{"type": "text", "text": "Go on reading."}]}]
    for k in range(3, 12):  # the conversation grows far over the proxy's threshold again
        agent.step(k)
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]
    # under the threshold nothing is done anyway ("none"); over it, never a layer of ours
    layers = [h["x-compaction-layers"] for h in agent.headers[3:]]
    assert set(layers) <= {"none", "deferred"} and layers[-1] == "deferred", layers
    for request in _main(upstream)[3:]:
        sent = request.json()["messages"]
        assert sent[0] == {"role": "assistant", "content": [block]}  # first, byte for byte
        assert "[context-proxy" not in orjson.dumps(sent).decode()


def test_provider_mode_puts_the_providers_block_first_and_keeps_its_bytes(
    make_proxy: Any, upstream: FakeUpstream, rules: ProviderRules, loop_thread: LoopThread, tmp_path: Path
) -> None:
    state = tmp_path / "shared-state"
    proxy = _proxy(make_proxy, "provider", state)
    agent = Agent(_client(proxy), upstream)
    for k in range(12):
        agent.step(k)
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]
    plans = [h.get("x-compaction-plan") for h in agent.headers]
    assert "new" in plans and plans.count("reused") >= 2, plans
    asks = [r for r in upstream.requests if r.path == "/v1/messages" and "compaction" in r.json()]
    assert asks and not [r for r in upstream.requests if r.json().get("model") == SUMMARY_MODEL]
    for ask in asks:  # the provider's compaction, on the request's own model, with its beta
        body = ask.json()
        assert body["model"] == MODEL and body["compaction"] == {"type": "summarize"}
        assert COMPACT_BETA in ask.headers["anthropic-beta"]
        assert "cache_control" not in orjson.dumps(body["messages"]).decode()
    first_new = plans.index("new")
    views = [r.json()["messages"] for r in _main(upstream)]
    block = views[first_new][0]["content"][0]
    assert views[first_new][0] == {"role": "assistant", "content": [block]} and block["type"] == "compaction"
    assert views[first_new][1]["role"] == "user" and views[first_new][1]["content"][0]["text"] == PROVIDER_TEXT
    # every later turn that reuses the plan forwards the very same block first
    for k in range(first_new + 1, len(views)):
        if plans[k] == "reused":
            assert orjson.dumps(views[k][:2]) == orjson.dumps(views[first_new][:2])
    # another replica sharing the store forwards the same bytes for the next turn
    loop_thread.run(proxy.app[DURABLE].drain())
    other = _proxy(make_proxy, "provider", state)
    agent.client = _client(other)
    agent.step(12)
    nxt = _main(upstream)[-1].json()["messages"]
    if agent.headers[-1].get("x-compaction-plan") == "reused":
        assert nxt[0] == views[-1][0]
    assert all(v.accepted for v in upstream.verdicts)
    # the compaction calls are in the ledger, billed by their iterations
    loop_thread.run(proxy.app[LEDGER].flush())
    rows = loop_thread.run(proxy.app[LEDGER].store.usage_rows("default", UsageQuery(kind="summary", limit=500)))
    assert rows and all(r.entry.status == 200 and r.entry.model == MODEL for r in rows)
    iterations = [r.entry.provider_usage.get("iterations") for r in rows if r.entry.provider_usage]
    assert iterations and all(i and i[0]["type"] == "compaction" for i in iterations)


def test_a_refused_provider_compaction_falls_back_to_the_proxys_summary(
    make_proxy: Any, upstream: FakeUpstream, rules: ProviderRules
) -> None:
    proxy = _proxy(make_proxy, "provider")
    rules.refuse_compaction(None)  # 529 compaction_unavailable, every time
    agent = Agent(_client(proxy), upstream)
    for k in range(8):
        agent.step(k)
    refusals = {(v.rejection.status, v.rejection.error_code) for v in upstream.verdicts if v.rejection}
    assert refusals == {(529, "compaction_unavailable")}, refusals  # only the compactions refused
    refused = [r for r in upstream.requests if r.path == "/v1/messages" and "compaction" in r.json()]
    summaries = [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") == SUMMARY_MODEL]
    assert refused and summaries  # asked the provider, then summarised itself
    new = next(k for k, h in enumerate(agent.headers) if h.get("x-compaction-plan") == "new")
    assert agent.headers[new]["x-compaction-summary"] == "ok"
    view = _main(upstream)[new].json()["messages"]
    assert view[0]["content"] == [{"type": "text", "text": "Read the files."}]  # the first message leads
    assert "SUMMARY by the proxy's summary model." in orjson.dumps(view).decode()
