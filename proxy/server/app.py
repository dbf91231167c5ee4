"""The aiohttp application: routes, typed app keys, one ClientSession, the error middleware.

``build_app`` assembles it: the middlewares (errors, the listener split when ``listen.admin_port``
is set, admission, auth), the lifecycle
(``cleanup_ctx``), the small handlers (``HEAD /``, ``/healthz``, ``/readyz``, ``/metrics``, the
``/v1/*`` passthrough). The messages handler is ``proxy.server.messages``; the admin API
``proxy.server.admin``. Handlers stay thin: they load what the core needs, call it, then do the
I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config.models import catalogue_of
from proxy.config.schema import ConfigError
from proxy.config.settings import Config
from proxy.console.routes import add_console_routes
from proxy.core.errors import (
    AuthenticationFailed,
    NotFound,
    Overloaded,
    ProxyError,
    error_body,
    new_request_id,
)
from proxy.core.pointers import PARSES
from proxy.core.reparse import BodyMemo
from proxy.server.admin.routes import add_admin_routes
from proxy.server.appkeys import (
    CATALOGUE,
    COMPACTION,
    CONFIG,
    DURABLE,
    FORWARDER,
    METRICS,
    PLATFORMS,
    REQUEST_TENANT,
    RESOLVER,
    SOURCE_CHECKS,
    STATE,
    STORE,
    TENANCY,
    THINKING,
    ProxyState,
    TenancyHolder,
)
from proxy.server.compaction.service import CompactionService
from proxy.server.compaction.thinking import ThinkingGuard
from proxy.server.context.durable import DurableContext
from proxy.server.exchange.chain import CHAIN, messages_chain
from proxy.server.exchange.stages.validate import BODIES
from proxy.server.formats.routes import FORMAT_PATHS, add_format_routes
from proxy.server.http.listeners import LISTENERS, Listeners, listener_middleware
from proxy.server.http.metrics import CONTENT_TYPE, new_metrics
from proxy.server.http.readiness import StoreReadiness
from proxy.server.ledger import LEDGER, LedgerRecorder
from proxy.server.maintenance.idle_caches import forget_when_idle
from proxy.server.maintenance.retention import retention_ctx
from proxy.server.messages import handle_messages, route_of, upstream_headers
from proxy.server.quota import QUOTA, QUOTA_TICKET, QuotaKeeper
from proxy.server.relay.answer import ERROR_FORMATS, ErrorRenderer
from proxy.server.relay.forward import Forwarder
from proxy.server.upstream.platforms import CURRENT, Platforms, UpstreamPlatform
from proxy.sources.resolver import ResolverLimits, SourceResolver
from proxy.store import open_store
from proxy.store.usage import KEY_CHECKS
from proxy.tenancy.policies import load_tenancy

log = logging.getLogger("context_proxy.app")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# the paths admission and authentication apply to: the Anthropic API's and the client formats'
API_PATHS = ("/v1/", *FORMAT_PATHS)
# the status a request whose client left during its answer is counted under (metrics, access log)
CLIENT_GONE = 499
ReadinessCheck = Callable[[], Awaitable[bool]]


def _error_response(exc: ProxyError, render: ErrorRenderer | None = None) -> web.Response:
    request_id = new_request_id()
    headers = {"request-id": request_id, "x-should-retry": "true" if exc.status >= 500 else "false"}
    headers.update(exc.headers)
    if render is not None:  # a client format's route: its own error shape
        return render(exc.status, exc.error_type, exc.message, request_id, headers)
    return web.Response(
        status=exc.status,
        body=error_body(exc.error_type, exc.message, request_id),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Renders every ProxyError the Anthropic way; counts every answer by route and status."""
    metrics = request.app[METRICS]
    route = route_of(request)
    try:
        response = await handler(request)
    except ProxyError as exc:
        log.info("[error] %s %s -> %d %s", request.method, route, exc.status, exc.error_type)
        ticket = request.get(QUOTA_TICKET)
        if ticket is not None:  # an admitted request's errors carry its allowance too
            exc.headers = {**ticket.headers, **exc.headers}
        response = _error_response(exc, request.app[ERROR_FORMATS].get(route))
    except web.HTTPException as exc:
        if exc.status == 404:
            response = _error_response(NotFound(f"{request.method} {request.path}: not found"))
        elif exc.status == 405:
            response = _error_response(NotFound(f"{request.method} {request.path}: method not allowed"))
        else:
            raise
    except ConnectionResetError as exc:
        if _client_gone(request):
            # The client left while its answer was written (the write found the connection
            # closing before aiohttp cancelled the handler): as a cancellation, nothing to answer
            # and no bug. 499, as nginx counts a client that closed its request; nothing is sent.
            log.info("[error] %s %s: the client went away during the answer", request.method, route)
            response = web.Response(status=CLIENT_GONE)
        else:
            response = _unexpected(request, route, exc)
    except Exception as exc:
        response = _unexpected(request, route, exc)
    finally:
        ticket = request.get(QUOTA_TICKET)
        if ticket is not None:  # a request that never reached the provider: its reservation back
            ticket.finish()
    metrics.child(metrics.requests, route, str(response.status)).inc()
    return response


