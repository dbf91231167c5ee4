"""Run the app: listen, and on SIGTERM/SIGINT drain (stop accepting, finish in-flight, exit)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import TextIO
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from proxy.config.schema import ConfigError
from proxy.config.settings import Config
from proxy.console.auth import CONSOLE_FIRST_SIGNIN
from proxy.console.first_signin import (
    announcement,
    hint,
    signin_link,
    tenant_without_admin_token,
)
from proxy.logs.formatting import escape
from proxy.server.app import build_app
from proxy.server.appkeys import CONFIG, FORWARDER, METRICS, STATE, TENANCY
from proxy.server.http.connections import ConnectionGuard, GuardedRunner, raise_open_files_limit
from proxy.server.http.listeners import Listeners, start_sites
from proxy.server.maintenance.idle_trim import release_when_idle
from proxy.tenancy.policies import load_tenancy
from proxy.tenancy.tenants import Tenancy

log = logging.getLogger("context_proxy.runner")


class AccessLogger(AbstractAccessLogger):
    """One short line per answer: method, path (no query string, no headers), status, bytes,
    milliseconds. Cheaper than aiohttp's format-string logger, and it logs nothing a client
    sent beyond the method and path, both escaped (a decoded path may hold CR, LF or ESC: it
    must not forge a line or drive a terminal)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %d %d %.1fms",
            escape(request.method, 32),
            escape(request.path, 1000),
            response.status,
            response.body_length,
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def make_runner(
    app: web.Application, config: Config, *, access_log: bool = True, shutdown_timeout: float = 2.0
) -> web.AppRunner:
    """The runner settings every deployment (and every test) uses."""
    return GuardedRunner(
        app,
        ConnectionGuard(config, app[METRICS]),
        keepalive_timeout=config.limits.idle_timeout,
        handler_cancellation=True,  # a client that disconnects cancels its upstream request
        shutdown_timeout=shutdown_timeout,
        # Request bodies stay as sent: passthrough is byte for byte, and the messages routes
        # decode gzip/deflate themselves only to inspect.
        auto_decompress=False,
        access_log=logging.getLogger("context_proxy.access") if access_log else None,
        access_log_class=AccessLogger,
    )


Announce = Callable[[web.Application, Listeners], None]


async def serve(
    config: Config,
    stop: asyncio.Event | None = None,
    terminal: TextIO | None = None,
    announce: Announce | None = None,
) -> None:
    """Serve until ``stop`` is set or a SIGTERM/SIGINT arrives, then drain and return.
    ``terminal``: where the one-time console link may be printed (stderr when it is a terminal;
    never the log stream). ``announce``: called once listening (``serve --demo`` prints what
    to do next), instead of the one-time link."""
    soft, hard = raise_open_files_limit()
    log.info("open files limit: %d (hard %d)", soft, hard)
    app = build_app(config)
    runner = make_runner(app, config)
    await runner.setup()
    listeners = await start_sites(runner, config, app)
    loop = asyncio.get_running_loop()
    start_worker_threads(loop)
    tune_interpreter()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, schedule_reload, app, config)
    for line in startup_lines(config, app[TENANCY].current, listeners):
        log.info("%s", line)
    if announce is not None:
        announce(app, listeners)
    else:
        announce_console(app, listeners.admin or listeners.client, terminal)
    # memory back to the system when the proxy goes idle after a burst (a 1 s poll)
    releasing = loop.create_task(release_when_idle(app[STATE]))
    try:
        await stop.wait()
    finally:
        releasing.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await drain(app, runner, config.shutdown.grace_seconds)
        await runner.cleanup()
        log.info("stopped")


