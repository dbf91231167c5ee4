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
    edge_1k               the same body to /v1/messages/batches, which the      information
                          proxy relays untouched: its HTTP edge alone
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
import functools
import gc
import importlib
import itertools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench import workloads  # noqa: E402
from bench.measure import (  # noqa: E402
    API_HEADERS,
    BASE_TARGETS,
    QUIET_CORES,
    Request,
    Workload,
    run_concurrency,
    run_latency,
)
from bench.report import BASELINE, code_version, machine_info, print_report, print_verdict, verdict  # noqa: E402
from bench.servers import (  # noqa: E402
    CHILDREN,
    PeerChild,
    _run_receiver,
    _run_relay,
    _run_upstream,
    allocator_env,
    free_port,
    raise_nofile,
    rss_mb,
    spawn_logged,
    spawn_upstream,
    write_proxy_config,
)
from bench.workloads import sse_events  # noqa: E402

# --- the rows ----------------------------------------------------------------------------------

GOAL_BELOW_THRESHOLD = 1.3  # a request below the compaction threshold: ratio proxy/floor, p50
GOAL_SESSION = 1.5  # the session in order
GOAL_COLD = 3.0  # a large body the proxy has never seen
JSON_HEADERS = {**API_HEADERS, "x-bench-mode": "json"}
EDGE_PATH = "/v1/messages/batches"  # relayed by the proxy as it came, not inspected
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


def _with_headers(body: Callable[[int], bytes], headers: dict[str, str]) -> Request:
    return lambda i: (body(i), headers)


