"""One session, many agents: each conversation its own transcript, plans, naming and retrieval.

Claude Code sends every request of a session with the same ``x-claude-code-session-id``; a
subagent's requests add ``x-claude-code-agent-id``, a nested one's
``x-claude-code-parent-agent-id`` (Claude Code's "Gateway protocol reference",
code.claude.com/docs/en/llm-gateway-protocol; observed with 2.1.197). And on every request it
moves its one ``cache_control`` marker to its newest message (observed with 2.1.197: the first
message carries it on the first turn only).

Here three conversations of one session -- the main one, a subagent ``a1`` and a nested ``a2``
-- run interleaved tool loops through the real proxy (official SDK -> proxy -> fake upstream,
SQLite store, tenant policy with transcript and artifact roots), with Claude Code's marker
habit, until each is compacted (pruned and summarised). The fake model answers each turn with
the conversation's own next assistant message, so the recorded answers are what the client
sends back. Then each conversation's model redeems a pointer its own bridge names (and gets
its own message back) and tries one another conversation's bridge names (denied).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.core.compaction.retrieval import TOOL, TOOL_NAME
from proxy.core.pointers import TranscriptPointer, parse_pointer
from proxy.server.appkeys import DURABLE, STORE
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

SESSION = "cc-6f1e2a"
API_KEY = "cpk-conversations-test-1"
ADMIN_TOKEN = "adm-conversations-test-1"
SUMMARY_MODEL = "summary-model"
CONVERSATIONS: dict[str, dict[str, str]] = {
    "main": {},
    "a1": {"x-claude-code-agent-id": "a1"},
    "a2": {"x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"},
}
TURNS = 9
TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]
FILLER = "output line " * 120


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _history(name: str) -> list[dict[str, Any]]:
    """A tool loop: the task, then TURNS rounds of a Bash call and its (long) result, then a
    question. Every message is tagged with its conversation and place."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"[{name}] task: inspect the build"}]}
    ]
    for i in range(TURNS):
        tool_id = f"toolu_{name}_{i:02d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"[{name}:{i}] running step {i}"},
                    {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"step": i}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_id, "content": f"[{name}:{i}] {FILLER}"}
                ],
            }
        )
    return messages


