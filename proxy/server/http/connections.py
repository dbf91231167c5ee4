"""Client connections: slow and idle clients lose their connection, not everyone else's.

aiohttp's server bounds only keep-alive idleness. :class:`GuardedRunner` serves the app through
:class:`GuardedHandler` (aiohttp's ``RequestHandler`` plus a timestamp per read) and one
:class:`ConnectionGuard` per runner, whose sweeper (every ``min(timeouts) / 4`` seconds, at most
1 s) closes:

* a connection whose request head is not complete ``limits.header_timeout`` seconds after its
  first byte (a new connection: after it opened; a kept-alive one: after the first byte of its
  next request). One that sent part of a head gets ``408`` first; a silent one is just closed;
* a connection that sent part of a request body and then nothing for ``limits.body_timeout``
  seconds (not counted while the proxy itself stops reading: back-pressure). The request is
  abandoned: the handler is cancelled, no upstream call is left behind;
* an idle kept-alive connection after ``limits.idle_timeout`` seconds (aiohttp's keep-alive).

At most ``limits.max_connections`` client connections are open: one more closes the oldest
connection that has no request in progress (idle, or still sending its head), or, when every
connection is busy with a request, the new one. A request in progress is never cut for room.

A malformed request (not HTTP, a bad header line) gets one Anthropic-shaped ``400`` and one log
line (no traceback). Log lines about connections are limited per kind per second
(:class:`proxy.logs.formatting.RepeatLimiter`); what is held back is reported as one
"N similar ... suppressed" line.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from proxy.config.settings import Config
from proxy.core.errors import error_body, new_request_id
from proxy.logs.formatting import RepeatLimiter, escape
from proxy.server.http.metrics import Metrics

log = logging.getLogger("context_proxy.connections")

# File descriptors kept free beyond client and upstream connections (store, logs, tokenizer...).
FD_RESERVE = 64

_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (each connection is a descriptor: a soft
    limit of 1024 locked legitimate clients out behind ~1,000 idle ones). Returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files limit not raised (%s); it stays %d", exc, soft)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class GuardedHandler(RequestHandler):
    """aiohttp's protocol, plus when the current request head began and when bytes last came."""

    guard: ConnectionGuard
    opened_at: float
    head_since: float | None  # a request head is being received since (None: not waiting)
    head_bytes: bool  # part of that head has arrived
    last_data: float
    malformed = False  # the answer being sent is for a malformed request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        now = self._loop.time()
        self.opened_at = self.last_data = now
        self.head_since = now
        self.head_bytes = False
        super().connection_made(transport)
        self.guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.closed(self)
        super().connection_lost(exc)

    def log_access(
        self, request: BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        if self.malformed:  # already logged, as one rate-limited line
            self.malformed = False
            return
        super().log_access(request, response, time)

    def busy(self) -> bool:
        """A request is queued or being answered."""
        return bool(self._request_in_progress or self._messages)

    def data_received(self, data: bytes) -> None:
        now = self._loop.time()
        self.last_data = now
        if not self.busy():
            if self.head_since is None:
                self.head_since = now
            self.head_bytes = True
        super().data_received(data)
        if self._messages:
            self.head_since = None
            self.head_bytes = False

    def body_stalled(self, now: float, timeout: float) -> bool:
        request = self._current_request
        if request is None or request.content.is_eof():
            return False
        if self._reading_paused or self._buffer_paused:
            return False  # the proxy is not reading: back-pressure, not the client's silence
        return now - self.last_data > timeout

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse: one line in the log, an Anthropic-shaped 400."""
        if not 400 <= status < 500:
            return super().handle_error(request, status, exc, message)
        self.malformed = True
        what = type(exc).__name__ if exc is not None else "BadHttpMessage"
        detail = getattr(exc, "message", None) or message or ""
        self.guard.note(
            "bad_request",
            "[edge] malformed request from %s: %s: %s",
            escape(str(request.remote), 64),
            what,
            escape(str(detail), 200),
        )
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response")
        request_id = new_request_id()
        response = web.Response(
            status=status,
            body=error_body("invalid_request_error", f"malformed HTTP request ({what})", request_id),
            content_type="application/json",
            headers={"request-id": request_id, "x-should-retry": "false"},
        )
        response.force_close()
        return response


class ConnectionGuard:
    """The open connections of one server and the sweeper that enforces the limits."""

    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        limits = config.limits
        self.header_timeout = limits.header_timeout
        self.body_timeout = limits.body_timeout
        self.max_connections = limits.max_connections
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = soft - config.upstream.pool_size - FD_RESERVE
        if room < self.max_connections:
            log.warning(
                "limits.max_connections %d exceeds what the open files limit (%d) leaves for"
                " clients; at most %d client connections",
                self.max_connections, soft, max(room, 1),
            )
            self.max_connections = max(room, 1)
        self.interval = max(0.02, min(1.0, min(self.header_timeout, self.body_timeout) / 4))
        self.metrics = metrics
        self.connections: dict[GuardedHandler, None] = {}  # insertion order: oldest first
        self.limiter = RepeatLimiter()
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle ---

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = self._loop.create_task(self._sweep_forever())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    # --- bookkeeping ---

    def opened(self, handler: GuardedHandler) -> None:
        self.connections[handler] = None
        self._gauge()
        if len(self.connections) <= self.max_connections:
            return
        victim = next(
            (h for h in self.connections if h is not handler and not h.busy()), handler
        )
        self._close(victim, "limit", "[edge] connection limit (%d) reached: closed %s connection",
                    self.max_connections, "the new" if victim is handler else "a waiting")

    def closed(self, handler: GuardedHandler) -> None:
        self.connections.pop(handler, None)
        self._gauge()

    def note(self, kind: str, message: str, *args: Any) -> None:
        """Log one line of ``kind``, within the repeat limit."""
        loop = self._loop or asyncio.get_running_loop()
        if self.limiter.allow(kind, loop.time()):
            log.info(message, *args)
        if self.metrics is not None and kind == "bad_request":
            self.metrics.connections_closed.labels(kind).inc()

    # --- enforcement ---

    def sweep(self, now: float) -> None:
        for handler in list(self.connections):
            if handler.busy():
                if handler.body_stalled(now, self.body_timeout):
                    self._close(handler, "body_timeout",
                                "[edge] request body stalled for %ss: connection closed",
                                self.body_timeout)
            elif handler.head_since is not None and now - handler.head_since > self.header_timeout:
                if handler.head_bytes:
                    self._close(handler, "header_timeout",
                                "[edge] request head incomplete after %ss: 408, connection closed",
                                self.header_timeout, answer_408=True)
                else:
                    self._close(handler, "header_timeout",
                                "[edge] no request within %ss of connecting: connection closed",
                                self.header_timeout)
        for kind, count, seconds in self.limiter.take_suppressed(now):
            log.info("[edge] %d similar %s lines suppressed in the last %ss", count, kind, seconds)

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sweep(loop.time())
            except Exception:  # never let one odd connection stop the sweeper
                log.exception("[edge] connection sweep failed")

    def _close(
        self, handler: GuardedHandler, kind: str, message: str, *args: Any, answer_408: bool = False
    ) -> None:
        self.connections.pop(handler, None)
        transport = handler.transport
        if answer_408 and transport is not None and not transport.is_closing():
            body = error_body("invalid_request_error", "request head not received in time",
                              new_request_id())
            transport.write(_REQUEST_TIMEOUT % (len(body), body))
        handler.force_close()
        if self.metrics is not None:
            self.metrics.connections_closed.labels(kind).inc()
        self._gauge()
        loop = self._loop or asyncio.get_running_loop()
        if self.limiter.allow(kind, loop.time()):
            log.info(message, *args)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.open_connections.set(len(self.connections))


class GuardedServer(Server):
    """aiohttp's ``Server`` making :class:`GuardedHandler` protocols bound to one guard."""

    guard: ConnectionGuard

    def __call__(self) -> RequestHandler:
        handler = GuardedHandler(self, loop=self._loop, **self._kwargs)
        handler.guard = self.guard
        return handler


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` whose server is a :class:`GuardedServer` (same settings otherwise)."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.guard = guard

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        guarded = GuardedServer.__new__(GuardedServer)
        guarded.__dict__.update(vars(server))
        guarded.guard = self.guard
        self.guard.start()
        return guarded

    async def _cleanup_server(self) -> None:
        await self.guard.stop()
        await super()._cleanup_server()
