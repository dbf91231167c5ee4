#!/usr/bin/env python
"""Benchmark: what the proxy adds on loopback, next to a direct call and a minimal aiohttp relay.

    python bench/bench_proxy.py [--quick] [--json out.json] [--peers litellm,headroom]

Process layout (all on 127.0.0.1):

    bench (this process: aiohttp load generator, one ClientSession, keep-alive)
      ├──▶ fake upstream ............................................. "direct"
      ├──▶ proxy  (`python -m proxy serve`, own process) ──▶ fake upstream  "proxy"
      ├──▶ floor  (a ~30-line raw aiohttp relay, own process) ──▶ fake upstream  "floor"
      └──▶ peers  (optional: LiteLLM, Headroom via bench/peers.py) ──▶ fake upstream

The fake upstream runs in its own process, so the proxy's process does only proxy work and its
CPU time (/proc/<pid>/stat, before and after each row) is CPU per proxied request.

Latency rows are sequential (concurrency 1) and interleaved: every iteration sends the same
request to each target (direct, floor, proxy, peers) in a rotating order, so the noise of a shared
machine hits them alike. "Added" = percentile(target) - percentile(direct) from the same run;
each row is held to a goal as a ratio proxy-added / floor-added (p50), and peer-added /
proxy-added when peers run. Rows (bench/workloads.py builds the bodies, bench/README.md says why):

    json_1k               1 KB JSON body, below the compaction threshold       goal ratio <= 1.3
    sse_1k                1 KB body, "stream": true, a 200-event SSE answer     goal ratio <= 1.3
    session_<style>       the real Claude Code session in order, a fresh        goal ratio <= 1.5
                          conversation each pass, one JSON style per row
    session_compact_off   the same, compact, with `x-compaction: off`           information
    cold_<style>          the session's last turn, a fresh x-api-key each time  goal ratio <= 3
    json_500k             500 KB synthetic agent body, a fresh key each time    goal ratio <= 3
    json_500k_resend      the same bytes re-sent with one key (exact re-send)   information
    conc                  1,000 simultaneous SSE streams, checked byte for byte, and the proxy's
                          resident memory at rest / after the rows / after the streams

Internal roles (spawned by the bench itself): ``--_role upstream`` and ``--_role relay``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench import workloads  # noqa: E402
from bench.report import code_version, machine_info, print_report, print_verdict, verdict  # noqa: E402
from bench.servers import (  # noqa: E402
    CHILDREN,
    CLK_TCK,
    PeerChild,
    _run_relay,
    _run_upstream,
    free_port,
    raise_nofile,
    rss_mb,
    spawn_logged,
    spawn_upstream,
    write_proxy_config,
)
from bench.workloads import conc_events, sse_events  # noqa: E402

BASE_TARGETS = ("direct", "floor", "proxy")  # + peers; the order rotates every iteration

# --- measurement -------------------------------------------------------------------------------


def system_busy_seconds() -> float:
    """CPU seconds spent busy by the whole machine, all CPUs (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def pct(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted data (numpy's default method)."""
    if not sorted_xs:
        return float("nan")
    k = (len(sorted_xs) - 1) * q
    f = int(k)
    c = min(f + 1, len(sorted_xs) - 1)
    return sorted_xs[f] + (sorted_xs[c] - sorted_xs[f]) * (k - f)


@dataclass
class Series:
    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        xs = sorted(self.samples)
        return {
            "n": len(xs),
            "p50": pct(xs, 0.50),
            "p90": pct(xs, 0.90),
            "p99": pct(xs, 0.99),
            "mean": sum(xs) / len(xs) if xs else float("nan"),
        }


class Mismatch(Exception):
    pass


API_HEADERS = {
    "x-api-key": "sk-ant-bench-not-a-real-key",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
}


async def one_json(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], *, peer: bool = False
) -> tuple[float, str]:
    """(ms to the last byte, the x-compaction-plan response header or "-")."""
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers=headers) as resp:
        data = await resp.read()
    t1 = time.perf_counter_ns()
    # The fake upstream's message, as it wrote it; a peer may re-serialise it (spaces, key order).
    ok = data.startswith(b'{"id":"msg_') or (peer and re.match(rb'\{\s*"id"\s*:\s*"msg_', data) is not None)
    if resp.status != 200 or not ok:
        raise Mismatch(f"status {resp.status}: {data[:200]!r}")
    return (t1 - t0) / 1e6, resp.headers.get("x-compaction-plan", "-")


async def one_sse(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], expected: bytes,
    *, peer: bool = False,
) -> tuple[float, float]:
    t0 = time.perf_counter_ns()
    parts: list[bytes] = []
    t_first = 0
    async with session.post(url, data=body, headers=headers) as resp:
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                break
            if not t_first:
                t_first = time.perf_counter_ns()
            parts.append(chunk)
    t1 = time.perf_counter_ns()
    got = b"".join(parts)
    if resp.status != 200 or (got != expected if not peer else b"message_stop" not in got):
        raise Mismatch(f"SSE status {resp.status}, {sum(map(len, parts))} bytes, expected {len(expected)}")
    return (t_first - t0) / 1e6, (t1 - t0) / 1e6


