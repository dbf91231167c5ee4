#!/usr/bin/env python
"""Benchmark: what compaction costs the proxy -- counting CPU, reused-plan latency, loop stalls.

    python bench/bench_compaction.py [--quick] [--json out.json]

Three measurements, side by side in one run (figures, targets and method: bench/COMPACTION.md):

1. **Counting CPU, block cache on vs. off** (in this process, no HTTP). The real Claude Code
   transcript is replayed turn by turn (request k = ``messages[:k]`` ending on a user turn, plus
   its tools) through ``TokenCounter.count_request``: once with one warm counter for the whole
   replay, once with ``cache_size=0`` (nothing memoised; still hashes, as the proxy would).
   ``time.process_time`` of each pass; the passes alternate, repeated, medians reported.
   Target: >= 20x less CPU with the cache.

2. **Added latency of a reused-plan request at ~100k tokens.** Process layout as in
   bench/bench_proxy.py: a fake upstream (tests/upstream.py, subclassed) and the proxy
   (``python -m proxy serve --port 0 --config <yaml>``, compaction at its defaults: threshold 80k)
   each in their own process. Bodies are laid out as Claude Code sends them: compact JSON,
   ``model``, ``messages`` with a ``cache_control`` breakpoint on the last block of the last
   message (moved every turn), then ``tools``. Turn N (>= 100k tokens by our counter) is sent once
   through the proxy (compaction, summary call answered by the fake upstream: plan ``new``); then
   turns N+1, N+2, ... (each one more assistant tool call + its small result) are sent,
   interleaved in rotating order, directly to the upstream, through the proxy (plan ``reused``,
   checked on every request) and through the proxy with ``x-compaction: off`` (parse + validate +
   forward only; as another conversation: one more member before ``messages``, so that the proxy
   does not see each body twice); in cycles of 40 turns on fresh conversations. ``--store
   both`` adds a second proxy on PostgreSQL and ``--compare-root`` one running other code, in
   the same rotation. Part 2b times the proxy's steps in process, for a re-sent body and from
   scratch. Target: added p50 (proxy - direct) <= 5 ms.

3. **Event-loop stall during a cold ~200k-token request.** A prober process (a blocking socket,
   keep-alive, one ``GET /healthz`` every 2 ms) runs against the proxy while one cold request
   (unique text, never seen by the proxy's caches) is compacted: summary call, worker-thread
   counting and all. Max and p99 of the healthz latency during the request vs. idle, split by
   phase (the fake upstream timestamps the summary call and the forwarded request, on the same
   CLOCK_MONOTONIC). Then an in-process diagnosis: the loop lag of a 1 ms asyncio ticker while
   each piece of the proxy's work runs in ``asyncio.to_thread`` (3b), the summary call's own
   loop time (3c), the cost of a full garbage collection (3d). Part 3 alternates between the proxy
   as shipped and ``--variants`` started by a launcher with ``sys.setswitchinterval`` and/or
   ``gc.freeze()`` (A/B of proposed start-up changes). Target: no stall over 20 ms.

Nothing is added to the proxy: everything is measured from outside it (or by running its pure
core in this process). Every proxy process is started by ``LAUNCHER``, which registers a
``gc.callbacks`` hook (GC pauses, written at exit) and then runs ``python -m proxy`` unchanged.
The fake upstream reports ``input_tokens: 0`` so that the proxy's calibration (real / estimate)
stays at 1.0 -- a fake figure would otherwise skew the threshold.

Internal roles (spawned by the bench itself): ``--_role upstream``, ``prober``, ``sdkprobe``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench import report  # noqa: E402
from bench.servers import serve_upstream, stop_process  # noqa: E402
from bench.workloads import with_breakpoint  # noqa: E402
from proxy.core.compaction import (  # noqa: E402
    CompactionInput,
    CompactionPolicy,
    Done,
    PlanCache,
    compact,
    finish,
)
from proxy.core.protocol import validate_request  # noqa: E402
from proxy.core.tokens import TokenCounter  # noqa: E402
from tests.upstream import FakeUpstream, Reply, message_json  # noqa: E402

TRANSCRIPT = Path("/work/shared/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json")
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
MODEL = "claude-sonnet-4-5"

TARGET_CACHE_RATIO = 20.0  # x less counting CPU with the block cache
TARGET_ADDED_P50_MS = 5.0  # reused plan at ~100k tokens, proxy - direct
TARGET_MAX_STALL_MS = 20.0  # healthz latency during a cold 200k-token request

OFF_HEAD = {"metadata": {"user_id": "bench-opted-out"}}  # see bench_reused

API_HEADERS = {
    "x-api-key": "sk-ant-bench-not-a-key",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
}


def pct(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


# --- workloads ---------------------------------------------------------------------------------


def load_transcript() -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(TRANSCRIPT.read_bytes())
    return data


def _line_pool(transcript: dict[str, Any]) -> list[str]:
    """Real tool-output lines from the transcript, to build large, realistic tool results."""
    lines: list[str] = []
    for m in transcript["messages"]:
        if not isinstance(m["content"], list):
            continue
        for b in m["content"]:
            if b.get("type") != "tool_result":
                continue
            c = b.get("content")
            texts = (
                [c]
                if isinstance(c, str)
                else [x.get("text", "") for x in c or [] if isinstance(x, dict)]
            )
            for t in texts:
                lines += [ln for ln in t.splitlines() if ln.strip()]
    return lines


def _tag_blocks(messages: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with every tool id suffixed and every text made unique by ``tag``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            out.append({**m, "content": f"[{tag}] {content}"})
            continue
        blocks: list[dict[str, Any]] = []
        for b in content:
            b = dict(b)
            kind = b.get("type")
            if kind == "tool_use":
                b["id"] = f"{b['id']}_{tag}"
            elif kind == "tool_result":
                b["tool_use_id"] = f"{b['tool_use_id']}_{tag}"
                c = b.get("content")
                if isinstance(c, str):
                    b["content"] = f"[{tag}] {c}"
                elif (
                    isinstance(c, list)
                    and c
                    and isinstance(c[0], dict)
                    and c[0].get("type") == "text"
                ):
                    b["content"] = [{**c[0], "text": f"[{tag}] {c[0]['text']}"}, *c[1:]]
            elif kind == "text":
                b["text"] = f"[{tag}] {b['text']}"
            blocks.append(b)
        out.append({**m, "content": blocks})
    return out


def read_pair(i: int, tag: str, pool: list[str], lines: int = 130) -> list[dict[str, Any]]:
    """An assistant ``Read`` call and its large result (Claude Code's numbered-line format)."""
    tool_id = f"toolu_bench_read_{tag}_{i:05d}"
    path = f"/repo/src/pkg_{tag}/module_{i:04d}.py"
    start = (i * 977) % max(1, len(pool) - lines)
    text = "".join(f"{n + 1:6d}\u2192{pool[(start + n) % len(pool)][:160]}\n" for n in range(lines))
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Let me read {path} to see how it handles this."},
                {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": path}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": text}],
        },
    ]


def small_pair(k: int) -> list[dict[str, Any]]:
    """One more agent step: a short tool call and its short result (~40 tokens)."""
    tool_id = f"toolu_bench_step_{k:06d}"
    return [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": "Bash",
                    "input": {
                        "command": f"pytest -q tests/test_case_{k}.py",
                        "description": "Run one test",
                    },
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_id,
                    "content": f"1 passed in 0.{k % 97:02d}s",
                },
            ],
        },
    ]


