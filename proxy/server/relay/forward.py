"""Talking to the upstream provider: header filtering, the request, and the response relay.

Lower-level client errors are translated to the proxy's error tree in exactly one place,
:func:`upstream_errors`. Responses are relayed as they arrive; a client write awaits the client's
drain, and the upstream read pauses while we wait, so a slow client slows the upstream read
instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.core.errors import (
    UpstreamTimeout,
    UpstreamUnavailable,
    new_request_id,
    sse_error_event,
)
from proxy.server.http.metrics import Metrics
from proxy.server.relay.answer import client_response
from proxy.server.relay.sse import EventSplitter
from proxy.server.upstream.platforms import CURRENT
from proxy.server.upstream.response import UpstreamResponse

log = logging.getLogger("context_proxy.forward")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: the hop-by-hop set plus what aiohttp sets for the new connection.
_REQUEST_DROP = HOP_BY_HOP | {"host", "expect"}
# Headers that describe a body encoding we removed when the proxy decoded the response.
_ENCODING_HEADERS = frozenset({"content-encoding", "content-length"})

# What the messages routes ask the upstream for: encodings aiohttp decodes natively, so that the
# proxy can read the stream it relays.
MESSAGES_ACCEPT_ENCODING = "gzip, deflate"


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    value = headers.get("Connection", "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def request_headers_for_upstream(
    headers: CIMultiDictProxy[str],
    *,
    accept_encoding: str | None,
    keep_content_length: bool,
) -> CIMultiDict[str]:
    """The client's headers as sent (auth, versions, betas, custom), minus hop-by-hop ones."""
    drop = _REQUEST_DROP | _connection_tokens(headers)
    if not keep_content_length:
        drop = drop | {"content-length"}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    if accept_encoding is not None:
        out["Accept-Encoding"] = accept_encoding
    return out


def response_headers_for_client(
    headers: CIMultiDictProxy[str], *, decoded: bool
) -> CIMultiDict[str]:
    drop = HOP_BY_HOP | _connection_tokens(headers)
    if decoded:
        drop = drop | _ENCODING_HEADERS
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


@contextlib.contextmanager
def upstream_errors(metrics: Metrics) -> Iterator[None]:
    """Map client-library failures before the response headers to the proxy's error tree."""
    try:
        yield
    except TimeoutError as exc:  # aiohttp's connect/read timeouts subclass TimeoutError
        metrics.upstream_errors.labels("timeout").inc()
        raise UpstreamTimeout(f"upstream did not answer in time ({type(exc).__name__})") from None
    except aiohttp.ClientConnectorError as exc:
        metrics.upstream_errors.labels("refused").inc()
        raise UpstreamUnavailable(
            f"upstream unreachable ({type(exc).__name__})"
        ) from None
    except aiohttp.ClientError as exc:
        metrics.upstream_errors.labels("reset").inc()
        raise UpstreamUnavailable(
            f"upstream connection failed before a response ({type(exc).__name__})"
        ) from None


# Failures while reading the upstream body after the status has been sent.
_READ_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


class _BodyResponse(web.StreamResponse):
    """A relayed non-SSE answer: its headers leave with the first body bytes (one send, as
    ``web.Response`` does), not in a packet of their own. SSE keeps sending headers at once."""

    _send_headers_immediately = False


@dataclass(slots=True)
class RelayOutcome:
    """What the relay saw; used for metrics now and transcript recording later."""

    status: int
    completed: bool
    is_sse: bool
    client_gone: bool = False


