"""Bedrock's, Vertex's and Foundry's error answers as Anthropic errors, keeping the wording.

Bedrock answers ``{"message": "..."}`` (``x-amzn-ErrorType: ValidationException:...`` names the
kind) and, inside a stream, an exception frame (``:exception-type: throttlingException``) whose
payload is ``{"message": "..."}``. Vertex answers Google's ``{"error": {"code", "message",
"status"}}`` (sometimes inside a one-item list), or, for errors the model service itself raised,
an Anthropic error body already. Foundry answers what the model service says as an Anthropic
error, and its own gateway's refusals as Azure's ``{"error": {"code", "message"[, "type"]}}``
(an unknown deployment: ``DeploymentNotFound``; a wrong key: ``"code": "401"``) or
``{"statusCode", "message"}`` (a bad Entra ID token). The translation keeps the status and the
message text as sent (clients such as Claude Code match on the wording: in Foundry mode it strips
a feature a deployment refuses by the 400's text); only the envelope changes.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from proxy.core.errors import error_body

# The Anthropic error type of each HTTP status (the SDK's status table).
_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}

_TYPES = frozenset({*_BY_STATUS.values(), "api_error"})

# Bedrock's exception names (lower-cased, "Exception" off) → the Anthropic error type.
_BEDROCK_KINDS = {
    "validation": "invalid_request_error",
    "accessdenied": "permission_error",
    "unrecognizedclient": "authentication_error",
    "expiredtoken": "authentication_error",
    "invalidsignature": "authentication_error",
    "resourcenotfound": "not_found_error",
    "throttling": "rate_limit_error",
    "servicequotaexceeded": "rate_limit_error",
    "modeltimeout": "timeout_error",
    "modelnotready": "overloaded_error",
    "serviceunavailable": "overloaded_error",
    "modelstreamerror": "api_error",
    "internalserver": "api_error",
    "modelerror": "api_error",
}

# Bedrock's exception names → the status an exception frame mid-stream stands for.
_BEDROCK_STATUS = {
    "validation": 400,
    "throttling": 429,
    "servicequotaexceeded": 429,
    "modeltimeout": 408,
    "modelnotready": 429,
    "serviceunavailable": 503,
    "internalserver": 500,
    "modelstreamerror": 424,
}


def type_for_status(status: int) -> str:
    return _BY_STATUS.get(status, "api_error")


def _bedrock_kind(name: str) -> str:
    """``ValidationException:http://...`` or ``throttlingException`` → ``validation``."""
    name = name.split(":", 1)[0].strip().lower()
    return name[: -len("exception")] if name.endswith("exception") else name


def bedrock_error_type(exception: str, status: int) -> str:
    return _BEDROCK_KINDS.get(_bedrock_kind(exception)) or type_for_status(status)


def bedrock_exception_status(exception: str) -> int:
    return _BEDROCK_STATUS.get(_bedrock_kind(exception), 500)


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _text(body: bytes, limit: int = 2000) -> str:
    return body[:limit].decode("utf-8", "replace").strip()


def anthropic_error_of(body: bytes) -> tuple[str, str] | None:
    """``(type, message)`` when ``body`` is an Anthropic error already."""
    data = _loads(body)
    if isinstance(data, Mapping) and data.get("type") == "error":
        error = data.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            kind = error.get("type")
            return (kind if isinstance(kind, str) else "api_error"), error["message"]
    return None


def bedrock_error(status: int, error_type_header: str, body: bytes, request_id: str) -> bytes:
    """A Bedrock error answer as an Anthropic error body (the message as Bedrock wrote it)."""
    already = anthropic_error_of(body)
    if already is not None:
        return error_body(already[0], already[1], request_id)
    data = _loads(body)
    message = None
    if isinstance(data, Mapping):
        for key in ("message", "Message"):
            if isinstance(data.get(key), str):
                message = data[key]
                break
    if message is None:
        message = _text(body) or f"upstream answered {status}"
    kind = bedrock_error_type(error_type_header, status) if error_type_header else type_for_status(status)
    return error_body(kind, message, request_id)


def vertex_error(status: int, body: bytes, request_id: str) -> bytes:
    """A Vertex error answer as an Anthropic error body (the message as Google wrote it)."""
    already = anthropic_error_of(body)
    if already is not None:
        return error_body(already[0], already[1], request_id)
    data = _loads(body)
    if isinstance(data, list) and data:
        data = data[0]
    message = None
    if isinstance(data, Mapping) and isinstance(data.get("error"), Mapping):
        error = data["error"]
        if isinstance(error.get("message"), str):
            message = error["message"]
            state = error.get("status")
            if isinstance(state, str) and state:
                message = f"{message} ({state})"
    if message is None:
        message = _text(body) or f"upstream answered {status}"
    return error_body(type_for_status(status), message, request_id)


def foundry_error(status: int, body: bytes, request_id: str) -> bytes:
    """A Foundry error answer as an Anthropic error body (the message as Foundry wrote it)."""
    already = anthropic_error_of(body)
    if already is not None:
        return error_body(already[0], already[1], request_id)
    data = _loads(body)
    kind = type_for_status(status)
    message = None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            message = error["message"]
            if error.get("type") in _TYPES:
                kind = error["type"]
        elif isinstance(data.get("message"), str):  # {"statusCode": 401, "message": ...}
            message = data["message"]
    if message is None:
        message = _text(body) or f"upstream answered {status}"
    return error_body(kind, message, request_id)
