"""The pure side of thinking-block binding (``proxy.core.thinking``), as tables of cases.

The rules encoded (the provider's "Preserved thinking" pages, platform.claude.com/docs/en/
build-with-claude/preserved-thinking and .../prefix-checks; Bedrock's "Thinking block binding"):
a block is bound to ``system``, ``tools`` and everything before it; ``cache_control`` markers
are left out of the comparison; the behaviour is ``thinking.block_binding.prefix_mismatch_behavior``
(``mismatch_behavior`` in some docs), ``"error"`` by default, ``"drop_block"`` with the beta
``thinking-binding-controls-2026-08-01``; a request without ``thinking`` may add it as
``adaptive`` ("models with preserved thinking default to adaptive thinking").
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.catalogue import Catalogue, make_entry
from proxy.core.thinking import (
    BindingRecords,
    PrefixKeys,
    answer_bindings,
    client_behavior,
    decide,
    thinking_blocks,
    with_drop_block,
    without_blocks,
)

SYSTEM = [{"type": "text", "text": "You are an agent."}]
TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]


def _thinking(sig: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": f"thoughts {sig}", "signature": sig}


def _convo() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": [_thinking("s1"), {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        {"role": "assistant", "content": [_thinking("s2"), {"type": "redacted_thinking", "data": "r2"}, {"type": "text", "text": "done"}]},
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize(
    ("model", "overrides", "expected"),
    [
        ("claude-fable-5-1", (), True),
        ("claude-mythos-5-1", (), True),
        ("us.anthropic.claude-fable-5-1", (), True),  # Bedrock's spelling
        ("claude-haiku-5-5", (), True),
        ("claude-opus-5-5", (), True),
        ("claude-opus-4-8", (), False),
        ("claude-fake-1", (), False),
        ("claude-fake-1", (("claude-fake-*", True),), True),
        ("claude-fable-5-1", (("claude-fable-*", False),), False),  # the config decides first
    ],
)
def test_which_models_bind(model: str, overrides: Any, expected: bool) -> None:
    entries = [make_entry(glob, f"models[{i}]", binds_thinking=b) for i, (glob, b) in enumerate(overrides)]
    assert Catalogue(entries).binds_thinking(model) is expected


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        (None, None),
        ({"type": "adaptive"}, None),
        ({"type": "adaptive", "block_binding": {}}, None),
        ({"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}}, "error"),
        ({"type": "enabled", "budget_tokens": 2048, "block_binding": {"mismatch_behavior": "drop_block"}}, "drop_block"),
        ({"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "sometimes"}}, None),
    ],
)
def test_the_clients_own_choice_in_either_spelling(thinking: Any, expected: str | None) -> None:
    body: dict[str, Any] = {"messages": []}
    if thinking is not None:
        body["thinking"] = thinking
    assert client_behavior(body) == expected


def test_markers_and_turn_scoped_system_messages_are_not_part_of_the_prefix() -> None:
    plain = _convo()
    keys = PrefixKeys(SYSTEM, TOOLS, plain)
    blocks = thinking_blocks(plain)
    assert [(b.message, b.index) for b in blocks] == [(1, 0), (3, 0), (3, 1)]
    marked = _convo()
    marked[0] = {"role": "user", "content": [{"type": "text", "text": "do it"}]}
    plain[0] = {"role": "user", "content": [{"type": "text", "text": "do it"}]}
    keys = PrefixKeys(SYSTEM, TOOLS, plain)
    marked[2]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    marked_system = [{**SYSTEM[0], "cache_control": {"type": "ephemeral"}}]
    again = PrefixKeys(marked_system, TOOLS, marked)
    assert [again.at(b.message, b.index) for b in blocks] == [keys.at(b.message, b.index) for b in blocks]
    scoped = [*plain[:2], {"role": "system", "content": "reminder", "clear_at": "next_user_message"}, *plain[2:]]
    with_reminder = PrefixKeys(SYSTEM, TOOLS, scoped)
    assert with_reminder.at(4, 0) == keys.at(3, 0)


@pytest.mark.parametrize("change", ["system", "tools", "earlier message", "block before it"])
def test_any_change_before_a_block_changes_its_key(change: str) -> None:
    messages = _convo()
    system: Any = SYSTEM
    tools: Any = TOOLS
    base = PrefixKeys(system, tools, messages)
    if change == "system":
        system = [*SYSTEM, {"type": "text", "text": "<durable_state/>"}]
    elif change == "tools":
        tools = [*TOOLS, {"name": "context_proxy_retrieve", "input_schema": {"type": "object"}}]
    elif change == "earlier message":
        messages = [messages[0], {"role": "assistant", "content": "bridge"}, {"role": "user", "content": "summary"}, *messages[1:]]
    else:
        messages = [*messages[:3], {**messages[3], "content": [{"type": "text", "text": "x"}, *messages[3]["content"]]}, messages[4]]
    after = PrefixKeys(system, tools, messages)
    moved = 2 if change == "earlier message" else 0
    shifted = 1 if change == "block before it" else 0
    assert after.at(3 + moved, 1 + shifted) != base.at(3, 1)


def test_a_learnt_answer_replays_valid_under_the_same_view_and_stale_under_another() -> None:
    records = BindingRecords()
    request = _convo()[:3]
    made = PrefixKeys(SYSTEM, TOOLS, request)
    answer = {"role": "assistant", "content": [_thinking("s9"), {"type": "text", "text": "hm"}]}
    records.learn(answer_bindings(made.end, answer))
    later = [*request, answer, {"role": "user", "content": "go on"}]
    same = PrefixKeys(SYSTEM, TOOLS, later)
    blocks = [b for b in thinking_blocks(later) if b.message == 3]
    body = {"model": "claude-fable-5-1", "messages": later}
    assert decide(body, same, blocks, records, {}).action == "none"
    rewritten = PrefixKeys([*SYSTEM, {"type": "text", "text": "durable"}], TOOLS, later)
    decision = decide(body, rewritten, blocks, records, {})
    assert decision.action == "asked-to-drop" and decision.count == 1


def _cut_tool_result(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What L1 does: message 2's tool result replaced (between the block of message 1 and the
    two of message 3)."""
    cut = {"type": "tool_result", "tool_use_id": "t1", "content": "[context-proxy: cut]"}
    return [*messages[:2], {"role": "user", "content": [cut]}, *messages[3:]]


