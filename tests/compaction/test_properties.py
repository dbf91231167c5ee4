"""Invariants of compaction over generated conversations (hypothesis)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    PlanCache,
    compact,
    finish,
    step,
)
from proxy.core.compaction.bridge import SUMMARY_HEADER
from proxy.core.tokens import TokenCounter
from tests.compaction.invariants import check_view, dumps
from tests.strategies import Conversation, conversations, policies

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
COUNTER = TokenCounter()  # a memo only: sharing it across examples changes no result

# what the fake summariser answers: a summary, or one of the ways a call fails
ANSWERS = st.sampled_from(["a summary of the earlier turns", None, "", "  \n "])


def run(
    conv: Conversation,
    policy: CompactionPolicy,
    answer: str | None,
    plans: PlanCache | None = None,
    counter: TokenCounter | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> CompactionResult:
    request = CompactionInput(
        conv.system, conv.tools, conv.messages if messages is None else messages, "model"
    )
    outcome = compact(
        request,
        policy,
        counter if counter is not None else COUNTER,
        plans if plans is not None else PlanCache(),
        "tenant",
    )
    while not isinstance(outcome, Done):
        assert outcome.summary_request.text.strip()
        assert "base64" not in outcome.summary_request.text
        assert conv_png_absent(outcome.summary_request.text)
        outcome = step(outcome.continuation, answer)
    return outcome.result


def conv_png_absent(text: str) -> bool:
    from tests.strategies import PNG_2X2

    return PNG_2X2 not in text


@SETTINGS
@given(conv=conversations(), policy=policies(), answer=ANSWERS)
def test_every_view_keeps_the_invariants(
    conv: Conversation, policy: CompactionPolicy, answer: str | None
) -> None:
    snapshot = copy.deepcopy(conv)
    raw = orjson.dumps(dataclasses.asdict(conv))
    result = run(conv, policy, answer)

    # the input is evidence: never mutated
    assert conv == snapshot
    assert orjson.dumps(dataclasses.asdict(conv)) == raw

    check_view(conv.messages, result.messages, conv.system, conv.tools)
    assert result.changed == (dumps(result.messages) != dumps(conv.messages))
    assert (result.compaction_id is None) == (not result.changed)
    assert result.tokens_after <= result.tokens_before
    if result.changed:
        assert result.tokens_before > policy.threshold
        assert result.plan is not None and result.plan_status == "new"
    assert result.over_hard_limit == (result.tokens_after > policy.hard_limit)
    if result.summary_status == "ok":
        assert "summarize" in result.layers
    if result.summary_status == "failed" or not (answer or "").strip():
        # a failed summary never reaches the conversation, not even as an error note
        assert result.summary_status != "ok"
        assert all(SUMMARY_HEADER.encode() not in dumps(m) for m in result.messages)


@SETTINGS
@given(conv=conversations(), policy=policies(), answer=ANSWERS)
def test_same_input_gives_the_same_bytes(
    conv: Conversation, policy: CompactionPolicy, answer: str | None
) -> None:
    # fresh plan caches; one run with a warm token memo, one with a cold one
    first = run(conv, policy, answer, PlanCache(), COUNTER)
    second = run(conv, policy, answer, PlanCache(), TokenCounter())
    assert dumps(first.messages) == dumps(second.messages)
    assert first.manifest == second.manifest
    assert first.compaction_id == second.compaction_id
    assert (first.tokens_before, first.tokens_after) == (second.tokens_before, second.tokens_after)
    if first.plan is not None:
        assert second.plan is not None
        assert first.plan.to_json() == second.plan.to_json()


@SETTINGS
@given(conv=conversations(min_turns=2), policy=policies())
def test_failed_summary_keeps_the_l1_to_l3_view(
    conv: Conversation, policy: CompactionPolicy
) -> None:
    with_summary = dataclasses.replace(policy, summarize=True)
    without = dataclasses.replace(policy, summarize=False)
    outcome = compact(
        CompactionInput(conv.system, conv.tools, conv.messages, "m"),
        with_summary,
        COUNTER,
        PlanCache(),
        "t",
    )
    if isinstance(outcome, Done):
        return
    failed = finish(outcome.continuation, None)
    pruned = run(conv, without, None)
    assert failed.summary_status == "failed"
    assert pruned.summary_status == "skipped"
    assert "prune" in failed.layers and "summarize" not in failed.layers
    # Same cut except the bridge may be sized for a summary: the failed view is the pruned view
    # of that cut, so it is valid and never longer than the view with the summary
    check_view(conv.messages, failed.messages, conv.system, conv.tools)
    chain = outcome
    while not isinstance(chain, Done):
        chain = step(chain.continuation, "the summary")
    ok = chain.result
    assert ok.summary_status == "ok"
    assert len(failed.messages) <= len(ok.messages)
    assert dumps(failed.messages[-2:]) == dumps(ok.messages[-2:])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(conv=conversations(min_turns=3, max_turns=14), policy=policies(), answer=ANSWERS)
def test_turn_by_turn_replay_reuses_plans(
    conv: Conversation, policy: CompactionPolicy, answer: str | None
) -> None:
    """Requests k = the prefixes ending on user messages, sharing one plan cache."""
    plans = PlanCache()
    previous: list[bytes] | None = None
    for k in range(1, len(conv.messages) + 1):
        if conv.messages[k - 1]["role"] != "user":
            continue
        prefix = conv.messages[:k]
        result = run(conv, policy, answer, plans, messages=prefix)
        check_view(prefix, result.messages, conv.system, conv.tools)
        view = [dumps(m) for m in result.messages]
        # a new compaction replaces the previous bridge: there is never more than one
        assert sum(b"[context-proxy] Earlier turns" in m for m in view) <= 1
        if result.plan_status == "reused" and previous is not None:
            # an agent's next request extends the previous forwarded view byte for byte
            assert view[: len(previous)] == previous
        previous = view
