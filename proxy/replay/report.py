"""What a replay found, for people (a table and totals), for programs (JSON) and as a figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from proxy.replay.runner import OFFLINE_NOTE, ReplayResult, TurnFigures

__all__ = ["PlotUnavailable", "format_report", "plot_tokens", "to_json", "write_json"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install 'context-proxy[plot]'``)."""


def _reader_line(result: ReplayResult) -> str:
    conv = result.conversation
    parts = [f"{len(conv.messages)} messages", f"{conv.tool_uses} tool_use"]
    if conv.format == "claude-code-jsonl":
        parts.append(f"{conv.invalid_lines} invalid lines skipped")
    stats = conv.stats
    for key, label in (
        ("assistant_lines_merged", "assistant lines merged"),
        ("thinking_blocks_dropped", "thinking blocks dropped"),
        ("sidechain_lines_skipped", "sidechain lines skipped"),
        ("missing_tool_results_synthesised", "missing tool results synthesised"),
        ("orphan_tool_results_dropped", "orphan tool results dropped"),
    ):
        if stats.get(key):
            parts.append(f"{stats[key]} {label}")
    return f"{conv.format}: " + ", ".join(parts)


def to_json(result: ReplayResult) -> dict[str, Any]:
    conv = result.conversation
    policy = result.policy
    return {
        "source": conv.source,
        "format": conv.format,
        "model": conv.model,
        "summariser": result.summariser,
        "offline": result.offline,
        "summary_note": OFFLINE_NOTE if result.offline else None,
        "summary_failures": list(result.summary_failures),
        "notes": list(result.notes),
        "policy": {
            "threshold": policy.threshold,
            "hard_limit": policy.hard_limit,
            "target_ratio": policy.target_ratio,
            "target": policy.target,
            "tool_result_cap": policy.tool_result_cap,
            "keep_recent": policy.keep_recent,
            "summarize": policy.summarize,
            "summary_model": policy.summary_model,
            "summary_max_tokens": policy.summary_max_tokens,
        },
        "reader": {
            "messages": len(conv.messages),
            "tool_uses": conv.tool_uses,
            "invalid_lines": conv.invalid_lines,
            "stats": dict(conv.stats),
            "client_compactions": [
                {
                    "message_index": b.message_index,
                    "line": b.line,
                    "trigger": b.trigger,
                    "pre_tokens": b.pre_tokens,
                    "request": next(
                        (t.turn for t in result.turns if t.client_compacted == b), None
                    ),
                }
                for b in conv.boundaries
            ],
        },
        "totals": result.totals(),
        "turns": [t.to_json() for t in result.turns],
    }


def write_json(result: ReplayResult, path: str | Path) -> None:
    Path(path).write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2) + b"\n")


def _notes(t: TurnFigures, threshold: int) -> str:
    notes: list[str] = []
    if t.event:
        notes.append(f"COMPACTED {(t.compaction_id or '')[:12]}".rstrip())
    if t.summary_call:
        calls = f", {t.summary_calls} calls" if t.summary_calls > 1 else ""
        notes.append(f"summary {t.summary}{calls}")
    if t.removed_messages is not None:
        notes.append(f"removed {t.removed_messages}, summarised {t.summarised_messages}")
    if t.over_hard_limit:
        notes.append("OVER HARD LIMIT: 400, not forwarded")
    elif t.tokens_after > threshold:
        notes.append("forwarded over the threshold (the layers found nothing to cut)")
    if t.valid is False:
        notes.append(f"INVALID VIEW: {t.violation}")
    if t.client_compacted is not None:
        pre = t.client_compacted.pre_tokens
        notes.append(
            "source client compacted before this request"
            + (f" (its count: {pre:,})" if pre is not None else "")
        )
    return "; ".join(notes)