class Forwarder:
    """Owns the one pooled ``ClientSession`` use for a given upstream base URL."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        connect_timeout: float,
        read_timeout: float,
        metrics: Metrics,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session = session
        self.draining = draining
        # Relays in progress, so that a shutdown past its grace period can end them cleanly.
        self.active: set[asyncio.Task[object]] = set()
        self._base = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self.metrics = metrics

    @property
    def base_url(self) -> str:
        """The Anthropic API's base URL this forwarder sends to (a tenant's platform aside)."""
        return self._base

    def url_for(self, raw_path: str) -> URL:
        """``raw_path`` is the client's path and query, still percent-encoded, kept as sent."""
        return URL(self._base + raw_path, encoded=True)

    async def open(
        self,
        request: web.Request,
        *,
        route: str,
        data: bytes | AsyncIterator[bytes] | None,
        decode: bool,
        headers: CIMultiDict[str],
        body: Mapping[str, Any] | None = None,
    ) -> UpstreamResponse:
        """Send the request upstream and return once its response headers arrived: the Anthropic
        API's answer, or a platform's one presented in its form (``proxy.server.upstream``).
        ``body``: what ``data`` holds, already parsed (a Messages call): a platform encodes it
        instead of parsing ``data`` again. The platform is the request's tenant's, as the auth
        middleware found it (``CURRENT``; ``None``: the Anthropic API at the base URL)."""
        started = time.perf_counter()
        platform = CURRENT.get()
        response: UpstreamResponse
        with upstream_errors(self.metrics):
            if platform is not None:
                response = await platform.open(
                    request, route=route, data=data, headers=headers, body=body
                )
            else:
                response = await self.session.request(
                    request.method,
                    self.url_for(request.raw_path),
                    headers=headers,
                    data=data,
                    timeout=self.timeout,
                    auto_decompress=decode,
                    allow_redirects=False,
                )
        self.metrics.child(self.metrics.upstream_latency, route).observe(
            time.perf_counter() - started
        )
        return response

    async def relay(
        self,
        request: web.Request,
        upstream: UpstreamResponse,
        *,
        decoded: bool,
        extra_headers: Mapping[str, str] | None = None,
        on_prepared: float | None = None,
        route: str = "other",
        tap: Callable[[bytes], None] | None = None,
    ) -> tuple[web.StreamResponse, RelayOutcome]:
        """Relay status, headers and body to the client as they arrive."""
        received_at = time.perf_counter()
        headers = response_headers_for_client(upstream.headers, decoded=decoded)
        if extra_headers:
            headers.update(extra_headers)
        content_type = upstream.headers.get("Content-Type", "")
        is_sse = content_type.startswith("text/event-stream")
        response_class = web.StreamResponse if is_sse else _BodyResponse
        response = client_response(
            request, response_class, status=upstream.status, reason=upstream.reason, headers=headers
        )
        length = upstream.headers.get("Content-Length")
        if length is not None and not (decoded and "Content-Encoding" in upstream.headers):
            response.content_length = int(length)
        outcome = RelayOutcome(status=upstream.status, completed=False, is_sse=is_sse)
        await response.prepare(request)
        added = time.perf_counter() - received_at
        if on_prepared is not None:
            added += on_prepared
        self.metrics.child(self.metrics.added_latency, route).observe(added)
        self.metrics.active_streams.inc()
        task = asyncio.current_task()
        if task is not None:
            self.active.add(task)
        try:
            await self._pump(response, upstream, outcome, request, tap)
        except asyncio.CancelledError:
            # The client went away, or the shutdown grace period ran out. In the latter case the
            # client is still there: tell it, in the stream, why it ends here.
            if is_sse:
                await self.end_if_draining(
                    response, upstream.headers.get("request-id") or new_request_id()
                )
            raise
        finally:
            if task is not None:
                self.active.discard(task)
            self.metrics.active_streams.dec()
        return response, outcome

    async def end_if_draining(self, response: web.StreamResponse, request_id: str) -> None:
        """A stream cancelled because the shutdown grace period ran out (the client is still
        there): tell it, in the stream, why it ends here. Nothing when the client went away."""
        if not self.draining() or not response.prepared:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                response.write(
                    sse_error_event(
                        "overloaded_error",
                        "the proxy is shutting down; the response is incomplete",
                        request_id,
                    )
                ),
                0.5,
            )

    async def _pump(
        self,
        response: web.StreamResponse,
        upstream: UpstreamResponse,
        outcome: RelayOutcome,
        request: web.Request,
        tap: Callable[[bytes], None] | None,
    ) -> None:
        splitter = EventSplitter() if outcome.is_sse else None
        chunks = upstream.content.iter_any().__aiter__()
        failure: str | None = None
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except _READ_ERRORS as exc:
                failure = type(exc).__name__
                break
            out = splitter.feed(chunk) if splitter is not None else chunk
            if out:
                await response.write(out)
                if tap is not None:
                    tap(out)
        if splitter is not None:
            if failure is None:
                tail = splitter.flush()
                if tail:
                    await response.write(tail)
            if not splitter.terminated:
                failure = failure or "stream ended before message_stop"
                self.metrics.upstream_errors.labels("midstream").inc()
                log.warning("[relay] upstream stream cut: %s", failure)
                await response.write(
                    sse_error_event(
                        "api_error",
                        "upstream connection lost mid-stream; the response is incomplete",
                        upstream.headers.get("request-id") or new_request_id(),
                    )
                )
                await response.write_eof()
                return
        elif failure is not None:
            # A non-SSE body cannot carry an error after its status: cut the connection so the
            # client sees an incomplete body rather than a silently truncated one.
            self.metrics.upstream_errors.labels("midstream").inc()
            log.warning("[relay] upstream body cut: %s", failure)
            if request.transport is not None:
                request.transport.close()
            return
        outcome.completed = True
        await response.write_eof()


async def read_limited(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """Read a whole request body; ``None`` when it exceeds ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