def store_text(url: str) -> str:
    """The store as a log line may name it: SQLite's file, PostgreSQL's host, port and database
    (never its user, password or settings)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return f"SQLite {os.path.abspath(url[len('sqlite:///'):])}"
    try:
        port = parts.port
    except ValueError:
        port = None
    where = f"{parts.hostname or 'localhost'}{f':{port}' if port else ''}{parts.path}"
    return f"PostgreSQL {where}"


def startup_lines(config: Config, tenancy: Tenancy, listeners: Listeners) -> list[str]:
    """What a start logs: how clients authenticate, the tenants, the store, each listener."""
    names = ", ".join(t.name for t in tenancy.tenants[:10])
    more = f" and {len(tenancy.tenants) - 10} more" if len(tenancy.tenants) > 10 else ""
    count = len(tenancy.tenants)
    lines = [
        f"auth.mode {tenancy.mode}, {count} tenant{'' if count == 1 else 's'} ({names}{more});"
        f" store {store_text(config.store_url)}"
    ]
    routes = "the API" if listeners.admin else "the API, /admin, /console and /metrics"
    for host, port in listeners.client:
        lines.append(
            f"listening on http://{host}:{port} upstream={config.upstream.base_url} ({routes})"
        )
    for host, port in listeners.admin:
        lines.append(
            f"admin listener on http://{host}:{port}: /admin, /console and /metrics"
            " (the client port answers 404 for them)"
        )
    return lines


def announce_console(
    app: web.Application, addresses: list[tuple[str, int]], terminal: TextIO | None
) -> None:
    """No admin token for the passthrough tenant: a one-time console sign-in link on the
    terminal (``proxy.console.first_signin``), or, without one, a log line saying how to set a
    token. ``auth.mode: keys``: the environment's admin token does not apply, said once."""
    tenancy = app[TENANCY].current
    if tenancy.mode == "keys" and app[CONFIG].admin_token_hashes:
        log.warning(
            "CONTEXT_PROXY_ADMIN_TOKEN(_SHA256) ignored: with auth.mode keys, each tenant's"
            " admin tokens are in its policy (admin_tokens_sha256)"
        )
    tenant = tenant_without_admin_token(tenancy)
    if tenant is None:
        return
    first = app.get(CONSOLE_FIRST_SIGNIN)
    if first is None or terminal is None or not addresses:
        log.info("%s", hint(tenant.name, console=first is not None))
        return
    host, port = addresses[0]
    link = signin_link(host, port, first.issue(tenant.name))
    print(announcement(tenant.name, link), file=terminal, flush=True)
    log.info("a one-time console sign-in link for tenant %s was printed on the terminal", tenant.name)


def worker_count() -> int:
    """The worker threads of ``asyncio.to_thread`` (Python's own default: CPUs + 4, at most 32)."""
    return min(32, (os.cpu_count() or 1) + 4)


def start_worker_threads(loop: asyncio.AbstractEventLoop, workers: int | None = None) -> ThreadPoolExecutor:
    """The loop's default executor (``asyncio.to_thread``: compaction of large requests, hashing,
    transcript exports, policy reloads) with all its threads started now, at start-up.

    Python starts them one at a time, when a call finds none idle: under a steady load the last
    ones came minutes in (the soak: 9 threads, then 11 at minute 16), each bringing its stack's
    pages and the allocator's per-thread cache and arena with it, a step in RSS long after the
    start, and a moment's thread creation on a request's path. Started together here, the count
    of threads is flat from the first request on (their memory is part of "at rest")."""
    count = workers or worker_count()
    executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="proxy-worker")
    # each call waits until all have started: no thread is idle when the next is submitted, so
    # every submission starts a new one
    barrier = threading.Barrier(count)
    wait_all([executor.submit(barrier.wait, 10.0) for _ in range(count)])
    loop.set_default_executor(executor)
    return executor


def tune_interpreter() -> None:
    """Keep the event loop responsive (measured in bench/COMPACTION.md):

    * ``gc.freeze()`` after start-up moves the ~180k objects of the loaded program out of the
      collector's reach: a full collection then takes ~0 ms instead of 170-330 ms, which used to
      stall every stream at once;
    * a 1 ms GIL switch interval (default 5 ms) bounds how long a worker thread that compacts a
      large request can hold the loop back;
    * a young generation of 20,000 allocations (default 700): parsing a large body allocates
      thousands of containers, and with the default every parse ran dozens of young collections
      that promoted the request's short-lived objects to the old generations, whose collections
      then walked them again (measured in process, a cold ~310 KB request: collector time
      0.33 -> 0.09 ms a request). Objects in cycles wait a little longer to be freed; no more.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    sys.setswitchinterval(0.001)


_RELOADS: set[asyncio.Task[None]] = set()


def schedule_reload(app: web.Application, config: Config) -> None:
    """SIGHUP: :func:`reload_policies` in a worker thread (reading and validating files never
    stalls the loop, whatever is in them)."""
    task = asyncio.get_running_loop().create_task(asyncio.to_thread(reload_policies, app, config))
    _RELOADS.add(task)
    task.add_done_callback(_RELOADS.discard)


def reload_policies(app: web.Application, config: Config) -> None:
    """Validate the tenant policies again and swap them in at once; requests in flight keep the
    tenant they started with. An invalid set is reported and the previous one kept."""
    try:
        tenancy = load_tenancy(config)
    except ConfigError as exc:
        log.error(
            "policies not reloaded, the previous ones stay in force (%d problem(s)):",
            len(exc.errors),
        )
        for line in str(exc).splitlines():  # one record per problem (at most 50, then a count)
            log.error("  %s", line)
        return
    app[TENANCY].current = tenancy
    log.info("policies reloaded: auth.mode %s, %d tenant(s)", tenancy.mode, len(tenancy.tenants))


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
