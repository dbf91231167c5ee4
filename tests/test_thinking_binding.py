"""Thinking blocks bound to their prefix, through the proxy: a compacting tool loop never meets
the provider's stale-block 400, never loses a block that is still valid, and changes nothing on
a model that does not bind.

The provider is ``tests/provider_rules`` (a fake written from the published rules; its docstring
quotes them): platform.claude.com/docs/en/build-with-claude/thinking, "Preserved thinking" --
a block is bound to ``system``, ``tools`` and everything before it; a stale one is the 400
``Invalid `signature` in `thinking` block. The block is bound to a different conversation.``
unless the request carries the beta ``thinking-binding-controls-2026-08-01`` and
``thinking.block_binding.prefix_mismatch_behavior: "drop_block"``, when it is dropped and listed
in ``input_transformations``; ``cache_control`` markers are not part of the prefix.

The client is the official SDK behaving like a faithful agent (answers appended verbatim, long
tool results, Claude Code's habit of moving its one marker to the newest message), with a
session, so the proxy compacts the loop (new plans, then reused ones), injects durable context
and offers its retrieval tool: every rewrite of the prefix the provider binds blocks to.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.config.model_entries import ModelConfig
from proxy.core.thinking import BINDING_BETA
from proxy.server.ledger import LEDGER
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.provider_rules import ProviderRules, Turn
from tests.test_retrieval_offer import named_pointers, offers_tool, tools_bytes
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

FABLE = "claude-fable-5-1"  # binds (the fake's and the proxy's tables)
OPUS = "claude-opus-4-8"  # does not bind
SUMMARY_MODEL = "claude-summary-test"
SESSION = "thinking-loop-1"
API_KEY = "cpk-thinking-binding-1"
ADMIN_TOKEN = "adm-thinking-binding-1"
SYSTEM = [
    {"type": "text", "text": "You are a careful agent."},
    {"type": "text", "text": "Read files with the tool.", "cache_control": {"type": "ephemeral"}},
]
TOOLS: list[dict[str, Any]] = [
    {"name": "read", "description": "read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
]
FILLER = "line of the file " * 120  # a long tool result: the loop keeps crossing the threshold
TURNS = 24


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def rules(upstream: FakeUpstream) -> ProviderRules:
    provider = ProviderRules()
    upstream.use_rules(provider)
    return provider


@pytest.fixture
def proxy(loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path) -> Iterator[ProxyServer]:
    server = binding_proxy(loop_thread, upstream, tmp_path)
    yield server
    loop_thread.run(server.stop())


def binding_proxy(
    loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path, platform: dict[str, Any] | None = None
) -> ProxyServer:
    """A started proxy (tenant ``team``, a low threshold, a summary model) on ``upstream`` (or,
    with ``platform``, that ``upstream:`` section)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = {
        "name": "team",
        "api_keys_sha256": [_sha(API_KEY)],
        "provider": {"mode": "passthrough"},
        "admin_tokens_sha256": [_sha(ADMIN_TOKEN)],
    }
    (policies / "team.yaml").write_text(yaml.safe_dump(policy))
    config = proxy_config(
        upstream.url,
        str(tmp_path / "state"),
        auth={"mode": "keys"},
        policies_dir=str(policies),
        compaction={
            "threshold": 6000,
            "hard_limit": 400_000,
            "keep_recent": 4,
            "tool_result_cap": 100_000,
            "summary": {"model": SUMMARY_MODEL},
        },
        ledger={"flush_seconds": 0.01},
        **({"upstream": platform} if platform else {}),
    )
    server = ProxyServer(config)
    loop_thread.run(server.start())
    return server


def _answer(k: int) -> Any:
    """The provider: a summary for the proxy's summary calls, a thinking tool turn otherwise."""

    def answer(req: RecordedRequest) -> Reply | Turn:
        if req.json().get("model") == SUMMARY_MODEL:
            return Reply(message_json("SUMMARY: files were read one by one.", model=SUMMARY_MODEL))
        return Turn(thinking=f"Step {k}: read f{k} next.", tool_use=("read", {"path": f"f{k}"}))

    return answer


