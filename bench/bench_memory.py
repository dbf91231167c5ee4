#!/usr/bin/env python
"""Benchmark: the proxy's memory (RSS) at rest, after ordinary requests and after a burst.

    python bench/bench_memory.py [--streams 1000] [--allocators pymalloc,malloc] [--json out.json]

Starts ``python -m proxy serve`` with the shipped defaults (a state dir in a temp dir; only
``upstream.pool_size`` raised so that the burst's streams are really simultaneous) against the
fake upstream of bench/bench_proxy.py in its own process, and reads the proxy's VmRSS and VmHWM
from /proc/<pid>/status. It does so once per allocator, one proxy process after the other in
the same run: ``pymalloc`` (``PYTHONMALLOC`` unset, the interpreter's default) and ``malloc``
(``PYTHONMALLOC=malloc``, what the Docker image sets). The phases:

* ``rest``: after start-up and ``--rest`` seconds idle;
* ``warm``: after ``--warmup`` ordinary requests (1 KB JSON and 200-event SSE, alternating),
  plus ``--settle`` seconds;
* ``burst``: after ``--streams`` simultaneous SSE streams (bench_proxy's ``run_concurrency``:
  the upstream holds them until all arrived, every answer checked byte for byte) ended, plus
  ``--burst-settle`` seconds (70: the goal is <= 1.1x rest by then).

It prints MB and the ratios to rest. Then, in fresh interpreters, what parts of the process
cost: the app's modules imported, the tokenizer loaded (as ``warm_up`` does at start-up), and
``anthropic`` (the SDK the summary call used to be made with) imported with a client made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench.measure import API_HEADERS, run_concurrency  # noqa: E402
from bench.servers import CHILDREN, allocator_env, raise_nofile, spawn_logged, spawn_upstream  # noqa: E402
from bench.workloads import build_body  # noqa: E402

MB = 1024 * 1024
GOAL_AFTER_BURST = 1.10  # VmRSS after the burst (and --burst-settle seconds), ratio to rest


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of ``pid`` in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[name] = int(value.split()[0]) * 1024
    return out


def write_config(tmp: Path, upstream_url: str, streams: int) -> Path:
    cfg = {
        "listen": {"host": "127.0.0.1"},
        # the shipped pool (512) would queue half of a 1,000-stream burst behind the others
        "upstream": {"base_url": upstream_url, "pool_size": max(512, streams + 64)},
        "state_dir": str(tmp / "state"),
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "proxy.yaml"
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    return path


async def warm_up(url: str, n: int) -> int:
    """``n`` ordinary requests, one at a time: 1 KB JSON and 200-event SSE alternating."""
    body_json = build_body(1024, result_size=200)
    body_sse = build_body(1024, result_size=200, stream=True)
    failures = 0
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            sse = i % 2 == 1
            headers = {**API_HEADERS, "x-bench-mode": "sse" if sse else "json"}
            async with session.post(url + "/v1/messages", data=body_sse if sse else body_json,
                                    headers=headers) as r:
                await r.read()
                failures += r.status != 200
    return failures


async def burst(urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    conc = argparse.Namespace(conc_streams=args.streams, conc_events=args.events, conc_pace=args.pace)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await run_concurrency(session, urls, conc)


PARTS = r"""
import json, sys
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
out = {"python": rss()}
import proxy.server.app, proxy.cli.main
out["app_modules"] = rss()
out["anthropic_loaded_at_start"] = "anthropic" in sys.modules
if sys.argv[1] == "tokenizer":
    from proxy.core.tokens import TokenCounter
    TokenCounter().count_text("warm up")
    out["after"] = rss()
else:
    import anthropic
    anthropic.AsyncAnthropic(api_key="x", base_url="http://127.0.0.1:9")
    out["after"] = rss()
