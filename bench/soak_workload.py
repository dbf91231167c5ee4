"""The rolling-session workload of bench/bench_soak.py (issue 28): who talks, what each request
is, and what the fake upstream answers. Pure (no I/O): the load generator and the upstream
process compute the same answer for the same turn, so a client can send back exactly the answer
it was given without parsing it.

A *conversation* is a session's main conversation or one of its subagents' (Claude Code's
``x-claude-code-agent-id`` / ``x-claude-code-parent-agent-id``). Each turn the client sends the
whole history (Claude Code's layout: ``model``, ``messages`` with a breakpoint on the last block,
``system``, ``tools``, ``metadata``, ``max_tokens``, maybe ``stream``); its last user message ends
with a text block ``soak-tag <tag>`` that names the turn. The upstream answers a tagged request
with ``answer_content(tag, thinking)``: a thinking block (binding models), a text, and a
``read_file`` call that the next turn answers with a tool result of 0.5-8 KB. Every text is
unique to its conversation, so no cache of the proxy recognises another conversation's content.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.workloads import SYSTEM, session

TAG = "soak-tag "
RETRIEVE_ID = "toolu_soakret_"  # the upstream's call of the proxy's retrieval tool
# A model whose thinking blocks are bound to their prefix (proxy.core.thinking), and one that is not.
BINDING_MODEL = "claude-opus-5-5"
PLAIN_MODEL = "claude-sonnet-4-5"
BEDROCK_PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_PATH = "/v1/projects/soak/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929"
POINTER = re.compile(rb"(?:transcript|artifact):[A-Za-z0-9._:-]+[A-Za-z0-9]")


@dataclass(frozen=True)
class Tenant:
    name: str
    keys: tuple[str, ...]
    upstream: str = "anthropic"  # or "bedrock": the tenant's own upstream section
    quota: bool = False  # budgets and rate limits on (never reached)
    share: float = 0.25  # of the new conversations

    @property
    def admin_token(self) -> str:
        return f"cpa-soak-{self.name}-admin"


TENANTS = (
    Tenant("alpha", tuple(f"cpk-soak-alpha-{i}" for i in range(4)), share=0.40),
    Tenant("bravo", tuple(f"cpk-soak-bravo-{i}" for i in range(3)), quota=True, share=0.30),
    Tenant("charlie", tuple(f"cpk-soak-charlie-{i}" for i in range(2)), share=0.25),
    Tenant("delta", ("cpk-soak-delta-0",), upstream="bedrock", share=0.05),
)


@dataclass(frozen=True)
class Mix:
    """The shares of each kind of traffic (of new conversations, or of requests)."""

    subagent: float = 0.19  # of new conversations: an agent of a live session (1,540 / 8,040)
    bedrock_client: float = 0.05  # of conversations: Bedrock's InvokeModel routes
    vertex_client: float = 0.04  # of conversations: Vertex's rawPredict routes
    thinking: float = 0.25  # of conversations: a binding model, thinking blocks in answers
    resumed: float = 0.25  # of conversations: start with a history of 6-30 messages
    stream: float = 0.7  # of requests
    leave: float = 0.05  # of streamed requests: the client reads one chunk and goes
    broken: float = 0.01  # of requests: a tool_result naming no tool_use (400)
    oversized: float = 0.003  # of requests: a body over limits.max_body_bytes (413)
    count_tokens: float = 0.02  # of requests: /v1/messages/count_tokens instead
    durable: float = 0.1  # of new sessions: a durable fact written through the admin API
    retrieve: float = 0.1  # of requests offering the retrieval tool: the upstream calls it
    mean_turns: float = 5.0


@dataclass
class Conversation:
    cid: int
    tenant: Tenant
    key: str
    session: str
    agent: str  # "" = the session's main conversation
    parent: str
    route: str  # anthropic | bedrock | vertex (the client's format)
    model: str
    thinking: bool
    turns_left: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0
    busy: bool = False

    @property
    def tag(self) -> str:
        return f"c{self.cid}t{self.turn}"

    def headers(self) -> dict[str, str]:
        out = {"x-api-key": self.key, "content-type": "application/json",
               "x-claude-code-session-id": self.session}
        if self.route != "bedrock":
            out["anthropic-version"] = "2023-06-01"
        if self.agent:
            out["x-claude-code-agent-id"] = self.agent
            if self.parent:
                out["x-claude-code-parent-agent-id"] = self.parent
        return out


def _text(seed: str, size: int) -> str:
    """``size`` characters of file-like text unique to ``seed``."""
    h = hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()
    line = f"{seed} {h}: def handler_{h[:6]}(request): return compute(request.body, '{h[6:]}')\n"
    return (line * (size // len(line) + 1))[:size]


def answer_content(tag: str, thinking: bool) -> list[dict[str, Any]]:
    """What the upstream answers to the request tagged ``tag`` (and the client sends back)."""
    h = hashlib.blake2b(tag.encode(), digest_size=16).hexdigest()
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": f"Next for {tag}: read the handler.",
                       "signature": f"sig{h}{h}"})
    blocks.append({"type": "text", "text": f"Step {tag}: let me read the next file."})
    conv, _, turn = tag.partition("t")
    # a conversation reads its four files again and again: a later read supersedes an earlier one
    blocks.append({"type": "tool_use", "id": f"toolu_soak_{tag}", "name": "read_file",
                   "input": {"path": f"src/{conv}/module_{int(turn or 0) % 4}.py"}})
    return blocks


def answer_message(tag: str, thinking: bool, model: str, input_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_soak_{tag}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": answer_content(tag, thinking),
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 40,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


def tag_of(body: Any) -> str | None:
    """The tag of a request body: its last message's last text block ``soak-tag <tag>``."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    if not isinstance(content, list) or not content:
        return None
    last = content[-1]
    if isinstance(last, dict) and isinstance(last.get("text"), str) and last["text"].startswith(TAG):
        return str(last["text"][len(TAG):])
    return None


