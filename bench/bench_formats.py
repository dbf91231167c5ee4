#!/usr/bin/env python
"""What the Bedrock, Vertex and Foundry client paths add next to the Anthropic path (issue 21).

    python bench/bench_formats.py [--quick] [--n 400] [--json out.json]

Processes as in bench/bench_proxy.py: the fake upstream (``BenchUpstream``: it answers by the
``x-bench-mode`` header, which every format forwards) and the proxy (``python -m proxy serve``,
shipped settings, ``PYTHONMALLOC=malloc``) in their own processes. Each iteration sends the same
conversation to four targets in a rotating order: the upstream directly, and the proxy as an
Anthropic client (``/v1/messages``), a Bedrock client (``/model/<profile>/invoke`` and
``invoke-with-response-stream``: no ``model``, ``anthropic_version``/``anthropic_beta`` in the body)
a Vertex client (``/v1/projects/…/models/<model>:rawPredict`` / ``:streamRawPredict``) and a
Foundry client (``/anthropic/v1/messages``): ``foundry`` names the model as Claude Code's Foundry
mode does (``claude-sonnet-4-5``, a name the Claude API takes: the client's bytes go on),
``foundry_rebuilt`` by a deployment name the Claude API does not take (``claude-opus-4``: the body
is rebuilt with the Anthropic id).
Every answer is checked (status, and for streams the last event: an SSE ``message_stop``, or
the last event-stream frame decoded and its CRCs checked).

Rows: ``json_1k`` / ``sse_1k`` (a 1 KB agent body; the stream is 200 events, so the Bedrock row
re-frames 200 events), ``json_500k`` (a 500 KB body re-sent with one key: the body memo path).
Figures: p50 and p90 of the time to the last byte, ``added`` = the target's p50 minus direct's
p50, and each platform's p50 minus the Anthropic path's (what the format costs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import pct  # noqa: E402
from bench.servers import (  # noqa: E402
    CHILDREN,
    allocator_env,
    raise_nofile,
    spawn_logged,
    spawn_upstream,
    write_proxy_config,
)
from bench.workloads import build_body  # noqa: E402
from proxy.formats.eventstream import FrameDecoder, chunk_event  # noqa: E402

PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX = "/v1/projects/bench/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929"
TARGETS = ("direct", "anthropic", "bedrock", "vertex", "foundry", "foundry_rebuilt")
KEY = "sk-ant-bench-not-a-real-key"


def _variants(body: bytes, stream: bool) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """target -> (path, body, headers): the same conversation in each client's format."""
    value = orjson.loads(body)
    value.pop("stream", None)
    value.pop("model", None)
    anthropic = {"model": "claude-sonnet-4-5-20250929", **value, **({"stream": True} if stream else {})}
    bedrock = {**value, "anthropic_version": "bedrock-2023-05-31", "anthropic_beta": ["bench-2026-01-01"]}
    vertex = {**value, "anthropic_version": "vertex-2023-10-16", **({"stream": True} if stream else {})}
    foundry = {"model": "claude-sonnet-4-5", **value, **({"stream": True} if stream else {})}
    rebuilt = {**foundry, "model": "claude-opus-4"}
    mode = "sse" if stream else "json"
    base = {"x-api-key": KEY, "content-type": "application/json", "x-bench-mode": mode}
    messages = {**base, "anthropic-version": "2023-06-01", "anthropic-beta": "bench-2026-01-01"}
    return {
        "direct": ("/v1/messages", orjson.dumps(anthropic), messages),
        "anthropic": ("/v1/messages", orjson.dumps(anthropic), messages),
        "bedrock": (
            f"/model/{PROFILE}/invoke" + ("-with-response-stream" if stream else ""),
            orjson.dumps(bedrock), base,
        ),
        "vertex": (
            VERTEX + (":streamRawPredict" if stream else ":rawPredict"), orjson.dumps(vertex),
            {**base, "anthropic-beta": "bench-2026-01-01"},
        ),
        "foundry": ("/anthropic/v1/messages?beta=true", orjson.dumps(foundry), messages),
        "foundry_rebuilt": ("/anthropic/v1/messages?beta=true", orjson.dumps(rebuilt), messages),
    }


