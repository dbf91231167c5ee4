"""OpenTelemetry traces (``tracing:``): the provider, the OTLP/HTTP exporter, the server span.

Imported by ``build_app`` only when ``tracing.enabled``: with tracing off, neither this module nor
OpenTelemetry is loaded, and the edge's span calls (``proxy.server.http.spans``) are no-ops.

One server span per ``/v1/*`` request (``POST /v1/messages``), continuing the W3C
``traceparent`` the client sent (the provider is parent-based always-on: a parent that was not
sampled is not recorded either). The edge's modules open its children through ``spans``. The
provider is the app's own (never the process-global one: tests run many apps in one process), so
is its exporter: every value comes from ``Config.tracing`` (``proxy.config.settings`` read the
``OTEL_*`` variables); nothing here reads the environment. Spans leave through
:class:`~proxy.server.http.span_export.BoundedExport`: a full queue or a failing collector drops
spans, counted in ``/metrics``, never waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from urllib.parse import urlsplit

from aiohttp import web
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.config.tracing import TracingConfig
from proxy.config.tracing_env import parse_pairs
from proxy.server.appkeys import CONFIG, METRICS, REQUEST_TENANT
from proxy.server.http import spans
from proxy.server.http.metrics import Metrics
from proxy.server.http.span_export import BoundedExport

log = logging.getLogger("context_proxy.tracing")

# an attribute's longest value (the prompt, with tracing.capture_content)
MAX_ATTRIBUTE_CHARS = 65536
# at shutdown, what waits is sent for at most this long (and the exporter's deadline)
SHUTDOWN_GRACE = 5.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}
_PROPAGATOR = TraceContextTextMapPropagator()
# The request's tenant, session and agent (``spans.identify``), copied onto each span it opens.
_IDENTITY: ContextVar[dict[str, str] | None] = ContextVar("context_proxy_span_identity", default=None)


class _Handle:
    """An SDK span behind ``spans.Span``."""

    __slots__ = ("_span", "recording")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self.recording = span.is_recording()

    def set(self, key: str, value: spans.AttributeValue | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def set_many(self, attributes: spans.Attributes) -> None:
        self._span.set_attributes(attributes)

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))

    def end(self, at: float | None = None) -> None:
        if at is None:
            self._span.end()
        else:  # a perf_counter reading, as the wall clock's nanoseconds
            self._span.end(time.time_ns() - int((time.perf_counter() - at) * 1e9))


class _Identify(SpanProcessor):
    """Copies the request's identity onto every span it starts."""

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        identity = _IDENTITY.get()
        if identity:
            span.set_attributes(identity)


class Tracing:
    """The app's tracer provider and exporter; ``spans.Tracer`` for the request path."""

    def __init__(self, config: TracingConfig, metrics: Metrics) -> None:
        self.capture_content = config.capture_content
        resource = {"service.name": config.service_name}
        resource.update(parse_pairs(config.resource_attributes) or {})
        # the exporter's per-batch error lines: ours is one line per outage (span_export)
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
        exporter = OTLPSpanExporter(
            endpoint=config.endpoint,
            headers=parse_pairs(config.headers) or {},
            timeout=config.export_timeout,
            compression=Compression.Gzip if config.compression == "gzip" else Compression.NoCompression,
        )
        counter = metrics.trace_spans
        self.export = BoundedExport(
            exporter,
            queue_size=config.queue_size,
            batch_size=config.batch_size,
            flush_seconds=config.flush_seconds,
            grace=min(config.export_timeout, SHUTDOWN_GRACE),
            count=lambda outcome, n: counter.labels(outcome).inc(n),
        )
        # every limit given (none read from the environment): the SDK's counts, and content
        # (tracing.capture_content) cut at MAX_ATTRIBUTE_CHARS
        limits = SpanLimits(
            max_attributes=128, max_events=128, max_links=128, max_span_attributes=128,
            max_event_attributes=128, max_link_attributes=128,
            max_attribute_length=MAX_ATTRIBUTE_CHARS, max_span_attribute_length=MAX_ATTRIBUTE_CHARS,
        )
        self.provider = TracerProvider(
            resource=Resource(resource), sampler=ParentBased(ALWAYS_ON), shutdown_on_exit=False,
            span_limits=limits,
        )
        self.provider.add_span_processor(_Identify())
        self.provider.add_span_processor(self.export)
        self.tracer = self.provider.get_tracer("context-proxy")

    # -- spans.Tracer ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def current(
        self, name: str, kind: spans.Kind, attributes: spans.Attributes | None
    ) -> Iterator[spans.Span]:
        with self.tracer.start_as_current_span(
            name, kind=_KINDS[kind], attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            handle = _Handle(span)
            try:
                yield handle
            except BaseException as exc:  # its type only: an error's text may quote input
                handle.fail(type(exc).__name__)
                raise

    def start(self, name: str, kind: spans.Kind, attributes: spans.Attributes | None) -> spans.Span:
        return _Handle(self.tracer.start_span(name, kind=_KINDS[kind], attributes=attributes))

    def identify(self, tenant: str, session: str | None, agent: str | None) -> None:
        identity = {spans.TENANT: tenant}
        if session:
            identity[spans.SESSION] = session
        if agent:
            identity[spans.AGENT] = agent
        _IDENTITY.set(identity)
        trace.get_current_span().set_attributes(identity)

    def session(self) -> str | None:
        identity = _IDENTITY.get()
        return identity.get(spans.SESSION) if identity else None

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Send what waits (bounded by the export deadline), in a thread: the loop goes on."""
        await asyncio.to_thread(self.provider.shutdown)


TRACING = web.AppKey("tracing", Tracing)


def _route(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else request.path


# the API's paths: the Anthropic routes and the client formats' (``proxy.server.formats.routes``'s
# FORMAT_PATHS; tests/formats/test_formats_across.py checks the two agree)
TRACED_PATHS = ("/v1/", "/model/", "/projects/", "/anthropic/")


@web.middleware
async def tracing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The server span of an API request (``/v1/*``, and the Bedrock, Vertex and Foundry routes); the
    request's context gets the tracer."""
    if not request.path.startswith(TRACED_PATHS):
        return await handler(request)
    tracing = request.app[TRACING]
    route = _route(request)
    attributes: dict[str, spans.AttributeValue] = {
        "http.request.method": request.method,
        "http.route": route,
        "url.path": request.path,
    }
    token = spans.activate(tracing)
    identity = _IDENTITY.set(None)
    try:
        with tracing.tracer.start_as_current_span(
            f"{request.method} {route}",
            context=_PROPAGATOR.extract(request.headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await handler(request)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR))
                raise
            tenant = request.get(REQUEST_TENANT)
            if tenant is not None:
                span.set_attribute(spans.TENANT, tenant.name)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_attribute("error.type", str(response.status))
                span.set_status(Status(StatusCode.ERROR))
            return response
    finally:
        _IDENTITY.reset(identity)
        spans.deactivate(token)


async def tracing_ctx(app: web.Application) -> AsyncIterator[None]:
    """The provider lives with the app (``cleanup_ctx``); its queue is sent, bounded by the
    export deadline, when the app stops. ``tracing_middleware`` goes first in the app's list
    (outside the error middleware: the server span sees the status the client gets)."""
    config = app[CONFIG].tracing
    app[TRACING] = Tracing(config, app[METRICS])
    where = urlsplit(config.endpoint)  # never its user-info
    log.info("[tracing] spans exported to %s://%s%s (OTLP/HTTP)", where.scheme, where.netloc.rpartition("@")[2], where.path)
    try:
        yield
    finally:
        await app[TRACING].close()
