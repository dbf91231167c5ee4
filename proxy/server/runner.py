"""Run the app: listen, and on SIGTERM/SIGINT drain (stop accepting, finish in-flight, exit)."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from proxy.config import Config
from proxy.server.app import build_app
from proxy.server.appkeys import FORWARDER, STATE

log = logging.getLogger("context_proxy.runner")


def make_runner(
    app: web.Application, config: Config, *, access_log: bool = True, shutdown_timeout: float = 2.0
) -> web.AppRunner:
    """The runner settings every deployment (and every test) uses."""
    return web.AppRunner(
        app,
        handler_cancellation=True,  # a client that disconnects cancels its upstream request
        shutdown_timeout=shutdown_timeout,
        # Request bodies stay as sent: passthrough is byte for byte, and the messages routes
        # decode gzip/deflate themselves only to inspect.
        auto_decompress=False,
        access_log=logging.getLogger("context_proxy.access") if access_log else None,
    )


async def serve(config: Config, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or a SIGTERM/SIGINT arrives, then drain and return."""
    app = build_app(config)
    runner = make_runner(app, config)
    await runner.setup()
    site = web.TCPSite(
        runner, config.listen.host, config.listen.port, backlog=4096, reuse_address=True
    )
    await site.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for host, port, *_ in (a for a in runner.addresses if isinstance(a, tuple)):
        log.info("listening on http://%s:%d upstream=%s", host, port, config.upstream.base_url)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await drain(app, runner, config.shutdown.grace_seconds)
        await runner.cleanup()
        log.info("stopped")


async def drain(app: web.Application, runner: web.AppRunner, grace: float) -> None:
    """Stop accepting, let in-flight requests finish within ``grace`` seconds, then end the rest.

    Streams still running at the deadline get an SSE ``overloaded_error`` event (never a
    fabricated ``message_stop``) before their connection closes.
    """
    state = app[STATE]
    state.draining = True  # keep-alive connections now get 529 for new requests
    for site in list(runner.sites):
        await site.stop()
    log.info("draining: stopped accepting; %d in flight; grace %ss", state.inflight, grace)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while state.inflight and loop.time() < deadline:  # noqa: ASYNC110 - a bounded 50 ms poll
        await asyncio.sleep(0.05)
    relays = set(app[FORWARDER].active)
    if relays:
        log.warning("grace period over: ending %d stream(s)", len(relays))
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