@dataclass
class Loop:
    """A faithful client: the answer appended verbatim, the tool result after it, one marker
    on the newest message (moved every turn, as Claude Code does)."""

    client: anthropic.Anthropic
    upstream: FakeUpstream
    model: str = FABLE
    thinking: dict[str, Any] | None = field(default_factory=lambda: {"type": "adaptive"})
    betas: list[str] = field(default_factory=list)
    stream: bool = False
    messages: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "user", "content": [{"type": "text", "text": "Read the files."}]}])
    answers: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def sent(self) -> list[dict[str, Any]]:
        out = copy.deepcopy(self.messages)
        out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return out

    def step(self, k: int, script: Any = None) -> dict[str, Any]:
        self.upstream.script(*([script or _answer(k)] * 3))  # with room for a summary call
        params: dict[str, Any] = {
            "model": self.model, "max_tokens": 2048, "system": SYSTEM, "tools": TOOLS, "messages": self.sent(),
        }
        if self.thinking is not None:
            params["thinking"] = self.thinking
        if self.betas:
            params["betas"] = self.betas
        if self.stream:
            with self.client.beta.messages.stream(**params) as s:
                for _ in s:
                    pass
                message = s.get_final_message().model_dump(mode="json", exclude_none=True)
                headers = dict(s.response.headers)
        else:
            raw = self.client.beta.messages.with_raw_response.create(**params)
            message = orjson.loads(raw.http_response.content)
            headers = dict(raw.headers)
        self.upstream._script.clear()  # what the turn did not use
        self.answers.append(message)
        self.headers.append(headers)
        content = [b for b in message["content"] if b.get("type") != "text" or b.get("text")]
        self.messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u["id"], "content": f"{u['input']['path']}: {FILLER}"} for u in uses
        ] or [{"type": "text", "text": "go on"}]})
        return message


def _client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.url, api_key=API_KEY, max_retries=0, default_headers={"x-session-id": SESSION}
    )


def _forwarded(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL]


def _signatures(message: dict[str, Any]) -> list[str]:
    return [b.get("signature") or b.get("data") for b in message["content"] if b.get("type") in ("thinking", "redacted_thinking")]


