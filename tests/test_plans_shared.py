"""Two proxy replicas sharing one store: the next turn of a conversation one replica compacted
goes through the other with the same view, byte for byte (the provider's cached prefix)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.compaction import prefix_hashes
from proxy.server.appkeys import COMPACTION, STORE
from proxy.store import StoreUnavailable
from proxy.tenancy.tenants import DEFAULT_TENANT
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-shared-plans-test-000111"
SUMMARY_MODEL = "claude-summary-test"
SMALL = {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}
ACME_KEY, GLOBEX_KEY = "cpk-acme-shared-1", "cpk-globex-shared-1"



def _turns(transcript: dict[str, Any], at_least: int) -> tuple[int, int]:
    messages = transcript["messages"]
    ends = [k for k in range(at_least, len(messages) + 1) if messages[k - 1]["role"] == "user"]
    return ends[0], ends[1]


def _client(proxy: ProxyServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)


def _create(client: anthropic.Anthropic, transcript: dict[str, Any], k: int) -> Any:
    return client.messages.with_raw_response.create(
        model="claude-fake-1", max_tokens=100, messages=transcript["messages"][:k], tools=transcript["tools"]
    )


def _main(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL]


def _summaries(upstream: FakeUpstream, model: str = SUMMARY_MODEL) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") == model]


def _script(upstream: FakeUpstream, summary_model: str = SUMMARY_MODEL) -> None:
    upstream.script(
        lambda req: Reply(message_json("SUMMARY: goal was X" if req.json()["model"] == summary_model else "ok"))
    )


def _messages_prefix(body: bytes) -> bytes:
    """The forwarded bytes up to the messages array's last element (the cached part)."""
    messages = orjson.loads(body)["messages"]
    return orjson.dumps(messages[:-1])[:-1]


def test_the_next_turn_on_another_replica_reuses_the_plan_byte_for_byte(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], tmp_path: Path, loop_thread: LoopThread
) -> None:
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    a = make_proxy(compaction=SMALL, store=shared)
    b = make_proxy(compaction=SMALL, store=shared)
    _script(upstream)
    k1, k2 = _turns(transcript, 90)

    first = _create(_client(a), transcript, k1)
    assert first.headers["x-compaction-plan"] == "new"
    assert "summarize" in first.headers["x-compaction-layers"]
    assert len(_summaries(upstream)) == 1
    sent_a = _main(upstream)[-1].body
    # Stored before A answered.
    anchor = prefix_hashes(transcript["messages"][:1])[1]
    assert len(loop_thread.run(b.app[STORE].plans_for(DEFAULT_TENANT, anchor))) == 1
    assert len(b.app[COMPACTION].plans) == 0  # B has not seen the conversation

    second = _create(_client(b), transcript, k2)
    assert second.headers["x-compaction-plan"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(_summaries(upstream)) == 1  # no second summary call
    sent_b = _main(upstream)[-1].body
    view_a = orjson.loads(sent_a)["messages"]
    view_b = orjson.loads(sent_b)["messages"]
    assert view_b[: len(view_a) - 1] == view_a[:-1]
    assert view_b[len(view_a) - 1 :] == transcript["messages"][k1 - 1 : k2]
    # Byte-level: B's messages start with exactly A's bytes (the provider's cache key).
    prefix = _messages_prefix(sent_a)
    assert orjson.dumps(view_b).startswith(prefix)
    head_a = sent_a[: sent_a.index(b'"messages":')]
    assert sent_b.startswith(head_a + b'"messages":' + prefix)


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _policy(name: str, key: str, env: str) -> str:
    return (
        f"name: {name}\n"
        f"api_keys_sha256: ['{_sha(key)}']\n"
        f"provider: {{mode: env, api_key_env: {env}}}\n"
        f"compaction: {{threshold: 20000, hard_limit: 60000, summary: {{model: {SUMMARY_MODEL}}}}}\n"
    )


def test_another_tenant_on_the_other_replica_never_reuses_the_plan(
    upstream: FakeUpstream,
    make_proxy: Any,
    transcript: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loop_thread: LoopThread,
) -> None:
    monkeypatch.setenv("ACME_PROVIDER_KEY", "sk-ant-acme-provider")
    monkeypatch.setenv("GLOBEX_PROVIDER_KEY", "sk-ant-globex-provider")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(_policy("acme", ACME_KEY, "ACME_PROVIDER_KEY"))
    (policies / "globex.yaml").write_text(_policy("globex", GLOBEX_KEY, "GLOBEX_PROVIDER_KEY"))
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    a = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies), store=shared)
    b = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies), store=shared)
    _script(upstream)
    k1, k2 = _turns(transcript, 90)
    anchor = prefix_hashes(transcript["messages"][:1])[1]

    first = _create(_client(a, ACME_KEY), transcript, k1)
    assert first.headers["x-compaction-plan"] == "new"
    assert len(_summaries(upstream)) == 1
    store = b.app[STORE]
    assert len(loop_thread.run(store.plans_for("acme", anchor))) == 1
    assert loop_thread.run(store.plans_for("globex", anchor)) == ()

    # Globex sends the very same history, on B: compacted afresh, never acme's plan.
    other = _create(_client(b, GLOBEX_KEY), transcript, k1)
    assert other.headers["x-compaction-plan"] == "new"
    assert other.headers["x-compaction-id"] != first.headers["x-compaction-id"]
    # ... nor acme's summary (the same summary request, so the same key): globex's own call,
    # with globex's provider key.
    calls = _summaries(upstream)
    assert len(calls) == 2 and calls[0].body == calls[1].body
    assert calls[1].headers["x-api-key"] == "sk-ant-globex-provider"
    summaries = _summaries(upstream)
    assert len(summaries) == 2
    assert summaries[-1].headers["x-api-key"] == "sk-ant-globex-provider"
    assert all(p.tenant == "globex" for p in b.app[COMPACTION].plans.plans("globex", anchor))
    assert b.app[COMPACTION].plans.plans("acme", anchor) == ()

    # Acme's next turn on B does reuse acme's plan (read through from the store).
    again = _create(_client(b, ACME_KEY), transcript, k2)
    assert again.headers["x-compaction-plan"] == "reused"
    assert again.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(_summaries(upstream)) == 2


