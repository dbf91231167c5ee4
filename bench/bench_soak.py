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

Verdict (the issue's targets): RSS over the second half grows < 3 % (the trend: a line fitted
through the medians of minutes 15-30; the two end samples' growth printed beside it, since one
5 s sample lands anywhere in the +-5 MB sawtooth of idle releases and uncollected garbage); steady RSS (the last minute)
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench.measure import CLK_TCK, self_cpu_seconds, system_busy_seconds  # noqa: E402
from bench.servers import CHILDREN, Child, allocator_env, raise_nofile, spawn_logged  # noqa: E402
from bench.soak_findings import find_report, native_report  # noqa: E402
from bench.soak_verdict import Minute, minute_rows, report, run_minutes, verdict  # noqa: E402
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
        "limits": {"max_body_bytes": args.max_body,
                   **({"cache_idle_seconds": args.idle_caches} if args.idle_caches is not None else {})},
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
    env = proxy_env(tmp, args.allocator)
    if args.native_collect:
        env["SOAK_PROBE_COLLECT"] = "1"
    return spawn_logged("proxy", argv, tmp, env=env)


# --- the load --------------------------------------------------------------------------------


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


async def caches_now(url: str) -> dict[str, float]:
    """Each cache's entries, from ``/metrics``."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        return scrape(await resp.text())[0]


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
            drained = None
            if args.drain:  # the conversations have stopped: what memory falls back to
                time.sleep(args.drain)
                drained = {**proc_sample(pid), "caches": asyncio.run(caches_now(proxy.url))}
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
        "drained": drained,
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
    p.add_argument("--allocator", default="jemalloc", choices=("malloc", "pymalloc", "jemalloc", "malloc-mmap"),
                   help="the proxy's allocator (default: what the Docker image ships, jemalloc preloaded with"
                        " PYTHONMALLOC=malloc)")
    p.add_argument("--rest", type=float, default=10.0, help="idle seconds after start-up")
    p.add_argument("--after", type=float, default=70.0,
                   help="idle seconds after the load and after the burst (the upstream pool closes idle"
                        " connections after 30 s, swept every 30 s)")
    p.add_argument("--idle-caches", type=float, default=None, metavar="SECONDS",
                   help="limits.cache_idle_seconds (default: the shipped 600 s)")
    p.add_argument("--drain", type=float, default=0.0, metavar="SECONDS",
                   help="after everything else, this many idle seconds more, then RSS and the caches' entries"
                        " (past --idle-caches: the per-conversation caches forgotten, memory given back)")
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
    p.add_argument("--native-collect", action="store_true",
                   help="with --native: a full collection after each sample (is what the heap keeps garbage"
                        " in reference cycles?), and the counters again after it")
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
