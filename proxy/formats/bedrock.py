"""Bedrock InvokeModel as a client format: the request decoded, the answer encoded back.

Requests: ``POST /model/{model}/invoke`` (one JSON answer) and
``/model/{model}/invoke-with-response-stream`` (an AWS event stream); the model is a Bedrock
model id, a cross-region inference profile or its ARN (URL-encoded in the path); the body is the
Messages body without ``model`` and ``stream``, with ``anthropic_version``
(``bedrock-2023-05-31``) and ``anthropic_beta`` (a list) in it.

Answers: a 200 JSON answer is the Messages answer as it is (Bedrock's carries the Anthropic
model id too); a stream is one event-stream ``chunk`` frame per Anthropic stream event, its JSON
base64-encoded; an error is Bedrock's: the HTTP status, ``{"message": ...}`` with the provider's
(or the proxy's) wording kept, and ``x-amzn-ErrorType``; an error inside a stream is an
``exception`` frame. ``AnswerEncoder`` is sans-I/O: feed it what the relay writes (whole SSE
events, or a JSON body in pieces), get the bytes for the client.
"""

from __future__ import annotations

import base64
import struct
import zlib

import orjson

from proxy.core.catalogue import Catalogue
from proxy.core.errors import InvalidRequest
from proxy.formats.eventstream import CONTENT_TYPE, chunk_frame, exception_frame
from proxy.formats.request import (
    PLATFORM_API_VERSION,
    Decoded,
    betas_of,
    members,
    rebuild,
    version_of,
)

_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
_ERROR_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
# Bedrock's error names by HTTP status
_ERROR_TYPES = {
    400: "ValidationException",
    401: "AccessDeniedException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    422: "ValidationException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    502: "ServiceUnavailableException",
    503: "ServiceUnavailableException",
    504: "ModelTimeoutException",
}
# in a stream: the event-stream exception for an Anthropic ``error.type``
_STREAM_EXCEPTIONS = {
    "invalid_request_error": "validationException",
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "timeout_error": "modelTimeoutException",
    "api_error": "internalServerException",
}
# the Anthropic-only overload status; Bedrock says 503
_OVERLOADED = 529
MAX_ERROR_BODY = 1 << 20
# an InvokeModel body's fields that the Messages API's count_tokens does not take
NOT_COUNTED = frozenset(
    {"max_tokens", "metadata", "stop_sequences", "temperature", "top_k", "top_p",
     "service_tier", "user_profile_id"}
)


def decode(model: str, text: bytes, *, stream: bool, ids: Catalogue) -> Decoded:
    """An InvokeModel request (``model`` from the path, decoded) as the Messages request."""
    found = members(text)
    version = version_of(found.get("anthropic_version"))
    betas = betas_of(found.get("anthropic_beta"))
    inside = ids.anthropic(model)
    body = rebuild(found, inside, stream=True if stream else None)
    return Decoded(body, version, betas, inside, model, stream)


def decode_count(model: str, text: bytes, *, ids: Catalogue) -> Decoded:
    """A CountTokens request (``POST /model/{model}/count-tokens``, body
    ``{"input": {"invokeModel": {"body": "<base64 of an InvokeModel body>"}}}``) as a Messages
    ``count_tokens`` request: the fields counting does not take are left out."""
    try:
        outer = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    given = outer.get("input") if isinstance(outer, dict) else None
    invoke = given.get("invokeModel") if isinstance(given, dict) else None
    if not isinstance(invoke, dict):
        raise InvalidRequest("input.invokeModel: Field required (only InvokeModel bodies are counted)")
    try:
        inner = base64.b64decode(invoke.get("body") or "", validate=True)
    except (ValueError, TypeError):
        raise InvalidRequest("input.invokeModel.body: Input should be base64-encoded") from None
    found = members(inner)
    raw_version = found.get("anthropic_version")
    version = version_of(raw_version) if raw_version is not None else PLATFORM_API_VERSION
    betas = betas_of(found.get("anthropic_beta"))
    inside = ids.anthropic(model)
    body = rebuild(found, inside, stream=None, drop=NOT_COUNTED)
    return Decoded(body, version, betas, inside, model, False)


def error_status(status: int) -> int:
    return 503 if status == _OVERLOADED else status


def error_type(status: int) -> str:
    name = _ERROR_TYPES.get(status)
    if name is None:
        name = "InternalServerException" if status >= 500 else "ValidationException"
    return name


def error_headers(status: int) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "x-amzn-ErrorType": error_type(error_status(status)) + _ERROR_SUFFIX,
    }


def error_body(message: str) -> bytes:
    return orjson.dumps({"message": message})


def message_of(body: bytes) -> str:
    """The wording of an Anthropic error body (the body's text when it is not one)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        error = value.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(value.get("message"), str):
            return str(value["message"])
    return body.decode("utf-8", "replace").strip() or "error"


def count_body(answer: bytes) -> bytes:
    """A Messages count_tokens answer as CountTokens'."""
    try:
        value = orjson.loads(answer)
    except orjson.JSONDecodeError:
        value = None
    tokens = value.get("input_tokens") if isinstance(value, dict) else None
    return orjson.dumps({"inputTokens": tokens if isinstance(tokens, int) else 0})