def hidden_round(body: Any) -> bool:
    """The proxy's own next round after answering the upstream's retrieval call."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    content = messages[-1].get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and str(b.get("tool_use_id", "")).startswith(RETRIEVE_ID) for b in content
    )


def retrieval_call(tag: str, raw: bytes, body: Any, share: float) -> dict[str, Any] | None:
    """The upstream's call of the retrieval tool for ``share`` of the tagged requests that
    offer it and name a pointer; ``None`` otherwise."""
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list) or not any(
        isinstance(t, dict) and t.get("name") == "context_proxy_retrieve" for t in tools
    ):
        return None
    if int(hashlib.blake2b(tag.encode(), digest_size=4).hexdigest(), 16) % 1000 >= share * 1000:
        return None
    found = POINTER.findall(raw)
    if not found:
        return None
    pointer = found[-1].decode()
    return {"type": "tool_use", "id": f"{RETRIEVE_ID}{tag}", "name": "context_proxy_retrieve",
            "input": {"pointer": pointer, "max_chars": 2000}}


class Population:
    """The rolling population: conversations start, run their turns and end; new sessions
    replace them, some sessions spawn agents."""

    def __init__(self, seed: int, mix: Mix) -> None:
        self.rng = random.Random(seed)
        self.mix = mix
        self.next_id = 0
        self.sessions = 0
        self.conversations = 0
        self.subagents = 0
        _messages, tools = session()
        self.tools = list(tools)
        self.live_mains: list[Conversation] = []

    def _tenant(self) -> Tenant:
        r = self.rng.random()
        for tenant in TENANTS:
            r -= tenant.share
            if r < 0:
                return tenant
        return TENANTS[0]

    def new(self) -> tuple[Conversation, bool]:
        """A new conversation, and whether it opened a new session."""
        rng, mix = self.rng, self.mix
        self.next_id += 1
        cid = self.next_id
        self.conversations += 1
        parent_conv = None
        if self.live_mains and rng.random() < mix.subagent:
            parent_conv = rng.choice(self.live_mains)
        turns = 1 + min(40, int(rng.expovariate(1 / max(0.1, mix.mean_turns - 1))))
        if parent_conv is not None:
            self.subagents += 1
            tenant, key, session_id = parent_conv.tenant, parent_conv.key, parent_conv.session
            agent, parent, route = f"agent-{cid:x}", parent_conv.agent, parent_conv.route
        else:
            self.sessions += 1
            tenant = self._tenant()
            key = rng.choice(tenant.keys)
            session_id = f"soak-{seed_hex(cid)}"
            agent = parent = ""
            r = rng.random()
            route = "anthropic"
            if tenant.upstream == "anthropic" and r < mix.bedrock_client:
                route = "bedrock"
            elif tenant.upstream == "anthropic" and r < mix.bedrock_client + mix.vertex_client:
                route = "vertex"
        thinking = route == "anthropic" and tenant.upstream == "anthropic" and rng.random() < mix.thinking
        conv = Conversation(
            cid, tenant, key, session_id, agent, parent, route,
            BINDING_MODEL if thinking else PLAIN_MODEL, thinking, turns,
        )
        opening = f"Subtask {cid}: search the handlers." if agent else f"Task {cid}: fix the handler."
        conv.messages.append({"role": "user", "content": [{"type": "text", "text": opening}]})
        if rng.random() < mix.resumed:
            for _ in range(rng.randint(3, 15)):
                self._advance(conv)
        self._tagged(conv)
        if not agent:
            self.live_mains.append(conv)
        return conv, not agent

    def end(self, conv: Conversation) -> None:
        if not conv.agent and conv in self.live_mains:
            self.live_mains.remove(conv)

    def result_size(self, conv: Conversation) -> int:
        if self.rng.random() < 0.05:  # a large result: compaction cuts it (L1), kept as an artifact
            return 20_000 + self.rng.randrange(20_000)
        return 500 + int(self.rng.random() ** 2 * 7500)

    def _advance(self, conv: Conversation) -> None:
        """The answer to the current turn and the client's next user turn (a tool result)."""
        tag = conv.tag
        conv.messages.append({"role": "assistant", "content": answer_content(tag, conv.thinking)})
        result = _text(f"{tag}-result", self.result_size(conv))
        conv.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_soak_{tag}", "content": result},
        ]})
        conv.turn += 1

    def _tagged(self, conv: Conversation) -> None:
        last = conv.messages[-1]
        conv.messages[-1] = {**last, "content": [*last["content"], {"type": "text", "text": TAG + conv.tag}]}

    def advance(self, conv: Conversation) -> None:
        """The current turn was answered: the next one."""
        self._advance(conv)
        self._tagged(conv)
        conv.turns_left -= 1

    def body(self, conv: Conversation, stream: bool) -> dict[str, Any]:
        """The request of the conversation's current turn, as Claude Code lays it out."""
        messages = conv.messages
        last = messages[-1]
        content = last["content"]
        marked = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
        body: dict[str, Any] = {
            "model": conv.model,
            "messages": [*messages[:-1], {**last, "content": marked}],
            "system": SYSTEM,
            "tools": self.tools,
            "metadata": {"user_id": f"user_soak__session_{conv.session}"},
            "max_tokens": 8192,
        }
        if conv.thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": 4096}
        if stream:
            body["stream"] = True
        return body