def _with_marker(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's habit: one marker, on the newest message's last block (a copy)."""
    out = [orjson.loads(orjson.dumps(m)) for m in messages]
    last = out[-1]["content"][-1]
    last["cache_control"] = {"type": "ephemeral"}
    return out


HISTORIES = {name: _history(name) for name in CONVERSATIONS}


def _who(request: RecordedRequest) -> str:
    agent = request.headers.get("x-claude-code-agent-id")
    return agent or "main"


def _text_of(body: dict[str, Any]) -> str:
    return orjson.dumps(body.get("messages")).decode()


def _bridge_pointers(body: dict[str, Any]) -> list[str]:
    """The transcript pointers the view's bridge names (not a tool call's input)."""
    found: list[str] = []
    for message in body["messages"]:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            text = block.get("text") if isinstance(block, dict) else None
            if isinstance(text, str) and text.startswith("[context-proxy: the compacted turns"):
                found += re.findall(r"transcript:[A-Za-z0-9._:-]+?:\d+", text)
    return found


class Model:
    """The fake model. A summary call gets a summary; a conversation's turn gets its next
    assistant message (found by the last user message it was sent); once the view offers the
    retrieval tool, it redeems the first pointer of its own bridge, then one of ``foreign``."""

    def __init__(self) -> None:
        self.foreign: dict[str, str] = {}  # conversation -> a pointer another one's bridge names
        self.results: dict[str, list[str]] = {}  # conversation -> the tool results it read
        self.asked: dict[str, list[str]] = {}

    def __call__(self, request: RecordedRequest) -> Reply:
        body = request.json()
        if body.get("model") == SUMMARY_MODEL:
            return Reply(message_json(f"Summary of {_text_of(body)[:40]}"))
        name = _who(request)
        history = HISTORIES[name]
        messages = body["messages"]
        last = messages[-1]
        results = [
            b for b in last["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result" and b["tool_use_id"].startswith("toolu_r")
        ]
        if results:  # our hidden round: what the proxy answered
            text = "".join(c["text"] for c in results[0]["content"] if c.get("type") == "text")
            self.results.setdefault(name, []).append(text)
            if len(self.asked[name]) == 1 and name in self.foreign:
                return self._call(name, self.foreign[name], 2)
            return Reply(message_json(f"[{name}] done"))
        if body.get("tools", [])[-1:] == [TOOL] and name not in self.asked:
            own = _bridge_pointers(body)
            assert own, "a view that offers the tool names pointers"
            return self._call(name, own[0], 1)
        stripped = [{k: v for k, v in b.items() if k != "cache_control"} for b in last["content"]]
        for i, message in enumerate(history):
            if message["role"] == "user" and message["content"] == stripped and i + 1 < len(history):
                return Reply(message_json(content=history[i + 1]["content"], stop_reason="tool_use"))
        return Reply(message_json(f"[{name}] nothing to do"))

    def _call(self, name: str, pointer: str, n: int) -> Reply:
        self.asked.setdefault(name, []).append(pointer)
        call = {"type": "tool_use", "id": f"toolu_r{n}", "name": TOOL_NAME, "input": {"pointer": pointer}}
        return Reply(message_json(content=[call], stop_reason="tool_use"))


@pytest.fixture
def proxy(loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path) -> Iterator[ProxyServer]:
    server = conversations_proxy(loop_thread, upstream, tmp_path)
    yield server
    loop_thread.run(server.stop())


def conversations_proxy(loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path) -> ProxyServer:
    """A started proxy (keys mode, tenant ``team`` with transcript and artifact roots, a low
    threshold, a summary model) on ``upstream``."""
    policies = tmp_path / "policies"
    policies.mkdir()
    roots = tmp_path / "roots"
    (roots / "transcripts").mkdir(parents=True)
    (roots / "artifacts").mkdir(parents=True)
    policy = {
        "name": "team",
        "api_keys_sha256": [_sha(API_KEY)],
        "provider": {"mode": "passthrough"},
        "sources": {
            "kinds": ["transcript", "artifact"],
            "session_patterns": ["*"],
            "transcript_root": str(roots / "transcripts"),
            "artifact_root": str(roots / "artifacts"),
        },
        "admin_tokens_sha256": [_sha(ADMIN_TOKEN)],
    }
    (policies / "team.yaml").write_text(yaml.safe_dump(policy))
    config = proxy_config(
        upstream.url,
        str(tmp_path / "state"),
        auth={"mode": "keys"},
        policies_dir=str(policies),
        compaction={
            "threshold": 2500,
            "hard_limit": 200_000,
            "keep_recent": 4,
            "tool_result_cap": 100_000,
            "summary": {"model": SUMMARY_MODEL},
        },
    )
    server = ProxyServer(config)
    loop_thread.run(server.start())
    return server


def _client(proxy: ProxyServer, name: str) -> anthropic.Anthropic:
    headers = {"x-claude-code-session-id": SESSION, **CONVERSATIONS[name]}
    return anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0, default_headers=headers)


def _run(proxy: ProxyServer, model: Model) -> dict[str, dict[str, str]]:
    """Every conversation, turn by turn, interleaved; the headers of each one's last answer."""
    clients = {name: _client(proxy, name) for name in CONVERSATIONS}
    last: dict[str, dict[str, str]] = {}
    for k in range(3, 2 * TURNS + 2, 2):
        for name, client in clients.items():
            messages = _with_marker(HISTORIES[name][:k])
            raw = client.messages.with_raw_response.create(
                model="claude-fake-1", max_tokens=64, messages=messages, tools=TOOLS  # type: ignore[arg-type]
            )
            last[name] = dict(raw.headers)
    return last


def test_each_conversation_names_and_redeems_only_its_own_events(
    proxy: ProxyServer, upstream: FakeUpstream, loop_thread: LoopThread, tmp_path: Path
) -> None:
    model = Model()
    # the foreign pointers: the main conversation asks for one of a1's events, a1 for main's
    model.foreign = {"main": f"transcript:{SESSION}:a1:2", "a1": f"transcript:{SESSION}:2"}
    upstream.script(*[model] * 500)
    last = _run(proxy, model)
    loop_thread.run(proxy.app[DURABLE].drain())
    store = proxy.app[STORE]

    # every conversation was compacted and offered the retrieval tool
    for name, headers in last.items():
        assert "summarize" in headers["x-compaction-layers"] or "prune" in headers["x-compaction-layers"], (name, headers)
        assert (headers.get("x-compaction-agent") or "main") == name
    offered = {
        _who(r) for r in upstream.requests
        if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL and r.json()["tools"][-1:] == [TOOL]
    }
    assert offered == set(CONVERSATIONS)

    # every pointer any view names is an event of that view's own conversation
    named_total, foreign = 0, 0
    for request in upstream.requests:
        if request.path != "/v1/messages" or request.json().get("model") == SUMMARY_MODEL:
            continue
        name = _who(request)
        agent = "" if name == "main" else name
        for text in _bridge_pointers(request.json()):
            pointer = parse_pointer(text)
            assert isinstance(pointer, TranscriptPointer)
            named_total += 1
            if (pointer.session, pointer.agent) != (SESSION, agent):
                foreign += 1
                continue
            events = loop_thread.run(
                store.transcript_events("team", SESSION, pointer.sequence - 1, 1, agent=agent)
            )
            assert events and f"[{name}" in orjson.dumps(events[0].event.content).decode()
    assert named_total > 0 and foreign == 0

    # each conversation redeemed its own pointer and got its own message back; another
    # conversation's pointer was denied
    for name in CONVERSATIONS:
        assert model.results[name][0].startswith(f"[{name}") or f"[{name}" in model.results[name][0], model.results[name][0][:200]
    for name in ("main", "a1"):
        assert "denied" in model.results[name][1], model.results[name][1]

    # each conversation's transcript holds only its own messages, numbered from 1
    for name in CONVERSATIONS:
        agent = "" if name == "main" else name
        events = loop_thread.run(store.transcript_events("team", SESSION, 0, 1000, agent=agent))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        for event in events:
            text = orjson.dumps(event.event.content).decode()
            others = [o for o in CONVERSATIONS if o != name and f"[{o}" in text]
            assert not others, (name, event.seq, text[:120])
        # every message of the conversation recorded exactly once (the moved marker changed
        # no key): messages 0..2*TURNS, one event per message, plus the retrieval turn's answer
        assert len(events) == 2 * TURNS + 1 + 1, (name, len(events))