def _last_turn_bytes(name: str, style: str) -> bytes:
    return workloads.encode(workloads.last_turn(f"[{name}]"), style)


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
    # The proxy relays this path byte for byte (no parse, no validation, no count): what its
    # edge alone (middlewares, tenant, metrics, access log, relay) adds next to the floor.
    out.append(Workload("edge_1k", f"{len(body_1k)} B to {EDGE_PATH}", args.n_1k, args.warmup,
                        _fixed(body_1k, JSON_HEADERS), _fixed(body_1k, JSON_HEADERS), None,
                        path=EDGE_PATH, peers=False))
    out.append(Workload("sse_1k", f"{len(sse_1k)} B, 200 events", args.n_sse, max(20, args.warmup // 4),
                        _fixed(sse_1k, SSE_HEADERS), _fixed(sse_1k, SSE_HEADERS), GOAL_BELOW_THRESHOLD,
                        sse_expected=b"".join(sse_events())))
    warm_session = min(turns, max(10, args.warmup // 4))
    session_rows: list[tuple[str, str, dict[str, str], float | None]] = [
        (f"session_{s}", s, JSON_HEADERS, GOAL_SESSION) for s in styles
    ]
    session_rows.append(("session_compact_off", "compact", {**JSON_HEADERS, "x-compaction": "off"}, None))
    for name, style, headers, goal in session_rows:
        passes = SessionPasses(name, style)
        out.append(Workload(
            name, f"{args.passes}x{turns} turns{', x-compaction: off' if goal is None else ''}",
            args.passes * turns, warm_session,
            _with_headers(passes.measured, headers),
            _with_headers(passes.warm, headers),
            goal,
        ))
    for style in styles:
        name = f"cold_{style}"
        body = _lazy(functools.partial(_last_turn_bytes, name, style))
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
            targets = len(urls) if wl.peers else sum(1 for t in urls if t in BASE_TARGETS or t == BASELINE)
            print(f"- {wl.name}: {wl.label}: {wl.n} x {targets} interleaved requests ...", file=sys.stderr, flush=True)
            results["workloads"][wl.name] = await run_latency(session, wl, urls, CHILDREN)
        results["memory_mb"]["after_rows"] = rss_mb(proxy_pid)
        if args.conc_streams > 0 and "conc" in args.only.split(","):
            print(f"- {args.conc_streams} simultaneous SSE streams through the proxy ...", file=sys.stderr, flush=True)
            results["concurrency"] = await run_concurrency(session, urls, args)
            await asyncio.sleep(3)  # settle
            results["memory_mb"]["after_streams"] = rss_mb(proxy_pid)
    return results


# --- main --------------------------------------------------------------------------------------

ALL_ROWS = "json_1k,edge_1k,sse_1k,session,cold,json_500k,json_500k_resend,conc"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sample counts (smoke run, ~1-3 min)")
    p.add_argument("--json", metavar="PATH", help="write all figures as JSON")
    p.add_argument("--only", default=ALL_ROWS,
                   help=f"comma-separated rows or families to run (default: {ALL_ROWS}); e.g. session_spaced, cold")
    p.add_argument("--styles", default=",".join(workloads.STYLES),
                   help=f"JSON styles of the session and cold rows (default: {','.join(workloads.STYLES)})")
    p.add_argument("--allocator", choices=("malloc", "pymalloc", "jemalloc", "malloc-mmap"), default="jemalloc",
                   help="the proxy's allocator: jemalloc preloaded with PYTHONMALLOC=malloc, as the Docker image "
                        "ships it (default); glibc's malloc (PYTHONMALLOC=malloc); Python's own (pymalloc)")
    p.add_argument("--baseline-root", default="", metavar="PATH",
                   help="also run the proxy from another checkout (e.g. `git worktree add /tmp/base <commit>`) as "
                        "the target 'baseline', interleaved with this one: a before/after in one run")
    p.add_argument("--baseline-allocator", choices=("malloc", "pymalloc", "jemalloc", "malloc-mmap"),
                   help="the baseline's allocator (default: --allocator); with --baseline-root . the same code "
                        "under both allocators, interleaved")
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
    p.add_argument("--quota", choices=["on", "off"], default="off",
                   help="the proxy target with budgets and rate limits on (a tenant policy whose limits are never"
                        " reached); with --baseline-root . the baseline is the same code with them off")
    p.add_argument("--profile-proxy", metavar="PATH",
                   help="run the proxy process under cProfile and write its stats to PATH (slows it down)")
    p.add_argument("--tracing", choices=["off", "on"], default="off",
                   help="the proxy's OpenTelemetry traces: on = every span exported to a local OTLP/HTTP "
                        "receiver (its own process, answering at once)")
    p.add_argument("--baseline-tracing", choices=["off", "on"], default="off",
                   help="the baseline's traces; with --baseline-root . --baseline-tracing on the same code "
                        "with tracing off (proxy) and on (baseline), interleaved")
    p.add_argument("--_role", choices=["upstream", "relay", "receiver"], help=argparse.SUPPRESS)
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
        peer_mod: Any = importlib.import_module("bench.peers")
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


def spawn_baseline(args: argparse.Namespace, upstream_url: str, tmp: Path, port: int, traces: str = "") -> str:
    """The proxy as another checkout has it (its ``proxy`` package first on the path), with its
    own state: one more target, measured like the peers (``x proxy``: its added latency over
    this proxy's)."""
    root = Path(args.baseline_root).resolve()
    if not (root / "proxy" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-root: {root} holds no proxy package")
    cfg = write_proxy_config(tmp, upstream_url, args, name=BASELINE, traces=traces)
    env = {**allocator_env(args.baseline_allocator or args.allocator),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    child = spawn_logged(BASELINE, [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--config", str(cfg)],
                         tmp, f"http://127.0.0.1:{port}" if port else "", env=env)
    return child.url


_TRACE_SPANS = re.compile(r'^context_proxy_trace_spans_total\{outcome="(\w+)"\} ([0-9.e+]+)$', re.M)


def trace_counts(urls: dict[str, str], traces: str) -> dict[str, Any]:
    """What the traced targets exported (their ``/metrics``) and the receiver took: the spans
    were really made and sent, not silently dropped."""
    import urllib.request

    out: dict[str, Any] = {}
    for target in ("proxy", BASELINE):
        if target in urls:
            with urllib.request.urlopen(urls[target] + "/metrics", timeout=5) as r:
                found = {k: float(v) for k, v in _TRACE_SPANS.findall(r.read().decode())}
            out[target] = found
    with urllib.request.urlopen(traces.removesuffix("/v1/traces") + "/counts", timeout=5) as r:
        out["receiver"] = json.loads(r.read())
    print(f"traces: {out}", file=sys.stderr, flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._role == "upstream":
        asyncio.run(_run_upstream())
        return 0
    if args._role == "relay":
        asyncio.run(_run_relay(args.upstream))
        return 0
    if args._role == "receiver":
        asyncio.run(_run_receiver())
        return 0

    nofile = raise_nofile()  # before spawning: the children inherit it
    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up = spawn_upstream()
            CHILDREN["upstream"] = up
            traces = ""
            if "on" in (args.tracing, args.baseline_tracing):
                receiver = spawn_logged("receiver", [sys.executable, str(Path(__file__).resolve()), "--_role",
                                                     "receiver"], tmp)
                traces = receiver.url + "/v1/traces"
            cfg = write_proxy_config(tmp, up.url, args, traces=traces if args.tracing == "on" else "")
            profile = ["-m", "cProfile", "-o", str(Path(args.profile_proxy).resolve())] if args.profile_proxy else []
            # At INFO the proxy logs its port ("listening on ..."); above INFO the bench picks one.
            port = 0 if args.proxy_log_level in ("DEBUG", "INFO") else free_port()
            proxy = spawn_logged(
                "proxy", [sys.executable, *profile, "-m", "proxy", "serve", "--port", str(port), "--config", str(cfg)],
                tmp, f"http://127.0.0.1:{port}" if port else "", env=allocator_env(args.allocator),
            )
            spawn_logged("floor", [sys.executable, str(Path(__file__).resolve()), "--_role", "relay",
                                   "--upstream", up.url], tmp)
            urls = {"direct": up.url, "floor": CHILDREN["floor"].url, "proxy": proxy.url}
            if args.baseline_root:
                urls[BASELINE] = spawn_baseline(args, up.url, tmp, port=0 if port == 0 else free_port(),
                                                traces=traces if args.baseline_tracing == "on" else "")
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
            if traces:
                res["tracing"] = trace_counts(urls, traces)
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
