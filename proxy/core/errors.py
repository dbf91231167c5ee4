"""Every error the proxy itself produces, and how it goes on the wire.

Errors from the upstream provider are never wrapped: they pass through untouched (a Bedrock or
Vertex upstream's are put in the Anthropic envelope, their wording kept:
``proxy.formats.upstream_errors``). The errors
below are the proxy's own, each with its HTTP status and Anthropic ``error.type``::

    ProxyError                      base; never raised itself
    ├── InvalidRequest          400 invalid_request_error   body not JSON / not an object /
    │   │                                                  no ``messages`` / tool protocol broken /
    │   │                                                  bad session id
    │   └── PromptTooLong       400 invalid_request_error   still over the hard limit after every
    │                                                      compaction layer ("prompt is too long: ...")
    ├── AuthenticationFailed    401 authentication_error    unknown proxy-issued key
    ├── NotFound                404 not_found_error         a path the proxy does not serve
    ├── RequestTooLarge         413 request_too_large       body over ``limits.max_body_bytes``
    ├── ValidationFailed        422 invalid_request_error   a well-formed write that breaks the
    │                                                      rules (admin API); ``error.details``
    │                                                      lists ``{field, message}`` per bad field
    ├── RateLimited             429 rate_limit_error        over the tenant's (or proxy key's) own
    │                                                      budget or rate limit, before anything
    │                                                      is sent upstream (``retry-after``)
    ├── UpstreamUnavailable     502 api_error               upstream refused / unreachable / reset
    │                                                      before response headers; no usable AWS /
    │                                                      Google / Azure credentials for a Bedrock /
    │                                                      Vertex / Foundry upstream
    ├── UpstreamTimeout         504 timeout_error           upstream connect or read timeout
    └── Overloaded              529 overloaded_error        proxy draining or at its concurrency
                                                           limit (sent with ``retry-after``)

Mid-stream failures cannot change the status (200 is already sent): the relay ends the stream with
an SSE ``event: error`` carrying ``api_error`` (upstream cut) or ``overloaded_error`` (proxy
shutting down), built by :func:`sse_error_event`.

The message text of an error never contains message content, API keys or filesystem paths.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import ClassVar

import orjson

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_request_id() -> str:
    """A request id shaped like the provider's (``req_`` + 24 base62), marked as the proxy's."""
    return "req_cp" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(22))


class ProxyError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "api_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class InvalidRequest(ProxyError):
    status = 400
    error_type = "invalid_request_error"


class PromptTooLong(InvalidRequest):
    pass


class AuthenticationFailed(ProxyError):
    status = 401
    error_type = "authentication_error"


class NotFound(ProxyError):
    status = 404
    error_type = "not_found_error"


class RequestTooLarge(ProxyError):
    status = 413
    error_type = "request_too_large"


class ValidationFailed(ProxyError):
    """``details`` names every bad field as ``(field, message)``; nothing was written."""

    status = 422
    error_type = "invalid_request_error"

    def __init__(
        self,
        details: Iterable[tuple[str, str]],
        message: str | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.details = tuple((str(field), str(problem)) for field, problem in details)
        if message is None:
            message = "; ".join(f"{field}: {problem}" for field, problem in self.details)
        super().__init__(message or "invalid request", headers=headers)


class RateLimited(ProxyError):
    """Over a limit of the tenant's policy (``quota``): ``retry-after`` is when the window that
    refused ends; ``x-should-retry`` is true for the per-minute limits (the SDK then retries after
    ``retry-after``), false for a spent budget (a day or a month away)."""

    status = 429
    error_type = "rate_limit_error"

    def __init__(
        self, message: str, *, retry_after_seconds: int, retry: bool, headers: dict[str, str]
    ) -> None:
        super().__init__(
            message,
            headers={
                **headers,
                "retry-after": str(retry_after_seconds),
                "x-should-retry": "true" if retry else "false",
            },
        )


class UpstreamUnavailable(ProxyError):
    status = 502
    error_type = "api_error"


class UpstreamTimeout(ProxyError):
    status = 504
    error_type = "timeout_error"


class Overloaded(ProxyError):
    status = 529
    error_type = "overloaded_error"

    def __init__(self, message: str, *, retry_after_seconds: int = 1) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after_seconds)})


def error_body(
    error_type: str,
    message: str,
    request_id: str,
    *,
    details: Iterable[tuple[str, str]] | None = None,
) -> bytes:
    """The Anthropic error envelope; ``details`` (field, message) pairs go in ``error.details``."""
    error: dict[str, object] = {"type": error_type, "message": message}
    if details is not None:
        error["details"] = [{"field": field, "message": problem} for field, problem in details]
    return orjson.dumps({"type": "error", "error": error, "request_id": request_id})


def sse_error_event(error_type: str, message: str, request_id: str) -> bytes:
    """An SSE ``error`` event, for failures after the response status was sent."""
    return b"event: error\ndata: " + error_body(error_type, message, request_id) + b"\n\n"