def _add_fact(proxy: ProxyServer) -> None:
    fact = {"id": "build", "content": "the build uses uv", "source": f"transcript:{SESSION}:1",
            "last_confirmed_at": "2026-12-01T10:00:00Z"}
    with httpx.Client(base_url=proxy.url, timeout=30, trust_env=False) as http:
        r = http.post(f"/admin/v1/sessions/{SESSION}/facts", json=fact, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_compacting_tool_loop_on_a_binding_model_never_meets_the_stale_block_400(
    proxy: ProxyServer, upstream: FakeUpstream, rules: ProviderRules, loop_thread: LoopThread, stream: bool
) -> None:
    loop = Loop(_client(proxy), upstream, stream=stream)
    made_at: dict[str, int] = {}  # signature -> the turn whose answer brought it
    for k in range(TURNS):
        if k == 9:
            _add_fact(proxy)  # the durable block in system changes: every earlier block is stale
        message = loop.step(k)
        for sig in _signatures(message):
            made_at[sig] = k
    verdicts = [v for v, r in zip(upstream.verdicts, upstream.requests, strict=False) if r.json().get("model") != SUMMARY_MODEL]
    rejected = [v.rejection.message for v in upstream.verdicts if v.rejection is not None]
    assert rejected == []  # stale-thinking 400s: 0
    plans = [h.get("x-compaction-plan") for h in loop.headers]
    assert plans.count("new") >= 2 and plans.count("reused") >= 3, plans  # a compacting loop

    # Every block the provider dropped was made under a view the proxy no longer forwards (before
    # the turn's latest new plan or the durable change); none made under the view in force.
    changes = [k for k, h in enumerate(loop.headers) if h.get("x-compaction-plan") == "new"] + [9]
    lost_valid = 0
    forwarded = _forwarded(upstream)
    dropped_total = 0
    for k, (request, verdict) in enumerate(zip(forwarded, verdicts, strict=True)):
        body = request.json()
        since = max((c for c in changes if c <= k), default=-1)
        for path in verdict.dropped:
            _, i, _, j = path.split(".")
            block = body["messages"][int(i)]["content"][int(j)]
            made = made_at[block.get("signature") or block.get("data")]
            dropped_total += 1
            if made >= since:
                lost_valid += 1
        # the proxy's header says how many it asked to drop: exactly what the provider dropped
        header = loop.headers[k].get("x-compaction-thinking", "none=0")
        action, count = header.split("=")
        assert int(count) == len(verdict.dropped), (k, header, sorted(verdict.dropped))
        if verdict.dropped:
            assert action == "asked-to-drop"
            assert BINDING_BETA in request.headers.get("anthropic-beta", "")
            assert body["thinking"] == {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        # the provider's report reaches the client untouched
        assert loop.answers[k].get("input_transformations", []) == verdict.input_transformations()
    assert lost_valid == 0  # still-valid blocks lost: 0
    assert dropped_total > 0  # the loop did replay stale blocks, and they were dropped
    # the retrieval tool: from the first view that names a pointer on, never before, one byte
    # string (the provider drops what it made stale; the tool is never held back for it)
    named = [bool(named_pointers(r.json())) for r in forwarded]
    first = named.index(True)
    assert [offers_tool(r.json()) for r in forwarded] == [k >= first for k in range(len(forwarded))]
    assert len({tools_bytes(r.body) for r in forwarded[first:]}) == 1

    # the ledger keeps what the provider dropped
    loop_thread.run(proxy.app[LEDGER].flush())
    with httpx.Client(base_url=proxy.url, timeout=30, trust_env=False) as http:
        rows = http.get("/admin/v1/usage", params={"session": SESSION, "limit": 500},
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["rows"]
    client_rows = [r for r in rows if r["kind"] == "client"]
    assert sum(r.get("thinking_blocks_dropped") or 0 for r in client_rows) == dropped_total


def test_on_a_model_that_does_not_bind_nothing_changes(
    proxy: ProxyServer, upstream: FakeUpstream, rules: ProviderRules
) -> None:
    loop = Loop(_client(proxy), upstream, model=OPUS)
    for k in range(TURNS):
        if k == 9:
            _add_fact(proxy)
        loop.step(k)
    assert all(v.accepted for v in upstream.verdicts)
    plans = [h.get("x-compaction-plan") for h in loop.headers]
    assert plans.count("new") >= 2, plans
    for request, headers in zip(_forwarded(upstream), loop.headers, strict=True):
        body = request.json()
        assert BINDING_BETA not in request.headers.get("anthropic-beta", "")
        assert "block_binding" not in body.get("thinking", {})
        assert "x-compaction-thinking" not in headers
    dropped = sum(len(v.dropped) for v in upstream.verdicts)
    assert dropped == 0  # blocks dropped on a non-binding model: 0


def test_when_the_client_chose_error_compaction_is_deferred_rather_than_a_400(
    proxy: ProxyServer, upstream: FakeUpstream, rules: ProviderRules
) -> None:
    error = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}}
    loop = Loop(_client(proxy), upstream, thinking=error, betas=[BINDING_BETA])
    for k in range(14):
        loop.step(k)
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]
    layers = [h.get("x-compaction-layers") for h in loop.headers]
    assert "deferred" in layers, layers
    deferred = [k for k, h in enumerate(loop.headers) if h.get("x-compaction-layers") == "deferred"]
    for k in deferred:
        assert loop.headers[k]["x-compaction-thinking"].startswith("deferred=")
    # a deferred request carries the client's own messages: nothing of the plan's, no pointer,
    # and so no retrieval tool; a compacted one that names a pointer carries it
    forwarded = _forwarded(upstream)
    for k in deferred:
        sent = forwarded[k].json()
        assert "[context-proxy" not in orjson.dumps(sent["messages"]).decode()
        assert not named_pointers(sent) and not offers_tool(sent)
    for k, request in enumerate(forwarded):
        if k not in deferred and named_pointers(request.json()):
            assert offers_tool(request.json()), k