def _unexpected(request: web.Request, route: str, exc: Exception) -> web.Response:
    """A bug: still an Anthropic-shaped 500 (never aiohttp's page), its traceback logged."""
    log.error(
        "[error] %s %s -> 500 unexpected %s", request.method, route, type(exc).__name__,
        exc_info=exc,
    )
    return _error_response(
        ProxyError("internal error in the proxy"), request.app[ERROR_FORMATS].get(route)
    )


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@web.middleware
async def admission_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuses new API work while draining or at the concurrency limit (529 + retry-after)."""
    if not request.path.startswith(API_PATHS):
        return await handler(request)
    state = request.app[STATE]
    if state.draining:
        raise Overloaded("the proxy is shutting down; retry on another instance", retry_after_seconds=1)
    if state.inflight >= request.app[CONFIG].limits.max_concurrent_requests:
        raise Overloaded("the proxy is at its concurrency limit", retry_after_seconds=1)
    state.inflight += 1
    try:
        return await handler(request)
    finally:
        state.inflight -= 1


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every API request (``/v1/*``, and the client formats' paths) belongs to a tenant: its
    proxy-issued key (``auth.mode: keys``) or the single default tenant (``passthrough``). An
    unknown key is 401, nothing forwarded."""
    if request.path.startswith(API_PATHS):
        tenant = request.app[TENANCY].current.authenticate(request.headers)
        if tenant is None:
            raise AuthenticationFailed("invalid x-api-key")
        request[REQUEST_TENANT] = tenant
        # where its requests (and the summaries made for them) go: None, the Anthropic API
        CURRENT.set(_platform_of(request))
    return await handler(request)


def _platform_of(request: web.Request) -> UpstreamPlatform | None:
    """The request's tenant's Bedrock, Vertex or Foundry upstream; ``None`` for the Anthropic API."""
    tenant = request.get(REQUEST_TENANT)
    if tenant is None or tenant.upstream.format == "anthropic":
        return None
    return request.app[PLATFORMS].get(tenant.upstream)


# --- handlers --------------------------------------------------------------------------------


async def handle_passthrough(request: web.Request) -> web.StreamResponse:
    """Every other /v1/* path and method: byte for byte, no decoding, body streamed."""
    forwarder = request.app[FORWARDER]
    data = _body_chunks(request) if request.body_exists else None
    headers = upstream_headers(request, messages_route=False)
    upstream = await forwarder.open(
        request, route="passthrough", data=data, decode=False, headers=headers
    )
    async with upstream:
        response, _outcome = await forwarder.relay(
            request, upstream, decoded=False, route="passthrough"
        )
    return response


