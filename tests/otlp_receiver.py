"""A real OTLP/HTTP trace receiver for the tests: aiohttp on 127.0.0.1:0, ``POST /v1/traces``.

Each export's protobuf body is decoded with ``opentelemetry-proto`` (the collector's own
message types) into :class:`ReceivedSpan` values; the raw bodies are kept too, so a test can
search every byte that left the proxy. ``hang()`` makes it accept exports and never answer (a
stuck collector); ``fail(status)`` answers every export with that status.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from tests.harness import serve_local

KINDS = {
    SpanProto.SPAN_KIND_INTERNAL: "internal",
    SpanProto.SPAN_KIND_SERVER: "server",
    SpanProto.SPAN_KIND_CLIENT: "client",
}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, which) if which else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.pending = 0  # exports received and not answered (hanging)
        self._hang: asyncio.Event | None = None
        self._status = 200
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", self._handle)
        self._runner, self.url = await serve_local(app)
        return self.url

    async def stop(self) -> None:
        if self._hang is not None:
            self._hang.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def hang(self) -> None:
        self._hang = asyncio.Event()

    def release(self) -> None:
        """A hung receiver answers again (call on its loop)."""
        if self._hang is not None:
            self._hang.set()
            self._hang = None

    def fail(self, status: int) -> None:
        self._status = status

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.headers.append(dict(request.headers))
        hang = self._hang
        if hang is not None:
            self.pending += 1
            await hang.wait()
            self.pending -= 1
        if self._status != 200:
            return web.Response(status=self._status)
        self.bodies.append(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status_code=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            resource=resource,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    # -- reading ------------------------------------------------------------------------------

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> ReceivedSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [s.name for s in self.spans])
        return found[0]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return sorted(
            (s for s in self.spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns
        )
