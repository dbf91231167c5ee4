"""The admin API's wire, shared by its routes: JSON answers, errors in the Anthropic shape (with
``error.details``), request bodies (bounded, a JSON object), the session in the path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from proxy.core.durable import FieldError
from proxy.core.errors import (
    InvalidRequest,
    NotFound,
    ProxyError,
    RequestTooLarge,
    ValidationFailed,
    error_body,
)
from proxy.core.pointers import is_valid_session_id
from proxy.server.relay.forward import read_limited
from proxy.store.base import Store
from proxy.tenancy.tenants import Tenant

__all__ = [
    "MAX_BODY_BYTES",
    "PREFIX",
    "SESSION_NOT_FOUND",
    "AdminUnavailable",
    "error_response",
    "failed",
    "json_object",
    "json_response",
    "require_session",
    "session_of",
]

PREFIX = "/admin/v1"
MAX_BODY_BYTES = 4 << 20

SESSION_NOT_FOUND = "session not found"


class AdminUnavailable(ProxyError):
    """503 api_error: the session store (or the sources, for a preview) cannot be read now."""

    status = 503
    error_type = "api_error"

    def __init__(self, message: str = "the session store is unavailable; retry later") -> None:
        super().__init__(message, headers={"retry-after": "1"})


def json_response(
    data: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(data),
        content_type="application/json",
        headers=headers,
    )


def error_response(exc: ProxyError, request_id: str) -> web.Response:
    details = exc.details if isinstance(exc, ValidationFailed) else None
    headers = {"x-should-retry": "true" if exc.status >= 500 else "false", **exc.headers}
    return web.Response(
        status=exc.status,
        body=error_body(exc.error_type, exc.message, request_id, details=details),
        content_type="application/json",
        headers=headers,
    )


async def json_object(request: web.Request) -> dict[str, Any]:
    too_large = RequestTooLarge(f"request body exceeds the maximum size of {MAX_BODY_BYTES} bytes")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise too_large
    raw = await read_limited(request.content, MAX_BODY_BYTES)
    if raw is None:
        raise too_large
    if not raw.strip():
        raise InvalidRequest("request body is empty: expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def session_of(request: web.Request) -> str:
    session = request.match_info["session"]
    if not is_valid_session_id(session):
        raise InvalidRequest(
            "session: not a valid session id (1-200 characters of [A-Za-z0-9._-], starting with"
            " a letter or a digit)"
        )
    return session


async def require_session(store: Store, tenant: Tenant, session: str) -> None:
    if session not in await store.list_sessions(tenant.name):
        raise NotFound(SESSION_NOT_FOUND)


def failed(errors: Sequence[FieldError]) -> ValidationFailed:
    """A 422 naming each bad field once (its first problem: later ones follow from it)."""
    first: dict[str, FieldError] = {}
    for error in errors:
        first.setdefault(error.field, error)
    return ValidationFailed(list(first.values()))
