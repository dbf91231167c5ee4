"""Digests carried from one turn to the next give the very result of hashing everything again.

The edge hands compaction a ``Resent`` list when a re-sent history was not parsed again: its first
messages are the objects of the previous request, with that request's digests. Compaction takes
those and hashes only the rest. Here each turn runs twice, side by side: once as a fresh parse
(a plain list, everything hashed) and once the way the edge does it (the previous turn's objects
for the unchanged prefix, their digests carried) -- every figure and every byte must agree.
"""

from __future__ import annotations

import copy
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
    step,
)
from proxy.core.compaction.context import COMPACTION_JSON
from proxy.core.compaction.digest import Digests, Resent, digests
from proxy.core.compaction.plan import prefix_hashes
from proxy.core.nesting import canonical_within
from proxy.core.tokens import (
    MARKER_JSON,
    Canonical,
    TokenCounter,
    canonical_all,
    containing,
    message_keys,
)
from tests.compaction.test_reuse import claude_code_markers
from tests.strategies import Conversation, conversations, policies

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run(
    conv: Conversation,
    messages: list[Any],
    policy: CompactionPolicy,
    plans: PlanCache,
    counter: TokenCounter,
    canonical: Canonical | None = None,
) -> CompactionResult:
    request = CompactionInput(conv.system, conv.tools, messages, "m", canonical=canonical)
    outcome = compact(request, policy, counter, plans, "t")
    while not isinstance(outcome, Done):
        outcome = step(outcome.continuation, "a summary of the earlier turns")
    return outcome.result


def fresh(messages: list[Any]) -> list[Any]:
    return orjson.loads(orjson.dumps(messages))  # type: ignore[no-any-return]


def resent(previous: list[Any], request: list[Any], known: Digests | None) -> Resent:
    """``request`` as the edge builds it: the previous request's objects for the leading
    messages whose JSON did not change, fresh objects after (and the previous digests)."""
    same = 0
    while same < min(len(previous), len(request)) and orjson.dumps(previous[same]) == orjson.dumps(
        request[same]
    ):
        same += 1
    return Resent([*previous[:same], *fresh(request[same:])], known)


def assert_same_digests(got: Digests, messages: list[Any]) -> None:
    """``got`` equals digests computed from scratch (compaction hashes lists of 2 or more)."""
    want = digests(list(messages), hashed=got.hashed)
    canonical = canonical_all(messages)
    marked = containing(canonical, MARKER_JSON)
    assert got.hashed == (len(messages) >= 2)
    if got.hashed:
        assert got.hashes == want.hashes == prefix_hashes(messages)
    assert got.own == want.own
    assert got.keys == want.keys == tuple(message_keys(messages, canonical, marked))
    assert got.marked == want.marked == tuple(marked)
    assert got.compaction == want.compaction == tuple(containing(canonical, COMPACTION_JSON))
    assert all(a is b for a, b in zip(got.messages, messages, strict=True))


@SETTINGS
@given(
    conv=conversations(min_turns=3, max_turns=14),
    policy=policies(),
    markers=st.booleans(),
)
def test_carried_digests_give_the_result_of_hashing_everything(
    conv: Conversation, policy: CompactionPolicy, markers: bool
) -> None:
    plain_plans, carried_plans = PlanCache(), PlanCache()
    plain_counter, carried_counter = TokenCounter(), TokenCounter()
    previous: list[Any] = []
    known: Digests | None = None
    reused = 0
    for k in range(1, len(conv.messages) + 1):
        if conv.messages[k - 1]["role"] != "user":
            continue
        request = fresh(conv.messages[:k])
        if markers:
            request = claude_code_markers(request)
        plain = run(conv, request, policy, plain_plans, plain_counter)
        messages = resent(previous, request, known)
        snapshot = copy.deepcopy(list(messages))
        # as the edge does: the nesting check made the new messages' canonical JSON
        same = sum(1 for a, b in zip(messages, previous, strict=False) if a is b)
        made = canonical_within(messages, same)
        assert made is not None and list(made.items) == canonical_all(messages[same:])
        carried = run(conv, messages, policy, carried_plans, carried_counter, made)
        assert list(messages) == snapshot  # never mutated
        assert [orjson.dumps(m) for m in carried.messages] == [
            orjson.dumps(m) for m in plain.messages
        ]
        assert (carried.tokens_before, carried.tokens_after) == (
            plain.tokens_before,
            plain.tokens_after,
        )
        assert (carried.plan_status, carried.compaction_id, carried.layers) == (
            plain.plan_status,
            plain.compaction_id,
            plain.layers,
        )
        assert (carried.manifest, carried.summary_status, carried.over_hard_limit) == (
            plain.manifest,
            plain.summary_status,
            plain.over_hard_limit,
        )
        assert carried.digests is not None
        assert_same_digests(carried.digests, list(messages))
        reused += sum(1 for a, b in zip(messages, previous, strict=False) if a is b)
        previous, known = list(messages), carried.digests
    assert reused > 0 or len(conv.messages) < 3