Request = Callable[[int], tuple[bytes, dict[str, str]]]  # iteration -> (body, headers)


@dataclass
class Workload:
    """A latency row: ``request(i)`` is what every target gets in iteration i (``warm(i)`` in the
    warm-up); ``goal``: the most proxy-added / floor-added (p50) may be, None for information."""

    name: str
    label: str
    n: int
    warmup: int
    request: Request
    warm: Request
    goal: float | None = None
    sse_expected: bytes | None = None


_ADDED_METRIC = re.compile(
    r'^context_proxy_added_latency_seconds_(sum|count)\{route="messages"\} ([0-9.e+-]+)$', re.M
)


async def proxy_self_added(session: aiohttp.ClientSession, url: str) -> tuple[float, float] | None:
    """(sum seconds, count) of the proxy's own added-latency histogram for /v1/messages: the time
    it spends before forwarding plus from upstream headers to client headers."""
    try:
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    except aiohttp.ClientError:
        return None
    found = dict((k, float(v)) for k, v in _ADDED_METRIC.findall(text))
    if "sum" not in found or "count" not in found:
        return None
    return found["sum"], found["count"]


QUIET_CORES = 0.25  # a block is "quiet" when other processes used less than this much CPU


def _summarize(rows: list[dict[str, float]], targets: Sequence[str]) -> dict[str, Any]:
    """Per-target percentiles, added = percentile(target) - percentile(direct), and the ratios:
    proxy-added / floor-added and peer-added / proxy-added (p50)."""
    out: dict[str, Any] = {
        "latency_ms": {t: Series([r[t] for r in rows if t in r]).summary() for t in targets}
    }
    d = out["latency_ms"]["direct"]
    others = [t for t in targets if t != "direct"]
    out["added_ms"] = {t: {q: out["latency_ms"][t][q] - d[q] for q in ("p50", "p90", "p99", "mean")} for t in others}
    added = {t: out["added_ms"][t]["p50"] for t in others}
    out["ratio_p50"] = {"proxy_to_floor": _ratio(added["proxy"], added["floor"])}
    for t in others:
        if t not in BASE_TARGETS:
            out["ratio_p50"][f"{t}_to_proxy"] = _ratio(added[t], added["proxy"])
    # Paired view: per-iteration differences (same iteration, adjacent in time).
    paired: dict[str, Any] = {}
    for t in others:
        diffs = sorted(r[t] - r["direct"] for r in rows if t in r and "direct" in r)
        paired[t] = {"p50": pct(diffs, 0.5), "p99": pct(diffs, 0.99)}
    out["paired_delta_ms"] = paired
    return out


def _ratio(a: float, b: float) -> float:
    """a / b, NaN when b is not a positive figure (a floor lost in the noise has no ratio)."""
    return a / b if b > 0 else float("nan")