def seed_hex(n: int) -> str:
    return hashlib.blake2b(str(n).encode(), digest_size=8).hexdigest()


def broken(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` whose last tool result answers a call that was never made (a 400)."""
    messages = list(body["messages"])
    last = messages[-1]
    content = [
        {**b, "tool_use_id": "toolu_never_made"} if isinstance(b, dict) and b.get("type") == "tool_result" else b
        for b in last["content"]
    ]
    if not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        content = [{"type": "tool_result", "tool_use_id": "toolu_never_made", "content": "x"}, *content]
    messages[-1] = {**last, "content": content}
    return {**body, "messages": messages}


def oversized(body: dict[str, Any], limit: int) -> bytes:
    """``body`` padded past ``limit`` bytes."""
    pad = {"type": "text", "text": "x" * (limit + 1024)}
    messages: Sequence[Any] = body["messages"]
    last = messages[-1]
    grown = [*messages[:-1], {**last, "content": [pad, *last["content"]]}]
    return orjson.dumps({**body, "messages": grown})


def for_route(conv: Conversation, body: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of the request in the conversation's client format."""
    if conv.route == "bedrock":
        value = {k: v for k, v in body.items() if k not in ("model", "stream")}
        value["anthropic_version"] = "bedrock-2023-05-31"
        return f"/model/{BEDROCK_PROFILE}/invoke" + ("-with-response-stream" if stream else ""), value
    if conv.route == "vertex":
        value = {k: v for k, v in body.items() if k != "model"}
        value["anthropic_version"] = "vertex-2023-10-16"
        return VERTEX_PATH + (":streamRawPredict" if stream else ":rawPredict"), value
    return "/v1/messages", body
