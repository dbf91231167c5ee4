"""Plans over real transcripts, replayed turn by turn the way an agent sends them."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    Plan,
    PlanCache,
    Summarized,
    SummaryRequest,
    compact,
    step,
)
from proxy.core.compaction.view import FromClient
from proxy.core.tokens import TokenCounter
from tests.compaction.invariants import check_view, dumps
from tests.shared_data import TRANSCRIPTS as SHARED_TRANSCRIPTS

TRANSCRIPTS = SHARED_TRANSCRIPTS
CLAUDE_CODE = TRANSCRIPTS / "cc_mclaude_3af9b1a7_with_autocompact_full.json"

pytestmark = pytest.mark.skipif(not CLAUDE_CODE.exists(), reason="transcripts not available")


def fake_summary(request: SummaryRequest) -> str:
    """Deterministic stand-in for the model: the first 400 characters of what it was sent."""
    return request.text[:400]


@dataclass
class Replay:
    results: list[CompactionResult] = field(default_factory=list)
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    summary_requests: list[SummaryRequest] = field(default_factory=list)
    shared_tokens: int = 0
    total_tokens: int = 0

    @property
    def events(self) -> int:
        return sum(r.plan_status == "new" for r in self.results)

    @property
    def share(self) -> float:
        return self.shared_tokens / self.total_tokens


def shared_prefix_tokens(
    previous: Sequence[Mapping[str, Any]],
    current: Sequence[Mapping[str, Any]],
    counter: TokenCounter,
) -> int:
    """Tokens of the longest prefix (whole messages, then whole blocks) two views share."""
    tokens = 0
    for a, b in zip(previous, current, strict=False):
        if dumps(a) == dumps(b):
            tokens += counter.count_message(b)
            continue
        if (
            a["role"] == b["role"]
            and isinstance(a["content"], list)
            and isinstance(b["content"], list)
        ):
            for x, y in zip(a["content"], b["content"], strict=False):
                if dumps(x) != dumps(y):
                    break
                tokens += counter.count_block(y)
        break
    return tokens


def replay(
    data: Mapping[str, Any],
    policy: CompactionPolicy,
    plans: PlanCache | None = None,
    counter: TokenCounter | None = None,
) -> Replay:
    counter = counter if counter is not None else TokenCounter()
    plans = plans if plans is not None else PlanCache()
    messages = data["messages"]
    out = Replay()
    previous: list[Mapping[str, Any]] | None = None
    for k in range(1, len(messages) + 1):
        if messages[k - 1]["role"] != "user":
            continue
        request = messages[:k]
        outcome = compact(
            CompactionInput(data["system"], data["tools"], request, "claude-sonnet-4-5"),
            policy,
            counter,
            plans,
            "tenant",
        )
        while not isinstance(outcome, Done):
            out.summary_requests.append(outcome.summary_request)
            outcome = step(outcome.continuation, fake_summary(outcome.summary_request))
        result = outcome.result
        check_view(request, result.messages, data["system"], data["tools"])
        if previous is not None:
            out.shared_tokens += shared_prefix_tokens(previous, result.messages, counter)
            out.total_tokens += sum(counter.count_message(m) for m in result.messages)
        previous = result.messages
        out.results.append(result)
        out.requests.append(request)
    return out


@pytest.fixture(scope="module")
def claude_code() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CLAUDE_CODE.read_text())
    return data


POLICY = CompactionPolicy(threshold=40_000, hard_limit=120_000)


@pytest.fixture(scope="module")
def cc_replay(claude_code: dict[str, Any]) -> Replay:
    return replay(claude_code, POLICY)


def test_replay_compacts_rarely_and_keeps_the_prefix_stable(cc_replay: Replay) -> None:
    results = cc_replay.results
    # it does compact (the transcript is ~2x the threshold), but rarely: hysteresis
    assert 1 <= cc_replay.events <= 4
    assert len(cc_replay.summary_requests) <= cc_replay.events
    assert cc_replay.share >= 0.90, cc_replay.share
    # never over the threshold after a compaction, never over the hard limit
    assert all(r.tokens_after <= POLICY.threshold for r in results)
    assert not any(r.over_hard_limit for r in results)
    final = results[-1]
    assert final.tokens_before > 2 * POLICY.threshold > final.tokens_after


def test_plans_are_reused_on_the_turns_after_a_compaction(cc_replay: Replay) -> None:
    first_event = next(i for i, r in enumerate(cc_replay.results) if r.plan_status == "new")
    for i in range(first_event + 1, len(cc_replay.results)):
        result, previous = cc_replay.results[i], cc_replay.results[i - 1]
        assert result.plan_status in ("reused", "new")
        if result.plan_status == "reused":
            assert result.plan is previous.plan
            assert result.summary_status == "skipped"
            # the previous forwarded view, byte for byte, then the new turns
            n = len(previous.messages)
            assert dumps(result.messages[:n]) == dumps(previous.messages)
            assert result.messages[n:] == cc_replay.requests[i][len(cc_replay.requests[i - 1]) :]
        else:
            # a new compaction starts from the plan's view: the head stays
            assert result.messages[0] is cc_replay.requests[i][0]


def test_summaries_are_incremental(cc_replay: Replay) -> None:
    requests = cc_replay.summary_requests
    assert len(requests) >= 2, "the replay should summarise at least twice"
    first, second = requests[0], requests[1]
    assert "<previous_summary>" not in first.text
    # the second call gets the first summary, not the turns it already covered
    assert f"<previous_summary>\n{fake_summary(first).strip()}\n</previous_summary>" in second.text
    opening = "I see you want to sync a repository"  # messages[1], summarised the first time
    assert opening in first.text
    assert opening not in second.text.split("</previous_summary>", 1)[1]
    summarized = [r for r in cc_replay.results[-1].manifest if isinstance(r, Summarized)]
    assert len(summarized) == len(requests)
    for earlier, later in itertools.pairwise(summarized):
        assert max(earlier.message_indices) < min(later.message_indices)


def test_plans_round_trip_through_json(cc_replay: Replay, claude_code: dict[str, Any]) -> None:
    plans = [r.plan for r in cc_replay.results if r.plan_status == "new"]
    assert plans
    for plan in plans:
        assert plan is not None
        again = Plan.from_json(plan.to_json())
        assert again == plan
        assert again.to_json() == plan.to_json()
        assert again.compaction_id == plan.compaction_id
    # a cache filled from JSON (as a shared store would) yields the very same views
    last_plan = plans[-1]
    assert last_plan is not None
    cache = PlanCache()
    cache.put(Plan.from_json(last_plan.to_json()))
    index = next(i for i, r in enumerate(cc_replay.results) if r.plan is last_plan)
    counter = TokenCounter()
    for i in range(index, len(cc_replay.results)):
        request = cc_replay.requests[i]
        outcome = compact(
            CompactionInput(claude_code["system"], claude_code["tools"], request, "m"),
            POLICY,
            counter,
            cache,
            "tenant",
        )
        assert isinstance(outcome, Done)
        assert dumps(outcome.result.messages) == dumps(cc_replay.results[i].messages)
        assert outcome.result.plan_status == "reused"


def test_replay_is_deterministic(claude_code: dict[str, Any], cc_replay: Replay) -> None:
    again = replay(claude_code, POLICY)
    assert [dumps(r.messages) for r in again.results] == [
        dumps(r.messages) for r in cc_replay.results
    ]
    assert [r.compaction_id for r in again.results] == [r.compaction_id for r in cc_replay.results]


@pytest.mark.parametrize(
    ("name", "threshold", "share"),
    [
        # 14 requests: the window alone is over the target, so it shrinks and the first
        # compaction comes a turn earlier (before, that request went out over the threshold)
        ("sweagent_marshmallow1867_function_calling.json", 4_000, 0.70),
        ("tau_bench_gpt4o_airline_task2.json", 3_000, 0.75),
        ("cc_mclaude_3af9b1a7_with_autocompact_full.json", 15_000, 0.75),
    ],
)
def test_other_transcripts_replay_validly(name: str, threshold: int, share: float) -> None:
    data = json.loads((TRANSCRIPTS / name).read_text())
    policy = CompactionPolicy(threshold=threshold, hard_limit=threshold * 3)
    result = replay(data, policy)
    assert result.events >= 1
    assert len(result.summary_requests) <= result.events * policy.summary_max_calls
    assert result.share >= share, result.share


def test_a_tenant_never_sees_another_tenants_plan(claude_code: dict[str, Any]) -> None:
    plans = PlanCache()
    messages = claude_code["messages"][:121]
    assert messages[-1]["role"] == "user"
    policy = CompactionPolicy(threshold=20_000, summarize=False)
    for tenant in ("a", "b"):
        outcome = compact(
            CompactionInput(None, claude_code["tools"], messages, "m"),
            policy,
            TokenCounter(),
            plans,
            tenant,
        )
        assert isinstance(outcome, Done) and outcome.result.plan_status == "new"
    assert len(plans) == 2


# --- PlanCache --------------------------------------------------------------------------------


def _plan(tenant: str, anchor: str, length: int, prefix_hash: str = "h") -> Plan:
    return Plan(
        tenant=tenant,
        anchor=anchor,
        prefix_len=length,
        prefix_hash=f"{prefix_hash}{length}",
        items=tuple(FromClient(i) for i in range(length)),
        layers=("prune",),
        manifest=(),
        bridge=None,
        summary_status="skipped",
    )


def test_plan_cache_takes_the_longest_matching_prefix() -> None:
    cache = PlanCache()
    for length in (3, 5, 9):
        cache.put(_plan("t", "a", length))
    hashes = [f"h{i}" for i in range(12)]
    found = cache.lookup("t", "a", hashes, limit=11)
    assert found is not None and found.prefix_len == 9
    found = cache.lookup("t", "a", hashes, limit=8)  # the plan must leave the last message out
    assert found is not None and found.prefix_len == 5
    hashes[9] = "other"
    found = cache.lookup("t", "a", hashes, limit=11)
    assert found is not None and found.prefix_len == 5
    assert cache.lookup("u", "a", hashes, limit=11) is None


def test_plan_cache_is_a_bounded_lru() -> None:
    cache = PlanCache(max_plans=3, per_conversation=2)
    for length in (1, 2, 3):
        cache.put(_plan("t", "a", length))
    assert [p.prefix_len for p in cache.plans("t", "a")] == [3, 2]  # per conversation
    cache.put(_plan("t", "b", 1))
    cache.put(_plan("t", "c", 1))  # over max_plans: the least recently used goes
    assert len(cache) == 3
    assert [p.prefix_len for p in cache.plans("t", "a")] == [3]
    assert cache.lookup("t", "b", ["x", "h1"], limit=1) is not None
    cache.put(_plan("t", "d", 1))  # "a" is now the least recently used conversation
    assert cache.plans("t", "a") == ()
    assert len(cache) == 3


@pytest.mark.parametrize(
    "bad",
    [b"{}", b"[]", b"not json", b'{"v": 2}'],
)
def test_malformed_plans_are_rejected(bad: bytes) -> None:
    with pytest.raises(ValueError):
        Plan.from_json(bad)