print(json.dumps(out))
"""


def part_costs() -> dict[str, Any]:
    """RSS deltas in fresh interpreters: the tokenizer; the anthropic SDK with a client."""
    res: dict[str, Any] = {}
    for what in ("tokenizer", "anthropic"):
        runs = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", PARTS, what], capture_output=True, text=True,
                                 check=True, cwd=ROOT)
            runs.append(json.loads(out.stdout))
        best = min(runs, key=lambda r: r["after"] - r["app_modules"])
        res[what] = {"delta_mb": (best["after"] - best["app_modules"]) / MB,
                     "app_modules_mb": best["app_modules"] / MB, "python_mb": best["python"] / MB,
                     "anthropic_loaded_at_start": best["anthropic_loaded_at_start"]}
    return res


# The allocators compared: the interpreter's own small-object allocator, and glibc's malloc (what
# the Docker image runs: ``ENV PYTHONMALLOC=malloc``).
ALLOCATORS = ("pymalloc", "malloc")


def spawn_proxy(name: str, cfg: Path, tmp: Path, allocator: str) -> Any:
    """``python -m proxy serve`` with ``PYTHONMALLOC`` set for ``allocator`` (unset: pymalloc)."""
    argv = [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(cfg)]
    return spawn_logged(name, argv, tmp, env=allocator_env(allocator))


def run_one(up_url: str, tmp: Path, allocator: str, args: argparse.Namespace) -> dict[str, Any]:
    """The phases for one proxy process (its own state dir), stopped at the end."""
    readings: dict[str, dict[str, int]] = {}
    cfg = write_config(tmp / allocator, up_url, args.streams)
    name = f"proxy-{allocator}"
    proxy = spawn_proxy(name, cfg, tmp, allocator)
    try:
        pid = proxy.proc.pid
        urls = {"direct": up_url, "proxy": proxy.url}
        time.sleep(args.rest)
        readings["rest"] = proc_status(pid)
        failures = asyncio.run(warm_up(proxy.url, args.warmup))
        time.sleep(args.settle)
        readings["warm"] = proc_status(pid)
        conc: dict[str, Any] | None = None
        if args.streams:
            conc = asyncio.run(burst(urls, args))
            readings["burst_end"] = proc_status(pid)
            time.sleep(args.burst_settle)
            readings["burst"] = proc_status(pid)
        if proxy.proc.poll() is not None:
            log_tail = proxy.log_path.read_text(errors="replace")[-2000:] if proxy.log_path else ""
            raise RuntimeError(f"the proxy died:\n{log_tail}")
    finally:
        CHILDREN.pop(name).stop()
    rest = readings["rest"]["VmRSS"]
    return {
        "readings_mb": {k: {n: v / MB for n, v in r.items()} for k, r in readings.items()},
        "ratio_to_rest": {k: r["VmRSS"] / rest for k, r in readings.items()},
        "warmup_failures": failures,
        "burst": conc and {k: conc[k] for k in ("streams", "wall_s", "results", "mismatches", "errors",
                                                  "upstream_peak_simultaneous")},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_nofile()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up = spawn_upstream()
            CHILDREN["upstream"] = up
            for allocator in args.allocators:
                results[allocator] = run_one(up.url, tmp, allocator, args)
        finally:
            for child in reversed(list(CHILDREN.values())):
                child.stop()
    return {
        "allocators": results,
        "parts": part_costs() if args.parts else None,
        "args": vars(args),
    }


def report(res: dict[str, Any]) -> None:
    for allocator, one in res["allocators"].items():
        print(f"-- {allocator} (PYTHONMALLOC={'unset' if allocator == 'pymalloc' else allocator})")
        print(f"{'phase':<12} {'VmRSS MB':>9} {'VmHWM MB':>9} {'RssAnon':>8} {'ratio':>6}")
        for name, r in one["readings_mb"].items():
            print(f"{name:<12} {r['VmRSS']:9.1f} {r['VmHWM']:9.1f} {r['RssAnon']:8.1f} "
                  f"{one['ratio_to_rest'][name]:6.2f}")
        if one["burst"]:
            b = one["burst"]
            after = one["ratio_to_rest"]["burst"]
            print(f"burst: {b['streams']} streams in {b['wall_s']:.1f} s, upstream peak "
                  f"{b['upstream_peak_simultaneous']} simultaneous, ok {b['results']['ok']}, "
                  f"mismatches {b['mismatches']}, errors {b['errors']}; "
                  f"{res['args']['burst_settle']:.0f} s after: {after:.2f}x rest "
                  f"({'met' if after <= GOAL_AFTER_BURST else 'NOT met'}: goal <= {GOAL_AFTER_BURST}x)")
        if one["warmup_failures"]:
            print(f"warm-up failures: {one['warmup_failures']}")
    if res["parts"]:
        p = res["parts"]
        print(f"parts (fresh interpreter): python {p['tokenizer']['python_mb']:.1f} MB, the app's "
              f"modules {p['tokenizer']['app_modules_mb']:.1f} MB (anthropic imported: "
              f"{p['tokenizer']['anthropic_loaded_at_start']}), tokenizer +{p['tokenizer']['delta_mb']:.1f} MB, "
              f"anthropic SDK + client +{p['anthropic']['delta_mb']:.1f} MB")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=1000, help="simultaneous SSE streams (0 = skip)")
    p.add_argument("--events", type=int, default=20, help="events per burst stream (>= 7)")
    p.add_argument("--pace", type=float, default=0.05, help="seconds between a burst stream's events")
    p.add_argument("--warmup", type=int, default=400, help="ordinary requests before the burst")
    p.add_argument("--rest", type=float, default=5.0, help="idle seconds after start-up")
    p.add_argument("--settle", type=float, default=5.0, help="idle seconds after the warm-up")
    p.add_argument("--burst-settle", type=float, default=70.0,
                   help="idle seconds after the burst (the goal: <= 1.1x rest within 70 s)")
    p.add_argument("--allocators", default=",".join(ALLOCATORS),
                   type=lambda v: [a for a in v.split(",") if a],
                   help="comma-separated, each a proxy process of its own, one after the other: "
                        "pymalloc (PYTHONMALLOC unset) and/or malloc (PYTHONMALLOC=malloc, the image's)")
    p.add_argument("--no-parts", dest="parts", action="store_false",
                   help="skip measuring the tokenizer's and the SDK's cost")
    p.add_argument("--json", metavar="PATH", help="write all figures as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    report(res)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
