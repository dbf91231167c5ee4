"""How bench/bench_proxy.py measures: one request to a target (JSON or SSE, checked), a latency
row (interleaved, with CPU per request and the foreign load per block), the 1,000 simultaneous
streams, and the summaries (added = percentile(target) - percentile(direct), and the ratios)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.report import BASELINE
from bench.servers import CHILDREN, CLK_TCK
from bench.workloads import conc_events

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
    path: str = "/v1/messages"
    # False: only direct, the floor, the proxy and a baseline proxy (a path peers do not relay)
    peers: bool = True


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
    targets = tuple(t for t in urls if wl.peers or t in BASE_TARGETS or t == BASELINE)
    errors = {t: 0 for t in targets}
    plans: Counter[str] = Counter()  # the proxy's x-compaction-plan answers, measured iterations

    async def once(target: str, body: bytes, headers: dict[str, str]) -> tuple[float, float] | None:
        url = urls[target] + wl.path
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
        if name not in targets and name != "upstream":
            continue  # a peer this row does not send to
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
                parts: list[bytes] = []
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




