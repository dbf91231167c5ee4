"""One real proxy for the console tests: two tenants (``acme``, ``globex``, ``auth.mode: keys``),
a real SQLite store, the fake upstream, and sessions seeded through the proxy itself with the
official SDK: untrusted text (an XSS payload) in a user message, a model answer, a tool result
(cut by L1 and kept as an artifact) and a durable fact written through the admin API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
import yaml

from proxy.server.appkeys import DURABLE
from proxy.server.ledger import LEDGER, record_upstream_call
from tests.console.browser import browser  # noqa: F401 (the fixture, for this folder)
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream, Reply, Reset, message_json

A_TOKEN = "cpa-acme-console-admin-token-0001"
B_TOKEN = "cpa-globex-console-admin-token-0001"
A_KEY = "cpk-acme-console-key-0001"
B_KEY = "cpk-globex-console-key-0001"
A_SESSION = "acme-build-42"
A_ERRORS = "acme-errors-1"
A_LONG = "acme-long-3"
B_SESSION = "globex-secret-7"

# Executes if any page ever treats data as HTML: sets a flag, opens a dialog, and asks another
# origin for an image (the tests watch for all three).
PAYLOAD = (
    '<img src="http://xss.invalid/p.png" onerror="window.__xss=1;alert(1)">'
    "<script>window.__xss=2;alert(2)</script>"
    '<svg onload="window.__xss=3;alert(3)"></svg>'
    "\"'><iframe src=\"javascript:alert(4)\"></iframe>"
)


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class World:
    url: str
    proxy: ProxyServer
    upstream: FakeUpstream
    loop: LoopThread
    compaction_id: str
    artifact_pointer: str
    fact_source: str

    def admin(self, method: str, path: str, token: str = A_TOKEN, **kw: Any) -> httpx.Response:
        with httpx.Client(timeout=30, trust_env=False) as http:
            return http.request(
                method,
                self.url + "/admin/v1" + path,
                headers={"Authorization": f"Bearer {token}"},
                **kw,
            )


def _write_policies(tmp: Path) -> Path:
    policies = tmp / "policies"
    policies.mkdir()
    for name, key, token in (("acme", A_KEY, A_TOKEN), ("globex", B_KEY, B_TOKEN)):
        roots = tmp / "roots" / name
        (roots / "transcripts").mkdir(parents=True)
        (roots / "artifacts").mkdir(parents=True)
        policy = {
            "name": name,
            "api_keys_sha256": [_sha(key)],
            "provider": {"mode": "passthrough"},
            "sources": {
                "kinds": ["transcript", "artifact"],
                "session_patterns": ["*"],
                "transcript_root": str(roots / "transcripts"),
                "artifact_root": str(roots / "artifacts"),
            },
            "admin_tokens_sha256": [_sha(token)],
        }
        if name == "acme":  # the Limits page's figures
            policy["quota"] = {"requests_per_minute": 1000, "budget_usd": 50, "per_key": {"requests_per_minute": 600}}
        (policies / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    return policies


def _client(url: str, key: str, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key=key, max_retries=0, default_headers={"x-session-id": session}
    )


def _answer(text: str, **usage: Any) -> Reply:
    """A provider answer with its usage exactly as the provider reports it (cache split too)."""
    message = message_json(text)
    message["usage"] = usage
    return Reply(message)


def _long_history() -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "start the long one"}]
    for n, (tool_id, text) in enumerate((("toolu_r1", "first"), ("toolu_r2", "second"))):
        history += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": "/src/app.py"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": f"{text} read " + "code " * 150}
            ]},
            {"role": "assistant", "content": f"read {n} done"},
            {"role": "user", "content": f"note {n}: " + "word " * 300},
        ]
    for k in range(9):
        history += [
            {"role": "assistant", "content": f"reply {k}"},
            {"role": "user", "content": f"filler {k}: " + "more " * 300},
        ]
    return history


def _seed(world_url: str, upstream: FakeUpstream) -> tuple[str, str]:
    """Conversations through the proxy; returns (x-compaction-id, the cut result's artifact)."""
    big = "\n".join(f"line {i}: {PAYLOAD} " + "data " * 12 for i in range(400))
    first = [{"role": "user", "content": f"Build it. {PAYLOAD}"}]
    upstream.script(
        _answer(
            f"Answer with markup: {PAYLOAD}",
            input_tokens=120,
            cache_creation_input_tokens=2048,
            cache_read_input_tokens=0,
            cache_creation={"ephemeral_5m_input_tokens": 2048, "ephemeral_1h_input_tokens": 0},
            output_tokens=11,
        ),
        _answer(
            "It is a log of 400 lines.",
            input_tokens=310,
            cache_creation_input_tokens=512,
            cache_read_input_tokens=2048,
            cache_creation={"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 512},
            output_tokens=23,
        ),
    )
    with _client(world_url, A_KEY, A_SESSION) as client:
        answer = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=first)  # type: ignore[arg-type]
        history: list[dict[str, Any]] = [
            *first,
            {"role": "assistant", "content": [{"type": "text", "text": answer.content[0].text}]},  # type: ignore[union-attr]
            {"role": "user", "content": "read the log"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": big}],
            },
            {"role": "assistant", "content": "It is long."},
            {"role": "user", "content": "summarise it"},
        ]
        raw = client.messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=history  # type: ignore[arg-type]
        )
        assert "truncate" in raw.headers["x-compaction-layers"], raw.headers
        compaction_id = raw.headers["x-compaction-id"]
    sent = upstream.requests[-1].json()["messages"][4]["content"][0]["content"]
    start = sent.index("full text: ") + len("full text: ")
    pointer = sent[start : sent.index("]", start)]
    # A session with failures: the provider's 529, then a connection reset (an upstream error).
    upstream.script(
        Reply(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            status=529,
        ),
        Reset(),
    )
    with _client(world_url, A_KEY, A_ERRORS) as client:
        for _ in range(2):
            with pytest.raises(anthropic.APIStatusError):
                client.messages.create(
                    model="claude-haiku-4-5",
                    max_tokens=16,
                    messages=[{"role": "user", "content": "will fail"}],
                )
    # A long session: 27 transcript events (two pages), a file read twice (dedup) and old turns
    # pruned and summarised (the summary call goes to the fake upstream too).
    with _client(world_url, A_KEY, A_LONG) as client:
        client.messages.create(model="claude-opus-4-1", max_tokens=16, messages=_long_history())  # type: ignore[arg-type]
    with _client(world_url, B_KEY, B_SESSION) as client:
        client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=16,
            messages=[{"role": "user", "content": "globex private conversation"}],
        )
    return compaction_id, pointer