def test_the_admin_api_shows_the_agents_and_each_transcript(
    proxy: ProxyServer, upstream: FakeUpstream, loop_thread: LoopThread, tmp_path: Path
) -> None:
    upstream.script(*[Model()] * 500)
    _run(proxy, Model())
    loop_thread.run(proxy.app[DURABLE].drain())
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=proxy.url, timeout=30, trust_env=False) as http:
        agents = http.get(f"/admin/v1/sessions/{SESSION}/agents", headers=auth).json()
        assert [(a["agent"], a["parent"]) for a in agents["agents"]] == [("a1", None), ("a2", "a1")]
        assert agents["main"]["events"] > 0 and all(a["events"] > 0 for a in agents["agents"])
        for name in ("a1", "a2"):
            page = http.get(
                f"/admin/v1/sessions/{SESSION}/transcript", params={"agent": name, "limit": 1000}, headers=auth
            ).json()
            assert page["agent"] == name
            assert [e["pointer"] for e in page["events"]][:2] == [
                f"transcript:{SESSION}:{name}:1", f"transcript:{SESSION}:{name}:2"
            ]
            assert len(page["events"]) == next(a["events"] for a in agents["agents"] if a["agent"] == name)
        bad = http.get(f"/admin/v1/sessions/{SESSION}/transcript", params={"agent": "../x"}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    # each agent's transcript is exported beside the main one's
    exported = tmp_path / "roots" / "transcripts" / "agents" / SESSION / "a2.jsonl"
    lines = exported.read_bytes().splitlines()
    assert [orjson.loads(line)["sequence"] for line in lines] == list(range(1, len(lines) + 1))
    assert all(orjson.loads(line)["agent_id"] == "a2" for line in lines)
    main = (tmp_path / "roots" / "transcripts" / f"{SESSION}.jsonl").read_bytes().splitlines()
    assert main and all("agent_id" not in orjson.loads(line) for line in main)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-claude-code-agent-id": "../etc"},
        {"x-agent-id": "a b"},
        {"x-claude-code-agent-id": "a1", "x-claude-code-parent-agent-id": "bad/parent"},
    ],
)
def test_a_malformed_agent_id_is_a_400_and_nothing_is_forwarded(
    proxy: ProxyServer, upstream: FakeUpstream, headers: dict[str, str]
) -> None:
    client = anthropic.Anthropic(
        base_url=proxy.url, api_key=API_KEY, max_retries=0,
        default_headers={"x-claude-code-session-id": SESSION, **headers},
    )
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert "invalid agent id" in info.value.message
    assert not [r for r in upstream.requests if r.path == "/v1/messages"]


def test_the_generic_headers_name_a_conversation_for_any_client(
    proxy: ProxyServer, upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    client = anthropic.Anthropic(
        base_url=proxy.url, api_key=API_KEY, max_retries=0,
        default_headers={"x-session-id": "generic-1", "x-agent-id": "worker-3", "x-parent-agent-id": "lead"},
    )
    raw = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-compaction-session"] == "generic-1" and raw.headers["x-compaction-agent"] == "worker-3"
    loop_thread.run(proxy.app[DURABLE].drain())
    store = proxy.app[STORE]
    agents = loop_thread.run(store.session_agents("team", "generic-1"))
    assert [(a.agent, a.parent) for a in agents] == [("", ""), ("worker-3", "lead")]
    events = loop_thread.run(store.transcript_events("team", "generic-1", agent="worker-3"))
    assert [e.pointer for e in events] == ["transcript:generic-1:worker-3:1", "transcript:generic-1:worker-3:2"]
    assert not loop_thread.run(store.transcript_events("team", "generic-1"))  # main: nothing