def _row(t: TurnFigures, with_source: bool, threshold: int) -> str:
    share = f"{100 * t.prefix_tokens / t.request_tokens:5.1f}%" if t.request_tokens else "   - "
    layers = ",".join(t.layers) or "-"
    source = ""
    if with_source:
        source = f" {t.source_context_tokens:>8,}" if t.source_context_tokens else f" {'':>8}"
    return (
        f"{t.turn:>5} {t.messages:>5} {t.tokens_before:>9,} {t.tokens_after:>9,}{source} "
        f"{t.plan:<7} {layers:<28} {share}  {_notes(t, threshold)}"
    ).rstrip()


def _selected(turns: tuple[TurnFigures, ...], max_rows: int) -> tuple[list[TurnFigures], int]:
    """All turns when few; else turns with events plus every Nth (and the first and last)."""
    if len(turns) <= max_rows:
        return list(turns), 1
    every = max(1, math.ceil(len(turns) / max(1, max_rows // 2)))
    keep = [
        t
        for i, t in enumerate(turns)
        if i == 0
        or i == len(turns) - 1
        or i % every == 0
        or t.event
        or t.summary_call
        or t.valid is False
        or t.over_hard_limit
        or t.client_compacted is not None
    ]
    return keep, every


def format_report(result: ReplayResult, max_rows: int = 40) -> str:
    conv = result.conversation
    policy = result.policy
    totals = result.totals()
    lines = [
        f"replay of {conv.source}",
        f"  read: {_reader_line(result)}",
        (
            f"  policy: threshold {policy.threshold:,}, hard limit {policy.hard_limit:,}, target "
            f"{policy.target:,} (ratio {policy.target_ratio}), keep_recent {policy.keep_recent}, "
            f"summary model {policy.summary_model}"
        ),
        f"  summaries: {OFFLINE_NOTE if result.offline else result.summariser}",
        "  tokens: the proxy's estimates (cl100k, calibration 1.0), not the provider's counts",
        *(f"  note: {n}" for n in result.notes),
        "",
    ]
    with_source = any(t.source_context_tokens for t in result.turns)
    head = f"{'turn':>5} {'msgs':>5} {'before':>9} {'after':>9}"
    if with_source:
        head += f" {'src ctx':>8}"
    head += f" {'plan':<7} {'layers':<28} {'prefix':>6}  notes"
    lines.append(head)
    shown, every = _selected(result.turns, max_rows)
    for t in shown:
        lines.append(_row(t, with_source, policy.threshold))
    if len(shown) < len(result.turns):
        lines.append(
            f"  ({len(shown)} of {len(result.turns)} requests shown: every {every}th plus every "
            "request with an event; --json has them all)"
        )
    if with_source:
        lines.append("  src ctx: the source's own recorded context size for that request")
    plans = totals["plans"]
    layers = ", ".join(f"{k} {v}" for k, v in totals["layers_in_events"].items()) or "-"
    before_sum, after_sum = totals["tokens_before_sum"], totals["tokens_after_sum"]
    saved = f" ({100 * (1 - after_sum / before_sum):.1f}% less)" if before_sum else ""
    forwarded = sum(t.forwarded for t in result.turns)
    lines += [
        "",
        "totals",
        f"  requests                  {totals['requests']}",
        (
            f"  last request              {totals['tokens_before_final']:,} tokens before, "
            f"{totals['tokens_after_final']:,} after"
        ),
        (
            f"  largest request           {totals['tokens_before_max']:,} before; largest "
            f"forwarded {totals['tokens_after_max']:,}"
        ),
        f"  input over the replay     {before_sum:,} before, {after_sum:,} forwarded{saved}",
        (
            f"  compaction events         {totals['compaction_events']} (plans: new {plans['new']}, "
            f"reused {plans['reused']}, none {plans['none']})"
        ),
        f"  layers in events          {layers}",
        (
            f"  summary calls             {totals['summary_calls']} (ok {totals['summaries']['ok']}, "
            f"failed {totals['summaries']['failed']}; at most {totals['summary_calls_max_per_event']}"
            " per event)"
        ),
        (
            f"  forwarded views valid     {forwarded - totals['invalid_views']}/{forwarded} "
            f"(invalid {totals['invalid_views']})"
        ),
        f"  over hard limit           {totals['over_hard_limit_turns']}",
        f"  forwarded over threshold  {totals['over_threshold_turns']}",
        (
            f"  prefix-stable share       {totals['prefix_stable_share']:.3f} (token-weighted: "
            "tokens each request shares, block by block, with the previous forwarded one)"
        ),
        (
            "  after the 1st compaction  "
            + (
                f"{totals['prefix_stable_share_from_first_compaction']:.3f}"
                if totals["prefix_stable_share_from_first_compaction"] is not None
                else "- (no compaction)"
            )
        ),
        (
            f"  removed / summarised      {totals['removed_messages']} / "
            f"{totals['summarised_messages']} messages (events where they differ: "
            f"{totals['events_summarised_short']})"
        ),
        f"  time                      {totals['seconds']:.1f} s",
    ]
    if totals["first_violation"]:
        lines.append(f"  first violation           {totals['first_violation']}")
    if result.summary_failures:
        lines.append(f"  summary call failures     {', '.join(result.summary_failures)}")
    for b in conv.boundaries:
        turn = next((t for t in result.turns if t.client_compacted == b), None)
        where = f"message {b.message_index}"
        own = f", its own count {b.pre_tokens:,} tokens" if b.pre_tokens is not None else ""
        if turn is None:
            lines.append(f"  source client compacted   before {where} ({b.trigger or '?'}{own})")
            continue
        lines.append(
            f"  source client compacted   before {where} = request {turn.turn} "
            f"({b.trigger or '?'}{own}); the proxy would forward {turn.tokens_after:,} "
            f"of {turn.tokens_before:,} there"
        )
    return "\n".join(lines)


def plot_tokens(result: ReplayResult, path: str | Path) -> None:
    """Tokens per request before and after compaction, compaction events marked (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'context-proxy[plot]'") from exc
    turns = result.turns
    x = [t.turn for t in turns]
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    ax.plot(x, [t.tokens_before for t in turns], label="before (client request)", color="#888888")
    ax.plot(x, [t.tokens_after for t in turns], label="after (forwarded)", color="#1f77b4")
    if any(t.source_context_tokens for t in turns):
        sx = [t.turn for t in turns if t.source_context_tokens]
        sy = [t.source_context_tokens for t in turns if t.source_context_tokens]
        ax.plot(sx, sy, label="source's recorded context", color="#bbbbbb", linestyle=":")
    events = [t for t in turns if t.event]
    if events:
        ax.scatter(
            [t.turn for t in events],
            [t.tokens_after for t in events],
            marker="v",
            color="#d62728",
            zorder=3,
            label="compaction event",
        )
        for t in events:
            ax.axvline(t.turn, color="#d62728", alpha=0.25, linewidth=1)
    for t in turns:
        if t.client_compacted is not None:
            ax.axvline(t.turn, color="#2ca02c", linestyle="--", linewidth=1.2)
            ax.annotate(
                "source client compacted",
                (t.turn, ax.get_ylim()[1] * 0.95),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color="#2ca02c",
            )
    policy = result.policy
    ax.axhline(policy.threshold, color="#ff7f0e", linestyle="--", linewidth=1, label="threshold")
    if policy.hard_limit <= 2 * max((t.tokens_before for t in turns), default=0):
        ax.axhline(
            policy.hard_limit, color="#9467bd", linestyle=":", linewidth=1, label="hard limit"
        )
    ax.set_xlabel("request (turn)")
    ax.set_ylabel("tokens (proxy estimate)")
    title = Path(result.conversation.source).name
    ax.set_title(
        f"{title}: tokens per request" + (" (offline summaries)" if result.offline else "")
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))
    plt.close(fig)