@pytest.mark.parametrize(
    ("change", "stale"),
    [
        ("nothing", []),
        ("system", [(1, 0), (3, 0), (3, 1)]),
        ("tool result between the blocks", [(3, 0), (3, 1)]),  # the block before it stands
        ("the last message, after every block", []),
        ("a message appended", []),
    ],
)
def test_unknown_blocks_are_stale_only_where_the_proxy_changed_the_prefix(
    change: str, stale: list[tuple[int, int]]
) -> None:
    messages = _convo()
    client = PrefixKeys(SYSTEM, TOOLS, messages)
    blocks = thinking_blocks(messages)
    theirs = {b.ident: client.at(b.message, b.index) for b in blocks}
    system, forwarded = SYSTEM, messages
    if change == "system":
        system = [*SYSTEM, {"type": "text", "text": "durable"}]
    elif change == "tool result between the blocks":
        forwarded = _cut_tool_result(messages)
    elif change == "the last message, after every block":
        forwarded = [*messages[:4], {"role": "user", "content": "next, and more"}]
    elif change == "a message appended":
        forwarded = [*messages, {"role": "assistant", "content": "bridge"}, {"role": "user", "content": "go on"}]
    decision = decide({"messages": forwarded}, PrefixKeys(system, TOOLS, forwarded), blocks, BindingRecords(), theirs)
    assert [(b.message, b.index) for b in decision.stale] == stale
    assert decision.count == len(stale)
    assert decision.action == ("asked-to-drop" if stale else "none")