async def _body_chunks(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_any():
        yield chunk


async def handle_head_root(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def handle_healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def handle_readyz(request: web.Request) -> web.StreamResponse:
    app = request.app
    state = app[STATE]
    problems: list[str] = []
    if state.draining:
        problems.append("draining")
    if app[FORWARDER].session.closed:
        problems.append("upstream session closed")
    for check in state.readiness_checks:
        if not await check():
            problems.append(getattr(check, "__name__", "check"))
    if problems:
        return web.json_response({"status": "not ready", "problems": problems}, status=503)
    return web.json_response({"status": "ready"})


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    response = web.Response(body=request.app[METRICS].render())
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


# --- assembly --------------------------------------------------------------------------------


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    """Exactly one pooled ClientSession per app, with keep-alive to the upstream."""
    config = app[CONFIG]
    connector = aiohttp.TCPConnector(
        limit=config.upstream.pool_size, limit_per_host=config.upstream.pool_size,
        keepalive_timeout=30, enable_cleanup_closed=True,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        # Forward the client's headers as sent: add none of aiohttp's defaults.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None),
        trust_env=False,
    )
    forwarder = Forwarder(
        session,
        config.upstream.base_url,
        config.upstream.connect_timeout,
        config.upstream.read_timeout,
        app[METRICS],
        draining=lambda: app[STATE].draining,
    )
    app[FORWARDER] = forwarder
    app[PLATFORMS] = Platforms(session, forwarder.timeout, app[CATALOGUE], app[METRICS])
    app[COMPACTION] = CompactionService(
        config.compaction, config.upstream.base_url, app[METRICS], app[CATALOGUE],
        limits=config.limits,
    )
    await app[COMPACTION].warm_up()
    store = await open_store(config.store_url)
    store.states.cache.resize(config.limits.durable_states)
    app[STORE] = store
    app[COMPACTION].store = store
    app[RESOLVER] = SourceResolver(ResolverLimits(cache_entries=config.limits.source_checks))
    app[DURABLE] = DurableContext(
        store, app[RESOLVER], export_files=config.limits.transcript_exports
    )
    app[METRICS].watch(
        *app[COMPACTION].caches(), *app[DURABLE].caches(), store.states.cache, PARSES, KEY_CHECKS
    )
    app[SOURCE_CHECKS] = app[DURABLE].checks
    app[STATE].readiness_checks.append(StoreReadiness(store))  # the store as requests see it
    app[LEDGER] = LedgerRecorder(store, app[METRICS], config, app[CATALOGUE])
    app[LEDGER].start()
    app[QUOTA] = QuotaKeeper(store, app[LEDGER].prices, app[METRICS])
    app[CHAIN] = messages_chain(app)  # the request path, once its services are all there
    try:
        yield
    finally:
        await app[DURABLE].drain()
        await app[DURABLE].checks.close()
        await app[LEDGER].close()
        await app[QUOTA].close()
        await store.close()
        await app[COMPACTION].close()
        await app[PLATFORMS].close()
        await session.close()


async def _forget_idle(app: web.Application) -> AsyncIterator[None]:
    """Forget what is kept per conversation once it has gone idle (``limits.cache_idle_seconds``):
    started after the store opened, stopped before it closes."""
    task = asyncio.get_running_loop().create_task(forget_when_idle(
        (
            app[BODIES].forget_idle,
            app[COMPACTION].plans.forget_idle,
            app[STORE].forget_idle_states,
            app[DURABLE].forget_idle,
        ),
        app[CONFIG].limits.cache_idle_seconds,
        app[STATE],
    ))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].draining = True


def build_app(config: Config) -> web.Application:
    # Bodies are read by the handlers with their own bound; this only guards request.read().
    middlewares: list[Any] = [error_middleware, admission_middleware, auth_middleware]
    if config.listen.admin_port is not None:  # each route on its own listener
        middlewares.insert(1, listener_middleware)
    if config.tracing.enabled:  # OpenTelemetry is imported only then
        try:
            from proxy.server.http.tracing import tracing_ctx, tracing_middleware
        except ImportError as exc:
            raise ConfigError("<config>", [
                "key 'tracing.enabled': traces need the tracing extra (pip install"
                f" 'context-proxy[tracing]'); {exc.name or 'OpenTelemetry'} is not installed"
            ]) from None
        middlewares.insert(0, tracing_middleware)
    app = web.Application(middlewares=middlewares, client_max_size=config.limits.max_body_bytes)
    app[CONFIG] = config
    app[TENANCY] = TenancyHolder(load_tenancy(config))  # invalid policies: PolicyError, no start
    app[BODIES] = BodyMemo(config.limits.body_memo_bytes)
    app[CATALOGUE] = catalogue_of(config)
    app[THINKING] = ThinkingGuard(app[CATALOGUE], max_records=config.limits.thinking_records)
    app[METRICS] = new_metrics()
    app[METRICS].watch(app[BODIES].entries, app[THINKING].records.cache)
    app[STATE] = ProxyState()
    app[ERROR_FORMATS] = {}
    app[LISTENERS] = Listeners()
    if config.tracing.enabled:
        app.cleanup_ctx.append(tracing_ctx)  # first in, last out: after every request's spans
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(retention_ctx)  # after the store opens, stopped before it closes
    app.cleanup_ctx.append(_forget_idle)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_route("HEAD", "/", handle_head_root, name="root")
    app.router.add_get("/healthz", handle_healthz, name="healthz", allow_head=True)
    app.router.add_get("/readyz", handle_readyz, name="readyz", allow_head=True)
    app.router.add_get("/metrics", handle_metrics, name="metrics")
    app.router.add_post("/v1/messages", handle_messages, name="messages")
    app.router.add_post("/v1/messages/count_tokens", handle_messages, name="count_tokens")
    # Bedrock, Vertex and Foundry clients (before the passthrough), by the platforms' own model table
    add_format_routes(app, app[CATALOGUE])
    app.router.add_route("*", "/v1/{tail:.*}", handle_passthrough, name="passthrough")
    add_admin_routes(app)
    add_console_routes(app)
    return app
