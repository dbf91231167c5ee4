#!/usr/bin/env python
"""Benchmark: the edge's work on a request body before compaction, for every JSON style.

    python bench/bench_parse.py [--compare-root /path/to/other/checkout] [--quick] [--json out.json]

In process, no HTTP. The shipped Claude Code transcript is replayed: request k is
``messages[:k]`` for each k ending on a user turn, the body ``model``, ``messages``, ``system``,
``tools``, ``max_tokens``, written in each style:

* ``compact``  -- ``orjson.dumps`` (as Claude Code writes);
* ``spaced``   -- ``json.dumps`` defaults (``", "``, ``": "``, ASCII escapes);
* ``ascii``    -- ``json.dumps(separators=(",", ":"))``: compact, ASCII escapes;
* ``sorted``   -- ``json.dumps(sort_keys=True)``;
* ``indent``   -- ``json.dumps(indent=2)``.

The work timed per request is what ``handle_messages`` does before compaction:
``parse_messages_body`` (through the app's ``BodyMemo``, shipped settings), the nesting check,
``scan_messages`` from the memo's checkpoint, ``parsed.remember``. CPU time of the thread
(``time.thread_time_ns``, so that other processes on a busy machine count less), per request.

* **in order**: the whole replay on a fresh memo, request after request (the memo remembers from
  64 KiB on: the early turns are parsed in full by both); mean and p50 over the requests (each
  request's median over ``--repeats`` replays), and how many messages were reused in total.
* ``--pause-ms``: each timed request comes after the process slept that long, as in the proxy,
  whose loop waits in ``epoll`` while the client, the upstream and the floor run: the same work
  then costs several times its back-to-back figure (caches and branch predictors cold, the core
  perhaps clocked down), which is why the stages measured inside the bench's proxy are dearer
  than here without it.
* **cold**: the last turn (~310 KB), each time under a new scope on an empty memo, after a full
  garbage collection (never seen: a full parse and learning where its elements end); median
  over ``--cold-runs``, split by step.

Each checkout runs in its own subprocess (``sys.path[0]`` = its root, so ``proxy`` is imported
from there), ``--rounds`` times per style, alternating between the two (each figure reported is
its lowest over the rounds), so the comparison is side by side in one run: this checkout ("this") and ``--compare-root`` ("other", e.g. main's code:
``mkdir /tmp/main-co && git archive main | tar -x -C /tmp/main-co``). No bytecode is written
into either.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPT = "tests/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json"
STYLES = ("compact", "spaced", "ascii", "sorted", "indent")


def _writer(style: str) -> Any:
    import orjson

    return {
        "compact": orjson.dumps,
        "spaced": lambda v: json.dumps(v).encode(),
        "ascii": lambda v: json.dumps(v, separators=(",", ":")).encode(),
        "sorted": lambda v: json.dumps(v, sort_keys=True).encode(),
        "indent": lambda v: json.dumps(v, indent=2).encode(),
    }[style]


def _bodies(transcript: Path, style: str) -> list[bytes]:
    from proxy.replay.readers import load_conversation

    conv = load_conversation(transcript)
    write = _writer(style)
    out = []
    for k in range(1, len(conv.messages) + 1):
        if conv.messages[k - 1]["role"] != "user":
            continue
        body: dict[str, Any] = {"model": "claude-sonnet-4-5", "messages": conv.messages[:k]}
        if conv.system is not None:
            body["system"] = conv.system
        body["tools"] = conv.tools
        body["max_tokens"] = 32000
        out.append(write(body))
    return out


def _worker(
    root: str, style: str, transcript: str, repeats: int, cold_runs: int, pause_ms: float = 0.0
) -> dict[str, Any]:
    """Runs in a subprocess with ``root`` first on ``sys.path``."""
    sys.path.insert(0, root)
    import proxy
    from proxy.core.nesting import nesting_violation
    from proxy.core.protocol import scan_messages
    from proxy.core.reparse import BodyMemo
    from proxy.server.exchange.stages.validate import CHECKPOINTS_KEPT, parse_messages_body

    assert Path(proxy.__file__).resolve().is_relative_to(Path(root).resolve()), proxy.__file__
    members_arg = len(inspect.signature(nesting_violation).parameters) >= 3
    texts = _bodies(Path(root) / transcript if not Path(transcript).is_absolute() else Path(transcript), style)
    clock = time.thread_time_ns

    def edge(memo: Any, scope: str, text: bytes, steps: list[int] | None = None) -> int:
        """The edge's steps (as ``handle_messages``); returns the messages reused."""
        t0 = clock()
        parsed = parse_messages_body(text, memo, scope)
        t1 = clock()
        body = parsed.body
        n = len(body["messages"])
        keep = range(max(0, n - CHECKPOINTS_KEPT), n + 1) if parsed.rememberable else ()
        if members_arg:
            too_deep = nesting_violation(body, parsed.reused, parsed.reused_members)
        else:
            too_deep = nesting_violation(body, parsed.reused)
        t2 = clock()
        violation, checkpoints = scan_messages(body["messages"], parsed.checkpoint, keep)
        t3 = clock()
        assert too_deep is None and violation is None, (too_deep, violation)
        parsed.remember(checkpoints)
        t4 = clock()
        if steps is not None:
            steps += [t1 - t0, t2 - t1, t3 - t2, t4 - t3]
        return int(parsed.reused)

    gc.collect()
    gc.freeze()
    per_request: list[list[int]] = [[] for _ in texts]
    reused = 0
    for _ in range(repeats):
        memo = BodyMemo()
        reused = 0
        for i, text in enumerate(texts):
            if pause_ms:
                time.sleep(pause_ms / 1000)
            t = clock()
            reused += edge(memo, "s", text)
            per_request[i].append(clock() - t)
    in_order = [statistics.median(times) / 1e6 for times in per_request]
    cold: list[list[int]] = []
    for run in range(cold_runs):
        memo = BodyMemo()  # (a memo full of other bodies would add their garbage collection)
        gc.collect()
        if pause_ms:
            time.sleep(pause_ms / 1000)
        steps: list[int] = []
        edge(memo, f"cold-{run}", texts[-1], steps)
        cold.append(steps)
    cold_steps = [statistics.median(s[i] for s in cold) / 1e6 for i in range(4)]
    cold_total = statistics.median(sum(s) for s in cold) / 1e6
    return {
        "style": style,
        "requests": len(texts),
        "last_bytes": len(texts[-1]),
        "last_messages": len(json.loads(texts[-1])["messages"]),
        "reused_total": reused,
        "in_order_mean_ms": statistics.fmean(in_order),
        "in_order_p50_ms": statistics.median(in_order),
        "in_order_sum_ms": sum(in_order),
        "cold_ms": cold_total,
        "cold_steps_ms": dict(zip(("parse", "nesting", "scan", "remember"), cold_steps, strict=True)),
    }