def stream_exception(event: bytes) -> bytes:
    """An Anthropic ``error`` event's JSON as an ``exception`` frame."""
    try:
        value = orjson.loads(event)
    except orjson.JSONDecodeError:
        value = None
    error = value.get("error") if isinstance(value, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    name = _STREAM_EXCEPTIONS.get(kind if isinstance(kind, str) else "", "internalServerException")
    return exception_frame(name, message_of(event))


class AnswerEncoder:
    """One answer, Anthropic in, Bedrock out. ``start`` with the status and content type, then
    ``feed`` and ``end``. ``counting``: a count_tokens answer, ``{"input_tokens": n}`` →
    CountTokens' ``{"inputTokens": n}``."""

    __slots__ = ("_counting", "_mode", "_pending", "_size", "rewrites", "status")

    def __init__(self, *, counting: bool = False) -> None:
        self._counting = counting
        self._mode = "json"
        self._pending = bytearray()
        self._size = 0
        self.status = 200
        # the body changes (length and type): what the relay set about it no longer holds
        self.rewrites = False

    def start(self, status: int, content_type: str) -> dict[str, str]:
        """The answer's status and content type: the headers to set."""
        if status != 200:
            self._mode = "error"
            self.status = error_status(status)
            self.rewrites = True
            return error_headers(status)
        if content_type.startswith("text/event-stream"):
            self._mode = "stream"
            self.rewrites = True
            return {"Content-Type": CONTENT_TYPE}
        if self._counting:
            self._mode = "count"
            self.rewrites = True
        return {}

    @property
    def streaming(self) -> bool:
        return self._mode == "stream"

    def feed(self, data: bytes) -> bytes:
        if self._mode == "json":
            return data
        if self._mode in ("error", "count"):
            if self._size + len(data) <= MAX_ERROR_BODY:
                self._pending += data
            self._size += len(data)
            return b""
        self._pending += data
        end = _last_boundary(self._pending)
        if end == 0:
            return b""
        complete = bytes(self._pending[:end])
        del self._pending[:end]
        return self._frames(complete)

    def end(self) -> bytes:
        if self._mode == "error":
            return error_body(message_of(bytes(self._pending)))
        if self._mode == "count":
            return count_body(bytes(self._pending))
        if self._mode == "stream" and self._pending:
            rest = bytes(self._pending)
            self._pending.clear()
            return self._frames(rest)
        return b""

    def _frames(self, events: bytes) -> bytes:
        out = bytearray()
        for name, data in sse_events(events):
            if not data:
                continue
            out += stream_exception(data) if name == "error" else fast_chunk_frame(data)
        return bytes(out)


# a chunk frame's headers, always the same (``eventstream.chunk_frame``'s, encoded once)
_CHUNK_HEADERS = chunk_frame(b"")[12:-4 - len(orjson.dumps({"bytes": ""}))]


def fast_chunk_frame(event: bytes) -> bytes:
    """``eventstream.chunk_frame(event)``, with its constant headers encoded once."""
    payload = b'{"bytes":"' + base64.b64encode(event) + b'"}'
    total = 16 + len(_CHUNK_HEADERS) + len(payload)
    prelude = _PRELUDE.pack(total, len(_CHUNK_HEADERS))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + _CHUNK_HEADERS + payload
    return head + _CRC.pack(zlib.crc32(head))


def sse_events(text: bytes) -> list[tuple[str, bytes]]:
    """(event name, data) of each whole SSE event in ``text``."""
    events: list[tuple[str, bytes]] = []
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for block in text.split(b"\n\n"):
        name = ""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"event":
                name = value.decode("utf-8", "replace")
            elif field == b"data":
                data.append(value)
        if name or data:
            events.append((name, b"\n".join(data)))
    return events


def _last_boundary(buffer: bytearray) -> int:
    best = 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buffer.rfind(sep)
        if i >= 0:
            best = max(best, i + len(sep))
    return best


def inference_profile(profile: str, ids: Catalogue) -> bytes | None:
    """``GET /inference-profiles/{id}`` (Claude Code asks after its first answer, for the model
    behind its profile): the profile as Bedrock describes it, backed by the foundation model of
    the same Claude model; ``None`` (404) when the id names no Claude model. The region is the
    ARN's, else ``us-east-1`` (a gateway has none)."""
    inside = ids.anthropic(profile)
    if not inside.startswith("claude"):
        return None
    parts = profile.split(":")
    region = parts[3] if profile.startswith("arn:") and len(parts) > 3 and parts[3] else "us-east-1"
    name = profile.rsplit("/", 1)[-1]
    foundation = ids.bedrock_foundation(inside)
    return orjson.dumps(
        {
            "inferenceProfileName": name,
            "inferenceProfileId": name,
            "inferenceProfileArn": profile if profile.startswith("arn:") else (
                f"arn:aws:bedrock:{region}::inference-profile/{name}"
            ),
            "models": [{"modelArn": f"arn:aws:bedrock:{region}::foundation-model/{foundation}"}],
            "status": "ACTIVE",
            "type": "SYSTEM_DEFINED",
        }
    )


def inference_profiles() -> bytes:
    """``GET /inference-profiles?type=SYSTEM_DEFINED`` (Claude Code's startup probe): none; the
    gateway takes the model ids and profiles as sent, and Claude Code keeps its defaults."""
    return orjson.dumps({"inferenceProfileSummaries": []})
