"""Bedrock Runtime's InvokeModel form of a Messages call, and its answers as Anthropic ones.

Request: ``POST /model/{model id, URL-encoded}/invoke`` (or ``/invoke-with-response-stream``) with
the Messages body less ``model`` and ``stream``, plus ``"anthropic_version": "bedrock-2023-05-31"``
and the betas as ``anthropic_beta`` (AWS, "Anthropic Claude Messages API: request and response").
Count tokens: ``POST /model/{id}/count-tokens`` with ``{"input": {"invokeModel": {"body": <base64
of the invoke body>}}}``, answered ``{"inputTokens": n}``.

Answer: a non-streaming invoke answers the Messages JSON itself; a stream answers AWS
event-stream frames (:mod:`proxy.formats.eventstream`), each ``chunk`` carrying one Anthropic
stream event, which :class:`StreamToSse` turns into the SSE bytes the Anthropic API would have sent.
An exception frame becomes an SSE ``error`` event with Bedrock's message; a corrupt frame, a bad CRC
or a stream cut inside a frame becomes an ``api_error`` event, and the stream ends there.

Pure: values in, bytes out.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson

from proxy.core.errors import sse_error_event
from proxy.formats.eventstream import EventStreamError, FrameDecoder, chunk_event
from proxy.formats.upstream_errors import bedrock_error_type

ANTHROPIC_VERSION = "bedrock-2023-05-31"
_TYPE = re.compile(rb'^\{\s*"type"\s*:\s*"([a-z_]{1,64})"')
# Fields of a Messages body that Bedrock takes from elsewhere (the path, the operation).
_NOT_IN_BODY = frozenset({"model", "stream"})


def model_path(model_id: str, *, stream: bool) -> str:
    """``/model/<id>/invoke[-with-response-stream]``; the id (an ARN has ``:`` and ``/``) encoded."""
    operation = "invoke-with-response-stream" if stream else "invoke"
    return f"/model/{quote(model_id, safe='')}/{operation}"


def count_tokens_path(model_id: str) -> str:
    return f"/model/{quote(model_id, safe='')}/count-tokens"


def invoke_body(body: Mapping[str, Any], betas: Sequence[str]) -> dict[str, Any]:
    """The InvokeModel body of a Messages request (a new mapping)."""
    out: dict[str, Any] = {"anthropic_version": ANTHROPIC_VERSION}
    if betas:
        out["anthropic_beta"] = list(betas)
    out.update((k, v) for k, v in body.items() if k not in _NOT_IN_BODY)
    return out


def count_tokens_body(body: Mapping[str, Any], betas: Sequence[str]) -> bytes:
    invoke = orjson.dumps(invoke_body(body, betas))
    return orjson.dumps({"input": {"invokeModel": {"body": base64.b64encode(invoke).decode()}}})


def count_tokens_answer(body: bytes) -> bytes | None:
    """Bedrock's ``{"inputTokens": n}`` as the Messages API's ``{"input_tokens": n}``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    tokens = data.get("inputTokens") if isinstance(data, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        return None
    return orjson.dumps({"input_tokens": tokens})


class StreamToSse:
    """Bedrock event-stream bytes in, Anthropic SSE bytes out (``feed`` what the socket gave).

    After an error event (an exception frame, a corrupt frame) ``done`` is set and later bytes
    are ignored: the stream ends there."""

    def __init__(self, request_id: str) -> None:
        self._decoder = FrameDecoder()
        self._request_id = request_id
        self.done = False
        self.failure: str | None = None  # why the stream ended in an error event

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        corrupt: EventStreamError | None = None
        try:
            frames = self._decoder.feed(data)
        except EventStreamError as exc:
            frames, corrupt = list(exc.frames), exc
        out = bytearray()
        for frame in frames:
            if frame.message_type == "exception" or frame.message_type == "error":
                name = frame.event_type or "internalServerException"
                out += self._fail(bedrock_error_type(name, 500), _message(frame.payload, name))
                break
            if frame.event_type != "chunk":
                continue  # initial-response and other framing events carry no message event
            try:
                event = chunk_event(frame)
                named = _TYPE.match(event)  # the provider writes "type" first: no second parse
                kind = named.group(1).decode() if named else orjson.loads(event).get("type")
            except (EventStreamError, orjson.JSONDecodeError, AttributeError) as exc:
                out += self._fail("api_error", f"upstream sent an unreadable chunk ({exc})")
                break
            if not isinstance(kind, str):
                out += self._fail("api_error", "upstream sent a chunk without an event type")
                break
            out += b"event: " + kind.encode() + b"\ndata: " + event + b"\n\n"
        if corrupt is not None and not self.done:
            out += self._fail("api_error", f"upstream sent a corrupt event-stream frame ({corrupt})")
        return bytes(out)

    def close(self) -> bytes:
        """The upstream's body ended: an error event if it ended inside a frame."""
        if self.done:
            return b""
        try:
            self._decoder.close()
        except EventStreamError as exc:
            return self._fail("api_error", f"upstream event stream cut off ({exc})")
        return b""

    def _fail(self, kind: str, message: str) -> bytes:
        self.done = True
        self.failure = message
        return sse_error_event(kind, message, self._request_id)


def _message(payload: bytes, name: str) -> str:
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return payload[:2000].decode("utf-8", "replace") or name
