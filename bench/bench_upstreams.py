#!/usr/bin/env python
"""Benchmark: the Bedrock, Vertex and Foundry upstream paths next to the Anthropic path, one
interleaved run.

    python bench/bench_upstreams.py [--n 400] [--json out.json]

Processes (all on 127.0.0.1):

    bench (this process: the load generator, one keep-alive ClientSession)
      ├──▶ fakes  (one process: the Anthropic, Bedrock Runtime, Vertex AI and Foundry answers) "direct"
      ├──▶ proxy "anthropic" (`python -m proxy serve`) ──▶ fakes /v1/messages
      ├──▶ proxy "bedrock"   (upstream.format: bedrock, SigV4 with a test key) ──▶ fakes /model/..
      ├──▶ proxy "vertex"    (upstream.format: vertex, a service-account token) ──▶ fakes :rawPredict
      ├──▶ proxy "foundry"   (upstream.format: foundry, the resource's key) ──▶ fakes /anthropic/v1/messages
      └──▶ proxy "foundry_entra" (foundry, an Entra ID token: azure-identity's chain, its managed
                              identity at the fakes' /msi/token) ──▶ fakes /anthropic/v1/messages

The fakes answer from bytes made once (Bedrock's stream as event-stream frames, the others as
SSE), without checking signatures, so that each row's upstream costs the same; the tests check
the signatures (tests/platform_fakes.py). Rows, sequential (concurrency 1), every iteration sending
the same request to each target in a rotating order: ``json_1k`` (1 KB body, a JSON answer) and
``sse_1k`` (``"stream": true``, a 200-event answer). "Added" = percentile(proxy) -
percentile(direct) in the same run; the platform rows are also shown minus the Anthropic row:
what the platform path itself costs (body re-encoding, signing, the key or the token,
event-stream decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from bench.measure import pct  # noqa: E402
from bench.servers import CHILDREN, spawn_logged  # noqa: E402
from bench.workloads import body_1k, sse_body_1k, sse_events  # noqa: E402
from proxy.formats.eventstream import CONTENT_TYPE, chunk_frame  # noqa: E402
from tests.upstream import message_json  # noqa: E402

TARGETS = ("direct", "anthropic", "bedrock", "vertex", "foundry", "foundry_entra")
PLATFORMS = TARGETS[2:]
IDENTITY_HEADER = "bench-identity-header"
KEY = "sk-ant-bench-0000000000000000"


# --- the fakes (child process) ------------------------------------------------------------------


def _answers() -> dict[str, bytes]:
    events = sse_events()
    frames = b"".join(chunk_frame(e.split(b"data: ", 1)[1].rstrip(b"\n")) for e in events)
    return {"json": orjson.dumps(message_json("x" * 200)), "sse": b"".join(events), "frames": frames}


async def _run_fakes() -> None:
    answers = _answers()

    async def anthropic_like(request: web.Request, stream: bool) -> web.StreamResponse:
        await request.read()
        if not stream:
            return web.Response(body=answers["json"], content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(answers["sse"])
        await response.write_eof()
        return response

    async def messages(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        return await anthropic_like(request, b'"stream":true' in raw)

    async def bedrock(request: web.Request) -> web.StreamResponse:
        await request.read()
        if request.match_info["op"] == "invoke":
            return web.Response(body=answers["json"], content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        await response.prepare(request)
        await response.write(answers["frames"])
        await response.write_eof()
        return response

    async def vertex(request: web.Request) -> web.StreamResponse:
        return await anthropic_like(request, request.path.endswith(":streamRawPredict"))

    async def foundry(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        return await anthropic_like(request, b'"stream":true' in raw)

    async def identity(request: web.Request) -> web.Response:  # App Service's managed identity
        expires = str(int(time.time()) + 3600)
        return web.json_response({"access_token": "eyJ.bench", "expires_on": expires,
                                  "resource": request.query.get("resource"), "token_type": "Bearer"})

    async def token(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"access_token": "ya29.bench", "expires_in": 3600, "token_type": "Bearer"})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/model/{model}/{op}", bedrock)
    app.router.add_post("/token", token)
    app.router.add_post("/v1/projects/{tail:.*}", vertex)
    app.router.add_post("/anthropic/v1/messages", foundry)
    app.router.add_get("/msi/token", identity)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"FAKES http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


# --- the proxies --------------------------------------------------------------------------------


def _service_account(fakes: str) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"type": "service_account", "project_id": "bench", "private_key_id": "k1", "private_key": pem,
            "client_email": "bench@bench.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": f"{fakes}/token"}


def _spawn_proxy(
    name: str, upstream: dict[str, Any], tmp: Path, extra_env: dict[str, str] | None = None
) -> str:
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": upstream,
        "state_dir": str(tmp / f"state-{name}"),
        "logging": {"level": "INFO"},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONMALLOC": "malloc", "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
           "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"), **(extra_env or {})}
    child = spawn_logged(name, [sys.executable, "-m", "proxy", "serve", "--config", str(path)], tmp, env=env)
    return child.url


# --- the measurement ----------------------------------------------------------------------------


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> float:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    started = time.perf_counter_ns()
    async with session.post(url + "/v1/messages", data=body, headers=headers) as response:
        data = await response.read()
    elapsed = (time.perf_counter_ns() - started) / 1e6
    ok = b"message_stop" in data if stream else data.startswith(b'{"id":"msg_')
    if response.status != 200 or not ok:
        raise RuntimeError(f"{url}: status {response.status}: {data[:300]!r}")
    return elapsed


async def _row(urls: dict[str, str], body: bytes, stream: bool, n: int, warmup: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {t: [] for t in TARGETS}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        for i in range(warmup + n):
            order = TARGETS[i % len(TARGETS):] + TARGETS[: i % len(TARGETS)]
            for target in order:
                ms = await _one(session, urls[target], body, stream)
                if i >= warmup:
                    samples[target].append(ms)
    out: dict[str, Any] = {}
    for target, xs in samples.items():
        xs.sort()
        out[target] = {"n": len(xs), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9)}
    for target in TARGETS[1:]:
        for q in ("p50", "p90"):
            out[target][f"added_{q}"] = out[target][q] - out["direct"][q]
    for target in PLATFORMS:
        for q in ("p50", "p90"):
            out[target][f"vs_anthropic_{q}"] = out[target][f"added_{q}"] - out["anthropic"][f"added_{q}"]
    return out


def _print(name: str, row: dict[str, Any]) -> None:
    print(f"\n{name}  (ms; added = minus direct in the same run)")
    print(f"{'target':<14} {'p50':>8} {'p90':>8} {'added p50':>10} {'added p90':>10} {'vs anthropic p50':>17}")
    for target in TARGETS:
        r = row[target]
        added = f"{r.get('added_p50', 0):10.3f} {r.get('added_p90', 0):10.3f}" if target != "direct" else " " * 21
        versus = f"{r['vs_anthropic_p50']:+17.3f}" if "vs_anthropic_p50" in r else ""
        print(f"{target:<14} {r['p50']:8.3f} {r['p90']:8.3f} {added} {versus}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--n", type=int, default=400, help="iterations per row (each sends to every target)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--_role", choices=["fakes"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._role == "fakes":
        asyncio.run(_run_fakes())
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-upstreams-") as name:
        tmp = Path(name)
        fakes_proc = subprocess.Popen(
            [sys.executable, __file__, "--_role", "fakes"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        try:
            assert fakes_proc.stdout is not None
            line = fakes_proc.stdout.readline().decode()
            if not line.startswith("FAKES "):
                raise RuntimeError(f"fakes did not start: {line!r}")
            fakes = line.split()[1]
            (tmp / "sa.json").write_text(json.dumps(_service_account(fakes)))
            urls = {
                "direct": fakes,
                "anthropic": _spawn_proxy("anthropic", {"base_url": fakes}, tmp),
                "bedrock": _spawn_proxy("bedrock", {"format": "bedrock", "region": "us-east-1",
                                                    "endpoint_url": fakes}, tmp),
                "vertex": _spawn_proxy("vertex", {"format": "vertex", "project": "bench",
                                                  "location": "us-east5", "endpoint_url": fakes,
                                                  "credentials_file": str(tmp / "sa.json")}, tmp),
                "foundry": _spawn_proxy("foundry", {"format": "foundry", "api_key_env": "BENCH_FOUNDRY_KEY",
                                                    "endpoint_url": fakes + "/anthropic"}, tmp,
                                        {"BENCH_FOUNDRY_KEY": "bench-foundry-key"}),
                "foundry_entra": _spawn_proxy(
                    "foundry_entra", {"format": "foundry", "endpoint_url": fakes + "/anthropic"}, tmp,
                    {"IDENTITY_ENDPOINT": fakes + "/msi/token", "IDENTITY_HEADER": IDENTITY_HEADER,
                     "AZURE_TOKEN_CREDENTIALS": "ManagedIdentityCredential"},
                ),
            }
            rows = {
                "json_1k": asyncio.run(_row(urls, body_1k(), False, args.n, args.warmup)),
                "sse_1k": asyncio.run(_row(urls, sse_body_1k(), True, max(1, args.n // 2), args.warmup // 2)),
            }
        finally:
            for child in CHILDREN.values():
                child.stop()
            fakes_proc.terminate()
            fakes_proc.wait(10)
    for name, row in rows.items():
        _print(name, row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
