"""Replay figures of issue 10: every shipped transcript at the default and a low threshold.

    python bench/replay_figures.py [--json out.json]

For each conversation in ``tests/data/transcripts`` (and the raw Claude Code session in
``tests/data/claude-code-sessions``), offline (the deterministic extractive summariser; no
network), with the built-in configuration (hard limit ``auto`` for the conversation's model,
``max_tokens`` 32,000) and only the threshold changed: compaction events, summary calls (total
and the most one event made), removed and summarised messages (the summariser's inputs label
each message; an event is short when a removed message reached no answered call), invalid
views, and the prefix-stable share after the first compaction (every forwarded request after the
first event's own, token-weighted: what the provider's prompt cache can reuse).

The low threshold is the lowest at which each conversation compacts several times: 40,000 for
the 100k-token Claude Code session, 4,000 / 3,000 for the two small ones (their whole length is
~8k / ~12k tokens). A compact summariser input budget (``--input-budget``, default the built-in
24,000) shows chains at work: ``--input-budget 4000``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config.compaction import limits_for, policy_from_config  # noqa: E402
from proxy.config.settings import CompactionConfig, SummaryConfig  # noqa: E402
from proxy.core.tokens import TokenCounter  # noqa: E402
from proxy.replay.readers import load_conversation  # noqa: E402
from proxy.replay.runner import ExtractiveSummariser, run_replay  # noqa: E402

DATA = ROOT / "tests" / "data"
CASES: list[tuple[str, tuple[int, ...]]] = [
    ("transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json", (80_000, 40_000)),
    ("claude-code-sessions/3af9b1a7-6512-4883-ad18-320658ced099.jsonl", (80_000, 40_000)),
    ("transcripts/sweagent_marshmallow1867_function_calling.json", (80_000, 4_000)),
    ("transcripts/tau_bench_gpt4o_airline_task2.json", (80_000, 3_000)),
]


def figures(path: Path, threshold: int, input_budget: int) -> dict[str, Any]:
    conversation = load_conversation(path)
    config = CompactionConfig(
        threshold=threshold, summary=SummaryConfig(input_budget=input_budget)
    )
    limits = limits_for(config, conversation.model or "claude-sonnet-4-5", (), 32_000)
    policy = policy_from_config(config, limits)
    counter = TokenCounter()
    result = run_replay(
        conversation, policy, ExtractiveSummariser(counter.count_text), offline=True, counter=counter
    )
    totals = result.totals()
    events = [t for t in result.turns if t.removed_messages is not None]
    return {
        "conversation": path.name,
        "threshold": policy.threshold,
        "hard_limit": policy.hard_limit,
        "input_budget": input_budget,
        "requests": totals["requests"],
        "events": totals["compaction_events"],
        "summary_calls": totals["summary_calls"],
        "calls_per_event_max": totals["summary_calls_max_per_event"],
        "removed": totals["removed_messages"],
        "summarised": totals["summarised_messages"],
        "events_short": totals["events_summarised_short"],
        "per_event": [
            {
                "request": t.turn,
                "removed_messages": t.removed_messages,
                "summarised_messages": t.summarised_messages,
                "summary_calls": t.summary_calls,
            }
            for t in events
        ],
        "invalid_views": totals["invalid_views"],
        "over_threshold": totals["over_threshold_turns"],
        "share_after_first": totals["prefix_stable_share_from_first_compaction"],
        "share_all": totals["prefix_stable_share"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--input-budget", type=int, default=SummaryConfig().input_budget)
    args = parser.parse_args()
    rows = [
        figures(DATA / name, threshold, args.input_budget)
        for name, thresholds in CASES
        for threshold in thresholds
    ]
    print(
        "| conversation | threshold | requests | events | summary calls (max/event) |"
        " removed = summarised | short events | invalid views | share after 1st compaction |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = "-" if r["share_after_first"] is None else f"{r['share_after_first']:.3f}"
        print(
            f"| {r['conversation'][:40]} | {r['threshold']:,} | {r['requests']} | {r['events']} |"
            f" {r['summary_calls']} ({r['calls_per_event_max']}) | {r['removed']} ="
            f" {r['summarised']} | {r['events_short']} | {r['invalid_views']} | {share} |"
        )
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
    bad = [r for r in rows if r["events_short"] or r["invalid_views"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())


