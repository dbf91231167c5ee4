"""A tiny fake provider for demos: ``context-proxy demo-upstream [--host] [--port]``.

It speaks just enough of the Messages API to try the proxy without a provider key, and never
calls out (``context-proxy serve --demo`` runs it in the proxy's own process):

* ``POST /v1/messages``: the demo model's deterministic answer (:mod:`proxy.demo.model`: an
  agent reading the files its plan lists, one ``tool_use`` a turn, or a text naming the number
  of messages), as JSON, or SSE when the request has ``"stream": true``;
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, a byte-based estimate (4 bytes a
  token);
* ``GET /v1/models``: one model.

Credentials are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import orjson
from aiohttp import web

from proxy.demo import model

log = logging.getLogger("context_proxy.demo_upstream")

MODEL = model.MODEL
estimate_tokens = model.estimate_tokens


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """One content block as its start, deltas (text in a few pieces; a tool's input as JSON in
    two) and stop."""
    def delta(d: dict[str, Any]) -> bytes:
        return _frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

    if block["type"] == "tool_use":
        start = {**block, "input": {}}
        partial = orjson.dumps(block["input"]).decode()
        half = len(partial) // 2
        deltas = [
            delta({"type": "input_json_delta", "partial_json": piece})
            for piece in (partial[:half], partial[half:])
        ]
    else:
        start = {"type": "text", "text": ""}
        text: str = block["text"]
        step = max(1, len(text) // 4)
        deltas = [
            delta({"type": "text_delta", "text": text[i : i + step]})
            for i in range(0, len(text), step)
        ]
    return [
        _frame("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
        *deltas,
        _frame("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def stream_events(msg: dict[str, Any]) -> list[bytes]:
    """``msg`` as a well-formed SSE answer."""
    start = {
        **msg,
        "content": [],
        "stop_reason": None,
        "usage": {**msg["usage"], "output_tokens": 1},
    }
    events = [
        _frame("message_start", {"type": "message_start", "message": start}),
        _frame("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(msg["content"]):
        events += _block_events(index, block)
    events.append(
        _frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": msg["usage"]["output_tokens"]},
            },
        )
    )
    events.append(_frame("message_stop", {"type": "message_stop"}))
    return events


def _error(status: int, kind: str, text: str) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": text}}
    return web.json_response(body, status=status, dumps=lambda v: orjson.dumps(v).decode())


async def _json_body(request: web.Request) -> tuple[dict[str, Any], bytes] | web.Response:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _error(400, "invalid_request_error", "the body is not JSON")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return _error(400, "invalid_request_error", "messages: expected a list")
    return body, raw


async def handle_messages(request: web.Request) -> web.StreamResponse:
    parsed = await _json_body(request)
    if isinstance(parsed, web.Response):
        return parsed
    body, raw = parsed
    msg = model.answer(body, raw)
    if body.get("stream") is not True:
        return web.json_response(msg, dumps=lambda v: orjson.dumps(v).decode())
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in stream_events(msg):
        await response.write(event)
    await response.write_eof()
    return response


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    parsed = await _json_body(request)
    if isinstance(parsed, web.Response):
        return parsed
    return web.json_response({"input_tokens": estimate_tokens(parsed[1])})


async def handle_models(request: web.Request) -> web.StreamResponse:
    model = {
        "type": "model",
        "id": MODEL,
        "display_name": "Demo model (context-proxy demo-upstream)",
        "created_at": "2026-01-01T00:00:00Z",
    }
    return web.json_response(
        {"data": [model], "has_more": False, "first_id": MODEL, "last_id": MODEL}
    )


async def handle_health(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


def build_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", handle_messages)
    app.router.add_post("/v1/messages/count_tokens", handle_count_tokens)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/healthz", handle_health)
    return app


async def start(host: str, port: int) -> tuple[web.AppRunner, str]:
    """The demo provider listening (``port`` 0: any free port): its runner and base URL."""
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = next(a for a in runner.addresses if isinstance(a, tuple))
    return runner, f"http://{bound[0]}:{bound[1]}"


async def serve(host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives."""
    runner, url = await start(host, port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("demo upstream listening on %s", url)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        log.info("stopped")