def test_a_failing_store_only_costs_the_reuse(
    upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    a = make_proxy(compaction=SMALL, store=shared)
    b = make_proxy(compaction=SMALL, store=shared)
    _script(upstream)
    k1, k2 = _turns(transcript, 90)

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the store is down")

    monkeypatch.setattr(a.app[STORE], "put_plan", unavailable)
    monkeypatch.setattr(b.app[STORE], "plans_for", unavailable)
    first = _create(_client(a), transcript, k1)
    assert first.status_code == 200 and first.headers["x-compaction-plan"] == "new"
    second = _create(_client(b), transcript, k2)  # nothing stored, nothing read: compacted afresh
    assert second.status_code == 200 and second.headers["x-compaction-plan"] == "new"
    assert len(_summaries(upstream)) == 2


def _tool_turns(n: int) -> list[dict[str, Any]]:
    """A conversation of ``n`` tool round trips, each result ~1,500 tokens of its own text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "audit the logs"}]
    for i in range(n):
        text = "\n".join(f"turn {i} line {j}: status=ok latency={i * 7 + j}ms" for j in range(120))
        messages.append(
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i:03d}", "name": "Bash", "input": {"command": f"cat log{i}"}}]}
        )
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:03d}", "content": text}]})
    return messages


def test_a_replica_with_an_older_plan_adopts_the_newer_one_the_other_made(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    """A has the conversation's first plan cached; B compacted again since. When A's view (old
    plan + new turns) crosses the threshold, A reads B's plan instead of making its own: the
    pair forwards exactly what one process forwards, turn after turn."""
    truncate_only = {"threshold": 12_000, "hard_limit": 60_000, "tool_result_cap": 300, "summary": {"model": SUMMARY_MODEL}}
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    a = make_proxy(compaction=truncate_only, store=shared)
    b = make_proxy(compaction=truncate_only, store=shared)
    single = make_proxy(compaction=truncate_only)
    _script(upstream)
    upstream.script(*[Reply(message_json("ok"))] * 200)
    messages = _tool_turns(24)

    def run(targets: list[Any]) -> tuple[list[bytes], list[str]]:
        start = len(upstream.requests)
        plans = []
        for turn, k in enumerate(range(3, len(messages) + 1, 2)):
            r = _client(targets[turn % len(targets)]).messages.with_raw_response.create(
                model="claude-fake-1", max_tokens=10, messages=messages[:k]
            )
            plans.append(r.headers["x-compaction-plan"] + ":" + r.headers["x-compaction-layers"])
        return [r.body for r in upstream.requests[start:]], plans

    alone, plans_alone = run([single])
    calls_alone = len(_summaries(upstream))
    pair, plans_pair = run([a, b])

    assert len(_summaries(upstream)) == 2 * calls_alone  # one call per event in either run
    assert sum(p.startswith("new:") for p in plans_alone) >= 3  # compacted again and again
    assert plans_pair == plans_alone
    assert pair == alone
