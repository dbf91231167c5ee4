"""A tiny fake provider for demos: ``context-proxy demo-upstream [--host] [--port]``.

It speaks just enough of the Messages API to try the proxy without a provider key, and never
calls out:

* ``POST /v1/messages``: a deterministic assistant message that echoes the length of the last
  user text and the number of messages (JSON, or SSE when the request has ``"stream": true``);
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, a byte-based estimate (4 bytes a
  token);
* ``GET /v1/models``: one model.

Credentials are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
from typing import Any

import orjson
from aiohttp import web

log = logging.getLogger("context_proxy.demo_upstream")

MODEL = "claude-demo-1"
BYTES_PER_TOKEN = 4


def estimate_tokens(raw: bytes) -> int:
    return max(1, len(raw) // BYTES_PER_TOKEN)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def answer_text(body: dict[str, Any]) -> str:
    """The deterministic reply: the last user text's length and the number of messages."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    last_user = ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            last_user = _text_of(message.get("content"))
            break
    return (
        f"Demo upstream: your last message was {len(last_user)} characters long;"
        f" the conversation has {len(messages)} messages."
    )


def message(body: dict[str, Any], raw: bytes) -> dict[str, Any]:
    text = answer_text(body)
    model = body.get("model") if isinstance(body.get("model"), str) else MODEL
    return {
        "id": "msg_demo_" + hashlib.sha256(raw).hexdigest()[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": estimate_tokens(raw),
            "output_tokens": estimate_tokens(text.encode()),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def stream_events(msg: dict[str, Any]) -> list[bytes]:
    """``msg`` as a well-formed SSE answer, its text in a few deltas."""
    text: str = msg["content"][0]["text"]
    start = {
        **msg,
        "content": [],
        "stop_reason": None,
        "usage": {**msg["usage"], "output_tokens": 1},
    }
    events = [
        _frame("message_start", {"type": "message_start", "message": start}),
        _frame(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        _frame("ping", {"type": "ping"}),
    ]
    step = max(1, len(text) // 4)
    for i in range(0, len(text), step):
        delta = {"type": "text_delta", "text": text[i : i + step]}
        events.append(
            _frame(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
        )
    events.append(_frame("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        _frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
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
    msg = message(body, raw)
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


async def serve(host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives."""
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for address in runner.addresses:
        if isinstance(address, tuple):
            log.info("demo upstream listening on http://%s:%d", address[0], address[1])
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        log.info("stopped")