def test_digests_of_other_objects_are_not_taken() -> None:
    """Equal values are not enough: only the very objects the digests were made of."""
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": "again"},
    ]
    known = digests(messages)
    tampered = Digests(
        known.messages,
        tuple(x + 1 for x in known.own),
        tuple(x + 1 for x in known.keys),
        tuple(not x for x in known.marked),
        tuple(not x for x in known.compaction),
        tuple("f" * 16 for _ in known.hashes),
    )
    copies = Resent(fresh(messages), tampered)
    assert_same_digests(digests(copies), list(copies))
    # the same objects: taken as they are (here, wrong on purpose: they are trusted)
    assert digests(Resent(messages, tampered)).own == tampered.own


def test_a_partly_reused_list_hashes_only_its_new_messages() -> None:
    messages = [
        {"role": "user", "content": f"turn {i}"}
        if i % 2 == 0
        else {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]}
        for i in range(9)
    ]
    known = digests(messages[:7])
    request = Resent([*messages[:5], *fresh(messages[5:])], known)
    got = digests(request)
    assert_same_digests(got, list(request))
    assert got.own[:5] == known.own[:5]


def test_unhashed_digests_are_not_carried_into_hashed_ones() -> None:
    messages = [{"role": "user", "content": "only one"}]
    known = digests(messages, hashed=False)
    assert known.hashes == () and not known.hashed
    got = digests(Resent([*messages, {"role": "assistant", "content": "x"}], known))
    assert got.hashed
    assert got.hashes == prefix_hashes(list(got.messages))


def test_canonical_made_for_other_objects_is_not_taken() -> None:
    """``Canonical`` serves only the very objects it was made of: equal-length lists of other
    messages get their own canonical JSON."""
    a = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    b = [{"role": "user", "content": "uno"}, {"role": "assistant", "content": "dos"}]
    made = canonical_within(a, 0)
    assert made is not None
    assert made.of(b, 0) == canonical_all(b)
    assert made.of(a, 1) == canonical_all(a[1:])
    assert digests(b, made=made) == digests(b)


def test_digests_handed_on_drop_their_canonical_json() -> None:
    messages = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    dg = digests(messages)
    assert [dg.canonical(i) for i in range(2)] == canonical_all(messages)
    kept = dg.carried()
    assert kept == dg and kept.fresh == () and kept.canonical(0) is None


def test_digests_made_for_these_very_messages_are_taken_whole() -> None:
    """A request carrying the digests made for it (``counting.with_digests``, then ``compact``):
    the same ``Digests``, not rebuilt; one message more, or another object, and they are not."""
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    ]
    known = digests(messages)
    assert digests(Resent(messages, known)) is known
    longer = Resent([*messages, {"role": "user", "content": "more"}], known)
    assert digests(longer) is not known
    assert_same_digests(digests(longer), list(longer))
    other = Resent([messages[0], dict(messages[1])], known)
    assert digests(other) is not known
    assert_same_digests(digests(other), list(other))
