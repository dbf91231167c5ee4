"""The report of bench/bench_proxy.py: the tables, the memory line and the verdict (each goal as a
ratio, met or missed)."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
PEER_GOAL = 10.0  # peer-added / proxy-added, p50, at least
BASELINE = "baseline"  # the target --baseline-root adds: shown like a peer, held to no goal
MEMORY_GOALS = {"rest_mb": 120.0, "after_streams_ratio": 1.1}


def _f(x: float, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def peers_of(res: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for w in res["workloads"].values():
        for t in w.get("added_ms", {}):
            if t not in ("floor", "proxy") and t not in names:
                names.append(t)
    return names


def _table(res: dict[str, Any], quiet: bool) -> None:
    peers = peers_of(res)
    hdr = (f"{'row':<40} {'n':>5}  {'direct p50':>10}  {'floor +p50':>10}  {'proxy +p50':>10} {'+p99':>7}  "
           f"{'proxy/floor':>11} {'goal':>6} {'met':>4}")
    for p in peers:
        hdr += f"  {p[:10] + ' +p50':>15} {'x proxy':>7}"
    if not quiet:
        hdr += f"  {'CPU ms/req proxy':>16} {'floor':>6}"
    print(hdr)
    print("-" * len(hdr))
    for name, w in res["workloads"].items():
        src = w["quiet"] if quiet else w
        label = f"{name} ({w['label']})"[:40]
        if "latency_ms" not in src:
            print(f"{label:<40} {src.get('n', 0):>5}  (too few quiet blocks)")
            continue
        n = src["latency_ms"]["proxy"]["n"]
        d = src["latency_ms"]["direct"]
        fl, px = src["added_ms"]["floor"], src["added_ms"]["proxy"]
        ratio = src["ratio_p50"]["proxy_to_floor"]
        goal = w.get("goal_ratio")
        met = "" if goal is None else ("yes" if ratio <= goal else "NO")
        line = (f"{label:<40} {n:>5}  {d['p50']:>10.3f}  {fl['p50']:>+10.3f}  {px['p50']:>+10.3f} {px['p99']:>+7.2f}  "
                f"{_f(ratio, '.2f'):>11} {'' if goal is None else f'<={goal}':>6} {met:>4}")
        for p in peers:
            if p in src["added_ms"]:
                line += f"  {src['added_ms'][p]['p50']:>+15.3f} {_f(src['ratio_p50'][f'{p}_to_proxy'], '.1f'):>7}"
            else:
                line += f"  {'-':>15} {'-':>7}"
        if not quiet:
            cpu = w["cpu"]
            line += f"  {cpu['proxy']['cpu_ms_per_req']:>16.3f} {cpu['floor']['cpu_ms_per_req']:>6.3f}"
        print(line)
        if "added_ttfb_ms" in w and not quiet:
            dt, ft, pt = w["ttfb_ms"]["direct"], w["added_ttfb_ms"]["floor"], w["added_ttfb_ms"]["proxy"]
            print(f"{'  └ time to 1st byte':<40} {n:>5}  {dt['p50']:>10.3f}  {ft['p50']:>+10.3f}  "
                  f"{pt['p50']:>+10.3f} {pt['p99']:>+7.2f}  {_f(pt['p50'] / ft['p50'] if ft['p50'] > 0 else math.nan, '.2f'):>11}")
        if not quiet and set(w.get("compaction_plan", {})) - {"-", "none"}:  # only rows that compacted
            plans = ", ".join(f"{k} {v}" for k, v in sorted(w["compaction_plan"].items()))
            print(f"{'  └ x-compaction-plan answers':<40} {plans}")
        errs = {k: v for k, v in w["errors"].items() if v}
        if errs and not quiet:
            print(f"{'  └ ERRORS':<40} {errs}")


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print()
    print(f"context-proxy bench  ({m['nproc']} CPUs, Python {m['python']}, aiohttp {m['aiohttp']}, "
          f"proxy at {res['code']['commit']}{' + local changes' if res['code']['proxy_dirty_files'] else ''}, "
          f"{'quick' if res['quick'] else 'default'} mode)")
    print("Latency in ms, concurrency 1, loopback; 'added' = percentile(via X) - percentile(direct), same run;")
    print("proxy/floor = proxy-added / floor-added (p50), held to the goal; 'x proxy' = peer-added / proxy-added "
          f"(goal >= {PEER_GOAL:g}).")
    for why in res.get("peers_skipped", []):
        print(f"peer skipped: {why}")
    print()
    _table(res, quiet=False)
    print("Proxy's own added-latency metric (mean ms; handler work before forwarding + upstream headers "
          "-> client headers): " + ", ".join(
              f"{w['name']} {w['proxy_self_added_mean_ms']:.3f}" for w in res["workloads"].values()
              if "proxy_self_added_mean_ms" in w))
    print("Foreign load (CPU used by other processes meanwhile, in cores of "
          f"{m['nproc']}): " + ", ".join(f"{w['name']} {w['foreign_load_cores']:.2f}" for w in res["workloads"].values()))
    print()
    print(f"Same, quiet blocks only (blocks during which other processes used < {res['quiet_cores']} cores):")
    _table(res, quiet=True)
    print()
    print("Paired view (median / p99 of per-iteration differences, all blocks):")
    for w in res["workloads"].values():
        pd = w["paired_delta_ms"]
        print(f"  {w['name']:<22} " + "   ".join(
            f"{t} {v['p50']:+.3f} / {v['p99']:+.3f}" for t, v in pd.items()))
    c = res.get("concurrency")
    if c:
        print()
        print(f"Concurrency: {c['streams']} simultaneous SSE streams through the proxy, {c['events_per_stream']} events "
              f"each ({c['bytes_per_stream']} B, distinct per stream), paced {c['pace_s'] * 1000:.0f} ms "
              f"(ideal {c['ideal_stream_s']:.1f} s a stream)")
        print(f"  wall {c['wall_s']:.2f} s   upstream peak simultaneous {c['upstream_peak_simultaneous']}   "
              f"ok {c['results']['ok']}/{c['streams']}   mismatches {c['mismatches']} "
              f"(dropped {c['results']['dropped']}, reordered {c['results']['reordered']}, "
              f"mixed {c['results']['mixed']}, corrupt {c['results']['corrupt']})   errors {c['errors']} "
              f"{c['error_kinds'] or ''}")
        print("  CPU during the run: " + ", ".join(f"{k} {v:.2f} s" for k, v in c["cpu_s"].items()))
    mem = res.get("memory_mb", {})
    if "rest" in mem:
        rest = mem["rest"]
        parts = [f"at rest {rest:.1f} MB (goal < {MEMORY_GOALS['rest_mb']:g})"]
        if "after_rows" in mem:
            parts.append(f"after the latency rows {mem['after_rows']:.1f} MB ({mem['after_rows'] / rest:.2f}x rest)")
        if "after_streams" in mem:
            parts.append(f"3 s after the streams ended {mem['after_streams']:.1f} MB "
                         f"({mem['after_streams'] / rest:.2f}x rest; the goal, <= {MEMORY_GOALS['after_streams_ratio']}x "
                         "once the proxy is idle again, is measured by bench/bench_memory.py)")
        print("Proxy memory (VmRSS): " + ";  ".join(parts))
    print()


def verdict(res: dict[str, Any]) -> dict[str, Any]:
    """Each goal: the measured ratio, the goal, met or not."""
    out: dict[str, Any] = {}
    for name, w in res["workloads"].items():
        goal = w.get("goal_ratio")
        ratio = w["ratio_p50"]["proxy_to_floor"]
        if goal is not None:
            out[name] = {"ratio": ratio, "goal": f"<= {goal}", "met": bool(ratio <= goal)}
        for key, r in w["ratio_p50"].items():
            # the peers are held to the goal; the baseline (another version of this proxy) is not
            if key.endswith("_to_proxy") and goal is not None and key != f"{BASELINE}_to_proxy":
                out[f"{name} {key}"] = {"ratio": r, "goal": f">= {PEER_GOAL:g}", "met": bool(r >= PEER_GOAL)}
    mem = res.get("memory_mb", {})
    if "rest" in mem:
        out["memory_rest_mb"] = {"ratio": mem["rest"], "goal": f"< {MEMORY_GOALS['rest_mb']:g}",
                                 "met": mem["rest"] < MEMORY_GOALS["rest_mb"]}
    c = res.get("concurrency")
    if c is not None:
        out["concurrency"] = {"ratio": c["mismatches"] + c["errors"], "goal": "0 mismatches/errors",
                              "met": c["mismatches"] == 0 and c["errors"] == 0}
    return out


def print_verdict(v: dict[str, Any], total_s: float) -> None:
    print("goals: " + "   ".join(
        f"{k} {_f(x['ratio'], '.2f')} {x['goal']}: {'met' if x['met'] else 'MISSED'}" for k, x in v.items()
    ) + f"   (total {total_s:.0f} s)")


def code_version() -> dict[str, Any]:
    """Which proxy code was measured (read-only git queries)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "proxy_dirty_files": git("status", "--porcelain", "--", "proxy").splitlines()}


def machine_info() -> dict[str, Any]:
    try:
        model = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
        )
    except OSError:
        model = "?"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "kernel": platform.release(),
    }