def test_with_thinking_off_the_proxy_removes_the_stale_blocks_itself(
    proxy: ProxyServer, upstream: FakeUpstream, rules: ProviderRules
) -> None:
    def no_thinking(k: int) -> Any:
        def answer(req: RecordedRequest) -> Reply | Turn:
            if req.json().get("model") == SUMMARY_MODEL:
                return Reply(message_json("SUMMARY: files were read.", model=SUMMARY_MODEL))
            return Turn(tool_use=("read", {"path": f"f{k}"}))

        return answer

    loop = Loop(_client(proxy), upstream)
    for k in range(3):
        loop.step(k)  # thinking on: blocks in the history
    loop.step(3, no_thinking(3))  # an answer without thinking: the client may now turn it off
    loop.thinking = {"type": "disabled"}
    _add_fact(proxy)  # the durable block changes system: the blocks made before are stale
    for k in range(4, 16):
        loop.step(k, no_thinking(k))
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]
    dropped_by_us = [h["x-compaction-thinking"] for h in loop.headers if h.get("x-compaction-thinking", "").startswith("dropped=")]
    assert dropped_by_us, [h.get("x-compaction-thinking") for h in loop.headers]
    for request, headers in zip(_forwarded(upstream), loop.headers, strict=True):
        if headers.get("x-compaction-thinking", "").startswith("dropped="):
            # what the provider was shown holds no stale block: it dropped none itself
            assert BINDING_BETA not in request.headers.get("anthropic-beta", "")
    assert sum(len(v.dropped) for v in upstream.verdicts) == 0


def test_on_a_platform_that_does_not_take_the_binding_beta_the_proxy_drops_stale_blocks(
    loop_thread: LoopThread, upstream: FakeUpstream, rules: ProviderRules, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Foundry upstream (the catalogue's Foundry column leaves the binding beta out: LiteLLM's
    azure_ai table) loses the beta and ``block_binding`` on the way, so asking the provider to
    drop would reach it as nothing: the proxy removes the stale blocks itself. The provider here
    is the rules fake behind Foundry's path (``<endpoint>/v1/messages``): a stale block would be
    its 400."""
    monkeypatch.setenv("BINDING_FOUNDRY_KEY", "foundry-key-for-the-rules-fake")
    server = binding_proxy(
        loop_thread, upstream, tmp_path,
        {"format": "foundry", "endpoint_url": upstream.url, "api_key_env": "BINDING_FOUNDRY_KEY"},
    )  # fmt: skip
    try:
        loop = Loop(_client(server), upstream)
        for k in range(14):
            if k == 9:
                _add_fact(server)  # the durable block changes system: earlier blocks are stale
            loop.step(k)
    finally:
        loop_thread.run(server.stop())
    assert all(v.accepted for v in upstream.verdicts), [v.rejection for v in upstream.verdicts if v.rejection]
    actions = [h.get("x-compaction-thinking", "none=0") for h in loop.headers]
    assert any(a.startswith("dropped=") for a in actions), actions
    assert not any(a.startswith("asked-to-drop") for a in actions), actions
    for request in _forwarded(upstream):
        assert BINDING_BETA not in request.headers.get("anthropic-beta", "")
        assert request.headers["x-api-key"] == "foundry-key-for-the-rules-fake"
    assert sum(len(v.dropped) for v in upstream.verdicts) == 0  # nothing stale reached it


def test_the_stale_block_400_is_what_the_fake_answers_without_the_guard(
    proxy: ProxyServer, upstream: FakeUpstream, rules: ProviderRules, loop_thread: LoopThread
) -> None:
    """The fake is not lenient: the same rewrite, forwarded by a replica configured to believe
    the model does not bind (``models: [{thinking_binding: none}]``), is the provider's 400."""
    loop = Loop(_client(proxy), upstream)
    for k in range(3):
        loop.step(k)
    _add_fact(proxy)
    unguarded = ProxyServer(dataclasses.replace(
        proxy.config, models=(ModelConfig(match="claude-fable-5-1*", thinking_binding="none"),)
    ))
    loop_thread.run(unguarded.start())
    try:
        loop.client = _client(unguarded)
        upstream.script(_answer(3))
        with pytest.raises(anthropic.BadRequestError) as caught:
            loop.step(3)
        assert "Invalid `signature` in `thinking` block. The block is bound to a different conversation." in caught.value.message
        loop.client = _client(proxy)  # the guarded replica: the same request goes through
        loop.step(3)
    finally:
        loop_thread.run(unguarded.stop())
