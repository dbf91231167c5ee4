"""bench/measure.py's latency loop, against real local servers: each row goes to its own path,
and a row that peers cannot relay is sent to direct, the floor, the proxy and a baseline only."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from bench.measure import Workload, run_latency


async def _recording_server(name: str, seen: dict[str, list[str]]) -> web.AppRunner:
    seen[name] = []

    async def handle(request: web.Request) -> web.Response:
        if request.method == "POST":
            seen[name].append(request.path)
        return web.json_response({"id": "msg_bench", "type": "message"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def request(_i: int) -> tuple[bytes, dict[str, str]]:
    return b'{"messages": []}', {"content-type": "application/json"}


async def test_a_row_goes_to_its_path_and_skips_the_peers_when_told() -> None:
    seen: dict[str, list[str]] = {}
    names = ("direct", "floor", "proxy", "baseline", "litellm")
    runners = {name: await _recording_server(name, seen) for name in names}
    urls = {name: f"http://127.0.0.1:{r.addresses[0][1]}" for name, r in runners.items()}
    try:
        async with aiohttp.ClientSession() as session:
            edge = Workload("edge_1k", "x", 6, 1, request, request, path="/v1/messages/batches", peers=False)
            out = await run_latency(session, edge, urls, {})
            assert set(out["added_ms"]) == {"floor", "proxy", "baseline"}
            assert seen["litellm"] == []
            for name in ("direct", "floor", "proxy", "baseline"):
                assert seen[name] == ["/v1/messages/batches"] * 7  # 1 warm-up + 6 measured

            usual = Workload("json_1k", "x", 3, 0, request, request)
            out = await run_latency(session, usual, urls, {})
            assert set(out["added_ms"]) == {"floor", "proxy", "baseline", "litellm"}
            assert seen["litellm"] == ["/v1/messages"] * 3
            assert "litellm_to_proxy" in out["ratio_p50"]
    finally:
        for r in runners.values():
            await r.cleanup()
