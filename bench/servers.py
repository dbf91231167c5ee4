"""The processes of bench/bench_proxy.py: the fake upstream, the floor relay, the proxy, and how
they are started, stopped and measured (CPU time and resident memory from /proc)."""

from __future__ import annotations

import argparse
import asyncio
import glob
import hashlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.workloads import conc_events, sse_events
from tests.upstream import FakeUpstream, Reply, Stream, message_json

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
BENCH_SCRIPT = Path(__file__).resolve().with_name("bench_proxy.py")  # runs the --_role children
# A streamed request, found without parsing the body (a peer may not forward x-bench-mode).
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def raise_nofile(want: int = 65536) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < new:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` (VmRSS from /proc/<pid>/status), in MB (2^20 bytes)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# --- the fake upstream, in its own process -----------------------------------------------------


@dataclass
class BarrierStream(Stream):
    """A stream that starts only once ``barrier`` concurrent streams have arrived (or 60 s)."""

    barrier: int = 0
    idx: int = 0


class BenchUpstream(FakeUpstream):
    """The test fake upstream, dispatching on an ``x-bench-mode`` header (no body parsing), not
    keeping request bodies, and counting its peak of simultaneous requests."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = deque(maxlen=8)  # type: ignore[assignment]
        self.peak_active = 0
        self.sse_200 = sse_events()
        self.conc_sent: dict[str, str] = {}  # stream index -> sha256 of the bytes sent
        self.arrived = 0
        self.go = asyncio.Event()

    async def start(self) -> str:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    def _default(self, recorded: Any) -> Any:
        mode = recorded.headers.get("x-bench-mode", "")
        if mode == "json":
            return Reply(message_json())
        if mode == "sse":
            return Stream(events=self.sse_200)
        if mode == "conc":
            idx = int(recorded.headers["x-bench-idx"])
            events = conc_events(idx, int(recorded.headers["x-bench-events"]))
            self.conc_sent[str(idx)] = hashlib.sha256(b"".join(events)).hexdigest()
            return BarrierStream(
                events=events,
                pace=float(recorded.headers["x-bench-pace"]),
                barrier=int(recorded.headers["x-bench-barrier"]),
                idx=idx,
            )
        if recorded.path == "/_bench/stats":
            return Reply({"peak_active": self.peak_active, "conc_sent": self.conc_sent})
        if recorded.path == "/_bench/reset":
            self.peak_active = 0
            self.conc_sent = {}
            self.arrived = 0
            self.go = asyncio.Event()
            return Reply({"ok": True})
        if recorded.path.endswith("/messages") and not mode:
            # No x-bench-mode (a peer that does not forward it): the provider's answer, without
            # parsing the body (that would add the body's parse time to the peer's latency).
            return Stream(events=self.sse_200) if STREAM_TRUE.search(recorded.body) else Reply(message_json())
        return super()._default(recorded)

    async def _answer(self, request: web.Request, entry: Any) -> web.StreamResponse:
        self.peak_active = max(self.peak_active, self.active)
        if isinstance(entry, BarrierStream):
            self.arrived += 1
            if self.arrived >= entry.barrier:
                self.go.set()
            try:
                await asyncio.wait_for(self.go.wait(), 60)
            except TimeoutError:
                pass
        return await super()._answer(request, entry)


async def serve_upstream(*ups: Any) -> None:
    """Run fake upstreams (each with ``start() -> url`` and ``stop()``) in this process until
    SIGTERM/SIGINT; their URLs go to stdout first (``UPSTREAM <url> ...``: what
    ``spawn_upstream`` reads)."""
    urls = [await up.start() for up in ups]
    print("UPSTREAM " + " ".join(urls), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for up in ups:
        await up.stop()


async def _run_upstream() -> None:
    raise_nofile()
    await serve_upstream(BenchUpstream())


# --- the floor: a minimal aiohttp pass-through, in its own process -------------------------------

_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "host"})


async def _run_relay(upstream: str) -> None:
    raise_nofile()
    connector = aiohttp.TCPConnector(limit=2000, limit_per_host=2000)
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                    skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP | {"content-length"}]
        async with session.request(request.method, upstream + request.raw_path, headers=headers,
                                   data=body, allow_redirects=False) as up:
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in _HOP})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
    print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await session.close()


# --- a trace collector: takes OTLP/HTTP exports, answers at once --------------------------------


async def _run_receiver() -> None:
    """What a local collector costs the proxy: each export read whole and answered with an empty
    ``ExportTraceServiceResponse`` (zero bytes of protobuf); counted, never decoded."""
    received = {"exports": 0, "bytes": 0}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received["exports"] += 1
        received["bytes"] += len(body)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def counts(request: web.Request) -> web.StreamResponse:
        return web.json_response(received)

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/traces", handle)
    app.router.add_get("/counts", counts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


# --- process management ------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path | None = None

    def cpu_seconds(self) -> float:
        """utime + stime of the whole process (all threads), from /proc/<pid>/stat."""
        with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)

    def sched_seconds(self) -> float:
        """Sum of on-CPU nanoseconds of the live threads (/proc/<pid>/task/*/schedstat)."""
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[0])
            except OSError:
                continue  # the thread ended since the listing: its time is no longer counted
        return total / 1e9

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_listening(child: Child, timeout: float = 60) -> str:
    """The URL from the child's "listening on http://127.0.0.1:PORT" log line or, when its log
    level hides that line (the port was then chosen by the bench), from a /healthz answer."""
    assert child.log_path is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = child.log_path.read_text(errors="replace")
        m = LISTENING.search(text)
        if m:
            return f"http://127.0.0.1:{m.group(1)}"
        if child.url and _healthy(child.url):
            return child.url
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{text}")
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not report 'listening on' within {timeout}s")


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_upstream() -> Child:
    proc = subprocess.Popen(
        [sys.executable, str(BENCH_SCRIPT), "--_role", "upstream"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("UPSTREAM "):
        raise RuntimeError(f"fake upstream did not start: {line!r}")
    return Child("upstream", proc, line.split()[1])


CHILDREN: dict[str, Any] = {}  # name -> Child or PeerChild, in start order


def allocator_env(allocator: str) -> dict[str, str]:
    """This process's environment for a proxy child with ``allocator`` as its small-object
    allocator: ``PYTHONMALLOC=malloc`` (what the Docker image sets), unset for pymalloc, or
    ``jemalloc``: ``PYTHONMALLOC=malloc`` with jemalloc preloaded in place of glibc's malloc."""
    env = dict(os.environ)
    env.pop("PYTHONMALLOC", None)
    env.pop("LD_PRELOAD", None)
    if allocator in ("malloc", "jemalloc", "malloc-mmap"):
        env["PYTHONMALLOC"] = "malloc"
    if allocator == "jemalloc":
        env["LD_PRELOAD"] = JEMALLOC
    if allocator == "malloc-mmap":  # glibc's mmap threshold fixed at 128 KiB (not raised as blocks are freed)
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    return env


# Debian's libjemalloc2 (what the Docker image preloads), on this machine's architecture
JEMALLOC = next(iter(sorted(glob.glob("/usr/lib/*-linux-gnu/libjemalloc.so.2"))), "libjemalloc.so.2")


def spawn_logged(name: str, argv: list[str], tmp: Path, url: str = "", env: dict[str, str] | None = None) -> Child:
    """Start a child with its stderr in a file (a full pipe would stall it), register it in
    CHILDREN at once (so that it is stopped even if it never comes up), wait until it listens."""
    log_path = tmp / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, cwd=tmp,
                                env=env)
    child = CHILDREN[name] = Child(name, proc, url, log_path)
    child.url = _wait_listening(child)
    return child


class PeerChild:
    """A peer (bench/peers.py) seen as a Child: CPU time for the per-request figures, stop."""

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.name: str = peer.name
        self.url: str = peer.url
        self.proc: subprocess.Popen[bytes] = peer.proc
        self.log_path: Path | None = peer.log_path

    def cpu_seconds(self) -> float:
        return float(self.peer.cpu_seconds())

    def sched_seconds(self) -> float:
        return self.cpu_seconds()

    def stop(self) -> None:
        self.peer.stop()


def write_proxy_config(
    tmp: Path, upstream_url: str, args: argparse.Namespace, name: str = "proxy", traces: str = ""
) -> Path:
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1"},
        "upstream": {"base_url": upstream_url, "pool_size": max(1024, args.conc_streams + 64)},
        "limits": {"max_concurrent_requests": max(2048, args.conc_streams * 2)},
        "shutdown": {"grace_seconds": 5},
        "state_dir": str(tmp / f"state-{name}"),
        "logging": {"level": args.proxy_log_level},
    }
    if args.compaction == "off":
        cfg["compaction"] = {"enabled": False}
    if args.ledger == "off":
        cfg["ledger"] = {"enabled": False}
    if getattr(args, "quota", "off") == "on" and name == "proxy":
        # budgets and rate limits on, never reached: every request pays admission and settlement
        policies = tmp / f"policies-{name}"
        policies.mkdir(exist_ok=True)
        policy = {
            "name": "bench",
            "provider": {"mode": "passthrough"},
            "quota": {"requests_per_minute": 10**12, "input_tokens_per_minute": 10**15,
                      "output_tokens_per_minute": 10**15, "budget_usd": 10**8, "budget_period": "month"},
        }
        (policies / "bench.yaml").write_text(json.dumps(policy))
        cfg["policies_dir"] = str(policies)
    if traces:  # the OTLP/HTTP endpoint of bench_proxy's receiver (--tracing / --baseline-tracing)
        cfg["tracing"] = {"enabled": True, "endpoint": traces}
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    return path


