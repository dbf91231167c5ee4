"""Identity survives client habits: moving ``cache_control`` markers changes no identity.

Clients decorate requests with bytes they move from turn to turn; the proxy's identities of "the
same conversation" and "the same message" must not see them. The decorations a client is known
to move (docs/guides/compaction.md, "Identity"): ``cache_control`` on any content block, a nested tool-result
block, a system block or a tool definition, with or without ``ttl`` / ``scope`` (Claude Code
2.1.197 moves its one message marker to the newest message on every request, the first message
carrying it on the first turn only; observed against a local fake), and turn-scoped system
messages (``clear_at``), which the binding keys leave out.

Property (any valid conversation, any placement of markers on any turn): the conversation's
anchor and prefix hashes (plans), every transcript event key, the keys compaction looks up to
name removed turns, and the thinking-binding keys are the same; and recording the conversation
turn by turn with the markers moved at random -- plus re-sends of earlier turns with other
markers, as a retry would -- records each message exactly once, in order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.compaction.digest import digests
from proxy.core.conversation import Conversation as ConversationId
from proxy.core.event_keys import message_key
from proxy.core.thinking import PrefixKeys, thinking_blocks
from proxy.server.compaction.plan_reads import anchor_of
from proxy.server.context.durable import DurableContext
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.store import open_store
from tests.strategies import Conversation, conversations

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
MARKERS = [
    {"type": "ephemeral"},
    {"type": "ephemeral", "ttl": "1h"},
    {"type": "ephemeral", "ttl": "5m", "scope": "global"},
]


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every block a marker may go on (nested tool-result blocks included)."""
    found: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") in ("thinking", "redacted_thinking"):
                continue  # a client never marks these (the provider refuses a changed one)
            found.append(block)
            inner = block.get("content")
            if block.get("type") == "tool_result" and isinstance(inner, list):
                found.extend(b for b in inner if isinstance(b, dict))
    return found


def _remarked(draw: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` with every marker removed and up to four put anywhere."""
    copy = _unmarked(orjson.loads(orjson.dumps(messages)))
    blocks = _blocks(copy)
    if blocks:
        for i in draw(st.lists(st.integers(0, len(blocks) - 1), max_size=4, unique=True)):
            blocks[i]["cache_control"] = draw(st.sampled_from(MARKERS))
    return copy


def _identity(system: Any, tools: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    dg = digests(messages, hashed=True)
    keys = [message_key(i, m, dg.hashes) for i, m in enumerate(messages)]
    binding = PrefixKeys(system, tools, messages)
    blocks = thinking_blocks(messages)
    return {
        "anchor": anchor_of(messages),
        "hashes": dg.hashes,
        "keys": keys,
        "binding": [binding.at(b.message, b.index) for b in blocks] + [binding.end],
    }


@SETTINGS
@given(conv=conversations(min_turns=1, max_turns=8), data=st.data())
def test_moving_markers_changes_no_identity(conv: Conversation, data: st.DataObject) -> None:
    plain = _identity(conv.system, conv.tools, _unmarked(conv.messages))
    moved = _remarked(data.draw, conv.messages)
    system = _unmarked(conv.system)
    if isinstance(system, list) and data.draw(st.booleans()):
        system[0]["cache_control"] = {"type": "ephemeral"}
    tools = _unmarked(conv.tools)
    if data.draw(st.booleans()):
        tools[-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert _identity(system, tools, moved) == plain


def _record_all(
    path: Path, turns: list[tuple[list[dict[str, Any]], dict[str, Any] | None]]
) -> list[tuple[int, str, Any]]:
    """Record each request of ``turns`` and its answer (as the relay would: the answer's own
    bytes, without the markers the client later puts on its copy) through the real recorder
    into a real SQLite store; the events as (seq, type, content)."""

    async def run() -> list[tuple[int, str, Any]]:
        store = await open_store(f"sqlite:///{path}")
        durable = DurableContext(store, SourceResolver())
        policy = SourcePolicy(allowed_kinds=frozenset({"transcript"}), session_patterns=("*",))
        conversation = ConversationId("s1", "a1")
        try:
            for messages, answer in turns:
                turn = durable.record_request("t", policy, conversation, messages)
                await durable.drain()
                if answer is not None:
                    durable.record_answer(turn, answer, True)
                    await durable.drain()
            events = await store.transcript_events("t", "s1", 0, 10_000, agent="a1")
            return [(e.seq, e.event.type, e.event.content) for e in events]
        finally:
            await store.close()

    return asyncio.run(run())


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(conv=conversations(min_turns=1, max_turns=6), data=st.data())
def test_moving_markers_never_records_a_message_twice(
    conv: Conversation, data: st.DataObject, tmp_path_factory: Any
) -> None:
    messages = conv.messages
    n = len(messages)
    ends = [k for k in range(1, n + 1) if messages[k - 1]["role"] == "user"]

    def answer(k: int) -> dict[str, Any] | None:
        nxt = messages[k] if k < n else None
        if nxt is None or nxt["role"] != "assistant":
            return None
        return {"role": "assistant", "content": _unmarked(nxt["content"])}

    turns = [(_remarked(data.draw, messages[:k]), answer(k)) for k in ends]
    # retries of earlier turns, with their markers elsewhere (and their answers again)
    for _ in range(data.draw(st.integers(0, 2))):
        k = data.draw(st.sampled_from(ends))
        turns.append((_remarked(data.draw, messages[:k]), answer(k)))
    recorded = _record_all(tmp_path_factory.mktemp("ids") / "s.db", turns)
    # every message recorded exactly once, in order: an assistant message as its answer
    got = [c["content"] if kind == "answer" else c for _, kind, c in recorded]
    assert [_unmarked(c) for c in got] == [_unmarked(m["content"]) for m in messages]
    assert [seq for seq, _, _ in recorded] == list(range(1, n + 1))
