"""The reused-plan path: one canonical dump per message, plan views kept in the cache.

A reused request must give exactly what the plan's items, materialised from *this* request (its
markers, its key order), followed by the new messages, give -- whatever the cache remembers. The
reference below rebuilds that view the slow way: every item materialised and counted, every
landmark found by walking the whole view.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    Plan,
    PlanCache,
    compact,
    step,
)
from proxy.core.compaction.context import compaction_end
from proxy.core.compaction.markers import cap_markers, count_markers
from proxy.core.compaction.plan import PlanView, prefix_hashes
from proxy.core.compaction.view import MARKER, FromClient, materialize, role_of, strip_markers
from proxy.core.tokens import (
    MARKER_JSON,
    TokenCounter,
    canonical_all,
    containing,
)
from tests.compaction.invariants import check_view, dumps
from tests.strategies import Conversation, conversations, policies

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
EPHEMERAL = {"type": "ephemeral"}


class ViewlessPlanCache(PlanCache):
    """A plan cache that never remembers a view: every reuse rebuilds it from the request."""

    def put(self, plan: Plan, view: PlanView | None = None) -> None:
        super().put(plan, None)

    def attach(self, plan: Plan, view: PlanView) -> None:
        return None


def run(
    conv: Conversation,
    messages: list[dict[str, Any]],
    policy: CompactionPolicy,
    plans: PlanCache,
    counter: TokenCounter,
) -> CompactionResult:
    outcome = compact(
        CompactionInput(conv.system, conv.tools, messages, "m"), policy, counter, plans, "t"
    )
    while not isinstance(outcome, Done):
        outcome = step(outcome.continuation, "a summary of the earlier turns")
    return outcome.result


def reference_view(
    conv: Conversation, messages: Sequence[dict[str, Any]], plan: Plan
) -> tuple[list[Any], int]:
    """The reused view built the slow way, and its raw message tokens."""
    counter = TokenCounter(cache_size=0)
    view = [materialize(item, messages) for item in plan.items]
    view += messages[plan.prefix_len :]
    stop = max((i for i, m in enumerate(view) if role_of(m) == "assistant"), default=-1)
    if stop < 0:
        stop = len(view) - 1
    start = max(1, compaction_end(view))
    out = cap_markers(conv.system, conv.tools, view, start, min(stop, len(view) - 1))
    return out, sum(counter.count_message(m) for m in view)


def _without_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != MARKER}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def claude_code_markers(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's habit: markers on the last block of the last message and of the message
    two before it, moved every turn (the previous ones are gone)."""
    out = [_without_markers(m) for m in messages]
    for i in (len(out) - 1, len(out) - 3):
        if i < 1:
            continue
        content = out[i]["content"]
        if (
            isinstance(content, list)
            and content
            and content[-1].get("type")
            not in (
                "thinking",
                "redacted_thinking",
            )
        ):
            content[-1] = {**content[-1], MARKER: EPHEMERAL}
    return out