@pytest.fixture(scope="module")
def world(loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("console")
    upstream = FakeUpstream()
    loop_thread.run(upstream.start())
    config = proxy_config(
        upstream.url,
        str(tmp / "state"),
        auth={"mode": "keys"},
        policies_dir=str(_write_policies(tmp)),
        compaction={"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200, "keep_recent": 2},
        ledger={"flush_seconds": 0.01},
    )
    proxy = ProxyServer(config)
    url = loop_thread.run(proxy.start())
    try:
        compaction_id, pointer = _seed(url, upstream)
        loop_thread.run(proxy.app[LEDGER].flush())

        async def own_calls() -> None:
            # What the proxy's own calls look like in the ledger (a summary, and a retrieval
            # continuation as the retrieval splice records it), made while serving a turn.
            for kind in ("summary", "retrieval"):
                record_upstream_call(
                    proxy.app, tenant="acme", session=A_LONG, model="claude-opus-4-1", kind=kind,  # type: ignore[arg-type]
                    status=200, latency_ms=12.0,
                    usage={"input_tokens": 40, "output_tokens": 5, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 0},
                )

        loop_thread.run(own_calls())
        with _client(url, A_KEY, A_LONG) as client:
            client.messages.create(
                model="claude-opus-4-1", max_tokens=16,
                messages=[*_long_history(), {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "one more turn"}],  # type: ignore[list-item]
            )
        loop_thread.run(proxy.app[DURABLE].drain())
        loop_thread.run(proxy.app[LEDGER].flush())
        world = World(url, proxy, upstream, loop_thread, compaction_id, pointer, f"transcript:{A_SESSION}:1")
        fact = {
            "id": "xss-fact",
            "content": f"The payload {PAYLOAD} is only text.",
            "source": world.fact_source,
            "last_confirmed_at": "2026-12-01T10:00:00Z",
        }
        created = world.admin("POST", f"/sessions/{A_SESSION}/facts", json=fact)
        assert created.status_code == 201, created.text
        yield world
    finally:
        loop_thread.run(proxy.stop())
        loop_thread.run(upstream.stop())


S_TOKEN = "cpa-solo-console-admin-token-0001"
S_SESSION = "solo-summarised-1"


@dataclass
class Summarised:
    """A proxy whose one session holds a real summarised compaction (prune + summarize)."""

    url: str
    compaction_id: str


@pytest.fixture(scope="module")
def summarised(loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Summarised]:
    tmp = tmp_path_factory.mktemp("console-summarised")
    policies = tmp / "policies"
    policies.mkdir()
    policy = {"name": "solo", "provider": {"mode": "passthrough"}, "admin_tokens_sha256": [_sha(S_TOKEN)]}
    (policies / "solo.yaml").write_text(yaml.safe_dump(policy))
    upstream = FakeUpstream()
    loop_thread.run(upstream.start())
    config = proxy_config(
        upstream.url,
        str(tmp / "state"),
        policies_dir=str(policies),
        # A small summary budget, so that pruning can reach the target with a summary in place.
        compaction={"threshold": 3000, "hard_limit": 100_000, "keep_recent": 2,
                    "summary": {"model": "claude-summary-test", "max_tokens": 200}},
        ledger={"flush_seconds": 0.01},
    )
    proxy = ProxyServer(config)
    url = loop_thread.run(proxy.start())
    try:
        upstream.script(
            Reply(message_json("SUMMARY: the long work so far, in a few words.", model="claude-summary-test")),
        )
        client = anthropic.Anthropic(
            base_url=url, api_key="sk-ant-solo", max_retries=0,
            default_headers={"x-session-id": S_SESSION},
        )
        with client:
            raw = client.messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=16, messages=_long_history()  # type: ignore[arg-type]
            )
        assert "summarize" in raw.headers["x-compaction-layers"], raw.headers
        assert raw.headers["x-compaction-summary"] == "ok", raw.headers
        loop_thread.run(proxy.app[DURABLE].drain())
        loop_thread.run(proxy.app[LEDGER].flush())
        yield Summarised(url, raw.headers["x-compaction-id"])
    finally:
        loop_thread.run(proxy.stop())
        loop_thread.run(upstream.stop())