def _run(root: Path, args: argparse.Namespace, style: str) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_worker",
        str(root),
        "--_style",
        style,
        "--transcript",
        args.transcript,
        "--repeats",
        str(args.repeats),
        "--cold-runs",
        str(args.cold_runs),
        "--pause-ms",
        str(args.pause_ms),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(command, check=True, capture_output=True, env=env, cwd=root)
    return dict(json.loads(out.stdout))


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's lowest over the rounds (the least disturbed by other processes)."""
    out = dict(runs[0])
    for key in ("in_order_mean_ms", "in_order_p50_ms", "in_order_sum_ms", "cold_ms"):
        out[key] = min(r[key] for r in runs)
    out["cold_steps_ms"] = {k: min(r["cold_steps_ms"][k] for r in runs) for k in out["cold_steps_ms"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare-root", type=Path, help="another checkout, run side by side")
    parser.add_argument("--transcript", default=TRANSCRIPT)
    parser.add_argument("--styles", default=",".join(STYLES))
    parser.add_argument("--repeats", type=int, default=5, help="replays in order per checkout")
    parser.add_argument("--cold-runs", type=int, default=41)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per checkout")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 replays, 11 cold runs")
    parser.add_argument("--pause-ms", type=float, default=0.0,
                        help="sleep this long before each timed request, as the proxy's process idles between "
                             "requests while the client, the upstream and the floor run (2: about the bench's "
                             "rhythm); 0: back to back, caches hot")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_style", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        print(json.dumps(_worker(args._worker, args._style, args.transcript, args.repeats, args.cold_runs,
                                 args.pause_ms)))
        return
    if args.quick:
        args.rounds, args.repeats, args.cold_runs = 1, 2, 11
    roots = {"this": ROOT}
    if args.compare_root is not None:
        roots["other"] = args.compare_root.resolve()
    results: dict[str, dict[str, Any]] = {label: {} for label in roots}
    print(
        f"transcript {args.transcript}; rounds {args.rounds}, each: {args.repeats} replays in order,"
        f" {args.cold_runs} cold runs; each figure the lowest over the rounds"
        + (f"; {args.pause_ms:g} ms idle before each request" if args.pause_ms else "")
    )
    print(f"{'style':8} {'code':6} {'in order: mean':>15} {'p50':>7} {'reused':>8}   {'cold':>7}"
          f"   {'parse':>6} {'nesting':>7} {'scan':>6} {'remember':>8}   (ms of CPU per request)")
    for style in args.styles.split(","):
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in roots}
        for _ in range(args.rounds):  # alternating, so that a busy moment hits both alike
            for label, root in roots.items():
                runs[label].append(_run(root, args, style))
        for label in roots:
            r = _best(runs[label])
            results[label][style] = r
            s = r["cold_steps_ms"]
            print(
                f"{style:8} {label:6} {r['in_order_mean_ms']:15.3f} {r['in_order_p50_ms']:7.3f}"
                f" {r['reused_total']:8d}   {r['cold_ms']:7.3f}   {s['parse']:6.3f} {s['nesting']:7.3f}"
                f" {s['scan']:6.3f} {s['remember']:8.3f}",
                flush=True,
            )
        if "other" in results:
            a, b = results["this"][style], results["other"][style]
            print(
                f"{style:8} {'ratio':6} {a['in_order_mean_ms'] / b['in_order_mean_ms']:15.2f}"
                f" {a['in_order_p50_ms'] / b['in_order_p50_ms']:7.2f} {'':8}   {a['cold_ms'] / b['cold_ms']:7.2f}"
                "   (this / other)"
            )
    if args.json is not None:
        meta = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "when": time.time()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
