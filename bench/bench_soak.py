#!/usr/bin/env python
"""Soak: does one proxy process stay steady under a rolling population of sessions? (issue 28)

    python bench/bench_soak.py --minutes 30                 # the verdict run (~33 min)
    python bench/bench_soak.py --minutes 4 --rps 20         # a short development run
    python bench/bench_soak.py --minutes 6 --find           # the proxy under tracemalloc: what grows

Processes: the fake upstreams (bench/soak_upstream.py: the Anthropic API and Bedrock Runtime, one
process), the proxy (``python -m proxy serve``, ``PYTHONMALLOC=malloc`` as the image ships it,
SQLite store, ``auth.mode: keys`` with four tenants, one on Bedrock and one with budgets, the
compaction threshold at 12,000 tokens, ``limits.max_body_bytes`` 2 MiB) and this load generator.

Load (bench/soak_workload.py): ``--rps`` requests a second, open loop, each the next turn of a
live conversation (a rolling population of ``--population`` conversations: each ends after its
turns, a new one takes its place, 19 % of them a subagent of a live session); 5 % Bedrock and 4 %
Vertex client formats, one tenant (5 %) on a Bedrock upstream, 25 % on a model that binds
thinking blocks, 25 % resumed with a history, 70 % streamed, 5 % of the streams left after their
first chunk, 1 % broken tool pairings (400), 0.3 % bodies over the limit (413), 2 %
count_tokens, durable facts on 10 % of sessions, the upstream calling the retrieval tool on 10 %
of the requests that offer it. Every answer is checked (status, and the content or the stream's
last event).

Each minute: RSS, open file descriptors (least and most of the 5 s samples), threads, requests,
statuses, p50/p99 of the time to the last byte (200 answers to whole turns), and each bounded
cache's size from ``/metrics`` (``context_proxy_cache_entries``). After the load: ``--after``
seconds idle, then a burst of ``--burst`` simultaneous streams, then ``--after`` seconds idle.

Verdict (the issue's targets): RSS over the second half grows < 3 %; steady RSS (the last minute)
<= rest + the sum of the caches' documented memory at their bounds
(``context_proxy_cache_bound_bytes``) + 40 MB; file descriptors flat (each minute's least count in
the second half within +-3 of their median; idle after the load within 3 of rest); p99 of the last
minute <= 1.5x the second minute's; after the burst and the idle time, RSS <= 1.05x what it was
before the burst; no unexpected status, no wrong answer, no traceback in the proxy's log.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench.measure import CLK_TCK, pct, self_cpu_seconds, system_busy_seconds  # noqa: E402
from bench.servers import CHILDREN, Child, allocator_env, raise_nofile, spawn_logged  # noqa: E402
from bench.soak_workload import (  # noqa: E402
    TENANTS,
    Conversation,
    Mix,
    Population,
    answer_content,
    broken,
    for_route,
    oversized,
)
from bench.workloads import conc_events  # noqa: E402
from proxy.formats.eventstream import FrameDecoder, chunk_event  # noqa: E402
from tests.platform_fakes import TEST_ACCESS_KEY, TEST_SECRET_KEY  # noqa: E402

MB = 1024 * 1024
GOAL_SECOND_HALF = 0.03
GOAL_HEADROOM_MB = 40
GOAL_FDS = 3
GOAL_P99 = 1.5
GOAL_AFTER_BURST = 1.05


# --- processes -------------------------------------------------------------------------------


def proc_sample(pid: int) -> dict[str, Any]:
    """RSS (bytes), threads, open file descriptors (and their kinds) and CPU seconds of ``pid``;
    the machine's busy CPU seconds."""
    out: dict[str, Any] = {"rss": 0, "threads": 0, "anon": 0, "file": 0, "shmem": 0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                # what the RSS is made of: the heap, mapped files (the interpreter, the
                # libraries), shared memory (SQLite's WAL index)
                out[line[3:line.index(":")].lower()] = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        if kind == "file" and target.endswith((".db", ".db-wal", ".db-shm")):
            kind = "sqlite"
        kinds[kind] += 1
    out["fds"] = sum(kinds.values())
    out["fd_kinds"] = dict(kinds)
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    out["cpu"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    out["busy"] = system_busy_seconds()
    out["t"] = time.monotonic()
    return out


def spawn_soak_upstream() -> tuple[Child, str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench/soak_upstream.py")],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    if not line or line[0] != "UPSTREAM":
        raise RuntimeError(f"the soak upstream did not start: {line!r}")
    child = CHILDREN["upstream"] = Child("upstream", proc, line[1])
    return child, line[2]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_config(tmp: Path, upstream: str, bedrock: str, args: argparse.Namespace) -> Path:
    policies = tmp / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    for tenant in TENANTS:
        policy: dict[str, Any] = {
            "name": tenant.name,
            "api_keys_sha256": [_sha(k) for k in tenant.keys],
            "provider": {"mode": "env", "api_key_env": "SOAK_PROVIDER_KEY"},
            "admin_tokens_sha256": [_sha(tenant.admin_token)],
        }
        if tenant.quota:  # every request pays admission and settlement; never refused
            policy["quota"] = {"requests_per_minute": 10**9, "output_tokens_per_minute": 10**12,
                               "budget_usd": 10**8, "budget_period": "month",
                               "per_key": {"requests_per_minute": 10**9}}
        if tenant.upstream == "bedrock":
            policy["upstream"] = {"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock}
        (policies / f"{tenant.name}.yaml").write_text(json.dumps(policy))
    cfg = {
        "listen": {"host": "127.0.0.1"},
        "upstream": {"base_url": upstream, "pool_size": max(512, args.burst + 64)},
        "state_dir": str(tmp / "state"),
        "auth": {"mode": "keys"},
        "policies_dir": str(policies),
        "compaction": {"threshold": args.threshold},
        "limits": {"max_body_bytes": args.max_body},
        "shutdown": {"grace_seconds": 5},
        "logging": {"level": "INFO"},
    }
    path = tmp / "proxy.yaml"
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    return path


def proxy_env(tmp: Path, allocator: str) -> dict[str, str]:
    env = allocator_env(allocator)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        env.pop(name, None)
    env.update({
        "SOAK_PROVIDER_KEY": "sk-ant-soak-provider-key",
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
        "AWS_CONFIG_FILE": str(tmp / "aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    return env


def spawn_proxy(tmp: Path, cfg: Path, args: argparse.Namespace) -> Child:
    argv = [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(cfg)]
    if args.find or args.native:
        args.probe_dir = tmp / "probe"
        argv = [sys.executable, str(ROOT / "bench/soak_probe.py"), str(args.probe_dir),
                str(args.native), str(args.find_frames if args.find or args.trace else 0), *argv[3:]]
    return spawn_logged("proxy", argv, tmp, env=proxy_env(tmp, args.allocator))


# --- the load --------------------------------------------------------------------------------


@dataclass
class Minute:
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    samples: list[dict[str, int]] = field(default_factory=list)
    caches: dict[str, float] = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)


def scrape(text: str) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float]]:
    """Each cache's entries, evictions, documented memory at its bound and weight (bytes of text,
    for the caches bounded by it), from ``/metrics``."""
    found: dict[str, dict[str, float]] = {"entries": {}, "evictions": {}, "bound": {}, "weight": {}}
    names = {"context_proxy_cache_entries": "entries", "context_proxy_cache_evictions_total": "evictions",
             "context_proxy_cache_bound_bytes": "bound", "context_proxy_cache_weight_bytes": "weight"}
    for line in text.splitlines():
        if not line.startswith("context_proxy_cache_"):
            continue
        name, _, rest = line.partition("{")
        if name not in names:
            continue
        labels, _, value = rest.rpartition("} ")
        cache = labels.split('cache="', 1)[1].split('"', 1)[0]
        found[names[name]][cache] = float(value)
    return found["entries"], found["evictions"], found["bound"], found["weight"]


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, pid: int, upstream: Child) -> None:
        self.args = args
        self.url = url
        self.pid = pid
        self.upstream = upstream
        self.mix = Mix()
        self.pop = Population(args.seed, self.mix)
        self.rng = random.Random(args.seed + 1)
        self.minutes: list[Minute] = []
        self.ready: list[Conversation] = []
        self.live = 0
        self.inflight: set[asyncio.Task[None]] = set()
        self.problems: Counter[str] = Counter()
        self.examples: list[str] = []
        self.durable_written = 0
        self.t0 = 0.0
        self.others0 = 0.0  # the upstream's and this bench's CPU seconds at rest

    def minute(self) -> Minute:
        k = int((time.monotonic() - self.t0) // 60)
        while len(self.minutes) <= k:
            self.minutes.append(Minute())
        return self.minutes[k]

    def problem(self, what: str, detail: str) -> None:
        self.problems[what] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{what}: {detail[:300]}")

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self.t0 = time.monotonic()
            sampler = asyncio.create_task(self.sample(http))
            interval = 1.0 / self.args.rps
            deadline = self.t0 + self.args.minutes * 60
            due = self.t0
            snapshots = 0
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                if self.args.find and (now - self.t0) // 60 > snapshots:
                    snapshots += 1
                    await self.probe_snapshot(snapshots)
                    due = time.monotonic()
                    continue
                if due > now:
                    await asyncio.sleep(due - now)
                due += interval
                if len(self.inflight) >= self.args.max_inflight:  # the proxy is not keeping up
                    self.minute().outcomes["skipped"] += 1
                    continue
                conv = self.ready.pop(0) if self.ready and self.live >= self.args.population else None
                if conv is None:
                    conv, new_session = self.pop.new()
                    self.live += 1
                    if new_session and self.rng.random() < self.mix.durable:
                        conv_durable = True
                    else:
                        conv_durable = False
                else:
                    conv_durable = False
                task = asyncio.create_task(self.turn(http, conv, conv_durable))
                self.inflight.add(task)
                task.add_done_callback(self.inflight.discard)
            if self.inflight:
                await asyncio.wait(self.inflight, timeout=150)
            sampler.cancel()
            await self.scrape_into(http, self.minutes[-1])

    async def probe_snapshot(self, k: int) -> None:
        """``--find``: pause the load, let what is in flight end and the background writes settle,
        then have the probe measure what the proxy keeps (``take-<k>``), then go on."""
        if self.inflight:
            await asyncio.wait(self.inflight, timeout=120)
        await asyncio.sleep(3)
        probe = self.args.probe_dir
        (probe / f"take-{k}").write_text("")
        for _ in range(1200):
            if (probe / f"done-{k}").exists():
                return
            await asyncio.sleep(0.1)
        self.problem("probe", f"snapshot {k} not taken")

    async def sample(self, http: aiohttp.ClientSession) -> None:
        last_minute = -1
        while True:
            k = int((time.monotonic() - self.t0) // 60)
            minute = self.minute()
            sample = proc_sample(self.pid)
            sample["others"] = self.upstream.cpu_seconds() + self_cpu_seconds()  # this bench's own
            minute.samples.append(sample)
            if k != last_minute and last_minute >= 0:
                await self.scrape_into(http, self.minutes[last_minute])
            last_minute = k
            await asyncio.sleep(self.args.sample)

    async def scrape_into(self, http: aiohttp.ClientSession, minute: Minute) -> None:
        try:
            async with http.get(self.url + "/metrics") as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.problem("metrics", repr(exc))
            return
        minute.caches, evictions, minute.bounds, weights = scrape(text)
        minute.caches.update({f"{k} evicted": v for k, v in evictions.items()})
        minute.caches.update({f"{k} weight": v for k, v in weights.items()})

    async def turn(self, http: aiohttp.ClientSession, conv: Conversation, durable: bool) -> None:
        rng, mix = self.rng, self.mix
        stream = rng.random() < mix.stream
        r = rng.random()
        kind = "turn"
        if r < mix.oversized:
            kind = "oversized"
        elif r < mix.oversized + mix.broken:
            kind = "broken"
        elif r < mix.oversized + mix.broken + mix.count_tokens and conv.route == "anthropic":
            kind = "count"
        elif stream and rng.random() < mix.leave:
            kind = "leave"
        body = self.pop.body(conv, stream and kind in ("turn", "leave"))
        headers = conv.headers()
        path = "/v1/messages"
        data: Any
        if kind == "count":
            path = "/v1/messages/count_tokens"
            body.pop("max_tokens", None)
            body.pop("metadata", None)
            data = orjson.dumps(body)
        elif kind == "broken":
            data = orjson.dumps(broken(body))
        elif kind == "oversized":
            raw = oversized(body, self.args.max_body)
            data = raw if rng.random() < 0.5 else _chunks(raw)
        else:
            path, value = for_route(conv, body, stream)
            data = orjson.dumps(value)
        minute = self.minute()
        t = time.perf_counter()
        try:
            async with http.post(self.url + path, data=data, headers=headers) as resp:
                if kind == "leave":
                    await resp.content.readany()
                    resp.close()
                    minute.outcomes["left"] += 1
                    self.ready.append(conv)
                    return
                got = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.problem(f"{kind} client error", repr(exc))
            self.ready.append(conv)
            return
        ms = (time.perf_counter() - t) * 1000
        expected = {"turn": 200, "count": 200, "broken": 400, "oversized": 413}[kind]
        minute.outcomes[f"{kind} {status}"] += 1
        if status != expected:
            self.problem(f"{kind} got {status}", got[:300].decode(errors="replace"))
            self.ready.append(conv)
            return
        if kind != "turn":
            self.ready.append(conv)
            return
        problem = check_answer(conv, stream, got)
        if problem:
            self.problem(f"{conv.route} answer", problem)
        minute.latencies.append(ms)
        self.pop.advance(conv)
        if durable:
            await self.write_fact(http, conv)
        if conv.turns_left > 0:
            self.ready.append(conv)
        else:
            self.pop.end(conv)
            self.live -= 1

    async def write_fact(self, http: aiohttp.ClientSession, conv: Conversation) -> None:
        """A durable fact for the session, citing its transcript's first event."""
        fact = {"id": f"fact-{conv.cid}", "content": f"Handler of task {conv.cid} fixed.",
                "source": f"transcript:{conv.session}:1",
                "last_confirmed_at": "2026-12-01T00:00:00Z"}
        headers = {"authorization": f"Bearer {conv.tenant.admin_token}"}
        url = f"{self.url}/admin/v1/sessions/{conv.session}/facts"
        try:
            async with http.post(url, json=fact, headers=headers) as r:
                await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.problem("durable fact client error", repr(exc))
            return
        if status != 201:
            self.problem("durable fact", f"{status}")
        else:
            self.durable_written += 1


async def _chunks(raw: bytes) -> Any:
    for i in range(0, len(raw), 256 * 1024):
        yield raw[i : i + 256 * 1024]


def check_answer(conv: Conversation, stream: bool, got: bytes) -> str | None:
    """What is wrong with a 200 answer to a whole turn (``None``: nothing)."""
    if stream and conv.route == "bedrock":
        decoder = FrameDecoder()
        frames = decoder.feed(got)
        decoder.close()
        if not frames or b"message_stop" not in chunk_event(frames[-1]):
            return "an event stream without message_stop at its end"
        return None
    if stream:
        if b"event: message_stop" not in got[-200:]:
            return f"a stream without message_stop at its end: {got[-200:]!r}"
        return None
    content = orjson.loads(got).get("content")
    want = answer_content(conv.tag, conv.thinking)
    if content != want:
        return f"content {str(content)[:200]} != {str(want)[:200]}"
    return None


async def burst(url: str, n: int) -> dict[str, int]:
    """``n`` simultaneous streams (the upstream holds them until all arrived), checked byte for byte."""
    key = TENANTS[0].keys[0]
    body = orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
                         "messages": [{"role": "user", "content": "burst"}]})

    async def one(http: aiohttp.ClientSession, i: int) -> bool:
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json",
                   "x-bench-mode": "conc", "x-bench-idx": str(i), "x-bench-events": "20",
                   "x-bench-pace": "0.05", "x-bench-barrier": str(n)}
        async with http.post(url + "/v1/messages", data=body, headers=headers) as r:
            return r.status == 200 and await r.read() == b"".join(conc_events(i, 20))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as http:
        results = await asyncio.gather(*(one(http, i) for i in range(n)), return_exceptions=True)
    ok = sum(1 for r in results if r is True)
    return {"streams": n, "ok": ok, "failed": n - ok}


# --- the report ------------------------------------------------------------------------------


def minute_rows(minutes: list[Minute], rest: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    before = rest
    for k, m in enumerate(minutes):
        cpu = foreign = float("nan")
        if m.samples and "cpu" in before:
            end = m.samples[-1]
            wall = end["t"] - before["t"]
            if wall > 0:
                cpu = (end["cpu"] - before["cpu"]) / wall
                others = end["others"] - before.get("others", end["others"])
                foreign = (end["busy"] - before["busy"] - (end["cpu"] - before["cpu"]) - others) / wall
            before = end
        lat = sorted(m.latencies)
        requests = sum(v for name, v in m.outcomes.items() if name != "skipped")
        unexpected = sum(v for name, v in m.outcomes.items()
                         if not name.endswith(("turn 200", "count 200", "broken 400", "oversized 413"))
                         and name not in ("left", "skipped"))
        last = m.samples[-1] if m.samples else {"rss": 0, "threads": 0, "fds": 0}
        fds = [s["fds"] for s in m.samples] or [0]
        # what is not a connection (files, the database's, the loop's own): no request holds one
        handles = [s["fds"] - s["fd_kinds"].get("socket", 0) for s in m.samples] or [0]
        rows.append({
            "minute": k + 1,
            "requests": requests,
            "rps": requests / 60,
            "left": m.outcomes.get("left", 0),
            "skipped": m.outcomes.get("skipped", 0),
            "errors_expected": sum(v for name, v in m.outcomes.items() if name.endswith(("400", "413"))),
            "unexpected": unexpected,
            "p50_ms": pct(lat, 0.5) if lat else float("nan"),
            "p99_ms": pct(lat, 0.99) if lat else float("nan"),
            "rss_mb": last["rss"] / MB,
            # the minute's median of each part (the 5 s samples): what the growth figures read
            "rss_median_mb": median(s["rss"] for s in m.samples) / MB if m.samples else 0.0,
            "anon_mb": median(s["anon"] for s in m.samples) / MB if m.samples else 0.0,
            "file_mb": median(s["file"] for s in m.samples) / MB if m.samples else 0.0,
            "shmem_mb": median(s["shmem"] for s in m.samples) / MB if m.samples else 0.0,
            "fds_min": min(fds),
            "fds_max": max(fds),
            "handles_min": min(handles),
            "handles_max": max(handles),
            "threads": max((s["threads"] for s in m.samples), default=0),
            "proxy_cpu": cpu,  # cores the proxy used
            "foreign_cores": foreign,  # cores the rest of the machine used (other work than this bench)
            "caches": dict(m.caches),
            "bounds": dict(m.bounds),
        })
    return rows


def run_minutes(minutes: list[Minute], length: float) -> list[Minute]:
    """The minutes of the load (a request that ended after it counts in the last one, and the
    caches read once the load ended are the last minute's)."""
    n = max(1, int(length + 0.999))
    kept = minutes[:n]
    for late in minutes[n:]:
        kept[-1].outcomes.update(late.outcomes)
        kept[-1].latencies.extend(late.latencies)
        if late.caches:
            kept[-1].caches, kept[-1].bounds = late.caches, late.bounds
    return kept


def fitted_growth(values: list[float]) -> float:
    """The growth a least-squares line through ``values`` (one a minute) gives from the first
    minute to the last, over its value at the first: the trend, without one sample's noise."""
    n = len(values)
    if n < 2:
        return 0.0
    xbar, ybar = (n - 1) / 2, sum(values) / n
    slope = sum((x - xbar) * (y - ybar) for x, y in enumerate(values)) / sum((x - xbar) ** 2 for x in range(n))
    start = ybar - slope * xbar
    return slope * (n - 1) / start if start else 0.0


def verdict(res: dict[str, Any]) -> list[tuple[str, bool, str]]:
    rows = res["minutes"]
    n = len(rows)
    out: list[tuple[str, bool, str]] = []
    if n >= 4:
        mid, end = rows[n // 2 - 1]["rss_mb"], rows[-1]["rss_mb"]
        growth = (end - mid) / mid
        slope = fitted_growth([r["rss_median_mb"] for r in rows[n // 2 - 1:]])
        out.append(("RSS over the second half", growth < GOAL_SECOND_HALF,
                    f"{mid:.1f} -> {end:.1f} MB ({growth:+.1%}; goal < {GOAL_SECOND_HALF:.0%}); the"
                    f" minutes' medians fitted by a line: {slope:+.1%}"))
        half = rows[n // 2:]
        # each minute's least count: a handle left open raises it for good; the exports' and
        # artifacts' files open for a moment do not
        floors = [r["handles_min"] for r in half]
        out.append(("files and database handles flat over the second half",
                    max(floors) - min(floors) <= 2 * GOAL_FDS,
                    f"least per minute {min(floors)}-{max(floors)} (goal +-{GOAL_FDS}; at most"
                    f" {max(r['handles_max'] for r in half)} open for a moment); sockets follow the"
                    f" requests in flight: {min(r['fds_min'] for r in half)}-{max(r['fds_max'] for r in half)}"
                    " FDs in all"))
        p2, plast = rows[1]["p99_ms"], rows[-1]["p99_ms"]
        out.append(("p99 last minute vs second", plast <= GOAL_P99 * p2,
                    f"{p2:.1f} -> {plast:.1f} ms ({plast / p2:.2f}x; goal <= {GOAL_P99}x)"))
    rest = res["rest"]["rss"] / MB
    bounds = sum(rows[-1]["bounds"].values()) / MB if rows else 0.0
    steady = rows[-1]["rss_mb"] if rows else 0.0
    limit = rest + bounds + GOAL_HEADROOM_MB
    out.append(("steady RSS <= rest + caps + 40 MB", steady <= limit,
                f"{steady:.1f} <= {rest:.1f} + {bounds:.1f} + {GOAL_HEADROOM_MB} = {limit:.1f} MB"))
    idle = res["idle"]
    out.append(("FDs idle after the load vs rest", idle["fds"] <= res["rest"]["fds"] + GOAL_FDS,
                f"{res['rest']['fds']} at rest, {idle['fds']} idle after ({res['args']['after']:.0f} s)"))
    if res.get("after_burst"):
        before, after = idle["rss"] / MB, res["after_burst"]["rss"] / MB
        out.append(("RSS back after a burst", after <= GOAL_AFTER_BURST * before,
                    f"{before:.1f} before, {res['burst_end']['rss'] / MB:.1f} at its end, {after:.1f} MB"
                    f" {res['args']['after']:.0f} s after ({after / before:.2f}x; goal <= {GOAL_AFTER_BURST}x)"))
    wrong = sum(res["problems"].values()) + res["tracebacks"] + (res["burst"] or {}).get("failed", 0)
    out.append(("answers as documented", wrong == 0,
                f"{sum(r['requests'] for r in rows)} requests, {wrong} problem(s), "
                f"{res['tracebacks']} traceback(s) in the log"))
    return out


def report(res: dict[str, Any]) -> None:
    rows = res["minutes"]
    a = res["args"]
    print(f"soak: {a['minutes']} min at {a['rps']} req/s offered, population {a['population']}, "
          f"threshold {a['threshold']}, PYTHONMALLOC={a['allocator']}; {res['sessions']} sessions, "
          f"{res['conversations']} conversations ({res['subagents']} subagents), "
          f"{res['durable']} durable facts; foreign load {res['load']}"
          f"; MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}")
    print(f"rest: RSS {res['rest']['rss'] / MB:.1f} MB, {res['rest']['fds']} FDs {res['rest']['fd_kinds']}, "
          f"{res['rest']['threads']} threads")
    print(f"{'min':>3} {'req/s':>6} {'skip':>5} {'left':>5} {'4xx':>4} {'bad':>4} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'RSS MB':>7} {'anon':>6} {'file':>5} {'shm':>5} {'FDs':>7} {'files':>5} {'thr':>4} {'cpu':>5} {'other':>5}")
    for r in rows:
        print(f"{r['minute']:>3} {r['rps']:6.1f} {r['skipped']:5d} {r['left']:5d} {r['errors_expected']:4d} {r['unexpected']:4d} "
              f"{r['p50_ms']:7.1f} {r['p99_ms']:7.1f} {r['rss_mb']:7.1f} {r.get('anon_mb', 0):6.1f} {r.get('file_mb', 0):5.1f} "
              f"{r.get('shmem_mb', 0):5.1f} {r['fds_min']:3d}-{r['fds_max']:<3d} "
              f"{r['handles_min']:2d}-{r['handles_max']:<2d} {r['threads']:4d} {r['proxy_cpu']:5.2f} {r['foreign_cores']:5.2f}")
    print("(RSS MB: the minute's last sample; anon, file, shm: the minute's medians of RssAnon (the heap),"
          " RssFile (mapped files) and RssShmem (shared memory: SQLite's WAL index);"
          " FDs: least and most of the 5 s samples; files: those that are not sockets (files, the database's,"
          " the loop's); cpu: cores the proxy used; other: cores the rest of the machine used, beside this"
          " bench and its upstream, of 2)")
    names = sorted({c for r in rows for c in r["caches"] if not c.endswith((" evicted", " weight"))})
    if names:
        print("cache entries per minute (evicted so far):")
        print("min " + " ".join(f"{c[:14]:>14}" for c in names))
        for r in rows:
            cells = []
            for c in names:
                v = r["caches"].get(c)
                e = r["caches"].get(f"{c} evicted", 0)
                cells.append(f"{'-' if v is None else f'{v:.0f}'}({e:.0f})".rjust(14))
            print(f"{r['minute']:>3} " + " ".join(cells))
        weights = {c.removesuffix(" weight"): v for c, v in rows[-1]["caches"].items() if c.endswith(" weight")}
        if weights:
            print("bytes of text held at the end, MB: " + ", ".join(f"{c} {v / MB:.1f}" for c, v in sorted(weights.items())))
        bounds = rows[-1]["bounds"]
        print("documented memory at the bound, MB: " + ", ".join(
            f"{c} {v / MB:.1f}" for c, v in sorted(bounds.items())) + f"; sum {sum(bounds.values()) / MB:.1f}")
    idle = res["idle"]
    print(f"idle {a['after']:.0f} s after the load: RSS {idle['rss'] / MB:.1f} MB, {idle['fds']} FDs "
          f"{idle['fd_kinds']}, {idle['threads']} threads")
    if res.get("burst"):
        b = res["burst"]
        print(f"burst: {b['streams']} simultaneous streams, {b['ok']} ok; RSS at its end "
              f"{res['burst_end']['rss'] / MB:.1f} MB, {a['after']:.0f} s after "
              f"{res['after_burst']['rss'] / MB:.1f} MB, {res['after_burst']['fds']} FDs {res['after_burst']['fd_kinds']}")
    if res["problems"]:
        print("problems: " + ", ".join(f"{k} x{v}" for k, v in res["problems"].items()))
        for line in res["examples"]:
            print(f"  {line}")
    print("verdict:")
    for name, ok, detail in verdict(res):
        print(f"  {'met' if ok else 'NOT met':>7}  {name}: {detail}")


# --- --find: what grows, from the probe's snapshots ------------------------------------------


def find_report(probe: Path, top: int = 30) -> None:
    """What grew between the second snapshot and the last: the named structures (every container
    an object of the proxy holds), the allocation sites (innermost frame in ``proxy/``, with
    tracemalloc) and the object types."""
    types = sorted(probe.glob("types-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if len(types) < 3:
        print(f"--find: only {len(types)} snapshot(s); run longer")
        return
    ta, tb = json.loads(types[1].read_text()), json.loads(types[-1].read_text())
    print(f"--find: named structures from {types[1].stem} to {types[-1].stem} (items; all that grew):")
    grown = sorted(((n - ta["named"].get(k, 0), k, n) for k, n in tb["named"].items()), reverse=True)
    for diff, name, n in grown:
        if diff > 0:
            print(f"  {diff:+9d}  now {n:9d}  {name}")
    print("--find: live objects per type, growth:")
    tgrowth = sorted(((n - ta["counts"].get(t, 0), t, n) for t, n in tb["counts"].items()), reverse=True)
    for diff, t, n in tgrowth[:top]:
        print(f"  {diff:+9d}  now {n:9d}  {t}")
    snaps = sorted(probe.glob("snap-*.pickle"), key=lambda p: int(p.stem.split("-")[1]))
    if len(snaps) < 3:
        return
    import tracemalloc

    def by_site(path: Path) -> Counter[str]:
        sizes: Counter[str] = Counter()
        for stat in tracemalloc.Snapshot.load(str(path)).statistics("traceback"):
            frames = [f for f in stat.traceback if "/proxy/" in f.filename]
            site = frames[-1] if frames else stat.traceback[-1]
            outer = frames[0] if len(frames) > 1 else None
            where = f"{site.filename.split('/proxy/')[-1]}:{site.lineno}"
            if outer is not None:
                where += f" <- {outer.filename.split('/proxy/')[-1]}:{outer.lineno}"
            sizes[where] += stat.size
        return sizes

    a, b = by_site(snaps[1]), by_site(snaps[-1])
    growth = sorted(((b[k] - a.get(k, 0), k) for k in b), reverse=True)[:top]
    print(f"--find: allocation growth from {snaps[1].stem} to {snaps[-1].stem} (innermost proxy frame <- outermost):")
    for diff, where in growth:
        print(f"  {diff / 1024:+10.1f} KiB  now {b[where] / 1024:10.1f} KiB  {where}")


def native_report(probe: Path, minutes: float) -> list[dict[str, Any]]:
    """``--native``: the probe's native counters, the last sample of each minute of the load, and
    how much each grew over the second half (what the heap's growth is: in use by SQLite, in use
    by the rest, or free but kept)."""
    path = probe / "native.jsonl"
    samples = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if len(samples) < 4:
        print(f"--native: only {len(samples)} sample(s); run longer")
        return samples
    t0 = samples[0]["t"]
    per_minute: dict[int, dict[str, Any]] = {}
    for sample in samples:
        minute = int((sample["t"] - t0) // 60) + 1
        if minute <= minutes:
            per_minute[minute] = {"minute": minute, **sample}
    rows = [per_minute[m] for m in sorted(per_minute)]
    cols = [c for c in ("RssAnon", "malloc_arena", "malloc_hblkhd", "malloc_uordblks", "malloc_fordblks",
                        "jemalloc_allocated", "jemalloc_active", "jemalloc_resident", "sqlite_memory_used",
                        "tracemalloc_traced", "tracemalloc_self") if c in rows[0]]
    print("--native: MB at each minute's last sample (uordblks: in use in malloc's heaps; fordblks: free"
          " but kept; hblkhd: mmapped chunks;"
          " sqlite: SQLite's own allocations, inside uordblks; traced: Python's, with --trace; self: tracemalloc's own)")
    print("  min  " + "  ".join(f"{c.removeprefix('malloc_'):>12}" for c in cols)
          + "  threads  full collections (objects collected)")
    for row in rows:
        print(f"  {row['minute']:3d}  " + "  ".join(f"{row[c] / MB:12.1f}" for c in cols) + f"  {row['threads']:7d}"
              + f"  {row.get('gc_full_collections', 0):5d} ({row.get('gc_full_collected', 0)})")
    half = rows[len(rows) // 2 - 1]
    last = rows[-1]
    print(f"--native: growth from minute {half['minute']} to {last['minute']}: " + ", ".join(
        f"{c.removeprefix('malloc_')} {(last[c] - half[c]) / MB:+.1f} MB" for c in cols))
    return rows


# --- main ------------------------------------------------------------------------------------


def foreign_load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3]) + " (loadavg)"
    except OSError:
        return "?"


def traceback_count(child: Child) -> int:
    if child.log_path is None:
        return 0
    return child.log_path.read_text(errors="replace").count("Traceback")


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_nofile()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up, bedrock = spawn_soak_upstream()
            cfg = write_config(tmp, up.url, bedrock, args)
            proxy = spawn_proxy(tmp, cfg, args)
            pid = proxy.proc.pid
            time.sleep(args.rest)
            rest = proc_sample(pid)
            others0 = up.cpu_seconds() + self_cpu_seconds()
            soak = Soak(args, proxy.url, pid, up)
            soak.others0 = others0
            asyncio.run(soak.run())
            time.sleep(args.after)
            idle = proc_sample(pid)
            burst_res = burst_end = after_burst = None
            if args.burst:
                burst_res = asyncio.run(burst(proxy.url, args.burst))
                burst_end = proc_sample(pid)
                time.sleep(args.after)
                after_burst = proc_sample(pid)
            if proxy.proc.poll() is not None:
                raise RuntimeError("the proxy died:\n" + (proxy.log_path.read_text()[-3000:] if proxy.log_path else ""))
            tracebacks = traceback_count(proxy)
            if args.keep_log:
                Path(args.keep_log).write_text(proxy.log_path.read_text(errors="replace") if proxy.log_path else "")
        finally:
            for child in reversed(list(CHILDREN.values())):
                child.stop()
        if args.find:
            find_report(tmp / "probe")
        if args.native:
            native = native_report(tmp / "probe", args.minutes)
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rest": rest,
        "minutes": minute_rows(run_minutes(soak.minutes, args.minutes), {**rest, "others": soak.others0}),
        "idle": idle,
        "burst": burst_res,
        "burst_end": burst_end,
        "after_burst": after_burst,
        "problems": dict(soak.problems),
        "examples": soak.examples,
        "tracebacks": tracebacks,
        "sessions": soak.pop.sessions,
        "conversations": soak.pop.conversations,
        "subagents": soak.pop.subagents,
        "durable": soak.durable_written,
        "load": foreign_load(),
        "native": native if args.native else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rps", type=float, default=36.0, help="requests a second, offered (open loop)")
    p.add_argument("--population", type=int, default=400, help="live conversations at once")
    p.add_argument("--threshold", type=int, default=12_000, help="compaction.threshold (tokens)")
    p.add_argument("--max-body", type=int, default=2 * MB, help="limits.max_body_bytes")
    p.add_argument("--allocator", default="malloc", choices=("malloc", "pymalloc", "jemalloc", "malloc-mmap"))
    p.add_argument("--rest", type=float, default=10.0, help="idle seconds after start-up")
    p.add_argument("--after", type=float, default=70.0,
                   help="idle seconds after the load and after the burst (the upstream pool closes idle"
                        " connections after 30 s, swept every 30 s)")
    p.add_argument("--burst", type=int, default=1000, help="simultaneous streams after the load (0: none)")
    p.add_argument("--max-inflight", type=int, default=64,
                   help="requests in flight at most: an arrival beyond it is skipped (and counted)")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between process samples")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--find", action="store_true",
                   help="run the proxy under tracemalloc; each minute the load pauses, nothing in flight, and"
                        " the probe takes a snapshot; at the end, what grew")
    p.add_argument("--find-frames", type=int, default=2, help="tracemalloc frames (0: no tracemalloc)")
    p.add_argument("--native", type=float, default=0.0, metavar="SECONDS",
                   help="every SECONDS, without pausing the load, read the proxy's native memory counters"
                        " (glibc's mallinfo2: in use and free in the heap; SQLite's memory used); at the"
                        " end, a table of them per minute")
    p.add_argument("--trace", action="store_true",
                   help="with --native: run the proxy under tracemalloc (--find-frames deep) so that Python's"
                        " share of the heap is known (slower)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--keep-log", metavar="PATH", help="copy the proxy's log here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    report(res)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return 0 if all(ok for _n, ok, _d in verdict(res)) else 1


if __name__ == "__main__":
    sys.exit(main())
