"""The response that writes an Anthropic answer in the client's format.

``EncodedResponse`` is what the relay and the retrieval loop get from ``client_response`` for a
Bedrock request: everything written to it goes through the pure ``bedrock.AnswerEncoder`` (SSE
events → event-stream frames, an error body → Bedrock's). The proxy's own errors on a format's
routes are rendered by ``render_bedrock_error`` / ``render_vertex_error`` (the error middleware
asks ``ERROR_FORMATS``).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from proxy.core.errors import error_body
from proxy.formats import bedrock

_AWS_REQUEST_ID = "x-amzn-RequestId"


class EncodedResponse(web.StreamResponse):
    """A response whose body is written through a Bedrock ``AnswerEncoder``."""

    def __init__(
        self, encoder: bedrock.AnswerEncoder, status: int, reason: str | None,
        headers: CIMultiDict[str],
    ) -> None:
        headers.update(encoder.start(status, headers.get("Content-Type", "")))
        request_id = headers.get("request-id")
        if request_id is not None:
            headers[_AWS_REQUEST_ID] = request_id
        changed = encoder.status != status
        super().__init__(status=encoder.status, reason=None if changed else reason, headers=headers)
        self._encoder = encoder
        # as the relay's plain answers: the headers leave with the first body bytes, but a
        # stream's at once
        self._send_headers_immediately = encoder.streaming

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._encoder.rewrites and not self.prepared:
            self.headers.popall("Content-Length", None)
        return await super().prepare(request)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        out = self._encoder.feed(bytes(data))
        if out:
            await super().write(out)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        out = self._encoder.feed(data) if data else b""
        await super().write_eof(out + self._encoder.end())


class BedrockAnswer:
    """The ``AnswerFormat`` of a Bedrock request (``relay.answer``); ``counting``: CountTokens."""

    __slots__ = ("counting",)

    def __init__(self, *, counting: bool = False) -> None:
        self.counting = counting

    def response(
        self, status: int, reason: str | None, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        encoder = bedrock.AnswerEncoder(counting=self.counting)
        return EncodedResponse(encoder, status, reason, headers)


def render_bedrock_error(
    status: int, error_type: str, message: str, request_id: str, headers: dict[str, str]
) -> web.Response:
    """A proxy error on a Bedrock route: Bedrock's shape, the proxy's wording."""
    out = {**headers, **bedrock.error_headers(status), _AWS_REQUEST_ID: request_id}
    out.pop("Content-Type", None)
    return web.Response(
        status=bedrock.error_status(status),
        body=bedrock.error_body(message),
        content_type="application/json",
        headers=out,
    )


def render_vertex_error(
    status: int, error_type: str, message: str, request_id: str, headers: dict[str, str]
) -> web.Response:
    """A proxy error on a Vertex route: the Anthropic error body, as Vertex relays it."""
    return web.Response(
        status=status,
        body=error_body(error_type, message, request_id),
        content_type="application/json",
        headers=headers,
    )