def shuffled_keys(messages: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The same messages with each message's and block's keys in another order."""
    rnd = random.Random(seed)

    def shuffle(d: dict[str, Any]) -> dict[str, Any]:
        items = list(d.items())
        rnd.shuffle(items)
        return dict(items)

    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [shuffle(b) if isinstance(b, dict) else b for b in content]
        out.append(shuffle({**m, "content": content}))
    return out


@SETTINGS
@given(
    conv=conversations(min_turns=3, max_turns=14),
    policy=policies(),
    markers=st.booleans(),
    reorder=st.booleans(),
)
def test_a_reused_view_is_the_plan_materialised_from_this_request(
    conv: Conversation, policy: CompactionPolicy, markers: bool, reorder: bool
) -> None:
    cached, viewless = PlanCache(), ViewlessPlanCache()
    counter = TokenCounter()
    for k in range(1, len(conv.messages) + 1):
        if conv.messages[k - 1]["role"] != "user":
            continue
        request = orjson.loads(orjson.dumps(conv.messages[:k]))  # a fresh parse, as the edge
        if markers:
            request = claude_code_markers(request)
        if reorder and k % 2:
            request = shuffled_keys(request, k)
        snapshot = copy.deepcopy(request)
        fast = run(conv, request, policy, cached, counter)
        slow = run(conv, request, policy, viewless, TokenCounter())
        assert request == snapshot  # never mutated
        assert dumps(fast.messages) == dumps(slow.messages)
        assert [orjson.dumps(m) for m in fast.messages] == [orjson.dumps(m) for m in slow.messages]
        assert (fast.tokens_before, fast.tokens_after) == (slow.tokens_before, slow.tokens_after)
        assert (fast.plan_status, fast.compaction_id, fast.manifest) == (
            slow.plan_status,
            slow.compaction_id,
            slow.manifest,
        )
        check_view(request, fast.messages, conv.system, conv.tools)
        event(f"plan {fast.plan_status}")
        if fast.plan_status == "reused":
            assert fast.plan is not None
            view, raw = reference_view(conv, request, fast.plan)
            # key order included: the view takes the client's objects of this request
            assert [orjson.dumps(m) for m in fast.messages] == [orjson.dumps(m) for m in view]
            assert fast.tokens_after == int(
                TokenCounter(cache_size=0).count_request(conv.system, conv.tools, []).total
                + raw
                + 0.5
            )


def test_a_view_is_kept_with_its_plan_and_only_in_memory() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start " * 50}]
    for i in range(30):
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x " * 400}],
            },
        ]
    policy = CompactionPolicy(threshold=4_000, hard_limit=20_000, summarize=False)
    plans, counter = PlanCache(), TokenCounter()
    conv = Conversation(None, [], messages)
    first = run(conv, messages, policy, plans, counter)
    assert first.plan_status == "new" and first.plan is not None
    found = plans.match("t", first.plan.anchor, prefix_hashes(messages), len(messages) - 1)
    assert found is not None
    plan, view = found
    assert view is not None and view.compaction_id == plan.compaction_id
    assert len(view.tokens) == len(plan.items)
    assert set(orjson.loads(plan.to_json())) == {
        "v",
        "tenant",
        "anchor",
        "prefix_len",
        "prefix_hash",
        "items",
        "layers",
        "manifest",
        "bridge",
        "summary_status",
        "pointers",  # whether its views offer the retrieval tool (retrieval.plan_names_pointers)
    }
    assert Plan.from_json(plan.to_json()) == plan
    # a plan put without a view gets one on its first reuse
    again = PlanCache()
    again.put(Plan.from_json(plan.to_json()))
    more = [
        *messages,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"},
    ]
    reused = run(conv, more, policy, again, TokenCounter())
    assert reused.plan_status == "reused"
    found = again.match("t", plan.anchor, prefix_hashes(more), len(more) - 1)
    assert found is not None and found[1] == view
    assert dumps(reused.messages) == dumps(run(conv, more, policy, plans, counter).messages)


def test_edited_items_follow_the_markers_of_this_request() -> None:
    """A cut tool result whose message gains or loses a marker: the view's cached token count is
    not used for it, and the marker shows exactly as in this request."""
    big = "line of output\n" * 900
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do it"}]
    for i in range(8):
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{i}", "content": big},
                    {"type": "text", "text": f"note {i}"},
                ],
            },
        ]
    policy = CompactionPolicy(
        threshold=8_000,
        hard_limit=200_000,
        tool_result_cap=200,
        summarize=False,
        shrink_window=False,  # the window's cut results stay in the plan as edited items
    )
    conv = Conversation(None, [], messages)
    plans = PlanCache()
    first = run(conv, messages, policy, plans, TokenCounter())
    assert first.plan is not None and "truncate" in first.layers
    edited = [i for i in first.plan.items if isinstance(i, FromClient) and i.blocks]
    assert edited
    origin = edited[0].origin
    viewless = ViewlessPlanCache()
    viewless.put(first.plan)
    tail = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    for marked in (True, False, True):
        request = [*copy.deepcopy(messages), *tail]
        if marked:
            block = request[origin]["content"][0]
            request[origin]["content"][0] = {**block, MARKER: EPHEMERAL}
        fast = run(conv, request, policy, plans, TokenCounter())
        slow = run(conv, request, policy, viewless, TokenCounter())
        assert fast.plan_status == slow.plan_status == "reused"
        assert orjson.dumps(fast.messages) == orjson.dumps(slow.messages)
        assert fast.tokens_after == slow.tokens_after
        view, _ = reference_view(conv, request, first.plan)
        assert orjson.dumps(fast.messages) == orjson.dumps(view)
        assert (MARKER in orjson.dumps(fast.messages).decode()) is marked


# --- the helpers the fast path rests on ---------------------------------------------------------


def _old_prefix_hashes(messages: Sequence[Any]) -> tuple[str, ...]:
    import xxhash

    out, h = [f"{0:016x}"], 0
    for m in messages:
        mh = xxhash.xxh3_64_intdigest(orjson.dumps(strip_markers(m), option=orjson.OPT_SORT_KEYS))
        h = xxhash.xxh3_64_intdigest(h.to_bytes(8, "big") + mh.to_bytes(8, "big"))
        out.append(f"{h:016x}")
    return tuple(out)


@SETTINGS
@given(conv=conversations(), markers=st.booleans())
def test_fast_helpers_agree_with_the_walks(conv: Conversation, markers: bool) -> None:
    messages = claude_code_markers(conv.messages) if markers else conv.messages
    canonical = canonical_all(messages)
    assert canonical == [orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in messages]
    marked = containing(canonical, MARKER_JSON)
    assert marked == [MARKER_JSON in c for c in canonical if c is not None]
    expected = _old_prefix_hashes(messages)
    assert prefix_hashes(messages) == expected
    assert prefix_hashes(messages, canonical) == expected
    assert prefix_hashes(messages, canonical, marked) == expected
    assert compaction_end(messages, canonical) == compaction_end(messages)
    assert count_markers(conv.system, conv.tools, messages, marked) == count_markers(
        conv.system, conv.tools, messages
    )
    stop = len(messages) - 1
    assert cap_markers(conv.system, conv.tools, messages, 1, stop, marked) == cap_markers(
        conv.system, conv.tools, messages, 1, stop
    )


def test_containing_finds_every_entry_and_never_spans_two() -> None:
    entries: list[bytes | None] = [b'{"a":"cache_', b'control"}', None, b"", b'"cache_control"']
    assert containing(entries, MARKER_JSON) == [False, False, True, False, True]
    assert containing([], MARKER_JSON) == []
    many = [b'{"cache_control":1,"x":"cache_control"}'] * 3 + [b"{}"]
    assert containing(many, MARKER_JSON) == [True, True, True, False]


def test_prefix_hashes_of_messages_that_are_not_json() -> None:
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "\ud800"}]
    canonical = canonical_all(bad)
    assert canonical[1] is None
    try:
        expected: object = _old_prefix_hashes(bad)
    except TypeError as exc:
        expected = type(exc)
    try:
        got: object = prefix_hashes(bad, canonical)
    except TypeError as exc:
        got = type(exc)
    assert got == expected
    # a marker that is not JSON is stripped before hashing, as it always was
    odd = [{"role": "user", "content": [{"type": "text", "text": "x", MARKER: {1j}}]}]
    assert prefix_hashes(odd, canonical_all(odd)) == _old_prefix_hashes(odd)


def test_reuse_from_threads_gives_the_sequential_results() -> None:
    """Worker threads share the plan cache and the counter (the edge offloads big requests)."""
    from concurrent.futures import ThreadPoolExecutor

    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for i in range(40):
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"{i} " * 300}
                ],
            },
        ]
    policy = CompactionPolicy(threshold=6_000, hard_limit=50_000, summarize=False)
    conv = Conversation(None, [], messages)
    # requests of 61..69 messages: the first compacts, the others reuse its plan (a request that
    # compacted again would make the results depend on the order the threads ran in)
    requests = [claude_code_markers(messages[:k]) for k in range(61, 70, 2)]
    plans, counter = PlanCache(), TokenCounter(cache_size=64, message_cache_size=16)
    results = [run(conv, request, policy, plans, counter) for request in requests]
    assert [r.plan_status for r in results] == ["new"] + ["reused"] * (len(requests) - 1)
    expected = [orjson.dumps(r.messages) for r in results]
    plan = results[0].plan
    assert plan is not None
    shared_plans, shared = PlanCache(), TokenCounter(cache_size=64, message_cache_size=16)
    shared_plans.put(Plan.from_json(plan.to_json()))  # no view yet: the threads race to make it
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(
            pool.map(
                lambda r: orjson.dumps(run(conv, r, policy, shared_plans, shared).messages),
                requests * 4,
            )
        )
    assert got == expected * 4


def test_attach_keeps_a_view_only_with_its_own_cached_plan() -> None:
    plan = Plan("t", "a", 1, "h1", (FromClient(0),), ("prune",), (), None, "skipped")
    view = PlanView((None,), 0, 0, plan.compaction_id)
    cache = PlanCache()
    cache.attach(plan, view)  # not cached: nothing happens
    assert cache.match("t", "a", ["x", "h1"], 1) is None
    cache.put(plan)
    cache.attach(Plan.from_json(plan.to_json()), view)  # an equal plan, not this one
    assert cache.match("t", "a", ["x", "h1"], 1) == (plan, None)
    cache.attach(plan, view)
    assert cache.match("t", "a", ["x", "h1"], 1) == (plan, view)
    assert cache.lookup("t", "a", ["x", "h1"], 1) is plan