async def run_latency(
    session: aiohttp.ClientSession, wl: Workload, urls: dict[str, str], children: dict[str, Any]
) -> dict[str, Any]:
    targets = tuple(urls)
    errors = {t: 0 for t in targets}
    plans: Counter[str] = Counter()  # the proxy's x-compaction-plan answers, measured iterations

    async def once(target: str, body: bytes, headers: dict[str, str]) -> tuple[float, float] | None:
        url = urls[target] + "/v1/messages"
        peer = target not in BASE_TARGETS
        try:
            if wl.sse_expected is None:
                ms, plan = await one_json(session, url, body, headers, peer=peer)
                if target == "proxy":
                    plans[plan] += 1
                return 0.0, ms
            return await one_sse(session, url, body, headers, wl.sse_expected, peer=peer)
        except (Mismatch, aiohttp.ClientError, TimeoutError) as exc:
            errors[target] += 1
            if errors[target] <= 3:
                print(f"  ! {wl.name} via {target}: {exc!r}", file=sys.stderr)
            return None

    for i in range(wl.warmup):
        body, headers = wl.warm(i)
        for target in targets:
            await once(target, body, headers)
    errors = {t: 0 for t in targets}
    plans.clear()
    gc.collect()
    metric0 = await proxy_self_added(session, urls["proxy"])

    # Iterations run in blocks; after each block the CPU that *other* processes used meanwhile
    # is noted, so that the figures can also be given for the quiet blocks only.
    block = max(5, wl.n // 60)
    rows: list[dict[str, float]] = []  # one per iteration: target -> total ms
    ttfb_rows: list[dict[str, float]] = []
    row_block: list[int] = []
    block_foreign: list[float] = []
    cpu0 = {name: (c.cpu_seconds(), c.sched_seconds()) for name, c in children.items()}
    busy0, self0 = system_busy_seconds(), self_cpu_seconds()
    wall0 = time.perf_counter()
    b_busy, b_ours, b_wall = busy0, self0 + sum(v[0] for v in cpu0.values()), wall0
    for i in range(wl.n):
        body, headers = wl.request(i)  # built (or taken from the pass being sent) before timing
        k = i % len(targets)
        row: dict[str, float] = {}
        trow: dict[str, float] = {}
        for target in targets[k:] + targets[:k]:
            got = await once(target, body, headers)
            if got is not None:
                trow[target], row[target] = got
        rows.append(row)
        ttfb_rows.append(trow)
        row_block.append(len(block_foreign))
        if (i + 1) % block == 0 or i + 1 == wl.n:
            busy, wall = system_busy_seconds(), time.perf_counter()
            ours = self_cpu_seconds() + sum(c.cpu_seconds() for c in children.values())
            block_foreign.append(max(0.0, (busy - b_busy) - (ours - b_ours)) / max(wall - b_wall, 1e-9))
            b_busy, b_ours, b_wall = busy, ours, wall
    wall = time.perf_counter() - wall0
    cpu1 = {name: (c.cpu_seconds(), c.sched_seconds()) for name, c in children.items()}
    busy, own = system_busy_seconds() - busy0, self_cpu_seconds() - self0
    ours = own + sum(cpu1[n][0] - cpu0[n][0] for n in children)
    metric1 = await proxy_self_added(session, urls["proxy"])

    out: dict[str, Any] = {"name": wl.name, "label": wl.label, "n": wl.n, "goal_ratio": wl.goal,
                           "wall_s": wall, "errors": errors, "compaction_plan": dict(plans)}
    out.update(_summarize(rows, targets))
    if metric0 is not None and metric1 is not None and metric1[1] > metric0[1]:
        # Mean of the proxy's own added-latency metric (its handler work before forwarding plus
        # from upstream headers to client headers; aiohttp's HTTP machinery not included).
        out["proxy_self_added_mean_ms"] = (metric1[0] - metric0[0]) / (metric1[1] - metric0[1]) * 1000
    if wl.sse_expected is not None:
        t = _summarize(ttfb_rows, targets)
        out["ttfb_ms"] = t["latency_ms"]
        out["added_ttfb_ms"] = t["added_ms"]
    quiet = [r for r, b in zip(rows, row_block, strict=True) if block_foreign[b] < QUIET_CORES]
    out["quiet"] = {"threshold_cores": QUIET_CORES, "blocks": sum(f < QUIET_CORES for f in block_foreign),
                    "of_blocks": len(block_foreign), "n": len(quiet)}
    if len(quiet) >= max(20, wl.n // 5):
        out["quiet"].update(_summarize(quiet, targets))
    # Each server process handles exactly one target's requests (the upstream handles them all).
    cpu: dict[str, Any] = {}
    for name in children:
        stat_s = cpu1[name][0] - cpu0[name][0]
        sched_s = cpu1[name][1] - cpu0[name][1]
        n_req = wl.n * (len(targets) if name == "upstream" else 1)
        cpu[name] = {
            "cpu_s": stat_s,
            "cpu_ms_per_req": stat_s * 1000 / n_req,
            "sched_ms_per_req": sched_s * 1000 / n_req,
            "requests": n_req,
        }
    out["cpu"] = cpu
    # Noise: CPU the rest of the machine used meanwhile, in cores (2.0 = both cores taken).
    out["foreign_load_cores"] = max(0.0, busy - ours) / wall
    out["foreign_load_blocks"] = block_foreign
    out["bench_client_cpu_ms_per_iter"] = own * 1000 / wl.n
    return out


async def run_concurrency(
    session: aiohttp.ClientSession, urls: dict[str, str], args: argparse.Namespace, target: str = "proxy"
) -> dict[str, Any]:
    n, n_events, pace = args.conc_streams, args.conc_events, args.conc_pace
    async with session.post(urls["direct"] + "/_bench/reset", headers={"x-bench-mode": "ctl"}) as r:
        await r.read()
    expected = [b"".join(conc_events(i, n_events)) for i in range(n)]
    markers = [f"s{i:04d}e".encode() for i in range(n)]
    body = orjson.dumps(
        {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    )
    results: list[str] = ["error"] * n
    error_text: dict[str, int] = {}
    first_at: list[float] = [0.0] * n

    async def one(i: int) -> None:
        headers = {
            **API_HEADERS, "x-bench-mode": "conc", "x-bench-idx": str(i), "x-bench-events": str(n_events),
            "x-bench-pace": str(pace), "x-bench-barrier": str(n),
        }
        try:
            async with session.post(urls[target] + "/v1/messages", data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=300)) as resp:
                parts = []
                async for chunk in resp.content.iter_any():
                    if not parts:
                        first_at[i] = time.perf_counter()
                    parts.append(chunk)
                got = b"".join(parts)
                status = resp.status
        except Exception as exc:  # report, never raise: we count them
            key = type(exc).__name__
            error_text[key] = error_text.get(key, 0) + 1
            return
        if status != 200:
            error_text[f"HTTP {status}"] = error_text.get(f"HTTP {status}", 0) + 1
            return
        results[i] = classify(got, expected[i], markers, i)

    cpu0 = {name: c.cpu_seconds() for name, c in CHILDREN.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    cpu1 = {name: c.cpu_seconds() for name, c in CHILDREN.items()}
    async with session.get(urls["direct"] + "/_bench/stats", headers={"x-bench-mode": "ctl"}) as r:
        stats = await r.json()
    sent = {int(k): v for k, v in stats["conc_sent"].items()}
    upstream_disagrees = sum(
        1 for i in range(n) if i in sent and sent[i] != hashlib.sha256(expected[i]).hexdigest()
    )
    counts = {k: results.count(k) for k in ("ok", "dropped", "reordered", "mixed", "corrupt", "error")}
    released = [t for t in first_at if t]
    return {
        "target": target,
        "streams": n,
        "events_per_stream": n_events,
        "pace_s": pace,
        "bytes_per_stream": len(expected[0]),
        "wall_s": wall,
        "ideal_stream_s": pace * n_events,
        "first_byte_spread_s": (max(released) - min(released)) if released else None,
        "upstream_peak_simultaneous": stats["peak_active"],
        "upstream_streams_sent": len(sent),
        "upstream_sent_differs_from_expected": upstream_disagrees,
        "results": counts,
        "mismatches": counts["dropped"] + counts["reordered"] + counts["mixed"] + counts["corrupt"],
        "errors": counts["error"],
        "error_kinds": error_text,
        "cpu_s": {name: cpu1[name] - cpu0[name] for name in cpu0},
    }


def classify(got: bytes, want: bytes, markers: list[bytes], i: int) -> str:
    if got == want:
        return "ok"
    got_events = [e for e in got.split(b"\n\n") if e]
    want_events = [e for e in want.split(b"\n\n") if e]
    mine = markers[i]
    for e in got_events:
        for m in re.findall(rb"s\d{4}e", e):
            if m != mine:
                return "mixed"
    if sorted(got_events) == sorted(want_events):
        return "reordered"
    if len(got_events) < len(want_events) and all(e in want_events for e in got_events):
        return "dropped"
    return "corrupt"




# --- the rows ----------------------------------------------------------------------------------

GOAL_BELOW_THRESHOLD = 1.3  # a request below the compaction threshold: ratio proxy/floor, p50
GOAL_SESSION = 1.5  # the session in order
GOAL_COLD = 3.0  # a large body the proxy has never seen
JSON_HEADERS = {**API_HEADERS, "x-bench-mode": "json"}
SSE_HEADERS = {**API_HEADERS, "x-bench-mode": "sse"}
_cold_keys = itertools.count()  # one per cold request of the whole run: no credential comes back


def family(name: str) -> str:
    """``--only`` accepts a row's name or its family (``session``, ``cold``)."""
    return name.split("_", 1)[0] if name.startswith(("session_", "cold_")) else name


class SessionPasses:
    """Iteration i of a session row: turn i % T of pass i // T. Every pass is a fresh conversation
    (its own tag in every text, its own session id), serialised in ``style``; a pass's bodies are
    built when its first turn is due (between two iterations, outside any timing)."""

    def __init__(self, name: str, style: str) -> None:
        self.name, self.style = name, style
        self._tag = ""
        self._bodies: list[bytes] = []

    def bodies(self, tag: str) -> list[bytes]:
        if tag != self._tag:
            self._bodies = [workloads.encode(r, self.style) for r in workloads.session_requests(tag)]
            self._tag = tag
        return self._bodies

    def measured(self, i: int) -> bytes:
        n = workloads.session_turns()
        return self.bodies(f"[{self.name} pass {i // n}]")[i % n]

    def warm(self, i: int) -> bytes:
        n = workloads.session_turns()
        return self.bodies(f"[{self.name} warm-up {i // n}]")[i % n]


def _fixed(body: bytes, headers: dict[str, str]) -> Request:
    return lambda _i: (body, headers)


def _cold(body: Callable[[], bytes]) -> Request:
    """The same bytes each time, with an x-api-key the proxy has never seen."""
    return lambda _i: (body(), {**JSON_HEADERS, "x-api-key": workloads.cold_key(next(_cold_keys))})


def build_workloads(args: argparse.Namespace) -> list[Workload]:
    only = set(args.only.split(","))
    styles = args.styles.split(",")
    turns = workloads.session_turns()
    out: list[Workload] = []
    body_1k, sse_1k = workloads.body_1k(), workloads.sse_body_1k()
    out.append(Workload("json_1k", f"{len(body_1k)} B", args.n_1k, args.warmup,
                        _fixed(body_1k, JSON_HEADERS), _fixed(body_1k, JSON_HEADERS), GOAL_BELOW_THRESHOLD))
    out.append(Workload("sse_1k", f"{len(sse_1k)} B, 200 events", args.n_sse, max(20, args.warmup // 4),
                        _fixed(sse_1k, SSE_HEADERS), _fixed(sse_1k, SSE_HEADERS), GOAL_BELOW_THRESHOLD,
                        sse_expected=b"".join(sse_events())))
    warm_session = min(turns, max(10, args.warmup // 4))
    session_rows = [(f"session_{s}", s, JSON_HEADERS, GOAL_SESSION) for s in styles]
    session_rows.append(("session_compact_off", "compact", {**JSON_HEADERS, "x-compaction": "off"}, None))
    for name, style, headers, goal in session_rows:
        passes = SessionPasses(name, style)
        out.append(Workload(
            name, f"{args.passes}x{turns} turns{', x-compaction: off' if goal is None else ''}",
            args.passes * turns, warm_session,
            lambda i, p=passes, h=headers: (p.measured(i), h),
            lambda i, p=passes, h=headers: (p.warm(i), h),
            goal,
        ))
    for style in styles:
        name = f"cold_{style}"
        body = _lazy(lambda s=style, n=name: workloads.encode(workloads.last_turn(f"[{n}]"), s))
        out.append(Workload(name, "last turn, fresh key", args.n_cold, max(5, args.warmup // 8),
                            _cold(body), _cold(body), GOAL_COLD))
    body_500k = _lazy(lambda: workloads.build_body(500 * 1024, result_size=1500))
    out.append(Workload("json_500k", "fresh key", args.n_500k, max(5, args.warmup // 8),
                        _cold(body_500k), _cold(body_500k), GOAL_COLD))
    out.append(Workload("json_500k_resend", "exact re-send", args.n_500k, max(5, args.warmup // 8),
                        lambda _i: (body_500k(), JSON_HEADERS), lambda _i: (body_500k(), JSON_HEADERS), None))
    return [w for w in out if w.name in only or family(w.name) in only]


def _lazy(make: Callable[[], bytes]) -> Callable[[], bytes]:
    """``make()`` once, when first needed (a row that is not run builds nothing)."""
    memo: list[bytes] = []

    def get() -> bytes:
        if not memo:
            memo.append(make())
        return memo[0]

    return get


async def bench(args: argparse.Namespace, urls: dict[str, str], proxy_pid: int) -> dict[str, Any]:
    wls = build_workloads(args)
    gc.collect()
    gc.freeze()
    results: dict[str, Any] = {"workloads": {}, "memory_mb": {}}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        for wl in wls:
            print(f"- {wl.name}: {wl.label}: {wl.n} x {len(urls)} interleaved requests ...", file=sys.stderr, flush=True)
            results["workloads"][wl.name] = await run_latency(session, wl, urls, CHILDREN)
        results["memory_mb"]["after_rows"] = rss_mb(proxy_pid)
        if args.conc_streams > 0 and "conc" in args.only.split(","):
            print(f"- {args.conc_streams} simultaneous SSE streams through the proxy ...", file=sys.stderr, flush=True)
            results["concurrency"] = await run_concurrency(session, urls, args)
            await asyncio.sleep(3)  # settle
            results["memory_mb"]["after_streams"] = rss_mb(proxy_pid)
    return results


# --- main --------------------------------------------------------------------------------------

ALL_ROWS = "json_1k,sse_1k,session,cold,json_500k,json_500k_resend,conc"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sample counts (smoke run, ~1-3 min)")
    p.add_argument("--json", metavar="PATH", help="write all figures as JSON")
    p.add_argument("--only", default=ALL_ROWS,
                   help=f"comma-separated rows or families to run (default: {ALL_ROWS}); e.g. session_spaced, cold")
    p.add_argument("--styles", default=",".join(workloads.STYLES),
                   help=f"JSON styles of the session and cold rows (default: {','.join(workloads.STYLES)})")
    p.add_argument("--peers", default="", help="comma-separated peers to add as targets (litellm,headroom; "
                   "bench/peers.py starts them; skipped with the reason when unavailable)")
    p.add_argument("--n-1k", type=int, help="iterations, json_1k (default 3000; quick 2000)")
    p.add_argument("--n-sse", type=int, help="iterations, sse_1k (default 600; quick 300)")
    p.add_argument("--passes", type=int, help="passes over the session per session row (default 5; quick 2)")
    p.add_argument("--n-cold", type=int, help="iterations per cold row (default 300; quick 120)")
    p.add_argument("--n-500k", type=int, help="iterations per 500 KB row (default 300; quick 120)")
    p.add_argument("--warmup", type=int, help="warm-up iterations, 1 KB (default 200; quick 40; fewer for the "
                   "large rows)")
    p.add_argument("--conc-streams", type=int, default=1000, help="simultaneous SSE streams (0 = skip)")
    p.add_argument("--conc-events", type=int, help="events per concurrent stream (default 40; quick 20)")
    p.add_argument("--conc-pace", type=float, default=0.05, help="seconds between events of a concurrent stream")
    p.add_argument("--proxy-log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="proxy logging.level (INFO = as shipped, with the access log)")
    p.add_argument("--compaction", choices=["default", "off"], default="default",
                   help="leave the proxy's compaction config at its defaults, or disable it")
    p.add_argument("--ledger", choices=["on", "off"], default="on",
                   help="the usage ledger as shipped (a row per upstream call), or disabled")
    p.add_argument("--profile-proxy", metavar="PATH",
                   help="run the proxy process under cProfile and write its stats to PATH (slows it down)")
    p.add_argument("--_role", choices=["upstream", "relay"], help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.n_1k = args.n_1k or (2000 if q else 3000)
    args.n_sse = args.n_sse or (300 if q else 600)
    args.passes = args.passes or (2 if q else 5)
    args.n_cold = args.n_cold or (120 if q else 300)
    args.n_500k = args.n_500k or (120 if q else 300)
    args.warmup = args.warmup if args.warmup is not None else (40 if q else 200)
    args.conc_events = args.conc_events or (20 if q else 40)
    if args.conc_events < 7:
        p.error("--conc-events must be >= 7")
    unknown = set(args.styles.split(",")) - set(workloads.STYLES)
    if unknown:
        p.error(f"--styles: unknown {sorted(unknown)}; known: {', '.join(workloads.STYLES)}")
    return args


def start_peers(names: list[str], upstream_url: str, tmp: Path, urls: dict[str, str]) -> list[str]:
    """Start each peer as one more target; returns why the others were skipped (never raises)."""
    if not names:
        return []
    try:
        from bench import peers as peer_mod
    except ImportError as exc:
        return [f"{', '.join(names)}: bench/peers.py cannot be imported ({exc})"]
    skipped = []
    for name in names:
        if name not in getattr(peer_mod, "PEER_NAMES", (name,)):
            skipped.append(f"{name}: not a known peer ({', '.join(peer_mod.PEER_NAMES)})")
            continue
        try:
            peer = peer_mod.start_peer(name, upstream_url, tmp / f"peer-{name}")
        except Exception as exc:  # PeerUnavailable or anything else: skip the peer, run the rest
            skipped.append(f"{name}: {exc}")
            continue
        CHILDREN[name] = PeerChild(peer)
        urls[name] = peer.url.rstrip("/")
    return skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._role == "upstream":
        asyncio.run(_run_upstream())
        return 0
    if args._role == "relay":
        asyncio.run(_run_relay(args.upstream))
        return 0

    nofile = raise_nofile()  # before spawning: the children inherit it
    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up = spawn_upstream()
            CHILDREN["upstream"] = up
            cfg = write_proxy_config(tmp, up.url, args)
            profile = ["-m", "cProfile", "-o", str(Path(args.profile_proxy).resolve())] if args.profile_proxy else []
            # At INFO the proxy logs its port ("listening on ..."); above INFO the bench picks one.
            port = 0 if args.proxy_log_level in ("DEBUG", "INFO") else free_port()
            proxy = spawn_logged(
                "proxy", [sys.executable, *profile, "-m", "proxy", "serve", "--port", str(port), "--config", str(cfg)],
                tmp, f"http://127.0.0.1:{port}" if port else "",
            )
            spawn_logged("floor", [sys.executable, str(Path(__file__).resolve()), "--_role", "relay",
                                   "--upstream", up.url], tmp)
            urls = {"direct": up.url, "floor": CHILDREN["floor"].url, "proxy": proxy.url}
            peers_skipped = start_peers([p for p in args.peers.split(",") if p], up.url, tmp, urls)
            for why in peers_skipped:
                print(f"peer skipped: {why}", file=sys.stderr, flush=True)
            print(f"upstream {up.url} (pid {up.proc.pid}), proxy {urls['proxy']} (pid {proxy.proc.pid}), "
                  f"floor {urls['floor']} (pid {CHILDREN['floor'].proc.pid}), peers "
                  f"{[t for t in urls if t not in BASE_TARGETS] or 'none'}; RLIMIT_NOFILE {nofile}",
                  file=sys.stderr, flush=True)
            time.sleep(3)  # idle after start-up: the resident memory "at rest", before any request
            rest_mb = rss_mb(proxy.proc.pid)
            res = asyncio.run(bench(args, urls, proxy.proc.pid))
            res["memory_mb"] = {"rest": rest_mb, **res["memory_mb"]}
            for name in ("proxy", "floor"):
                if CHILDREN[name].proc.poll() is not None:
                    raise RuntimeError(f"{name} died during the run: {CHILDREN[name].log_path}")
        finally:
            for child in reversed(list(CHILDREN.values())):
                child.stop()
        res = {
            "machine": machine_info(),
            "code": code_version(),
            "quick": args.quick,
            "settings": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "upstream"}
            | {"rlimit_nofile": nofile},
            "peers_skipped": peers_skipped,
            "quiet_cores": QUIET_CORES,
            **res,
            "total_wall_s": time.perf_counter() - started,
        }
    res["machine"]["loadavg_start"] = loadavg_start
    res["machine"]["loadavg_end"] = os.getloadavg()
    print_report(res)
    res["verdict"] = verdict(res)
    print_verdict(res["verdict"], res["total_wall_s"])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