def conversation(
    transcript: dict[str, Any], target_tokens: int, tag: str, counter: TokenCounter, pool: list[str]
) -> tuple[list[dict[str, Any]], int]:
    """The transcript (copied as often as fits, each copy made unique by ``tag``) extended with
    large ``Read`` results until our counter says >= ``target_tokens``; ends on a user turn."""
    tools = transcript["tools"]
    base = transcript["messages"]
    base_tokens = counter.count_request(None, tools, base).total
    copies = max(1, (target_tokens - 8_000) // base_tokens)
    messages: list[dict[str, Any]] = []
    for c in range(copies):
        messages += _tag_blocks(base, f"{tag}.{c}")
    i = 0
    while True:
        messages += read_pair(i, tag, pool)
        i += 1
        total = counter.count_request(None, tools, messages).total
        if total >= target_tokens:
            break
    body = {"model": MODEL, "max_tokens": 1024, "tools": tools, "messages": messages}
    violation = validate_request(body)
    assert violation is None, violation
    return messages, total


def body_bytes(
    transcript: dict[str, Any], messages: list[dict[str, Any]], head: dict[str, Any] | None = None
) -> bytes:
    """The request body as Claude Code lays it out: compact JSON, ``model``, ``messages`` (the
    breakpoint on the last message), then ``tools`` and the rest. ``head``: more members before
    ``messages`` (the bench gives each target that shares a proxy its own, so that the proxy
    sees one conversation per target, as it would with one client per conversation)."""
    return orjson.dumps(
        {
            "model": MODEL,
            **(head or {}),
            "messages": with_breakpoint(messages),
            "tools": transcript["tools"],
            "max_tokens": 1024,
        }
    )


# --- 1. counting CPU ---------------------------------------------------------------------------


def bench_counting(transcript: dict[str, Any], reps: int) -> dict[str, Any]:
    system, tools, msgs = transcript.get("system"), transcript["tools"], transcript["messages"]
    requests = [msgs[:k] for k in range(1, len(msgs) + 1) if msgs[k - 1]["role"] == "user"]
    TokenCounter().count_text("load the encoding once")  # process-wide; not part of either pass

    def cached_pass() -> tuple[float, TokenCounter]:
        counter = TokenCounter()
        t = time.process_time()
        for r in requests:
            counter.count_request(system, tools, r)
        return time.process_time() - t, counter

    def uncached_pass() -> float:
        counter = TokenCounter(cache_size=0)
        t = time.process_time()
        for r in requests:
            counter.count_request(system, tools, r)
        return time.process_time() - t

    def all_hits_pass() -> float:  # every block already memoised: the cost of hashing alone
        counter = TokenCounter()
        counter.count_request(system, tools, msgs)
        t = time.process_time()
        for r in requests:
            counter.count_request(system, tools, r)
        return time.process_time() - t

    def one_full_cold() -> float:  # tokenising every block of the transcript once
        counter = TokenCounter(cache_size=0)
        t = time.process_time()
        counter.count_request(system, tools, msgs)
        return time.process_time() - t

    def message_memo_pass() -> tuple[float, bool]:
        """PROTOTYPE (not proxy code): a message-level memo in front of the block memo -- one
        canonical dump + hash per message; a miss falls back to ``count_message``."""
        import xxhash

        counter = TokenCounter()
        memo: dict[int, int] = {}
        same = True
        t = time.process_time()
        for r in requests:
            total = counter.count_request(system, tools, ()).total
            for m in r:
                key = xxhash.xxh3_64_intdigest(orjson.dumps(m, option=orjson.OPT_SORT_KEYS))
                n = memo.get(key)
                if n is None:
                    n = memo[key] = counter.count_message(m)
                total += n
            if r is requests[-1]:
                same = total == counter.count_request(system, tools, r).total
        return time.process_time() - t, same

    cached, uncached, hits_only, full_cold, proto = [], [], [], [], []
    proto_same = True
    counter = None
    gc.collect()
    for _ in range(reps):
        c, counter = cached_pass()
        cached.append(c)
        uncached.append(uncached_pass())
        hits_only.append(all_hits_pass())
        pt, same = message_memo_pass()
        proto.append(pt)
        proto_same = proto_same and same
        full_cold.append(one_full_cold())
    assert counter is not None
    med_c, med_u = statistics.median(cached), statistics.median(uncached)
    last = counter.count_request(system, tools, msgs)
    return {
        "requests": len(requests),
        "messages_last": len(msgs),
        "tokens_last": last.total,
        "tokens_replayed": sum(counter.count_request(system, tools, r).total for r in requests),
        "reps": reps,
        "cpu_s": {
            "cached": cached,
            "uncached": uncached,
            "all_hits": hits_only,
            "tokenise_transcript_once": full_cold,
        },
        "median_cpu_s": {
            "cached": med_c,
            "uncached": med_u,
            "all_hits": statistics.median(hits_only),
            "tokenise_transcript_once": statistics.median(full_cold),
        },
        "ratio": med_u / med_c,
        "prototype_message_memo": {
            "cpu_s": proto,
            "median_cpu_s": statistics.median(proto),
            "ratio": med_u / statistics.median(proto),
            "same_total": proto_same,
        },
        "ratio_worst": min(u / c for u, c in zip(uncached, cached, strict=True)),
        "cached_counter": {
            "hits": counter.hits,
            "misses": counter.misses,
            "cache_len": counter.cache_len,
        },
        "target_ratio": TARGET_CACHE_RATIO,
        "met": med_u / med_c >= TARGET_CACHE_RATIO,
    }


# --- the fake upstream, in its own process -----------------------------------------------------

SUMMARY_TEXT = (
    "1. Goal and constraints: the user wants the repository history cleaned of secrets and "
    "large files, then force-pushed; keep a rollback tag.\n"
    "2. Decisions made: git filter-repo over BFG; redact paths under Archives/.\n"
    "3. Files and commands: "
    + "; ".join(f"edited src/module_{i}.py (handler fix)" for i in range(60))
    + ".\n"
    "4. Errors and fixes: push rejected (non-fast-forward) -> force push after review.\n"
    "5. Open work: verify the clean history on a fresh clone; next step: run the test suite.\n"
)


class BenchUpstream(FakeUpstream):
    """The test fake upstream; dispatches on ``x-bench-mode`` (no body parsing for the measured
    requests), keeps few bodies, timestamps arrivals (CLOCK_MONOTONIC, comparable across
    processes) and reports no input tokens (the proxy's calibration stays at 1.0)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = deque(maxlen=4)  # type: ignore[assignment]
        self.events: list[dict[str, Any]] = []

    def _default(self, recorded: Any) -> Any:
        now = time.monotonic()
        if recorded.path == "/_bench/events":
            events, self.events = self.events, []
            return Reply({"events": events})
        mode = recorded.headers.get("x-bench-mode", "")
        tag = recorded.headers.get("x-bench-tag", "")
        if mode == "json":
            if tag:
                self.events.append(
                    {"kind": "forward", "tag": tag, "t": now, "bytes": len(recorded.body)}
                )
            return Reply(message_json(input_tokens=0))
        if recorded.path.endswith(
            "/v1/messages"
        ):  # the proxy's summary call (the SDK, no bench header)
            self.events.append({"kind": "summary", "t": now, "bytes": len(recorded.body)})
            return Reply(message_json(SUMMARY_TEXT, input_tokens=0))
        return super()._default(recorded)


async def _run_upstream() -> None:
    await serve_upstream(BenchUpstream())


# --- the healthz prober, in its own process ----------------------------------------------------


def _run_prober(url: str, interval: float) -> None:
    """GET /healthz every ``interval`` s on one keep-alive connection (blocking socket: no event
    loop of its own to stall). stdin commands: ``dump`` -> one JSON line of ``[[t_send, latency],
    ...]`` since the last dump; ``quit``."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    active = threading.Event()
    active.set()

    def control() -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "dump":
                with lock:
                    out, samples[:] = list(samples), []
                sys.stdout.write(json.dumps(out) + "\n")
                sys.stdout.flush()
            elif cmd == "pause":
                active.clear()
            elif cmd == "resume":
                active.set()
            elif cmd == "quit":
                break
        stop.set()

    threading.Thread(target=control, daemon=True).start()
    buf = b""
    print("READY", flush=True)
    next_t = time.monotonic()
    while not stop.is_set():
        if not active.is_set():
            time.sleep(0.01)
            next_t = time.monotonic()
            continue
        t0 = time.monotonic()
        sock.sendall(request)
        while True:  # one whole response: headers + Content-Length bytes
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                m = re.search(rb"(?i)content-length:\s*(\d+)", buf[:end])
                need = end + 4 + (int(m.group(1)) if m else 0)
                if len(buf) >= need:
                    buf = buf[need:]
                    break
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("proxy closed the probe connection")
            buf += chunk
        t1 = time.monotonic()
        with lock:
            samples.append((t0, t1 - t0))
        next_t = max(next_t + interval, t1)
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    sock.close()


class Prober:
    def __init__(self, url: str, interval: float) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--_role",
                "prober",
                "--url",
                url,
                "--interval",
                str(interval),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"prober did not start: {line!r}")

    def dump(self) -> list[tuple[float, float]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        return [(float(a), float(b)) for a, b in json.loads(self.proc.stdout.readline())]

    def command(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


# --- process management (same layout as bench/bench_proxy.py) ----------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path | None = None
    gc_log: Path | None = None
    ready_t: float = 0.0  # CLOCK_MONOTONIC when it was seen listening

    def threads(self) -> dict[int, tuple[int, int]]:
        """tid -> (on-CPU ns, run-queue wait ns), from /proc/<pid>/task/*/schedstat."""
        out: dict[int, tuple[int, int]] = {}
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat", "rb") as f:
                    run, wait, _ = f.read().split()
                out[int(tid)] = (int(run), int(wait))
            except (OSError, ValueError):
                pass
        return out

    def cpu_ns(self) -> int:
        return sum(run for run, _ in self.threads().values())

    def stop(self) -> None:
        stop_process(self.proc)


def _wait_listening(
    name: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 30
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = LISTENING.search(text)
        if m:
            return f"http://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{text}")
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not report 'listening on' within {timeout}s")


def spawn_upstream() -> Child:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--_role", "upstream"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("UPSTREAM "):
        raise RuntimeError(f"fake upstream did not start: {line!r}")
    return Child("upstream", proc, line.split()[1])


# Starts ``python -m proxy`` unchanged, after (a) registering a ``gc.callbacks`` hook that records
# every collection's generation and duration (written as JSON at exit), and optionally (b) calling
# ``sys.setswitchinterval`` and/or (c) importing the proxy, loading the tokenizer, ``gc.freeze()``.
# (b) and (c) are experiments for proposed start-up changes; no proxy code is modified.
LAUNCHER = """
import atexit, gc, json, runpy, sys, time
opts = json.loads(sys.argv[1])
pauses, started = [], [0.0]
def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        pauses.append([time.monotonic(), info["generation"], (time.perf_counter() - started[0]) * 1000])
def dump():
    with open(opts["gc_log"], "w") as f:
        json.dump(pauses, f)
gc.callbacks.append(on_gc)
atexit.register(dump)
if opts.get("switch"):
    sys.setswitchinterval(opts["switch"])
if opts.get("freeze"):
    import proxy.cli.main, proxy.server.app
    from proxy.core.tokens import TokenCounter
    TokenCounter().count_text("warm up")
    gc.collect()
    gc.freeze()
sys.argv = ["proxy", *sys.argv[2:]]
runpy.run_module("proxy", run_name="__main__")
"""


@dataclass(frozen=True)
class Variant:
    """How a proxy process is started: ``switch`` (seconds, 0 = default) and ``freeze``."""

    switch: float = 0.0
    freeze: bool = False

    @property
    def label(self) -> str:
        parts = []
        if self.switch:
            parts.append(f"switchinterval {self.switch * 1000:g} ms")
        if self.freeze:
            parts.append("gc.freeze() after start-up")
        return " + ".join(parts) or "as shipped"

    @staticmethod
    def parse(spec: str) -> Variant:
        switch, freeze = 0.0, False
        for part in spec.split("+"):
            if part.startswith("switch="):
                switch = float(part.removeprefix("switch="))
            elif part == "freeze":
                freeze = True
            else:
                raise ValueError(f"unknown variant part {part!r} (switch=S, freeze)")
        return Variant(switch, freeze)


def spawn_proxy(
    tmp: Path,
    upstream_url: str,
    log_level: str,
    profile: str | None = None,
    offload_bytes: int | None = None,
    variant: Variant = Variant(),
    name: str = "proxy",
    root: Path = ROOT,
    store_url: str | None = None,
) -> Child:
    """``python -m proxy serve --port 0 --config <yaml>`` in its own process, through
    ``LAUNCHER`` (gc pause log; ``variant``), or under cProfile when ``profile`` is set.

    ``root``: the source tree the proxy runs from (its working directory; ``--compare-root``
    starts a second one from a copy of other code). ``store_url``: ``store.url`` (default: the
    SQLite file in its own state folder)."""
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1"},
        "upstream": {"base_url": upstream_url},
        "state_dir": str(tmp / f"state-{name}"),
        "logging": {"level": log_level},
        # compaction: the defaults (threshold 80k, hard limit 120k, offload_bytes 256 KiB)
    }
    if store_url is not None:
        cfg["store"] = {"url": store_url}
    if offload_bytes is not None:  # an experiment: what the worker-thread hop costs
        cfg["compaction"] = {"offload_bytes": offload_bytes}
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    log_path = tmp / f"{name}.log"
    gc_log = tmp / f"{name}.gc.json"
    serve = ["serve", "--port", "0", "--config", str(path)]
    if profile:
        argv = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(Path(profile).resolve()),
            "-m",
            "proxy",
            *serve,
        ]
    else:
        opts = {"gc_log": str(gc_log), "switch": variant.switch, "freeze": variant.freeze}
        argv = [sys.executable, "-c", LAUNCHER, json.dumps(opts), *serve]
    with open(log_path, "wb") as log:  # stderr to a file: a full pipe would stall the child
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, cwd=root
        )
    url = _wait_listening(name, proc, log_path)
    return Child(name, proc, url, log_path, gc_log, time.monotonic())