def _check(target: str, stream: bool, status: int, data: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"{target}: status {status}: {data[:200]!r}")
    if not stream:
        if not data.startswith(b'{"id":"msg_'):
            raise RuntimeError(f"{target}: not a message: {data[:200]!r}")
        return
    if target == "bedrock":
        decoder = FrameDecoder()
        frames = decoder.feed(data)
        decoder.close()
        last = chunk_event(frames[-1])
    else:
        last = data.rstrip().rsplit(b"\n", 1)[-1]
    if b"message_stop" not in last:
        raise RuntimeError(f"{target}: stream without message_stop at its end")


async def _one(
    session: aiohttp.ClientSession, url: str, request: tuple[str, bytes, dict[str, str]]
) -> tuple[float, int, bytes]:
    path, body, headers = request
    t0 = time.perf_counter_ns()
    async with session.post(url + path, data=body, headers=headers) as response:
        data = await response.read()
    return (time.perf_counter_ns() - t0) / 1e6, response.status, data


async def _row(
    session: aiohttp.ClientSession, urls: dict[str, str], name: str, body: bytes, stream: bool,
    n: int, warmup: int,
) -> dict[str, Any]:
    variants = _variants(body, stream)
    times: dict[str, list[float]] = {t: [] for t in TARGETS}
    for i in range(warmup + n):
        k = i % len(TARGETS)
        for target in TARGETS[k:] + TARGETS[:k]:
            ms, status, data = await _one(session, urls[target], variants[target])
            _check(target, stream, status, data)
            if i >= warmup:
                times[target].append(ms)
        if i == warmup:
            gc.collect()
    out: dict[str, Any] = {"row": name, "n": n, "body_bytes": len(body)}
    for target in TARGETS:
        xs = sorted(times[target])
        out[target] = {"p50": pct(xs, 0.5), "p90": pct(xs, 0.9)}
    for target in TARGETS[1:]:
        out[target]["added_p50"] = out[target]["p50"] - out["direct"]["p50"]
    for target in TARGETS[2:]:
        out[target]["vs_anthropic_p50"] = out[target]["p50"] - out["anthropic"]["p50"]
    return out


async def bench(args: argparse.Namespace, urls: dict[str, str]) -> list[dict[str, Any]]:
    connector = aiohttp.TCPConnector(limit=16)
    timeout = aiohttp.ClientTimeout(total=120)
    rows = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        small = build_body(1024, result_size=150)
        rows.append(await _row(session, urls, "json_1k", small, False, args.n, args.warmup))
        rows.append(await _row(session, urls, "sse_1k", small, True, args.n // 2, args.warmup // 2))
        big = build_body(500_000, result_size=6000)
        rows.append(await _row(session, urls, "json_500k", big, False, args.n_500k, 5))
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'row':10} {'n':>5}  {'target':15} {'p50 ms':>8} {'p90 ms':>8} {'added p50':>10} {'vs anthropic':>12}")
    for row in rows:
        for target in TARGETS:
            fig = row[target]
            added = f"{fig['added_p50']:10.3f}" if "added_p50" in fig else " " * 10
            versus = f"{fig['vs_anthropic_p50']:+12.3f}" if "vs_anthropic_p50" in fig else ""
            print(f"{row['row']:10} {row['n']:>5}  {target:15} {fig['p50']:8.3f} {fig['p90']:8.3f} {added} {versus}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller samples (smoke run)")
    parser.add_argument("--n", type=int, help="iterations of the 1 KB rows (default 600; quick 150)")
    parser.add_argument("--n-500k", type=int, help="iterations of the 500 KB row (default 100; quick 30)")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    args.n = args.n or (150 if args.quick else 600)
    args.n_500k = args.n_500k or (30 if args.quick else 100)
    # write_proxy_config's settings (shipped defaults otherwise)
    args.conc_streams, args.proxy_log_level, args.compaction, args.ledger = 0, "INFO", "default", "on"
    raise_nofile()
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            up = spawn_upstream()
            CHILDREN["upstream"] = up
            cfg = write_proxy_config(tmp, up.url, args)
            proxy = spawn_logged(
                "proxy", [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(cfg)],
                tmp, env=allocator_env("malloc"),
            )
            urls = {"direct": up.url, **dict.fromkeys(TARGETS[1:], proxy.url)}
            time.sleep(2)
            rows = asyncio.run(bench(args, urls))
        finally:
            for child in reversed(list(CHILDREN.values())):
                child.stop()
    _print(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
