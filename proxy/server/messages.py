"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the proxy's main handler.

It reads the body (bounded, decoded for inspection), makes the request's ``Exchange`` and runs
it through the chain of stages (``proxy.server.exchange.chain``: validation, admission, durable
context, recording, compaction, the thinking guard, retrieval, the ledger, calibration, the body
memo and tracing, then forwarding and the relay). ``build_app`` (``proxy.server.app``) mounts it.
"""

from __future__ import annotations

import time
import zlib

from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import InvalidRequest, RequestTooLarge
from proxy.server.appkeys import CONFIG, METRICS, REQUEST_TENANT, TENANCY
from proxy.server.compaction.service import OPT_OUT_HEADER
from proxy.server.exchange.chain import CHAIN
from proxy.server.exchange.exchange import Exchange
from proxy.server.relay.forward import (
    MESSAGES_ACCEPT_ENCODING,
    read_limited,
    request_headers_for_upstream,
)


def route_of(request: web.Request) -> str:
    """The route's name (a metrics label): ``messages``, ``count_tokens``... or ``other``."""
    name = request.match_info.route.name
    return name or "other"


def upstream_headers(request: web.Request, *, messages_route: bool) -> CIMultiDict[str]:
    """The client's headers for the upstream: hop-by-hop ones dropped, the tenant's upstream
    credentials applied (set, or removed for ``None``). The messages routes are re-bodied by the
    proxy (its own length, an encoding it can read) and drop its control header."""
    headers = request_headers_for_upstream(
        request.headers,
        accept_encoding=MESSAGES_ACCEPT_ENCODING if messages_route else None,
        keep_content_length=not messages_route,
    )
    if messages_route:
        headers.popall(OPT_OUT_HEADER, None)
    tenancy = request.app[TENANCY].current
    for name, value in tenancy.upstream_auth_headers(request[REQUEST_TENANT], request.headers).items():
        headers.popall(name, None)
        if value is not None:
            headers[name] = value
    return headers


# --- body handling ---------------------------------------------------------------------------


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, bounded by ``limit`` before anything is forwarded (413 otherwise)."""
    too_large = RequestTooLarge(f"request body exceeds the maximum size of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    body = await read_limited(request.content, limit)
    if body is None:
        raise too_large
    return body


def decoded_for_inspection(request: web.Request, raw: bytes, limit: int) -> bytes:
    """The JSON text of a body sent with ``Content-Encoding: gzip|deflate`` (forwarded as sent)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise InvalidRequest(f"unsupported Content-Encoding: {encoding[:40]}")
    wbits = 31 if "gzip" in encoding else 15
    try:
        decoder = zlib.decompressobj(wbits)
        text = decoder.decompress(raw, limit + 1)
    except zlib.error:
        raise InvalidRequest(f"request body is not valid {encoding} data") from None
    if len(text) > limit or decoder.unconsumed_tail:
        raise RequestTooLarge(f"request body exceeds the maximum size of {limit} bytes after decoding")
    return text


# --- handlers --------------------------------------------------------------------------------


async def handle_messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages and /v1/messages/count_tokens."""
    started = time.perf_counter()
    limit = request.app[CONFIG].limits.max_body_bytes
    raw = await read_body(request, limit)
    text = decoded_for_inspection(request, raw, limit)
    return await serve_messages(request, route_of(request), raw, text, started)


async def serve_messages(
    request: web.Request, route: str, raw: bytes, text: bytes, started: float
) -> web.StreamResponse:
    """A Messages request, read: ``raw`` is what goes upstream when nothing changes, ``text`` its
    JSON (``raw`` decoded when it came compressed). ``request`` is the one the answer is written
    to; its path, method and headers are the internal Messages request's: the client's own on
    ``/v1/messages``, or the clone a client format decoded its request into
    (``proxy.server.formats``), whose answer a format encoder writes (``relay.answer``)."""
    app = request.app
    app[METRICS].request_bytes.labels(route).observe(len(raw))
    exchange = Exchange(
        request,
        route,
        raw,
        text,
        started,
        request[REQUEST_TENANT],
        upstream_headers(request, messages_route=True),
    )
    return await app[CHAIN].run(exchange)