def read_gc_log(child: Child) -> list[tuple[float, int, float]]:
    """(monotonic end time, generation, pause ms) of every collection in ``child``; after stop."""
    if child.gc_log is None or not child.gc_log.exists():
        return []
    return [(float(t), int(g), float(ms)) for t, g, ms in json.loads(child.gc_log.read_text())]


def gc_summary(pauses: Sequence[tuple[float, int, float]], t0: float, t1: float) -> dict[str, Any]:
    """Collections that ended in [t0, t1 + 1 ms]: count by generation, total and max pause."""
    inside = [(g, ms) for t, g, ms in pauses if t0 <= t <= t1 + 0.001]
    by_gen = {str(g): sum(1 for gg, _ in inside if gg == g) for g in (0, 1, 2)}
    gen2 = [ms for g, ms in inside if g == 2]
    return {
        "count_by_generation": by_gen,
        "total_ms": sum(ms for _, ms in inside),
        "max_ms": max((ms for _, ms in inside), default=0.0),
        "gen2_ms": gen2,
    }


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


def own_jiffies(children: Sequence[Child]) -> int:
    total = 0
    for pid in [os.getpid(), *(c.proc.pid for c in children)]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


class ForeignLoad:
    """CPU used by processes other than ours during a window, in cores."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = children
        self.t = time.monotonic()
        self.busy = busy_jiffies()
        self.own = own_jiffies(children)

    def cores(self) -> float:
        wall = time.monotonic() - self.t
        foreign = (busy_jiffies() - self.busy) - (own_jiffies(self.children) - self.own)
        return max(0.0, foreign / CLK_TCK / wall) if wall > 0 else 0.0


# --- 2. reused-plan latency --------------------------------------------------------------------


async def _post(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> tuple[float, int, Any, bytes]:
    t = time.perf_counter()
    async with session.post(url, data=data, headers=headers) as resp:
        payload = await resp.read()
        elapsed = time.perf_counter() - t
        return elapsed, resp.status, resp.headers, payload


async def bench_reused(
    session: aiohttp.ClientSession,
    urls: dict[str, str],
    transcript: dict[str, Any],
    pool: list[str],
    n: int,
    per_cycle: int,
    warmup: int,
    proxy: Child,
    upstream: Child,
    prober: Prober,
    others: Sequence[tuple[str, Child]] = (),
    others_off: bool = True,
    session_id: str | None = None,
) -> dict[str, Any]:
    """``n`` measured turns in cycles of ``per_cycle``: each cycle is a fresh ~100k-token
    conversation (turn N compacts: plan ``new``), then ``warmup`` unmeasured and ``per_cycle``
    measured turns, each one small tool step longer (plan ``reused``). Cycles keep every measured
    request at a realistic ~230-330 messages instead of growing one conversation to 1000+.

    ``others``: more proxy processes (label, child), e.g. another store backend or another copy
    of the code, measured in the same rotation as ``proxy`` (targets ``label`` and, with
    ``others_off``, ``label off``): side by side, under the same noise.

    ``session_id``: requests carry ``x-session-id`` (the opted-out ones another id: they are
    another conversation), so the proxy records the transcript as a client with a session has
    it do (recording runs in the background; this measures what it costs the answer)."""
    counter = TokenCounter()
    headers = {**API_HEADERS, "x-bench-mode": "json"}
    off_headers = {**headers, "x-compaction": "off"}
    if session_id is not None:
        headers["x-session-id"] = session_id
        off_headers["x-session-id"] = session_id + "-off"
    route: dict[str, tuple[str, dict[str, str], Child | None]] = {
        "direct": (urls["direct"], headers, None),
        "proxy": (urls["proxy"], headers, proxy),
        "off": (urls["proxy"], off_headers, proxy),
    }
    compacting = ["proxy"]  # targets whose answers must say plan ``reused``
    for label, child in others:
        route[label] = (child.url, headers, child)
        compacting.append(label)
        if others_off:
            route[f"{label} off"] = (child.url, off_headers, child)
    targets = tuple(route)
    proxied = targets[1:]
    lat: dict[str, list[float]] = {t: [] for t in targets}
    stamps: dict[str, list[tuple[float, float]]] = {t: [] for t in targets}
    cpu: dict[str, list[float]] = {t: [] for t in proxied}
    window_start = time.monotonic()
    statuses: dict[str, dict[str, int]] = {t: {} for t in compacting}
    off_status: dict[str, int] = {}
    body_sizes: list[int] = []
    msg_counts: list[int] = []
    token_counts: list[int] = []
    tokens_after: list[int] = []
    errors: list[str] = []
    turn_n: dict[str, Any] = {}
    new_plan_ms: list[float] = []
    main_new_ms: list[float] = []  # turn N of every cycle (the first one included)
    others_new_ms: dict[str, list[float]] = {}
    nonce = f"{os.getpid()}-{random.randrange(1 << 30):08x}"
    foreign_cores: list[float] = []
    children = [upstream, proxy, *(child for _, child in others)]
    measured = 0
    cycle = 0
    while measured < n:
        messages, tokens = conversation(transcript, 100_000, f"r{cycle}-{nonce}", counter, pool)
        raw = body_bytes(transcript, messages)
        first = cycle == 0
        if first:  # the proxy's first compaction ever (a fresh process): watch the loop too
            prober.command("resume")
            await asyncio.sleep(0.3)
            prober.dump()
        t_send = time.monotonic()
        elapsed, status, h, payload = await _post(
            session, urls["proxy"] + "/v1/messages", raw, headers
        )
        t_end = time.monotonic()
        if first:
            await asyncio.sleep(0.05)
            probes = [x for x in prober.dump() if x[0] + x[1] >= t_send and x[0] <= t_end]
            prober.command("pause")  # no probes while latency is measured
        if status != 200 or h.get("x-compaction-plan") != "new":
            raise RuntimeError(
                f"turn N: status {status}, plan {h.get('x-compaction-plan')}: {payload[:300]!r}"
            )
        for label, child in others:  # turn N through each other proxy too: its own plan
            other_ms, st, hh, body = await _post(session, child.url + "/v1/messages", raw, headers)
            others_new_ms.setdefault(label, []).append(other_ms * 1000)
            if st != 200 or hh.get("x-compaction-plan") != "new":
                raise RuntimeError(
                    f"turn N ({label}): status {st}, plan {hh.get('x-compaction-plan')}: "
                    f"{body[:300]!r}"
                )
        if first:
            turn_n = {
                "messages": len(messages),
                "tokens_our_counter": tokens,
                "body_bytes": len(raw),
                "latency_ms": elapsed * 1000,
                "headers": {k: v for k, v in h.items() if k.lower().startswith("x-compaction")},
                "healthz_ms_during": _lat_stats(probes),
            }
        else:
            new_plan_ms.append(elapsed * 1000)
        main_new_ms.append(elapsed * 1000)
        load = None
        take = min(per_cycle, n - measured)
        for k in range(1, warmup + take + 1):
            if k == warmup + 1:
                load = ForeignLoad(children)
            messages = messages + small_pair(k)
            raw = body_bytes(transcript, messages)
            # the opted-out requests go to the same proxy: as another conversation (another
            # client), not as a second copy of this one's body
            raw_off = body_bytes(transcript, messages, OFF_HEAD)
            rec = k > warmup
            shift = k % len(targets)
            order = targets[shift:] + targets[:shift]  # rotate who goes first
            for target in order:
                base, hdrs, measured_child = route[target]
                data = raw_off if hdrs is off_headers else raw
                before = measured_child.cpu_ns() if measured_child is not None else 0
                t_mono = time.monotonic()
                elapsed, status, h, payload = await _post(session, base + "/v1/messages", data, hdrs)
                after = measured_child.cpu_ns() if measured_child is not None else 0
                if status != 200:
                    errors.append(f"{target}: HTTP {status} {payload[:200]!r}")
                    continue
                if not rec:
                    continue
                lat[target].append(elapsed * 1000)
                stamps[target].append((t_mono, elapsed))
                if measured_child is not None:
                    cpu[target].append((after - before) / 1e6)
                if target in statuses:
                    st = h.get("x-compaction-plan", "?")
                    statuses[target][st] = statuses[target].get(st, 0) + 1
                    if target == "proxy":
                        tokens_after.append(int(h.get("x-compaction-tokens-after", "0")))
                elif target == "off":
                    st = h.get("x-compaction-layers", "?")
                    off_status[st] = off_status.get(st, 0) + 1
            if rec:
                body_sizes.append(len(raw))
                msg_counts.append(len(messages))
        token_counts += [tokens, counter.count_request(None, transcript["tools"], messages).total]
        if load is not None:
            foreign_cores.append(load.cores())
        measured += take
        cycle += 1
    s = {t: summary(v) for t, v in lat.items()}
    paired = {
        t: summary([a - b for a, b in zip(lat[t], lat["direct"], strict=True)]) for t in proxied
    }
    added = {t: {q: s[t][q] - s["direct"][q] for q in ("p50", "p90", "p99")} for t in proxied}
    # another proxy against the main one: percentiles, and the median of per-turn differences
    versus: dict[str, dict[str, float]] = {}
    for t in proxied[2:]:
        main = "off" if t.endswith(" off") else "proxy"
        versus[t] = {
            "p50": s[t]["p50"] - s[main]["p50"],
            "p99": s[t]["p99"] - s[main]["p99"],
            "paired_p50": pct([a - b for a, b in zip(lat[t], lat[main], strict=True)], 50),
        }
    plan_status = statuses["proxy"]
    all_reused = all(st == {"reused": n} for st in statuses.values())
    return {
        "turn_n": turn_n,
        "n": n,
        "cycles": cycle,
        "per_cycle": per_cycle,
        "warmup_per_cycle": warmup,
        "new_plan_latency_ms_later_cycles": summary(new_plan_ms) if new_plan_ms else None,
        # turn N (plan new: compaction, summary call, plan stored), every cycle, per proxy
        "new_plan_latency_ms_by_target": {
            "proxy": summary(main_new_ms),
            **{label: summary(v) for label, v in others_new_ms.items()},
        },
        "body_bytes": {"min": min(body_sizes), "max": max(body_sizes)},
        "messages": {"min": min(msg_counts), "max": max(msg_counts)},
        "tokens_our_counter": {"min": min(token_counts), "max": max(token_counts)},
        "forwarded_tokens_after": {"min": min(tokens_after), "max": max(tokens_after)}
        if tokens_after
        else {},
        "targets": list(targets),
        "others": [label for label, _ in others],
        "latency_ms": s,
        "added_ms": added,
        "paired_delta_ms": paired,
        "versus_main_ms": versus,
        "compaction_path_minus_off_ms": {q: s["proxy"][q] - s["off"][q] for q in ("p50", "p99")},
        "proxy_cpu_ms_per_req": {t: summary(v) for t, v in cpu.items()},
        "plan_status_counts": plan_status,
        "plan_status_counts_by_target": statuses,
        "all_reused": all_reused,
        "off_layers_counts": off_status,
        "errors": errors[:10],
        "n_errors": len(errors),
        "foreign_load_cores": statistics.fmean(foreign_cores) if foreign_cores else None,
        "raw_latency_ms": lat,
        "raw_proxy_cpu_ms": cpu,
        "request_stamps": stamps,  # (monotonic start, seconds) per measured request
        "window": [window_start, time.monotonic()],
        "target_added_p50_ms": TARGET_ADDED_P50_MS,
        "met": all_reused and not errors and added["proxy"]["p50"] <= TARGET_ADDED_P50_MS,
    }


# --- 2b. in-process breakdown of the reused-plan path ------------------------------------------


def reused_breakdown(transcript: dict[str, Any], pool: list[str], n: int) -> dict[str, Any]:
    """The proxy's per-request work for a reused plan at ~100k tokens, step by step, in this
    process (no HTTP, no other thread), each step both ways: as the proxy does it for a re-sent
    body (the history parsed, validated and hashed on an earlier turn, ``proxy.core.reparse``)
    and from scratch (a body seen for the first time, or a proxy without that memo).

    Each turn's body is new to both paths, as in the proxy: a fresh parse has fresh string
    objects, whose UTF-8 form every dump must compute again (that, not the JSON, is most of a
    dump's cost), while a re-sent history's objects already carry it."""
    from proxy.core.protocol import scan_messages
    from proxy.core.reparse import BodyMemo

    messages, tokens = conversation(transcript, 100_000, "r", TokenCounter(), pool)
    policy, counter = CompactionPolicy(), TokenCounter()
    plans = {"memo": PlanCache(), "scratch": PlanCache()}
    for cache in plans.values():
        first = compact(
            CompactionInput(None, transcript["tools"], with_breakpoint(messages), MODEL),
            policy,
            counter,
            cache,
            "default",
        )
        assert not isinstance(first, Done)
        finish(first.continuation, SUMMARY_TEXT)
    memo = BodyMemo()
    keep = 8
    steps: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        steps.setdefault(name, []).append(seconds * 1000)

    def run_compact(body: dict[str, Any], cache: PlanCache) -> Any:
        out = compact(
            CompactionInput(None, body["tools"], body["messages"], MODEL),
            policy,
            counter,
            cache,
            "default",
        )
        assert isinstance(out, Done) and out.result.plan_status == "reused", out
        return out.result

    gc.collect()
    forwarded = b""
    size = 0
    for k in range(1, n + 6):
        messages = messages + small_pair(k)
        raw = body_bytes(transcript, messages)
        size = len(raw)
        rec = k > 5
        # the proxy's path for a re-sent body
        t0 = time.perf_counter()
        parsed = memo.parse("default", raw)
        t1 = time.perf_counter()
        msgs = parsed.body["messages"]
        count = len(msgs)
        violation, kept = scan_messages(
            msgs, parsed.checkpoint, range(max(0, count - keep), count + 1)
        )
        assert violation is None
        parsed.remember(kept)
        t2 = time.perf_counter()
        result = run_compact(parsed.body, plans["memo"])
        t3 = time.perf_counter()
        parsed.keep_digests(result.digests)
        forwarded = orjson.dumps({**parsed.body, "messages": result.messages})
        t4 = time.perf_counter()
        # from scratch: the same turn, parsed, validated and hashed in full
        body = orjson.loads(raw)
        t5 = time.perf_counter()
        assert scan_messages(body["messages"])[0] is None
        t6 = time.perf_counter()
        scratch = run_compact(body, plans["scratch"])
        t7 = time.perf_counter()
        again = orjson.dumps({**body, "messages": scratch.messages})
        t8 = time.perf_counter()
        assert again == forwarded  # the same bytes either way
        if not rec:
            continue
        assert parsed.reused > 0, "the memo did not re-use the history"
        add("parse: the re-sent body (BodyMemo.parse)", t1 - t0)
        add("parse: orjson.loads of the whole body", t5 - t4)
        add("validate: from the kept checkpoint (scan_messages)", t2 - t1)
        add("validate: every message", t6 - t5)
        add("compact (reused plan): digests carried", t3 - t2)
        add("compact (reused plan): every message hashed", t7 - t6)
        add("orjson.dumps(forwarded body), re-sent objects", t4 - t3)
        add("orjson.dumps(forwarded body), fresh objects", t8 - t7)
    memo_total = sum(
        pct(steps[name], 50)
        for name in steps
        if name.startswith(("parse: the", "validate: from", "compact (reused plan): digests"))
        or name == "orjson.dumps(forwarded body), re-sent objects"
    )
    scratch_total = sum(
        pct(steps[name], 50)
        for name in steps
        if name.startswith(("parse: orjson", "validate: every", "compact (reused plan): every"))
        or name == "orjson.dumps(forwarded body), fresh objects"
    )
    return {
        "n": n,
        "tokens": tokens,
        "forwarded_bytes": len(forwarded),
        "body_bytes": size,
        "memo": {"hits": memo.hits, "misses": memo.misses},
        "ms": {k: {"min": min(v), "p50": pct(v, 50), "p90": pct(v, 90)} for k, v in steps.items()},
        "sum_p50_ms": {"re-sent": memo_total, "scratch": scratch_total},
    }



# --- 3. event-loop stall -----------------------------------------------------------------------


def _lat_stats(samples: Sequence[tuple[float, float]]) -> dict[str, float]:
    return summary([lat * 1000 for _, lat in samples])


async def _idle_window(
    proxy: Child, upstream: Child, prober: Prober, seconds: float
) -> dict[str, Any]:
    prober.command("resume")
    await asyncio.sleep(0.3)
    prober.dump()
    load = ForeignLoad([proxy, upstream])
    wait0 = proxy.threads().get(proxy.proc.pid, (0, 0))[1]
    await asyncio.sleep(seconds)
    idle = prober.dump()
    return {
        "seconds": seconds,
        "healthz_ms": _lat_stats(idle),
        "foreign_load_cores": load.cores(),
        "main_runqueue_wait_ms": (proxy.threads().get(proxy.proc.pid, (0, 0))[1] - wait0) / 1e6,
    }


async def probed_request(
    session: aiohttp.ClientSession,
    upstream: Child,
    proxy: Child,
    prober: Prober,
    transcript: dict[str, Any],
    pool: list[str],
    counter: TokenCounter,
    target_tokens: int,
    tag: str,
) -> dict[str, Any]:
    """One never-seen request of ``target_tokens`` through ``proxy`` while ``prober`` (already
    resumed) hits its /healthz; healthz latency overall and per phase, thread CPU / run-queue."""
    messages, tokens = conversation(transcript, target_tokens, tag, counter, pool)
    raw = body_bytes(transcript, messages)
    headers = {**API_HEADERS, "x-bench-mode": "json", "x-bench-tag": tag}
    ctl = {"x-bench-mode": "ctl"}
    async with session.get(upstream.url + "/_bench/events", headers=ctl) as r:
        await r.read()  # clear
    gc.collect()
    await asyncio.sleep(0.2)
    prober.dump()
    threads0 = proxy.threads()
    load = ForeignLoad([proxy, upstream])
    t_send = time.monotonic()
    elapsed, status, h, _payload = await _post(session, proxy.url + "/v1/messages", raw, headers)
    t_end = time.monotonic()
    foreign = load.cores()
    threads1 = proxy.threads()
    await asyncio.sleep(0.1)
    samples = prober.dump()
    async with session.get(upstream.url + "/_bench/events", headers=ctl) as r:
        events = (await r.json())["events"]
    t_summary = next((e["t"] for e in events if e["kind"] == "summary"), None)
    t_forward = next((e["t"] for e in events if e["kind"] == "forward" and e["tag"] == tag), None)
    during = [x for x in samples if x[0] + x[1] >= t_send and x[0] <= t_end]
    phases: dict[str, list[tuple[float, float]]] = {}
    bounds = [
        ("1 read+parse+validate+compact (to summary call)", t_send, t_summary),
        ("2 summary call + finish + re-serialise (to forward)", t_summary, t_forward),
        ("3 forward + relay answer", t_forward, t_end),
    ]
    for name, a, b in bounds:
        if a is not None and b is not None:
            phases[name] = [x for x in during if x[0] < b and x[0] + x[1] > a]
    worst = max(during, key=lambda x: x[1]) if during else (0.0, 0.0)
    main_tid = proxy.proc.pid
    per_thread = {}
    for tid, (run1, wait1) in threads1.items():
        run0, wait0 = threads0.get(tid, (0, 0))
        if run1 - run0 > 1_000_000 or tid == main_tid:
            per_thread["main" if tid == main_tid else f"tid {tid}"] = {
                "cpu_ms": (run1 - run0) / 1e6,
                "runqueue_wait_ms": (wait1 - wait0) / 1e6,
            }
    return {
        "tag": tag,
        "t_send": t_send,
        "t_end": t_end,
        "worst_probe_t": worst[0],
        "tokens_our_counter": tokens,
        "messages": len(messages),
        "body_bytes": len(raw),
        "status": status,
        "latency_ms": elapsed * 1000,
        "headers": {k: v for k, v in h.items() if k.lower().startswith("x-compaction")},
        "phase_ms": {
            "to_summary_call": None if t_summary is None else (t_summary - t_send) * 1000,
            "to_forward": None if t_forward is None else (t_forward - t_send) * 1000,
        },
        "healthz_ms": _lat_stats(during),
        "healthz_ms_by_phase": {k: _lat_stats(v) for k, v in phases.items()},
        "worst_probe_at_ms": (worst[0] - t_send) * 1000,
        "probes": len(during),
        "proxy_threads": per_thread,
        "foreign_load_cores": foreign,
    }


async def bench_stall(
    session: aiohttp.ClientSession,
    upstream: Child,
    transcript: dict[str, Any],
    pool: list[str],
    trials: int,
    idle_s: float,
    interval: float,
    targets: list[tuple[str, Child, Prober, bool]],
) -> dict[str, Any]:
    """Cold ~200k-token requests, alternating between the proxies in ``targets`` (name, proxy,
    its prober, whether its first compaction is still to be watched here)."""
    counter = TokenCounter()
    nonce = f"{os.getpid()}-{random.randrange(1 << 30):08x}"
    out: dict[str, dict[str, Any]] = {}
    for name, proxy, prober, first in targets:
        out[name] = {"idle": await _idle_window(proxy, upstream, prober, idle_s), "cold_runs": []}
        if first:  # like turn N of part 2: this process's first compaction (~100k tokens)
            out[name]["first_compaction"] = await probed_request(
                session,
                upstream,
                proxy,
                prober,
                transcript,
                pool,
                counter,
                100_000,
                f"first-{name}-{nonce}",
            )
        prober.command("pause")
    for trial in range(trials):
        order = targets[trial % len(targets) :] + targets[: trial % len(targets)]
        for name, proxy, prober, _ in order:
            prober.command("resume")
            run = await probed_request(
                session,
                upstream,
                proxy,
                prober,
                transcript,
                pool,
                counter,
                200_000,
                f"cold{trial}-{name}-{nonce}",
            )
            prober.command("pause")
            out[name]["cold_runs"].append(run)
    for res in out.values():
        runs = res["cold_runs"]
        maxes = [r["healthz_ms"]["max"] for r in runs]
        res["max_healthz_ms_during_cold"] = max(maxes) if maxes else float("nan")
        res["median_of_max_healthz_ms"] = statistics.median(maxes) if maxes else float("nan")
        res["median_p99_healthz_ms"] = (
            statistics.median([r["healthz_ms"]["p99"] for r in runs]) if runs else float("nan")
        )
        res["met"] = (
            all(r["status"] == 200 for r in runs)
            and res["max_healthz_ms_during_cold"] <= TARGET_MAX_STALL_MS
        )
    shipped = out[targets[0][0]]
    return {
        "interval_ms": interval * 1000,
        "targets": out,
        "target_max_stall_ms": TARGET_MAX_STALL_MS,
        "met": shipped["met"],
    }


# --- 3b. in-process diagnosis: which work stalls an event loop, and why -------------------------


def _thread_sched(tid: int) -> tuple[int, int]:
    with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


async def _lag_while(fn: Callable[[], Any], tick: float = 0.001) -> dict[str, Any]:
    """Run ``fn`` in ``asyncio.to_thread``; meanwhile a ticker sleeps ``tick`` and records by how
    much each wake-up was late. Returns the work's wall time, the max/p99 lateness, and the main
    thread's run-queue wait (CPU contention, as opposed to waiting for the GIL)."""
    lags: list[float] = []
    done = False
    main_tid = threading.get_native_id()
    _, wait0 = _thread_sched(main_tid)

    async def ticker() -> None:
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(tick)
            lags.append((time.perf_counter() - t - tick) * 1000)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    lags.clear()
    t = time.perf_counter()
    await asyncio.to_thread(fn)
    wall = time.perf_counter() - t
    done = True
    await task
    _, wait1 = _thread_sched(main_tid)
    return {
        "work_ms": wall * 1000,
        "ticks": len(lags),
        "lag_ms": {
            "p50": pct(lags, 50),
            "p99": pct(lags, 99),
            "max": max(lags) if lags else float("nan"),
        },
        "main_runqueue_wait_ms": (wait1 - wait0) / 1e6,
    }


def _niced(nice: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in this (worker) thread at a lower CPU priority (Linux: per-thread nice)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    return fn()


def diagnose(
    transcript: dict[str, Any], pool: list[str], reps: int, quick: bool = False
) -> dict[str, Any]:
    tools = transcript["tools"]
    counter = TokenCounter()
    tag = f"diag-{os.getpid()}-{random.randrange(1 << 30):08x}"
    messages, tokens = conversation(transcript, 200_000, tag, counter, pool)
    raw = body_bytes(transcript, messages)
    policy = CompactionPolicy()
    texts: list[str] = []
    for m in messages:
        for b in m["content"] if isinstance(m["content"], list) else [m["content"]]:
            if isinstance(b, str):
                texts.append(b)
            elif b.get("type") == "text":
                texts.append(b["text"])
            elif b.get("type") == "tool_result":
                c = b.get("content")
                texts += [c] if isinstance(c, str) else [x.get("text", "") for x in c or []]
    enc = counter._encoder()  # the bundled cl100k encoding (read-only use)
    longest = max(texts, key=len)

    def timed(fn: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(max(3, reps)):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return best * 1000

    body = orjson.loads(raw)
    state: dict[str, Any] = {}

    def run_compact() -> None:
        out = compact(
            CompactionInput(None, tools, messages, MODEL), policy, TokenCounter(), PlanCache(), "t"
        )
        state["outcome"] = out

    run_compact()
    outcome = state["outcome"]
    assert not isinstance(outcome, Done), "the 200k body should need a summary"
    result = finish(outcome.continuation, SUMMARY_TEXT)
    on_loop_ms = {
        "orjson.loads(body)": timed(lambda: orjson.loads(raw)),
        "validate_request(body)": timed(lambda: validate_request(body)),
        "orjson.dumps(forwarded body)": timed(
            lambda: orjson.dumps({**body, "messages": result.messages})
        ),
        "len(raw) > offload_bytes": 0.0,
    }
    in_thread_ms = {
        "count_request, cold (fresh counter)": timed(
            lambda: TokenCounter().count_request(None, tools, messages)
        ),
        "compact, cold (fresh counter, no plan)": timed(run_compact),
        "finish (summary in)": timed(lambda: finish(outcome.continuation, SUMMARY_TEXT)),
    }
    work: dict[str, Callable[[], Any]] = {
        "count_request cold": lambda: TokenCounter().count_request(None, tools, messages),
        "compact cold": run_compact,
        "compact cold, worker thread at nice +10": lambda: _niced(10, run_compact),
        "finish": lambda: finish(outcome.continuation, SUMMARY_TEXT),
        "tiktoken encode_ordinary only (every text)": lambda: [
            enc.encode_ordinary(t) for t in texts
        ],
        f"tiktoken encode_ordinary, one {len(longest)}-char text x5": lambda: [
            enc.encode_ordinary(longest) for _ in range(5)
        ],
        "hashing only (orjson canonical + xxh3 per block) x10": lambda: [
            counter.uncached_bytes(None, tools, messages) for _ in range(10)
        ],
        "pure-Python loop (GIL-bound control)": lambda: sum(i * i for i in range(2_000_000)),
    }
    if quick:  # smoke run: the pipeline and the control only
        work = {
            k: v
            for k, v in work.items()
            if k in ("compact cold", "pure-Python loop (GIL-bound control)")
        }
    old = sys.getswitchinterval()
    lag: dict[str, dict[str, Any]] = {}
    try:
        for interval in (old, 0.001):
            sys.setswitchinterval(interval)
            key = f"switchinterval {interval * 1000:g} ms"
            lag[key] = {}
            for name, fn in work.items():
                runs = [asyncio.run(_lag_while(fn)) for _ in range(reps)]
                worst = max(runs, key=lambda r: r["lag_ms"]["max"])
                lag[key][name] = {
                    **worst,
                    "max_lag_ms_each_rep": [r["lag_ms"]["max"] for r in runs],
                }
            lag[key]["idle (sleep 0.3 s)"] = asyncio.run(_lag_while(lambda: time.sleep(0.3)))
    finally:
        sys.setswitchinterval(old)
    return {
        "body": {
            "tokens_our_counter": tokens,
            "bytes": len(raw),
            "messages": len(messages),
            "texts": len(texts),
            "longest_text_chars": len(longest),
        },
        "on_loop_ms_best": on_loop_ms,
        "in_thread_ms_best": in_thread_ms,
        "loop_lag_while_in_thread": lag,
        "default_switchinterval_ms": old * 1000,
    }


# --- 3c. the summary call's own cost on the loop, first call of a process vs. later ones --------


async def _lag_during(coro: Any, tick: float = 0.001) -> tuple[Any, dict[str, Any]]:
    """Await ``coro`` while a ticker records how late each ``tick`` sleep wakes up."""
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(tick)
            lags.append((time.perf_counter() - t - tick) * 1000)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    lags.clear()
    t = time.perf_counter()
    result = await coro
    wall = (time.perf_counter() - t) * 1000
    done = True
    await task
    return result, {
        "wall_ms": wall,
        "ticks": len(lags),
        "lag_max_ms": max(lags) if lags else float("nan"),
        "lag_p99_ms": pct(lags, 99),
    }


async def _sdk_probe(upstream_url: str, calls: int) -> dict[str, Any]:
    """In a fresh process: the proxy's own ``Summaries.summarize`` (the anthropic SDK
    call for L4), as the proxy builds it, against the fake upstream; loop lateness per call."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from proxy.config.settings import CompactionConfig
    from proxy.server.compaction.service import (
        CompactionService,  # imports anthropic, like the proxy at start
    )
    from proxy.server.http.metrics import new_metrics

    transcript = load_transcript()
    messages, _ = conversation(transcript, 100_000, "sdk", TokenCounter(), _line_pool(transcript))
    outcome = compact(
        CompactionInput(None, transcript["tools"], messages, MODEL),
        CompactionPolicy(),
        TokenCounter(),
        PlanCache(),
        "t",
    )
    assert not isinstance(outcome, Done)
    service = CompactionService(CompactionConfig(), upstream_url, new_metrics())
    headers = CIMultiDictProxy(CIMultiDict({"x-api-key": API_HEADERS["x-api-key"]}))
    rows = []
    try:
        for _ in range(calls):
            call = service.summaries.summarize(outcome.summary_request, headers)
            text, row = await _lag_during(call)
            row["ok"] = bool(text)
            rows.append(row)
    finally:
        await service.close()
    # PROTOTYPE (not proxy code): the same call made with one aiohttp session and orjson, as the
    # proxy's forwarder already does for every request.
    req = outcome.summary_request
    session = aiohttp.ClientSession()

    async def plain_call() -> str:
        body = orjson.dumps(
            {
                "model": req.model,
                "max_tokens": req.max_tokens,
                "system": req.system,
                "messages": [{"role": "user", "content": req.text}],
            }
        )
        hdrs = {**API_HEADERS, "content-type": "application/json"}
        async with session.post(upstream_url + "/v1/messages", data=body, headers=hdrs) as resp:
            data = orjson.loads(await resp.read())
        return "".join(
            b.get("text", "") for b in data.get("content", []) if b.get("type") == "text"
        )

    plain = []
    try:
        for _ in range(calls):
            text, row = await _lag_during(plain_call())
            row["ok"] = bool(text)
            plain.append(row)
    finally:
        await session.close()
    return {"summary_request_chars": len(req.text), "calls": rows, "plain_aiohttp_orjson": plain}


def sdk_probe(upstream_url: str, calls: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--_role",
            "sdkprobe",
            "--url",
            upstream_url,
            "--interval",
            str(calls),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sdk probe failed: {proc.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


# --- 3d. what a full garbage collection costs in a process that imported the proxy -------------

GC_COST = """
import gc, json, time
import proxy.cli.main, proxy.server.app
from proxy.core.tokens import TokenCounter
TokenCounter().count_text("warm up")
gc.collect()
def full(n=3):
    out = []
    for _ in range(n):
        t = time.perf_counter(); gc.collect(); out.append((time.perf_counter() - t) * 1000)
    return out
objects = len(gc.get_objects())
plain = full()
gc.freeze()
print(json.dumps({"tracked_objects": objects, "full_collection_ms": plain,
                  "after_gc_freeze_ms": full(), "frozen": gc.get_freeze_count(),
                  "thresholds": gc.get_threshold()}))
"""


def gc_cost() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", GC_COST], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    if proc.returncode != 0:
        raise RuntimeError(f"gc cost probe failed: {proc.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


# --- report ------------------------------------------------------------------------------------


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print()
    print(
        f"context-proxy compaction bench  ({m['nproc']} CPUs {m['cpu_model']}, Python {m['python']}, "
        f"{'quick' if res['quick'] else 'full'} mode, loadavg at start {m['loadavg_start'][0]:.2f})"
    )
    print(
        f"proxy code: commit {res['code']['commit']}"
        f"{' + local changes' if res['code']['proxy_dirty_files'] else ''}, "
        f"proxy/*.py sha256 {res['code']['proxy_tree_sha256']}"
    )
    c = res.get("counting")
    if c:
        mc = c["median_cpu_s"]
        print()
        print(
            f"1. Counting CPU, transcript replay: {c['requests']} requests (messages[:k], user-ending), "
            f"last {c['tokens_last']} tokens, {c['reps']} rep(s), medians"
        )
        print(
            f"   block cache on : {mc['cached'] * 1000:9.1f} ms CPU   (hits {c['cached_counter']['hits']}, "
            f"misses {c['cached_counter']['misses']})"
        )
        print(f"   block cache off: {mc['uncached'] * 1000:9.1f} ms CPU")
        print(
            f"   ratio {c['ratio']:.1f}x (worst rep {c['ratio_worst']:.1f}x)   target >= {c['target_ratio']:.0f}x   "
            f"met: {'yes' if c['met'] else 'NO'}"
        )
        print(
            f"   of which, cached: tokenising the transcript once {mc['tokenise_transcript_once'] * 1000:.1f} ms, "
            f"a replay where every block hits {mc['all_hits'] * 1000:.1f} ms (hashing floor)"
        )
        pm = c["prototype_message_memo"]
        print(
            f"   PROTOTYPE message-level memo in front of the block memo: {pm['median_cpu_s'] * 1000:.1f} ms CPU, "
            f"ratio {pm['ratio']:.1f}x (same totals: {pm['same_total']})"
        )
    r = res.get("reused")
    if r:
        t = r["turn_n"]
        print()
        print(
            f"2. Reused plan at ~100k tokens: turn N = {t['messages']} messages, {t['tokens_our_counter']} tokens, "
            f"{t['body_bytes'] // 1024} KiB; compaction: {t['headers'].get('x-compaction-layers')} "
            f"{t['headers'].get('x-compaction-tokens-before')} -> {t['headers'].get('x-compaction-tokens-after')} "
            f"tokens, summary {t['headers'].get('x-compaction-summary')}, {t['latency_ms']:.0f} ms"
        )
        fh = t["healthz_ms_during"]
        print(
            f"   (turn N is the proxy's first compaction since start; healthz meanwhile: {fh['n']} probes, "
            f"p99 {fh['p99']:.2f}, max {fh['max']:.2f} ms)"
        )
        nl = r["new_plan_latency_ms_later_cycles"]
        later = "" if nl is None else f", p50 {nl['p50']:.0f} ms after the first"
        print(
            f"   {r['n']} measured turns in {r['cycles']} cycle(s) of a fresh conversation: turn N "
            f"(plan new{later}), "
            f"{r['warmup_per_cycle']} unmeasured, then up to {r['per_cycle']} turns x 3 targets, interleaved"
        )
        print(
            f"   measured bodies {r['body_bytes']['min'] // 1024}-{r['body_bytes']['max'] // 1024} KiB, "
            f"{r['messages']['min']}-{r['messages']['max']} messages, "
            f"{r['tokens_our_counter']['min']}-{r['tokens_our_counter']['max']} tokens; forwarded after "
            f"compaction {r['forwarded_tokens_after'].get('min')}-{r['forwarded_tokens_after'].get('max')} tokens"
        )
        hdr = f"   {'target':<36} {'p50 ms':>8} {'p90':>8} {'p99':>8}  {'added p50':>9} {'added p99':>9}  {'paired p50':>10}  {'proxy CPU ms/req p50':>20}"
        print(hdr)
        names = {
            "direct": "direct to upstream",
            "proxy": f"{r.get('main_label') or 'proxy'}, compaction (reused)",
            "off": f"{r.get('main_label') or 'proxy'}, x-compaction: off",
        }
        for label in r.get("others", []):
            names[label] = f"{label}, compaction (reused)"
            names[f"{label} off"] = f"{label}, x-compaction: off"
        for key in r.get("targets", ("direct", "proxy", "off")):
            s = r["latency_ms"][key]
            add = r["added_ms"].get(key)
            pr = r["paired_delta_ms"].get(key)
            cpu = r["proxy_cpu_ms_per_req"].get(key)
            add50 = "" if add is None else f"{add['p50']:+.2f}"
            add99 = "" if add is None else f"{add['p99']:+.2f}"
            pr50 = "" if pr is None else f"{pr['p50']:+.2f}"
            cpu50 = "" if cpu is None else f"{cpu['p50']:.2f}"
            print(
                f"   {names[key]:<36} {s['p50']:>8.2f} {s['p90']:>8.2f} {s['p99']:>8.2f}  "
                f"{add50:>9} {add99:>9}  {pr50:>10}  {cpu50:>20}"
            )
        for key, v in r.get("versus_main_ms", {}).items():
            main = names["off" if key.endswith(" off") else "proxy"]
            print(
                f"   {names[key]} minus {main}: p50 {v['p50']:+.2f} ms, p99 {v['p99']:+.2f} ms, "
                f"paired p50 {v['paired_p50']:+.2f} ms"
            )
        if r.get("others"):
            by = r["new_plan_latency_ms_by_target"]
            print(
                f"   turn N (plan new), {r['cycles']} per proxy, p50 / max ms: "
                + ", ".join(
                    f"{names[key].split(',')[0]} {v['p50']:.0f} / {v['max']:.0f}"
                    for key, v in by.items()
                )
            )
        cm = r["compaction_path_minus_off_ms"]
        print(
            f"   compaction path minus plain forwarding: p50 {cm['p50']:+.2f} ms, p99 {cm['p99']:+.2f} ms"
        )
        print(
            f"   x-compaction-plan on the measured proxied requests: {r['plan_status_counts']}   errors {r['n_errors']}   "
            f"foreign load {r['foreign_load_cores']:.2f} cores"
        )
        print(
            f"   target: added p50 <= {r['target_added_p50_ms']} ms   met: {'yes' if r['met'] else 'NO'}"
        )
        g = r.get("gc")
        if g:
            slow = g["slowest_requests"]
            print(
                f"   proxy gc during part 2: collections by generation {g['count_by_generation']}, gen2 pauses "
                f"{[round(x) for x in g['gen2_ms']]} ms; slowest 10 proxied requests "
                f"{slow['proxy']['slowest_10_ms']} ms ({slow['proxy']['of_which_overlap_a_gen2_collection']} "
                f"overlap a gen2 collection), opted-out {slow['off']['slowest_10_ms']} ms "
                f"({slow['off']['of_which_overlap_a_gen2_collection']})"
            )
    b2 = res.get("reused_breakdown")
    if b2:
        print()
        print(
            f"2b. Reused-plan path in-process, step by step ({b2['n']} turns, ~{b2['tokens'] // 1000}k tokens, "
            f"{b2['body_bytes'] // 1024} KiB in, {b2['forwarded_bytes'] // 1024} KiB forwarded; ms; "
            f"memo hits {b2['memo']['hits']}, misses {b2['memo']['misses']})"
        )
        print(f"   {'step':<56} {'min':>7} {'p50':>7} {'p90':>7}")
        for name, v in b2["ms"].items():
            print(f"   {name:<56} {v['min']:7.2f} {v['p50']:7.2f} {v['p90']:7.2f}")
        tot = b2["sum_p50_ms"]
        print(
            f"   parse + validate + compact + dumps, sum of p50s: re-sent {tot['re-sent']:.2f} ms, "
            f"from scratch {tot['scratch']:.2f} ms"
        )
        print(
            "   (each turn's body is new to both paths, timed once; 're-sent' is the proxy's path "
            "for the next turn of a conversation it has seen, 'from scratch' the path for a body "
            "it has not)"
        )
    s = res.get("stall")
    if s:
        print()
        print(
            f"3. Event loop during cold ~200k-token requests: GET /healthz every {s['interval_ms']:.0f} ms "
            f"from a separate process (one keep-alive connection, blocking socket)"
        )
        for name, t in s["targets"].items():
            i = t["idle"]["healthz_ms"]
            print(f"   [{name}]")
            print(
                f"   idle ({t['idle']['seconds']:.0f} s, {i['n']} probes): p50 {i['p50']:.2f}  p99 {i['p99']:.2f}  "
                f"max {i['max']:.2f} ms   foreign load {t['idle']['foreign_load_cores']:.2f} cores, "
                f"proxy main thread runqueue wait {t['idle']['main_runqueue_wait_ms']:.0f} ms"
            )
            runs = (
                [("first compaction of the process", t["first_compaction"])]
                if "first_compaction" in t
                else []
            )
            runs += [("cold", run) for run in t["cold_runs"]]
            for kind, run in runs:
                h = run["healthz_ms"]
                hd = run["headers"]
                to_sum = run["phase_ms"]["to_summary_call"] or 0
                to_fwd = run["phase_ms"]["to_forward"] or 0
                threads = ", ".join(
                    f"{k} cpu {v['cpu_ms']:.0f} / runq {v['runqueue_wait_ms']:.0f}"
                    for k, v in run["proxy_threads"].items()
                )
                print(
                    f"   {kind} {run['tokens_our_counter']} tok {run['body_bytes'] // 1024} KiB: HTTP {run['status']} "
                    f"{run['latency_ms']:.0f} ms (summary call at {to_sum:.0f}, forward at {to_fwd:.0f} ms; "
                    f"{hd.get('x-compaction-layers')} {hd.get('x-compaction-tokens-before')}->"
                    f"{hd.get('x-compaction-tokens-after')})"
                )
                by_phase = "  ".join(
                    f"ph{k[0]} n {ph['n']} max {ph['max']:.1f}"
                    for k, ph in run["healthz_ms_by_phase"].items()
                )
                print(
                    f"      healthz ({h['n']} probes) p50 {h['p50']:.2f} p99 {h['p99']:.2f} max {h['max']:.2f} ms "
                    f"(worst at +{run['worst_probe_at_ms']:.0f} ms)  {by_phase}  foreign {run['foreign_load_cores']:.2f} cores"
                )
                gcr = run.get("gc")
                gc_text = ""
                if gcr:
                    gc_text = (
                        f"; gc: {gcr['count_by_generation']} by generation, max pause {gcr['max_ms']:.1f} ms"
                        f"{', a gen2 collection during the worst probe' if gcr['gen2_during_worst_probe'] else ''}"
                    )
                print(f"      proxy threads (ms): {threads}{gc_text}")
            print(
                f"   => max healthz during cold requests {t['max_healthz_ms_during_cold']:.2f} ms (median of the "
                f"per-request max {t['median_of_max_healthz_ms']:.2f}, median p99 {t['median_p99_healthz_ms']:.2f})"
                f"   target <= {s['target_max_stall_ms']:.0f} ms   met: {'yes' if t['met'] else 'NO'}"
            )
        print(
            "   (phases: 1 read+parse+validate+compact up to the summary call, 2 summary call + finish + "
            "re-serialise, 3 forward + relay)"
        )
    gcc = res.get("gc_cost")
    if gcc:
        print()
        print(
            f"3d. A full gc.collect() in a process that imported the proxy ({gcc['tracked_objects']} tracked "
            f"objects, thresholds {gcc['thresholds']}): {[round(x) for x in gcc['full_collection_ms']]} ms; "
            f"after gc.freeze(): {[round(x, 2) for x in gcc['after_gc_freeze_ms']]} ms"
        )
    gp = res.get("gc_pauses")
    if gp:
        print()
        print("GC in the proxy processes over the whole run (gc.callbacks hook in the launcher):")
        for label, g in gp.items():
            sv, su = g["serving"], g["start_up"]
            print(
                f"   {label:<30} serving: {sv['collections']:>5} collections {sv['by_generation']}, max pause "
                f"{sv['max_ms']:.1f} ms, gen2 pauses {sv['gen2_ms']} ms;  start-up: gen2 pauses {su['gen2_ms']} ms"
            )
    sc = res.get("summary_call")
    if sc:
        print()
        print(
            f"3c. The L4 summary call (Summaries.summarize, anthropic SDK) in a fresh process, "
            f"{sc['summary_request_chars'] // 1024} KiB prompt; lateness of a 1 ms asyncio ticker:"
        )
        for label, rows in (
            ("SDK", sc["calls"]),
            ("PROTOTYPE aiohttp+orjson", sc.get("plain_aiohttp_orjson", [])),
        ):
            for i, row in enumerate(rows, 1):
                print(
                    f"   {label:<25} call {i}: wall {row['wall_ms']:7.1f} ms   loop lag max "
                    f"{row['lag_max_ms']:7.2f} ms  p99 {row['lag_p99_ms']:6.2f} ms   ok {row['ok']}"
                )
    d = res.get("diagnosis")
    if d:
        print()
        b = d["body"]
        print(
            f"3b. In-process diagnosis ({b['tokens_our_counter']} tokens, {b['bytes'] // 1024} KiB, {b['texts']} texts, "
            f"longest {b['longest_text_chars']} chars)"
        )
        print(
            "   on the event loop (best of N): "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in d["on_loop_ms_best"].items() if v)
        )
        print(
            "   in the worker thread (best of N): "
            + ", ".join(f"{k} {v:.0f} ms" for k, v in d["in_thread_ms_best"].items())
        )
        print(
            "   lateness of a 1 ms asyncio ticker while the work runs in asyncio.to_thread (worst rep):"
        )
        for key, rows in d["loop_lag_while_in_thread"].items():
            print(f"   [{key}]")
            for name, row in rows.items():
                print(
                    f"     {name:<52} work {row['work_ms']:7.0f} ms  lag p50 {row['lag_ms']['p50']:6.2f}  p99 "
                    f"{row['lag_ms']['p99']:6.2f}  max {row['lag_ms']['max']:6.2f} ms  (runqueue wait "
                    f"{row['main_runqueue_wait_ms']:.0f} ms)"
                )
    print()


def machine_info() -> dict[str, Any]:
    return {**report.machine_info(), "orjson": orjson.__version__, "loadavg_start": os.getloadavg()}


def code_version(root: Path = ROOT) -> dict[str, Any]:
    """Which proxy code was measured (read-only git queries; none outside a git tree)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    import hashlib

    tree = hashlib.sha256()
    for path in sorted((root / "proxy").rglob("*.py")):
        tree.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    inside = (root / ".git").exists()
    return {
        "root": str(root),
        "commit": git("rev-parse", "--short", "HEAD") if inside else "",
        "proxy_dirty_files": git("status", "--porcelain", "--", "proxy").splitlines()
        if inside
        else [],
        "proxy_tree_sha256": tree.hexdigest()[:16],  # the exact proxy/*.py measured
    }


# --- PostgreSQL for --store postgres|both ------------------------------------------------------


def redact_url(url: str) -> str:
    """``url`` without its password (for the report)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


async def _pg_execute(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def pg_schema(url: str) -> tuple[str, str]:
    """A fresh schema on the PostgreSQL server at ``url`` and the URL that puts the proxy's
    tables in it (``search_path``, as tests/pg_server.py does). Dropped by ``drop_pg_schema``."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    schema = f"bench_{random.randrange(1 << 48):012x}"
    asyncio.run(_pg_execute(url, f'CREATE SCHEMA "{schema}"'))
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return schema, urlunsplit(parts._replace(query=urlencode(query)))


def drop_pg_schema(url: str, schema: str) -> None:
    asyncio.run(_pg_execute(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sample counts (smoke run, < 60 s)")
    p.add_argument("--json", metavar="PATH", help="write all figures as JSON")
    p.add_argument("--count-reps", type=int, help="replays per counting mode (default 5; quick 1)")
    p.add_argument(
        "--n", type=int, help="measured turns in part 2, x3 requests (default 400; quick 40)"
    )
    p.add_argument(
        "--per-cycle",
        type=int,
        default=40,
        help="measured turns per fresh conversation in part 2 (default 40)",
    )
    p.add_argument("--warmup", type=int, help="unmeasured turns per part-2 cycle (default 3)")
    p.add_argument(
        "--cold-trials", type=int, help="cold 200k-token requests in part 3 (default 5; quick 1)"
    )
    p.add_argument(
        "--idle-s", type=float, help="idle probing window in part 3 (default 5; quick 1)"
    )
    p.add_argument(
        "--probe-interval", type=float, default=0.002, help="seconds between healthz probes"
    )
    p.add_argument(
        "--diag-reps",
        type=int,
        help="repetitions of each in-process diagnosis (default 3; quick 1)",
    )
    p.add_argument(
        "--only",
        default="counting,reused,breakdown,stall,diagnosis",
        help="comma-separated parts to run (default: counting,reused,breakdown,stall,diagnosis)",
    )
    p.add_argument("--breakdown-n", type=int, help="turns timed in part 2b (default 60; quick 15)")
    p.add_argument(
        "--proxy-log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="proxy logging.level (INFO = as shipped, with the access log)",
    )
    p.add_argument(
        "--variants",
        help="part 3 also runs, alternating, proxies started differently: comma-separated specs "
        "of switch=S and/or freeze joined by '+' (default 'switch=0.001,freeze,switch=0.001+freeze'; "
        "quick: none; '' = none)",
    )
    p.add_argument(
        "--offload-bytes",
        type=int,
        help="experiment: set the proxy's compaction.offload_bytes (default: the shipped 256 KiB)",
    )
    p.add_argument(
        "--profile-proxy",
        metavar="PATH",
        help="run the proxy under cProfile (main thread only) and write its stats to PATH",
    )
    p.add_argument(
        "--store",
        choices=["sqlite", "postgres", "both"],
        default="sqlite",
        help="the proxy's store in part 2 (default sqlite, as shipped); 'both': a second proxy on "
        "PostgreSQL, measured in the same rotation as the SQLite one",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("CONTEXT_PROXY_TEST_PG"),
        help="PostgreSQL server for --store postgres|both (default $CONTEXT_PROXY_TEST_PG, from "
        "`bash .ci/pg start && . .ci/pg.env`); the bench makes a fresh schema and drops it after",
    )
    p.add_argument(
        "--compare-root",
        metavar="DIR",
        help="A/B: a second proxy started from the source tree DIR (e.g. a copy of the code "
        "before a change), measured in the same rotation in part 2",
    )
    p.add_argument("--compare-label", default="compare", help="its label in the report")
    p.add_argument(
        "--session",
        metavar="ID",
        help="part 2: send x-session-id ID (transcripts recorded, durable context read), as a "
        "client with a session does; default: no session",
    )
    p.add_argument("--_role", choices=["upstream", "prober", "sdkprobe"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    q = a.quick
    a.count_reps = a.count_reps or (1 if q else 5)
    a.n = a.n or (40 if q else 400)
    a.warmup = a.warmup if a.warmup is not None else 3
    a.cold_trials = a.cold_trials or (1 if q else 5)
    a.idle_s = a.idle_s or (1.0 if q else 5.0)
    a.diag_reps = a.diag_reps or (1 if q else 3)
    a.breakdown_n = a.breakdown_n or (15 if q else 60)
    if a.store != "sqlite" and not a.pg_url:
        p.error(f"--store {a.store} needs --pg-url or CONTEXT_PROXY_TEST_PG (bash .ci/pg start)")
    if a.variants is None:
        a.variants = "" if q else "switch=0.001,freeze,switch=0.001+freeze"
    return a


async def run_servers_parts(
    args: argparse.Namespace,
    transcript: dict[str, Any],
    pool: list[str],
    proxy: Child,
    upstream: Child,
    variants: list[tuple[str, Child]],
    others: Sequence[tuple[str, Child]] = (),
    main_label: str | None = None,
) -> dict[str, Any]:
    urls = {"direct": upstream.url, "proxy": proxy.url}
    only = set(args.only.split(","))
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    probers = [Prober(proxy.url, args.probe_interval)]
    probers += [Prober(child.url, args.probe_interval) for _, child in variants]
    for prober in probers:
        prober.command("pause")
    try:
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=300),
            skip_auto_headers=("User-Agent",),
        ) as session:
            if "reused" in only:
                print(
                    f"- 2. reused plan at ~100k tokens: {args.n} x 3 interleaved ...",
                    file=sys.stderr,
                    flush=True,
                )
                out["reused"] = await bench_reused(
                    session,
                    urls,
                    transcript,
                    pool,
                    args.n,
                    args.per_cycle,
                    args.warmup,
                    proxy,
                    upstream,
                    probers[0],
                    others,
                    session_id=args.session,
                )
                out["reused"]["main_label"] = main_label
                out["reused"]["session"] = args.session
            if "stall" in only:
                print(
                    f"- 3. healthz during {args.cold_trials} cold ~200k-token request(s) "
                    f"x {1 + len(variants)} proxy process(es) ...",
                    file=sys.stderr,
                    flush=True,
                )
                targets: list[tuple[str, Child, Prober, bool]] = [
                    ("as shipped", proxy, probers[0], "reused" not in only)
                ]
                for (label, child), prober in zip(variants, probers[1:], strict=True):
                    targets.append((label, child, prober, True))
                out["stall"] = await bench_stall(
                    session,
                    upstream,
                    transcript,
                    pool,
                    args.cold_trials,
                    args.idle_s,
                    args.probe_interval,
                    targets,
                )
    finally:
        for prober in probers:
            prober.stop()
    return out


def attach_gc(res: dict[str, Any], children: dict[str, Child]) -> None:
    """After the proxies stopped: their gc pause logs, per part and per cold request."""
    logs = {label: read_gc_log(child) for label, child in children.items()}
    res["gc_pauses"] = {}
    for label, p in logs.items():
        ready = children[label].ready_t
        serving = [(t, g, ms) for t, g, ms in p if t > ready]
        res["gc_pauses"][label] = {
            "start_up": {
                "collections": len(p) - len(serving),
                "gen2_ms": [round(ms, 1) for t, g, ms in p if g == 2 and t <= ready],
            },
            "serving": {
                "collections": len(serving),
                "gen2_ms": [round(ms, 1) for _, g, ms in serving if g == 2],
                "max_ms": max((ms for _, _, ms in serving), default=0.0),
                "by_generation": {
                    str(k): sum(1 for _, g, _ in serving if g == k) for k in (0, 1, 2)
                },
            },
        }
    r = res.get("reused")
    shipped = logs.get("as shipped", [])
    if r:
        r["gc"] = gc_summary(shipped, *r["window"])
        gen2 = [(t, ms) for t, g, ms in shipped if g == 2 and r["window"][0] <= t <= r["window"][1]]
        slow: dict[str, Any] = {}
        for target in ("proxy", "off"):
            stamps = sorted(r["request_stamps"][target], key=lambda x: -x[1])[:10]
            hit = sum(1 for t0, dt in stamps if any(t0 <= t <= t0 + dt for t, _ in gen2))
            slow[target] = {
                "slowest_10_ms": [round(dt * 1000, 1) for _, dt in stamps],
                "of_which_overlap_a_gen2_collection": hit,
            }
        r["gc"]["slowest_requests"] = slow
        del r["request_stamps"]
    st = res.get("stall")
    if st:
        for label, t in st["targets"].items():
            pauses = logs.get(label, [])
            runs = ([t["first_compaction"]] if "first_compaction" in t else []) + t["cold_runs"]
            for run in runs:
                run["gc"] = gc_summary(pauses, run["t_send"], run["t_end"])
                worst_t = run["worst_probe_t"]
                run["gc"]["gen2_during_worst_probe"] = any(
                    g == 2 and worst_t <= tt <= worst_t + run["healthz_ms"]["max"] / 1000 + 0.001
                    for tt, g, _ in pauses
                )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._role == "upstream":
        asyncio.run(_run_upstream())
        return 0
    if args._role == "prober":
        _run_prober(args.url, args.interval)
        return 0
    if args._role == "sdkprobe":
        print(json.dumps(asyncio.run(_sdk_probe(args.url, int(args.interval)))))
        return 0

    started = time.perf_counter()
    only = set(args.only.split(","))
    transcript = load_transcript()
    pool = _line_pool(transcript)
    walls: dict[str, float] = {}
    res: dict[str, Any] = {
        "machine": machine_info(),
        "code": code_version(),
        "quick": args.quick,
        "command": " ".join(["python", "bench/bench_compaction.py", *(argv or sys.argv[1:])]),
    }
    if "counting" in only:
        print(
            f"- 1. counting CPU, {args.count_reps} rep(s) per mode ...", file=sys.stderr, flush=True
        )
        res["counting"] = bench_counting(transcript, args.count_reps)
        walls["1 counting"] = time.perf_counter() - started
    if only & {"reused", "stall"}:
        t_part = time.perf_counter()
        children: list[Child] = []
        schema: str | None = None
        with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp_name:
            try:
                pg_url = None
                if args.store != "sqlite":
                    schema, pg_url = pg_schema(args.pg_url)
                    res["store"] = {"postgres": redact_url(args.pg_url), "schema": schema}
                up = spawn_upstream()
                children.append(up)
                px = spawn_proxy(
                    Path(tmp_name),
                    up.url,
                    args.proxy_log_level,
                    args.profile_proxy,
                    args.offload_bytes,
                    store_url=pg_url if args.store == "postgres" else None,
                )
                children.append(px)
                print(
                    f"upstream {up.url} (pid {up.proc.pid}), proxy {px.url} (pid {px.proc.pid})",
                    file=sys.stderr,
                    flush=True,
                )
                others: list[tuple[str, Child]] = []
                main_label = None
                if args.store == "both":
                    main_label = "SQLite store"
                    pgx = spawn_proxy(
                        Path(tmp_name),
                        up.url,
                        args.proxy_log_level,
                        offload_bytes=args.offload_bytes,
                        name="proxy-postgres",
                        store_url=pg_url,
                    )
                    children.append(pgx)
                    others.append(("PostgreSQL store", pgx))
                elif args.store == "postgres":
                    main_label = "PostgreSQL store"
                if args.compare_root:
                    cmp = spawn_proxy(
                        Path(tmp_name),
                        up.url,
                        args.proxy_log_level,
                        offload_bytes=args.offload_bytes,
                        name="proxy-compare",
                        root=Path(args.compare_root).resolve(),
                    )
                    children.append(cmp)
                    others.append((args.compare_label, cmp))
                    res["compare_code"] = code_version(Path(args.compare_root).resolve())
                variants: list[tuple[str, Child]] = []
                if "stall" in only:
                    for i, spec in enumerate(v for v in args.variants.split(",") if v):
                        variant = Variant.parse(spec)
                        child = spawn_proxy(
                            Path(tmp_name),
                            up.url,
                            args.proxy_log_level,
                            offload_bytes=args.offload_bytes,
                            variant=variant,
                            name=f"proxy-variant{i}",
                        )
                        children.append(child)
                        variants.append((variant.label, child))
                res.update(
                    asyncio.run(
                        run_servers_parts(
                            args, transcript, pool, px, up, variants, others, main_label
                        )
                    )
                )
                if "diagnosis" in only:
                    print(
                        "- 3c. summary call (SDK) on the loop, fresh process ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    res["summary_call"] = sdk_probe(up.url, 2 if args.quick else 5)
                if px.proc.poll() is not None:
                    raise RuntimeError(f"proxy died during the run: {px.log_path}")
            finally:
                for child in reversed(children):
                    child.stop()
                if schema is not None:
                    drop_pg_schema(args.pg_url, schema)
            attach_gc(res, {"as shipped": px, **{label: c for label, c in variants}})
        walls["2, 3, 3c (servers)"] = time.perf_counter() - t_part
    if "breakdown" in only:
        print("- 2b. reused-plan path, in-process breakdown ...", file=sys.stderr, flush=True)
        t_part = time.perf_counter()
        res["reused_breakdown"] = reused_breakdown(transcript, pool, args.breakdown_n)
        walls["2b breakdown"] = time.perf_counter() - t_part
    if "diagnosis" in only:
        print(
            f"- 3b. in-process diagnosis, {args.diag_reps} rep(s) ...", file=sys.stderr, flush=True
        )
        t_part = time.perf_counter()
        res["diagnosis"] = diagnose(transcript, pool, args.diag_reps, args.quick)
        res["gc_cost"] = gc_cost()
        walls["3b diagnosis"] = time.perf_counter() - t_part
    res["part_wall_s"] = walls
    res["settings"] = {
        k: v
        for k, v in vars(args).items()
        if not k.startswith("_") and k not in ("url", "interval", "json")
    }
    res["targets"] = {
        "cache_ratio_min": TARGET_CACHE_RATIO,
        "added_p50_ms_max": TARGET_ADDED_P50_MS,
        "stall_ms_max": TARGET_MAX_STALL_MS,
    }
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_wall_s"] = time.perf_counter() - started
    print_report(res)
    verdict = {k: res[k]["met"] for k in ("counting", "reused", "stall") if k in res}
    print(
        "targets met: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in verdict.items())
        + f"   (total {res['total_wall_s']:.0f} s: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in res["part_wall_s"].items())
        + ")"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
