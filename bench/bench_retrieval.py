#!/usr/bin/env python
"""Benchmark: what a hidden retrieval round costs beyond the two upstream calls themselves, and
what offering the tool does to the prefix-stable share.

    python bench/bench_retrieval.py [--n 400] [--warmup 40] [--json out.json] [--share-only]

1. **Splice latency.** One event loop runs the fake upstream (tests/upstream.py), the proxy
   (``build_app``, as ``serve`` builds it) and the client. The model the upstream plays calls
   ``context_proxy_retrieve`` for a cut tool result (a 28,000-character artifact) and then
   answers. Per iteration, interleaved in a rotating order:

   * ``direct``: the client itself makes the two upstream calls the proxy would make (the same
     bodies, captured during warm-up), one after the other;
   * ``proxy``: one client request through the proxy, which makes both calls, reads and verifies
     the artifact, pages it into the tool result and splices the two answers into one;
   * ``plain``: one client request through the proxy whose answer calls no tool (one upstream
     call): the proxy's own cost on this conversation, without retrieval.

   Everything shares one thread, so a latency difference is CPU work (the network is loopback).
   ``added`` = p50(proxy) - p50(direct): what the retrieval round trip costs over the two calls
   themselves (the proxy's per-request work included). ``splice`` = added - (p50(plain) -
   p50(direct call 1)): the part due to the retrieval alone. Both for JSON and for SSE (to the
   last byte; each answer is about 12 events per round).

2. **Prefix-stable share** on the shared Claude Code transcript (tests/data), replayed at a low
   threshold (40,000) with the offline summariser, once as ``replay`` does (no session: no
   pointers, no tool) and once as the proxy does with a session (artifact pointers in markers,
   transcript pointers in the bridge, the tool appended to ``tools`` once the view names one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from proxy.config.settings import parse_config  # noqa: E402
from proxy.core.compaction import CompactionInput, Done, PlanCache, compact, finish  # noqa: E402
from proxy.core.compaction.bridge import TranscriptNaming  # noqa: E402
from proxy.core.compaction.retrieval import TOOL_NAME, offer_tool, plan_names_pointers  # noqa: E402
from proxy.core.compaction.truncate import artifact_pointer  # noqa: E402
from proxy.core.tokens import TokenCounter  # noqa: E402
from proxy.server.appkeys import DURABLE  # noqa: E402
from tests.harness import ProxyServer  # noqa: E402
from tests.upstream import (  # noqa: E402
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    message_stream_events,
)

SESSION = "bench-1"
BIG = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
TOOLS = [{"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}}]
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "read the log"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log1", "name": "Bash", "input": {"command": "cat log"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log1", "content": BIG}]},
    {"role": "assistant", "content": "It is long."},
    {"role": "user", "content": "what failed?"},
]
CALL = {"type": "tool_use", "id": "toolu_r1", "name": TOOL_NAME, "input": {"pointer": artifact_pointer(SESSION, BIG)}}
ROUND1 = message_json(content=[{"type": "text", "text": "Let me read the whole log."}, CALL], stop_reason="tool_use", input_tokens=300, output_tokens=20)
ROUND2 = message_json("The failure is on line 399: " + "detail " * 40, input_tokens=7300, output_tokens=60)
PLAIN = message_json("Nothing to fetch: " + "detail " * 40, input_tokens=300, output_tokens=60)
ROUND1_SSE = message_stream_events(ROUND1)
ROUND2_SSE = message_stream_events(ROUND2)
PLAIN_SSE = message_stream_events(PLAIN)


class BenchUpstream(FakeUpstream):
    """Answers by what the request is: a continuation (it carries our tool's result), a request
    marked plain, or a first round. Keeps no bodies after the warm-up."""

    keep = True

    def _take(self, recorded: RecordedRequest) -> Reply | Stream:  # type: ignore[override]
        if not self.keep:
            self.requests.clear()
        stream = b'"stream":true' in recorded.body
        if b'"tool_use_id":"toolu_r1"' in recorded.body:
            return Stream(ROUND2_SSE) if stream else Reply(ROUND2)
        if recorded.headers.get("x-bench") == "plain":
            return Stream(PLAIN_SSE) if stream else Reply(PLAIN)
        return Stream(ROUND1_SSE) if stream else Reply(ROUND1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> bytes:
    async with http.post(url, data=body, headers=headers) as r:
        data = await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {data[:200]!r}")
        return data


async def _mode(
    http: aiohttp.ClientSession, proxy: ProxyServer, upstream: BenchUpstream, headers: dict[str, str],
    mode: str, n: int, warmup: int,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "tools": TOOLS}
    if mode == "sse":
        body["stream"] = True
    raw = orjson.dumps(body)
    upstream.keep = True
    upstream.requests.clear()
    answer = await _post(http, f"{proxy.url}/v1/messages", raw, headers)
    sent = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert len(sent) == 2 and TOOL_NAME.encode() not in answer.replace(b'"tools"', b""), "not a retrieval round trip"
    first, second = sent[0].body, sent[1].body
    up = {k: v for k, v in headers.items() if k != "x-session-id"}
    upstream.keep = False
    samples: dict[str, list[float]] = {"direct": [], "direct1": [], "proxy": [], "plain": []}
    cpu: dict[str, list[float]] = {k: [] for k in samples}

    async def settle() -> None:
        # background work of the previous request (transcript recording) ends first
        await proxy.app[DURABLE].drain()

    async def direct() -> None:
        await settle()
        c0, t0 = time.process_time(), time.perf_counter()
        await _post(http, f"{upstream.url}/v1/messages", first, up)
        c1, t1 = time.process_time(), time.perf_counter()
        await _post(http, f"{upstream.url}/v1/messages", second, up)
        samples["direct"].append(time.perf_counter() - t0)
        samples["direct1"].append(t1 - t0)
        cpu["direct"].append(time.process_time() - c0)
        cpu["direct1"].append(c1 - c0)

    async def via_proxy() -> None:
        await settle()
        c0, t0 = time.process_time(), time.perf_counter()
        await _post(http, f"{proxy.url}/v1/messages", raw, headers)
        samples["proxy"].append(time.perf_counter() - t0)
        cpu["proxy"].append(time.process_time() - c0)

    async def plain() -> None:
        await settle()
        c0, t0 = time.process_time(), time.perf_counter()
        await _post(http, f"{proxy.url}/v1/messages", raw, {**headers, "x-bench": "plain"})
        samples["plain"].append(time.perf_counter() - t0)
        cpu["plain"].append(time.process_time() - c0)

    runs = [direct, via_proxy, plain]
    for i in range(warmup + n):
        order = runs[i % 3 :] + runs[: i % 3]
        for run in order:
            await run()
        if i == warmup - 1:
            for v in [*samples.values(), *cpu.values()]:
                v.clear()
    ms = {k: {"p50": pct(v, 0.5) * 1000, "p99": pct(v, 0.99) * 1000} for k, v in samples.items()}
    added = ms["proxy"]["p50"] - ms["direct"]["p50"]
    own = ms["plain"]["p50"] - ms["direct1"]["p50"]
    paired = [p - d for p, d in zip(samples["proxy"], samples["direct"], strict=True)]
    figures: dict[str, Any] = {
        "samples": n,
        "ms": ms,
        "added_p50_ms": added,
        "added_paired_median_ms": statistics.median(paired) * 1000,
        "proxy_own_p50_ms": own,
        "splice_p50_ms": added - own,
        "cpu_ms_p50": {k: statistics.median(v) * 1000 for k, v in cpu.items()},
    }
    c = figures["cpu_ms_p50"]
    figures["splice_cpu_p50_ms"] = (c["proxy"] - c["direct"]) - (c["plain"] - c["direct1"])
    return figures


async def latency(n: int, warmup: int) -> dict[str, Any]:
    upstream = BenchUpstream()
    await upstream.start()
    state = tempfile.mkdtemp(prefix="bench-retrieval-")
    config = parse_config(
        {
            "upstream": {"base_url": upstream.url},
            "state_dir": state,
            "logging": {"level": "WARNING"},
            "compaction": {"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200},
        },
        "<bench>",
    )
    proxy = ProxyServer(config)
    await proxy.start()
    headers = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01", "content-type": "application/json", "x-session-id": SESSION}
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for mode in ("json", "sse"):
            out[mode] = await _mode(http, proxy, upstream, headers, mode, n, warmup)
    await proxy.stop()
    await upstream.stop()
    return out


def share(threshold: int = 40_000) -> dict[str, Any]:
    from proxy.config.compaction import policy_from_config
    from proxy.config.settings import CompactionConfig
    from proxy.replay.readers import parse_messages_json
    from proxy.replay.runner import ExtractiveSummariser, request_units, shared_prefix_tokens
    from tests.shared_data import CC_TRANSCRIPT

    conversation = parse_messages_json(orjson.loads(CC_TRANSCRIPT.read_bytes()), str(CC_TRANSCRIPT))
    policy = policy_from_config(CompactionConfig(threshold=threshold, hard_limit=max(threshold * 3 // 2, 120_000)))
    messages = conversation.messages
    ks = [k for k in range(1, len(messages) + 1) if messages[k - 1].get("role") == "user"]
    result: dict[str, Any] = {"transcript": CC_TRANSCRIPT.name, "threshold": threshold, "requests": len(ks)}
    for label, session in (("no session (replay)", None), ("session: pointers + tool", "s1")):
        counter = TokenCounter()
        plans = PlanCache()
        summariser = ExtractiveSummariser(counter.count_text)
        previous = None
        shared = total = 0
        started = False
        offered_from = None
        tool_changes = 0
        had_tool = False
        for turn, k in enumerate(ks, 1):
            request = messages[:k]
            # offline, the transcript as the proxy records a conversation from its start:
            # message i is event i + 1 (looked up by key online)
            recorded = tuple((i, i + 1) for i in range(k))
            naming = TranscriptNaming(session, "", recorded) if session else None
            outcome = compact(
                CompactionInput(conversation.system, conversation.tools, request, "claude-sonnet-4-5", artifact_session=session, transcript=naming),
                policy, counter, plans, "bench",
            )
            res = outcome.result if isinstance(outcome, Done) else finish(outcome.continuation, summariser(outcome.summary_request))
            view = res.messages if res.changed else list(request)
            tools = conversation.tools
            if session and res.changed and plan_names_pointers(res.plan):
                offered = offer_tool({"tools": tools, "messages": view})
                if offered is not None:
                    tools = offered["tools"]
                    offered_from = offered_from or turn
            has_tool = tools is not conversation.tools
            tool_changes += has_tool != had_tool
            had_tool = has_tool
            units = request_units(conversation.system, tools, view, counter)
            if res.changed:
                started = True
            if started:
                shared += shared_prefix_tokens(previous, units)
                total += sum(t for _, t in units)
            previous = units
        result[label] = {
            "prefix_stable_share_from_first_compaction": round(shared / total, 4) if total else None,
            "tool_offered_from_request": offered_from,
            "tool_appeared_or_vanished": tool_changes,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--share-only", action="store_true")
    parser.add_argument("--threshold", type=int, default=40_000)
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if not args.share_only:
        report["latency"] = asyncio.run(latency(args.n, args.warmup))
        for mode, figures in report["latency"].items():
            ms = figures["ms"]
            print(
                f"{mode:4}  direct (2 calls) p50 {ms['direct']['p50']:.2f} ms  via proxy p50 {ms['proxy']['p50']:.2f} ms"
                f"  added p50 {figures['added_p50_ms']:.2f} ms (paired median {figures['added_paired_median_ms']:.2f})"
                f"  | proxy's own work on a plain turn {figures['proxy_own_p50_ms']:.2f} ms  -> splice {figures['splice_p50_ms']:.2f} ms"
                f"  | CPU: splice {figures['splice_cpu_p50_ms']:.2f} ms"
            )
    report["share"] = share(args.threshold)
    for label in ("no session (replay)", "session: pointers + tool"):
        print(f"share  {label:26} {report['share'][label]}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