def test_a_known_block_is_judged_by_its_record_and_an_unknown_one_by_the_clients_prefix() -> None:
    """Mixed: the first block's record says it was made under another prefix than the client's
    (stale although the client sent it unchanged); the later ones, unknown, stand or fall with
    the proxy's change between them."""
    messages = _convo()
    client = PrefixKeys(SYSTEM, TOOLS, messages)
    blocks = thinking_blocks(messages)
    theirs = {b.ident: client.at(b.message, b.index) for b in blocks}
    records = BindingRecords()
    records.learn({blocks[0].ident: theirs[blocks[0].ident] + 1})
    body = {"messages": messages}
    decision = decide(body, client, blocks, records, theirs)
    assert [(b.message, b.index) for b in decision.stale] == [(1, 0)]
    cut = _cut_tool_result(messages)
    decision = decide({"messages": cut}, PrefixKeys(SYSTEM, TOOLS, cut), blocks, records, theirs)
    assert [(b.message, b.index) for b in decision.stale] == [(1, 0), (3, 0), (3, 1)]
    records = BindingRecords()
    records.learn({blocks[0].ident: theirs[blocks[0].ident]})  # recorded as the client sent it
    decision = decide({"messages": cut}, PrefixKeys(SYSTEM, TOOLS, cut), blocks, records, theirs)
    assert [(b.message, b.index) for b in decision.stale] == [(3, 0), (3, 1)]


@pytest.mark.parametrize(
    ("thinking", "action", "without_the_beta"),
    [
        (None, "asked-to-drop", "dropped"),
        ({"type": "adaptive"}, "asked-to-drop", "dropped"),
        ({"type": "disabled"}, "dropped", "dropped"),
        ({"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}, "forwarded", "dropped"),
        ({"type": "adaptive", "block_binding": {"mismatch_behavior": "error"}}, "deferred", "deferred"),
    ],
)
def test_what_is_done_with_stale_blocks(thinking: Any, action: str, without_the_beta: str) -> None:
    """``without_the_beta``: on a platform the binding beta does not reach (Foundry), neither the
    proxy nor the client can ask the provider to drop: the proxy drops them itself."""
    messages = _convo()
    body: dict[str, Any] = {"messages": messages}
    if thinking is not None:
        body["thinking"] = thinking
    keys = PrefixKeys([*SYSTEM, {"type": "text", "text": "durable"}], TOOLS, messages)
    blocks = thinking_blocks(messages)
    client = PrefixKeys(SYSTEM, TOOLS, messages)
    theirs = {b.ident: client.at(b.message, b.index) for b in blocks}
    assert decide(body, keys, blocks, BindingRecords(), theirs).action == action
    assert decide(body, keys, blocks, BindingRecords(), theirs, can_ask=False).action == without_the_beta


def test_asking_to_drop_keeps_the_clients_type_and_fields() -> None:
    body = {"model": "m", "thinking": {"type": "enabled", "budget_tokens": 4096, "block_binding": {"bind_to_end_user": True}}}
    asked = with_drop_block(body)
    assert asked["thinking"] == {
        "type": "enabled",
        "budget_tokens": 4096,
        "block_binding": {"bind_to_end_user": True, "prefix_mismatch_behavior": "drop_block"},
    }
    assert body["thinking"]["block_binding"] == {"bind_to_end_user": True}  # never mutated
    assert with_drop_block({"model": "m"})["thinking"] == {
        "type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}
    }


def test_dropping_blocks_leaves_everything_else_by_reference() -> None:
    messages = _convo()
    blocks = thinking_blocks(messages)
    out = without_blocks(messages, [blocks[0], blocks[2]])
    assert out[0] is messages[0] and out[2] is messages[2] and out[4] is messages[4]
    assert [b["type"] for b in out[1]["content"]] == ["tool_use"]
    assert [b["type"] for b in out[3]["content"]] == ["thinking", "text"]
    assert [b["type"] for b in messages[1]["content"]] == ["thinking", "tool_use"]  # unchanged


def test_the_records_are_bounded() -> None:
    records = BindingRecords(max_entries=3)
    records.learn({1: 10, 2: 20, 3: 30})
    assert records.get(1) == 10  # now the most recent
    records.learn({4: 40})
    assert len(records) == 3 and records.get(2) is None and records.get(1) == 10
