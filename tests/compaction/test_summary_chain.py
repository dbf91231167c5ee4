"""Issue 10 items 2, 4 and 5 in the core: every removed message reaches the summariser (a
bounded chain of calls), the recent window shrinks instead of compacting anew every turn, no
summary call for a view that would be refused, L1 spares the kept window, and the bridge carries
only what a person typed."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    NeedsSummary,
    PlanCache,
    Summarized,
    compact,
    step,
)
from proxy.core.compaction.bridge import CARRIED_HEADER
from proxy.core.compaction.noise import typed_text
from proxy.core.tokens import TokenCounter
from tests.compaction.invariants import check_view, dumps
from tests.strategies import Conversation, conversations, policies

COUNTER = TokenCounter()
LABEL = re.compile(r"^\[#(\d+)\] (?:USER|ASSISTANT|SYSTEM):", re.MULTILINE)
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclasses.dataclass
class Run:
    result: CompactionResult
    texts: list[str]  # the summariser's inputs, in order
    labels: list[list[int]]  # the client message indices each input renders


def run(
    messages: list[dict[str, Any]],
    policy: CompactionPolicy,
    answers: Any = "a summary",
    plans: PlanCache | None = None,
    system: Any = None,
    tools: Any = None,
) -> Run:
    outcome = compact(
        CompactionInput(system, tools, messages, "m"),
        policy,
        COUNTER,
        plans if plans is not None else PlanCache(),
        "t",
    )
    texts: list[str] = []
    labels: list[list[int]] = []
    while isinstance(outcome, NeedsSummary):
        text = outcome.summary_request.text
        texts.append(text)
        labels.append([int(x) for x in LABEL.findall(text)])
        assert labels[-1] == list(outcome.continuation.origins)
        answer = answers(len(texts)) if callable(answers) else answers
        outcome = step(outcome.continuation, answer)
    return Run(outcome.result, texts, labels)


# --- the summariser sees every removed message ------------------------------------------------


@SETTINGS
@given(
    conv=conversations(min_turns=2),
    policy=policies(),
    fail_at=st.integers(0, 6),  # 0: no call fails
)
def test_every_removed_message_reaches_the_summariser(
    conv: Conversation, policy: CompactionPolicy, fail_at: int
) -> None:
    policy = dataclasses.replace(policy, summarize=True)
    got = run(
        conv.messages,
        policy,
        lambda i: None if i == fail_at else f"SUMMARY-CALL-{i}",
        system=conv.system,
        tools=conv.tools,
    )
    result = got.result
    check_view(conv.messages, result.messages, conv.system, conv.tools)
    assert len(got.texts) <= policy.summary_max_calls
    assert result.summary_calls == len(got.texts)
    flat = [i for part in got.labels for i in part]
    assert len(flat) == len(set(flat))  # each message in one call only
    assert flat == sorted(flat)  # oldest first, in order
    if result.summary_status == "ok":
        [record] = [r for r in result.manifest if isinstance(r, Summarized)]
        assert flat == list(record.message_indices)  # all of them, and only them
        assert record.calls == len(got.texts)
        assert fail_at == 0 or fail_at > len(got.texts)
        # every later call read what the previous one wrote
        for i, text in enumerate(got.texts[1:], start=1):
            assert f"<previous_summary>\nSUMMARY-CALL-{i}\n</previous_summary>" in text
    elif got.texts:
        assert result.summary_status == "failed" and 1 <= fail_at <= len(got.texts)
        assert len(got.texts) == fail_at  # nothing called after a failure
        assert "SUMMARY-CALL" not in dumps(result.messages).decode()


@SETTINGS
@given(conv=conversations(min_turns=3), policy=policies())
def test_summary_calls_stay_within_the_budget_unless_the_region_is_enormous(
    conv: Conversation, policy: CompactionPolicy
) -> None:
    policy = dataclasses.replace(policy, summarize=True, summary_max_calls=50)
    got = run(conv.messages, policy, system=conv.system, tools=conv.tools)
    for text in got.texts:
        # the previous summary ("a summary") is far under summary_max_tokens: the budget holds
        assert COUNTER.count_text(text) <= policy.summary_input_cap + 8


# --- no thrash ------------------------------------------------------------------------------------


def _agent(turns: int, result_words: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "build the thing"}]
    for i in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"c{i}", "name": "Bash", "input": {"n": i}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"c{i}",
                        "content": f"output {i} " + "lorem ipsum " * result_words,
                    }
                ],
            },
        ]
    return messages


@pytest.mark.parametrize("shrink", [True, False])
def test_a_heavy_recent_window_does_not_compact_every_turn(shrink: bool) -> None:
    """Three recent interactions of ~3,000 tokens each are over the 8,000 threshold by
    themselves: without shrinking the window, every turn is a new compaction and a new summary
    call; with it, the view drops under the target and the next turns reuse the plan."""
    policy = CompactionPolicy(
        threshold=8_000,
        hard_limit=60_000,
        keep_recent=6,
        summary_max_tokens=200,
        shrink_window=shrink,
    )
    messages = _agent(20, 1_500)
    plans = PlanCache()
    calls = events = turns = 0
    for k in range(3, len(messages) + 1, 2):
        got = run(messages[:k], policy, plans=plans)
        check_view(messages[:k], got.result.messages)
        calls += len(got.texts)
        if got.result.plan_status == "new":
            events += 1
        turns += 1
        assert not got.result.over_hard_limit
        if shrink:
            assert got.result.tokens_after <= policy.threshold
            assert "truncate" not in got.result.layers  # the window was never cut into
    assert events >= 3
    if shrink:
        assert calls <= events and events <= turns // 2 + 1
    else:
        assert calls >= turns - 4  # the thrash this fixes: a summary call nearly every turn


def test_no_summary_call_for_a_view_that_will_be_refused() -> None:
    policy = CompactionPolicy(
        threshold=1_000, hard_limit=1_500, keep_recent=2, summary_max_tokens=1_000
    )
    # the last message alone is over the hard limit: 400 whatever happens, and no summary call
    messages = _agent(6, 100)
    messages[-1] = {
        "role": "user",
        "content": [
            {**messages[-1]["content"][0], "content": "big " * 3_000},
        ],
    }
    outcome = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    assert isinstance(outcome, Done)
    assert outcome.result.over_hard_limit and outcome.result.summary_status == "skipped"
    # the view with a summary would be over the hard limit, the pruned one is not: no call, and
    # the pruned view goes out
    messages = _agent(6, 250)
    outcome = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    assert isinstance(outcome, Done)
    result = outcome.result
    assert "prune" in result.layers and result.summary_status == "skipped"
    assert not result.over_hard_limit
    check_view(messages, result.messages)
    # with room for the summary, the call is made
    roomy = dataclasses.replace(policy, hard_limit=5_000)
    outcome = compact(CompactionInput(None, None, messages, "m"), roomy, COUNTER, PlanCache(), "t")
    assert isinstance(outcome, NeedsSummary)


def test_l1_spares_the_kept_window_when_pruning_is_enough() -> None:
    policy = CompactionPolicy(
        threshold=6_000, hard_limit=60_000, keep_recent=4, tool_result_cap=300, summary_max_tokens=200
    )
    messages = _agent(12, 400)  # every result (~800 tokens) is over the L1 cap
    got = run(messages, policy)
    result = got.result
    assert result.summary_status == "ok"
    check_view(messages, result.messages)
    # the kept window's results are the client's, byte for byte
    kept = [m for m in result.messages[-4:]]
    assert [dumps(m) for m in kept] == [dumps(m) for m in messages[-4:]]
    # the window is cut into only when nothing else gets the view under the target
    tight = dataclasses.replace(policy, threshold=1_500, shrink_window=False, summarize=False)
    result = run(messages, tight).result
    assert "truncate" in result.layers
    assert dumps(result.messages[-3]) != dumps(messages[-3])  # a window result was cut


# --- only what a person typed ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "typed"),
    [
        ("fix the parser", "fix the parser"),
        ("  keep my spacing \n", "  keep my spacing \n"),  # untouched when there is no noise
        ("<system-reminder>\nThe file was modified.\n</system-reminder>", ""),
        ("<system-reminder>x</system-reminder>\nnow run the tests", "now run the tests"),
        (
            "<task-notification>\n<task-id>bc34d29</task-id>\n<status>completed</status>\n"
            "</task-notification>\nRead the output file to retrieve the result: /tmp/t.output",
            "",
        ),
        (
            "<command-message>init is analyzing your codebase…</command-message>\n"
            "<command-name>/init</command-name>\n<command-args></command-args>",
            "",
        ),
        ("<local-command-stdout>Set model to opus</local-command-stdout>", ""),
        (
            "Caveat: The messages below were generated by the user while running local "
            "commands. DO NOT respond to these messages or otherwise consider them in your "
            "response unless the user explicitly asks you to.",
            "",
        ),
        ("[Request interrupted by user]", ""),
        ("[Request interrupted by user for tool use]", ""),
        ("[Request interrupted by user]\nno, use the other branch", "no, use the other branch"),
        ("compare <a> and <b>", "compare <a> and <b>"),
    ],
)
def test_typed_text(text: str, typed: str) -> None:
    assert typed_text(text) == typed


@given(st.text(alphabet=st.characters(blacklist_characters="<["), min_size=1))
def test_text_without_noise_is_carried_as_it_is(text: str) -> None:
    assert typed_text(text) == (text if text.strip() else "")


def test_the_bridge_carries_no_client_noise() -> None:
    noise = [
        "<system-reminder>\nTodo list is empty.\n</system-reminder>",
        "<task-notification>\n<task-id>b1</task-id>\n</task-notification>\n"
        "Read the output file to retrieve the result: /tmp/b1.output",
        "<command-name>/model</command-name>\n<command-message>model</command-message>\n"
        "<command-args>opus</command-args>",
        "<local-command-stdout>Set model to opus</local-command-stdout>",
        "[Request interrupted by user]",
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "build the thing"},
        {"role": "assistant", "content": "more " * 300},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>r</system-reminder>"},
                {"type": "text", "text": "please use tabs"},
            ],
        },
    ]
    for i, text in enumerate(noise):
        messages += [
            {"role": "assistant", "content": f"step {i} " + "words " * 300},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]
    messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    policy = CompactionPolicy(threshold=1_000, hard_limit=50_000, keep_recent=2, summarize=False)
    result = run(messages, policy).result
    check_view(messages, result.messages)
    carried = [
        b["text"]
        for m in result.messages
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if isinstance(b, dict) and str(b.get("text", "")).startswith(CARRIED_HEADER)
    ]
    assert carried == [f"{CARRIED_HEADER}\nplease use tabs"]
