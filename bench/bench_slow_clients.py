#!/usr/bin/env python
"""Benchmark: a normal client's latency while 2,000 hostile connections are held open.

    python bench/bench_slow_clients.py [--quick] [--baseline] [--json out.json]

Processes (all on 127.0.0.1): the demo upstream (``python -m proxy demo-upstream``), the proxy
(``python -m proxy serve``, shipped limits unless told otherwise), the attacker (this script
with ``--_role attack``) and this process, the normal client (apart, so that the attackers' own
work does not show in its latency):

* ``--slow-headers`` (1,000) connections send a request head one byte every 2 s (slowloris);
* ``--idle`` (500) connections open and send nothing;
* ``--slow-bodies`` (500) connections send a complete ``POST /v1/messages`` head announcing a
  1 MB body, then one body byte every 40 s (longer than the body timeout, shorter than nothing).

Every attacker reconnects as soon as the proxy closes it, so about 2,000 hostile connections are
open for the whole run (the figure is sampled and reported). Meanwhile a normal client sends one
``POST /v1/messages`` (a small valid body, non-streaming) every ``--interval`` seconds, each on a
new connection (a new client), and records its latency and failures.

``--baseline`` runs the proxy as main ran it: no header/body timeouts (1e6 s), no connection
limit, and a hard open-files limit of 1,024 for the proxy process (the common default that main
never raised), to show the lock-out the limits remove.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

BODY = json.dumps(
    {"model": "claude-demo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
).encode()


def _spawn(args: list[str], *, nofile: int | None = None) -> tuple[subprocess.Popen[str], str]:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", *args],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=limit,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if match:
            # keep draining stderr, or the child blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
            return proc, match.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"{args[0]} did not start")


class Attack:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.open = 0
        self.closed_by_proxy = 0
        self.connect_failures = 0
        self.stopping = False

    async def _hold(self, kind: str) -> None:
        while not self.stopping:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                self.connect_failures += 1
                await asyncio.sleep(0.5)
                continue
            self.open += 1
            try:
                await self._behave(kind, reader, writer)
            except (ConnectionError, OSError):
                pass
            finally:
                self.open -= 1
                writer.close()
            if not self.stopping:
                self.closed_by_proxy += 1

    async def _behave(self, kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def closed_within(seconds: float) -> bool:
            try:
                data = await asyncio.wait_for(reader.read(65536), seconds)
            except TimeoutError:
                return False
            del data  # an answer (408) or the end of the stream: either way, closed
            return True

        if kind == "idle":
            while not self.stopping and not await closed_within(5):
                pass
            return
        if kind == "slow_header":
            head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000
            for byte in head:
                if self.stopping:
                    return
                writer.write(bytes([byte]))
                if await closed_within(2):
                    return
            return
        writer.write(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: attacker\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
        )
        while not self.stopping:
            if await closed_within(40):
                return
            writer.write(b" ")

    def start(self, counts: dict[str, int]) -> list[asyncio.Task[None]]:
        tasks = []
        for kind, n in counts.items():
            for _ in range(n):
                tasks.append(asyncio.create_task(self._hold(kind)))
        return tasks


async def _normal_request(host: str, port: int, limit: float) -> float | None:
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), limit)
        writer.write(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-ant-bench\r\n"
            b"anthropic-version: 2023-06-01\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        )
        data = await asyncio.wait_for(reader.read(), limit - (time.perf_counter() - started))
        writer.close()
    except (TimeoutError, OSError):
        return None
    if not data.startswith(b"HTTP/1.1 200 "):
        return None
    return time.perf_counter() - started


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _metric(host: str, port: int, name: str) -> str:
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = (await asyncio.wait_for(reader.read(), 10)).decode()
        writer.close()
    except (TimeoutError, OSError):
        return "unavailable"
    return "; ".join(line for line in text.splitlines() if line.startswith(name)) or "0"


async def _attack(args: argparse.Namespace) -> None:
    """The attacker process: hold the connections; print the open count every 0.5 s."""
    host, port_text = args.target.removeprefix("http://").split(":")
    attack = Attack(host, int(port_text))
    counts = {"slow_header": args.slow_headers, "idle": args.idle, "slow_body": args.slow_bodies}
    attack.start(counts)
    while True:
        print(f"{attack.open} {attack.closed_by_proxy} {attack.connect_failures}", flush=True)
        await asyncio.sleep(0.5)


async def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    host, port_text = url.removeprefix("http://").split(":")
    port = int(port_text)
    attacker = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurement
        [sys.executable, __file__, "--_role", "attack", "--target", url,
         "--slow-headers", str(args.slow_headers), "--idle", str(args.idle),
         "--slow-bodies", str(args.slow_bodies)],
        stdout=subprocess.PIPE, text=True,
    )
    state = {"open": 0, "reconnects": 0, "failures": 0}

    def follow() -> None:
        for line in attacker.stdout or ():
            a, b, c = (int(x) for x in line.split())
            state.update(open=a, reconnects=b, failures=c)

    threading.Thread(target=follow, daemon=True).start()
    hostile = args.slow_headers + args.idle + args.slow_bodies
    deadline = time.monotonic() + 60
    while state["open"] < hostile * 0.95 and time.monotonic() < deadline:  # noqa: ASYNC110 - a bounded ramp-up poll
        await asyncio.sleep(0.2)
    latencies: list[float] = []
    failures = 0
    open_samples: list[int] = []
    end = time.monotonic() + args.duration
    try:
        while time.monotonic() < end:
            open_samples.append(state["open"])
            latency = await _normal_request(host, port, args.timeout)
            if latency is None:
                failures += 1
            else:
                latencies.append(latency)
            await asyncio.sleep(args.interval)
        closed = await _metric(host, port, "context_proxy_connections_closed_total")
    finally:
        attacker.kill()
        attacker.wait()
    n = len(latencies) + failures
    return {
        "mode": "baseline (main's behaviour)" if args.baseline else "shipped limits",
        "hostile_connections_target": hostile,
        "hostile_open_min": min(open_samples) if open_samples else 0,
        "hostile_open_median": sorted(open_samples)[len(open_samples) // 2] if open_samples else 0,
        "hostile_reconnects": state["reconnects"],
        "hostile_connect_failures": state["failures"],
        "normal_requests": n,
        "normal_failures": failures,
        "normal_p50_ms": round(_pct(latencies, 50) * 1000, 1) if latencies else None,
        "normal_p99_ms": round(_pct(latencies, 99) * 1000, 1) if latencies else None,
        "normal_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "proxy_closed": closed,
        "duration_s": args.duration,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.python_version()}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 s instead of 60 s")
    parser.add_argument("--baseline", action="store_true", help="run the proxy as main did (see above)")
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between normal requests")
    parser.add_argument("--timeout", type=float, default=10.0, help="a normal request slower than this fails")
    parser.add_argument("--slow-headers", type=int, default=1000)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--slow-bodies", type=int, default=500)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--_role", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attackers' own sockets
    if args._role == "attack":
        asyncio.run(_attack(args))
        return 0
    args.duration = args.duration or (20.0 if args.quick else 60.0)
    with tempfile.TemporaryDirectory() as tmp:
        upstream, upstream_url = _spawn(["demo-upstream", "--port", "0"])
        config = Path(tmp) / "proxy.yaml"
        limits = (
            "limits: {header_timeout: 1000000, body_timeout: 1000000, max_connections: 1000000}\n"
            if args.baseline else ""
        )
        config.write_text(
            f"upstream: {{base_url: '{upstream_url}'}}\nstate_dir: '{tmp}'\n{limits}"
            "logging: {level: INFO}\n"
        )
        proxy, url = _spawn(
            ["serve", "--config", str(config), "--port", "0"], nofile=1024 if args.baseline else None
        )
        try:
            result = asyncio.run(_run(args, url))
        finally:
            for proc in (proxy, upstream):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    for key, value in result.items():
        print(f"{key:28} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
