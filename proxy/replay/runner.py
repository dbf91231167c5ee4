"""Turn-by-turn replay of a conversation through the real compaction engine.

Request ``k`` is ``messages[:k]`` for every ``k`` ending on a user message, with the file's system
and tools: what an agent sends, one request per turn. Every request goes through
:func:`proxy.core.compaction.compact` (and :func:`~proxy.core.compaction.step` for each summary
call L4 asks for: one, or a bounded chain) with one :class:`~proxy.core.tokens.TokenCounter`, one
:class:`~proxy.core.compaction.PlanCache` and the tenant ``"replay"``, exactly as the edge does for
one client. Calibration stays 1.0 (there is no provider usage offline).

Summaries come from a :data:`~proxy.replay.summarisers.Summariser`
(:mod:`proxy.replay.summarisers`: offline and deterministic, or the edge's own call upstream).

For every request the runner also measures what the provider's prompt cache would see: the
tokens of the longest block-level prefix the forwarded request shares with the previous forwarded
request, in provider order (tools, system, then each message's blocks; ``cache_control`` markers
ignored, a message boundary is part of the comparison).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.config.compaction import policy_from_config
from proxy.core.catalogue_data import REPLAY_MODEL
from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    NeedsNaming,
    PlanCache,
    Removed,
    Summarized,
    compact,
    named,
    step,
)
from proxy.core.compaction.provider import CompactionCall
from proxy.core.compaction.view import strip_markers
from proxy.core.protocol import validate_messages
from proxy.core.tokens import MESSAGE_OVERHEAD, TokenCounter
from proxy.replay.readers import CompactionBoundary, Conversation
from proxy.replay.summarisers import LABEL, Summariser

__all__ = [
    "OFFLINE_NOTE",
    "TENANT",
    "ReplayResult",
    "TurnFigures",
    "policy_from_config",
    "request_units",
    "run_replay",
    "shared_prefix_tokens",
    "with_overrides",
]

TENANT = "replay"
OFFLINE_NOTE = (
    "offline extractive summaries (no model was called; pass --upstream URL for real ones)"
)


# --- prefix measurement ----------------------------------------------------------------------

Unit = tuple[object, ...]


def request_units(
    system: object, tools: object, messages: Sequence[Mapping[str, Any]], counter: TokenCounter
) -> list[tuple[Unit, int]]:
    """The request as the provider reads it, block by block, each with its tokens; the units'
    tokens add up to ``counter.count_request(...).total``."""
    units: list[tuple[Unit, int]] = []
    if isinstance(tools, list):
        for tool in tools:
            units.append(
                (("tool", strip_markers(tool)), counter.count_request(None, [tool], []).tools)
            )
    elif tools is not None:
        units.append((("tool", strip_markers(tools)), counter.count_request(None, tools, []).tools))
    if isinstance(system, list):
        for block in system:
            units.append((("system", strip_markers(block)), counter.count_block(block)))
    elif system is not None:
        units.append((("system", system), counter.count_block(system)))
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            if not content:
                units.append((("message", role, True, None), MESSAGE_OVERHEAD))
            for j, block in enumerate(content):
                tokens = counter.count_block(block) + (MESSAGE_OVERHEAD if j == 0 else 0)
                units.append((("message", role, j == 0, strip_markers(block)), tokens))
        elif content is None:
            units.append((("message", role, True, None), MESSAGE_OVERHEAD))
        else:
            units.append(
                (("message", role, True, content), MESSAGE_OVERHEAD + counter.count_block(content))
            )
    return units


def shared_prefix_tokens(
    previous: Sequence[tuple[Unit, int]] | None, current: Sequence[tuple[Unit, int]]
) -> int:
    """Tokens of ``current``'s longest block-level prefix equal to ``previous``'s."""
    if previous is None:
        return 0
    shared = 0
    for (a, _), (b, tokens) in zip(previous, current, strict=False):
        if a != b:
            break
        shared += tokens
    return shared


# --- the replay ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnFigures:
    """One request of the replay."""

    turn: int  # 1-based request number
    messages: int  # k: the request is messages[:k]
    forwarded_messages: int  # messages in the view the proxy would forward
    tokens_before: int
    tokens_after: int
    layers: tuple[str, ...]
    plan: str  # new / reused / none
    summary: str  # ok / failed / skipped
    summary_call: bool
    compaction_id: str | None
    over_hard_limit: bool  # the edge would answer 400 and forward nothing
    forwarded: bool
    valid: bool | None  # validate_messages on the forwarded view (None: not forwarded)
    violation: str | None
    request_tokens: int  # the forwarded request (tools + system + view), counted again
    prefix_tokens: int  # of it, the block-level prefix shared with the previous forwarded one
    client_compacted: CompactionBoundary | None  # the source's client compacted before this
    source_context_tokens: int | None  # the source's own context size for this request
    seconds: float
    summary_calls: int = 0  # summariser calls this request made (a chain when > 1)
    # compaction events that removed messages (prune / summarize): how many client messages
    # left the view, and how many of them reached a summary that is in the view (read from the
    # summariser's inputs that were answered: each message is labelled there)
    removed_messages: int | None = None
    summarised_messages: int | None = None

    @property
    def event(self) -> bool:
        return self.plan == "new"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["layers"] = list(self.layers)
        data["compaction_event"] = self.event
        data["prefix_share"] = (
            self.prefix_tokens / self.request_tokens if self.request_tokens else None
        )
        return data


@dataclass(frozen=True, slots=True)
class ReplayResult:
    conversation: Conversation
    policy: CompactionPolicy
    summariser: str
    offline: bool
    turns: tuple[TurnFigures, ...]
    seconds: float
    summary_failures: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    # --- totals ---
    @property
    def compaction_events(self) -> int:
        return sum(t.event for t in self.turns)

    @property
    def summary_calls(self) -> int:
        return sum(t.summary_calls for t in self.turns)

    @property
    def invalid_views(self) -> int:
        return sum(t.valid is False for t in self.turns)

    @property
    def over_hard_limit(self) -> int:
        return sum(t.over_hard_limit for t in self.turns)

    @property
    def prefix_stable_share(self) -> float:
        total = sum(t.request_tokens for t in self.turns if t.forwarded)
        shared = sum(t.prefix_tokens for t in self.turns if t.forwarded)
        return shared / total if total else 1.0

    @property
    def prefix_share_from_first_compaction(self) -> float | None:
        """The prefix-stable share over the requests after the first compaction event (that
        event's own request, a cache miss by design, left out; later events counted); ``None``
        when no request follows an event."""
        first = next((i for i, t in enumerate(self.turns) if t.event), None)
        if first is None or first + 1 >= len(self.turns):
            return None
        turns = [t for t in self.turns[first + 1 :] if t.forwarded]
        total = sum(t.request_tokens for t in turns)
        return sum(t.prefix_tokens for t in turns) / total if total else 1.0

    def totals(self) -> dict[str, Any]:
        turns = self.turns
        last = turns[-1] if turns else None
        plans = Counter(t.plan for t in turns)
        summaries = Counter(t.summary for t in turns if t.summary_call)
        layers: Counter[str] = Counter()
        for t in turns:
            if t.event:
                layers.update(t.layers)
        violations = [t.violation for t in turns if t.violation]
        before_sum = sum(t.tokens_before for t in turns)
        after_sum = sum(t.tokens_after for t in turns if t.forwarded)
        return {
            "requests": len(turns),
            "messages": len(self.conversation.messages),
            "tool_uses": self.conversation.tool_uses,
            "tokens_before_final": last.tokens_before if last else 0,
            "tokens_after_final": last.tokens_after if last else 0,
            "tokens_before_max": max((t.tokens_before for t in turns), default=0),
            "tokens_after_max": max((t.tokens_after for t in turns if t.forwarded), default=0),
            "tokens_before_sum": before_sum,
            "tokens_after_sum": after_sum,
            "compaction_events": self.compaction_events,
            "plans": {k: plans.get(k, 0) for k in ("new", "reused", "none")},
            "layers_in_events": dict(layers),
            "summary_calls": self.summary_calls,
            "summary_calls_max_per_event": max((t.summary_calls for t in turns), default=0),
            "removed_messages": sum(t.removed_messages or 0 for t in turns),
            "summarised_messages": sum(t.summarised_messages or 0 for t in turns),
            "events_summarised_short": sum(
                t.removed_messages is not None and t.summarised_messages != t.removed_messages
                for t in turns
            ),
            "summaries": {k: summaries.get(k, 0) for k in ("ok", "failed")},
            "invalid_views": self.invalid_views,
            "first_violation": violations[0] if violations else None,
            "over_hard_limit_turns": self.over_hard_limit,
            "over_threshold_turns": sum(
                t.forwarded and t.tokens_after > self.policy.threshold for t in turns
            ),
            "prefix_shared_tokens": sum(t.prefix_tokens for t in turns if t.forwarded),
            "prefix_request_tokens": sum(t.request_tokens for t in turns if t.forwarded),
            "prefix_stable_share": self.prefix_stable_share,
            "prefix_stable_share_from_first_compaction": self.prefix_share_from_first_compaction,
            "seconds": self.seconds,
        }


def _boundary_turns(
    boundaries: Sequence[CompactionBoundary], ks: Sequence[int]
) -> dict[int, CompactionBoundary]:
    """For each source compaction, the request the source's client sent right after it: the
    first ``messages[:k]`` with ``k >= message_index`` (it produced ``messages[message_index]``)."""
    out: dict[int, CompactionBoundary] = {}
    for b in boundaries:
        k = next((k for k in ks if k >= b.message_index), None)
        if k is not None:
            out.setdefault(k, b)
    return out


def run_replay(
    conversation: Conversation,
    policy: CompactionPolicy,
    summariser: Summariser,
    *,
    offline: bool,
    counter: TokenCounter | None = None,
    plans: PlanCache | None = None,
    progress: bool = False,
    max_plans: int = 10_000,
) -> ReplayResult:
    """Replay every request of ``conversation`` through the engine; see the module docstring."""
    from tqdm import tqdm

    counter = counter if counter is not None else TokenCounter()
    plans = plans if plans is not None else PlanCache(max_plans)
    messages = conversation.messages
    system, tools = conversation.system, conversation.tools
    model = conversation.model or REPLAY_MODEL
    ks = [k for k in range(1, len(messages) + 1) if messages[k - 1].get("role") == "user"]
    client_compactions = _boundary_turns(conversation.boundaries, ks)
    failures: list[str] = []
    turns: list[TurnFigures] = []
    previous: list[tuple[Unit, int]] | None = None
    started = time.perf_counter()
    bar = tqdm(
        ks,
        desc="replay",
        unit="req",
        disable=not progress,
        leave=False,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    try:
        for turn, k in enumerate(bar, start=1):
            t0 = time.perf_counter()
            request = messages[:k]
            outcome = compact(
                CompactionInput(system, tools, request, model), policy, counter, plans, TENANT
            )
            calls = 0
            answered: set[int] = set()  # message labels of the inputs the summariser answered
            while not isinstance(outcome, Done):
                if isinstance(outcome, NeedsNaming):  # offline: no transcript, nothing named
                    outcome = named(outcome.continuation, {})
                    continue
                calls += 1
                asked = outcome.summary_request
                if isinstance(asked, CompactionCall):  # offline: the provider's own summary
                    outcome = step(outcome.continuation, None)  # cannot be had: the fallback
                    continue
                text = summariser(asked)
                if text is not None and text.strip():
                    answered.update(int(x) for x in LABEL.findall(asked.text))
                outcome = step(outcome.continuation, text)
            result: CompactionResult = outcome.result
            removed, summarised = _event_messages(result, answered)
            forwarded = not result.over_hard_limit
            view = result.messages if result.changed else list(request)
            violation = validate_messages(list(view)) if forwarded else None
            units = request_units(system, tools, view, counter)
            request_tokens = sum(t for _, t in units)
            prefix = shared_prefix_tokens(previous, units) if forwarded else 0
            if forwarded:
                previous = units
            turns.append(
                TurnFigures(
                    turn=turn,
                    messages=k,
                    forwarded_messages=len(view),
                    tokens_before=result.tokens_before,
                    tokens_after=result.tokens_after,
                    layers=tuple(result.layers),
                    plan=result.plan_status,
                    summary=result.summary_status,
                    summary_call=calls > 0,
                    compaction_id=result.compaction_id if result.changed else None,
                    over_hard_limit=result.over_hard_limit,
                    forwarded=forwarded,
                    valid=(violation is None) if forwarded else None,
                    violation=violation.message if violation is not None else None,
                    request_tokens=request_tokens,
                    prefix_tokens=prefix,
                    client_compacted=client_compactions.get(k),
                    source_context_tokens=conversation.source_context.get(k),
                    seconds=time.perf_counter() - t0,
                    summary_calls=calls,
                    removed_messages=removed,
                    summarised_messages=summarised,
                )
            )
            if progress:
                bar.set_postfix(
                    tokens=f"{result.tokens_before}->{result.tokens_after}",
                    events=sum(t.event for t in turns),
                    refresh=False,
                )
    finally:
        bar.close()
    fails = getattr(summariser, "failures", None)
    if isinstance(fails, list):
        failures.extend(str(f) for f in fails)
    return ReplayResult(
        conversation=conversation,
        policy=policy,
        summariser=summariser.name,
        offline=offline,
        turns=tuple(turns),
        seconds=time.perf_counter() - started,
        summary_failures=tuple(failures),
    )


def _event_messages(
    result: CompactionResult, answered: set[int]
) -> tuple[int | None, int | None]:
    """``(removed, summarised)`` for a new plan whose last record removed whole messages."""
    if result.plan_status != "new" or not result.manifest:
        return None, None
    record = result.manifest[-1]
    if isinstance(record, Summarized):
        indices = set(record.message_indices)
        return len(indices), len(indices & answered)
    if isinstance(record, Removed) and record.reason == "prune":
        return len(set(record.message_indices)), 0
    return None, None


def with_overrides(
    policy: CompactionPolicy, threshold: int | None, hard_limit: int | None
) -> CompactionPolicy:
    """``policy`` with the command line's ``--threshold`` / ``--hard-limit`` (validated again)."""
    changes: dict[str, int] = {}
    if threshold is not None:
        changes["threshold"] = threshold
    if hard_limit is not None:
        changes["hard_limit"] = hard_limit
    return dataclasses.replace(policy, **changes) if changes else policy  # type: ignore[arg-type]
