"""The AWS event-stream binary framing (``application/vnd.amazon.eventstream``), both ways.

Bedrock's ``invoke-with-response-stream`` answers in it: each message is

    prelude:  total length (uint32 BE) | headers length (uint32 BE) | CRC32 of those 8 bytes
    headers:  name length (uint8) | name (UTF-8) | value type (uint8) | value
    payload
    trailer:  CRC32 of everything before it

(AWS "Event stream encoding", and botocore/eventstream.py, which tests/formats decodes our frames
with). A Bedrock ``chunk`` event's payload is ``{"bytes": "<base64 of one Anthropic stream event>"}``;
an error is a frame with ``:message-type: exception`` and ``:exception-type``.

Pure: bytes in, frames out. ``FrameDecoder`` is incremental (feed whatever the socket gave) and
raises ``EventStreamError`` on a bad CRC, an impossible length or a truncated end, never hangs on
one: a frame is decided as soon as its declared length has arrived.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import orjson

CONTENT_TYPE = "application/vnd.amazon.eventstream"

_PRELUDE = struct.Struct(">II")
_PRELUDE_CRC = struct.Struct(">III")
_PRELUDE_LENGTH = 12  # two lengths and their CRC
_TRAILER_LENGTH = 4
_MIN_FRAME = _PRELUDE_LENGTH + _TRAILER_LENGTH
# AWS's limits (botocore enforces the same): headers up to 128 KiB, a payload up to 24 MiB
MAX_HEADERS = 128 * 1024
MAX_PAYLOAD = 24 * 1024 * 1024

_STRING = 7
_BYTES = 6
# fixed-width header value types: bool true/false carry no value
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}

HeaderValue = str | bytes | int | bool


class EventStreamError(ValueError):
    """The bytes are not a valid event stream (bad CRC, length or header). ``frames``: the
    whole frames the same ``feed`` decoded before the bad one (they are good)."""

    frames: tuple[Frame, ...] = ()


@dataclass(frozen=True, slots=True)
class Frame:
    headers: Mapping[str, HeaderValue]
    payload: bytes

    @property
    def message_type(self) -> str:
        value = self.headers.get(":message-type", "event")
        return value if isinstance(value, str) else ""

    @property
    def event_type(self) -> str:
        value = self.headers.get(":event-type") or self.headers.get(":exception-type") or ""
        return value if isinstance(value, str) else ""


def encode_frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One message: string headers (the only kind Bedrock's events carry) and the payload."""
    encoded = bytearray()
    for name, value in headers.items():
        raw_name = name.encode()
        raw_value = value.encode()
        if len(raw_name) > 255 or len(raw_value) > 0xFFFF:
            raise EventStreamError(f"header {name!r} too long")
        encoded += bytes([len(raw_name)]) + raw_name + bytes([_STRING])
        encoded += struct.pack(">H", len(raw_value)) + raw_value
    total = _MIN_FRAME + len(encoded) + len(payload)
    prelude = _PRELUDE.pack(total, len(encoded))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + bytes(encoded) + payload
    return head + struct.pack(">I", zlib.crc32(head))


def chunk_frame(event: bytes) -> bytes:
    """A Bedrock ``chunk`` event carrying one Anthropic stream event's JSON."""
    payload = orjson.dumps({"bytes": base64.b64encode(event).decode()})
    return encode_frame(
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
        payload,
    )


def exception_frame(exception_type: str, message: str) -> bytes:
    """A Bedrock stream error (``throttlingException``, ``modelStreamErrorException``...)."""
    return encode_frame(
        {
            ":exception-type": exception_type,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        orjson.dumps({"message": message}),
    )


def chunk_event(frame: Frame) -> bytes:
    """The Anthropic event JSON a ``chunk`` frame carries (``EventStreamError`` otherwise)."""
    try:
        body = orjson.loads(frame.payload)
        return base64.b64decode(body["bytes"], validate=True)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise EventStreamError(f"chunk without a base64 'bytes' field: {exc}") from None


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, get the frames completed so far."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame held (non-zero at the end of a stream: truncated)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        try:
            self._decode(frames)
        except EventStreamError as exc:
            exc.frames = tuple(frames)
            raise
        return frames

    def _decode(self, frames: list[Frame]) -> None:
        # One pass over the buffer with an offset, cut once at the end (deleting each frame from
        # the front as it was decoded moved the rest every time: quadratic in a large read).
        buffer = self._buffer
        view = memoryview(buffer)
        at = 0
        try:
            while len(buffer) - at >= _PRELUDE_LENGTH:
                total, headers_length, prelude_crc = _PRELUDE_CRC.unpack_from(buffer, at)
                if zlib.crc32(view[at : at + 8]) != prelude_crc:
                    raise EventStreamError("prelude CRC mismatch")
                if headers_length > MAX_HEADERS:
                    raise EventStreamError(f"headers length {headers_length} over {MAX_HEADERS}")
                if total < _MIN_FRAME + headers_length or total - _MIN_FRAME - headers_length > MAX_PAYLOAD:
                    raise EventStreamError(f"impossible frame length {total}")
                if len(buffer) - at < total:
                    break
                end = at + total - _TRAILER_LENGTH
                (message_crc,) = struct.unpack_from(">I", buffer, end)
                if zlib.crc32(view[at:end]) != message_crc:
                    raise EventStreamError("message CRC mismatch")
                headers_end = at + _PRELUDE_LENGTH + headers_length
                headers = _cached_headers(bytes(view[at + _PRELUDE_LENGTH : headers_end]))
                frames.append(Frame(headers, bytes(view[headers_end:end])))
                at += total
        finally:
            view.release()
            if at:
                del buffer[:at]

    def close(self) -> None:
        """The stream ended: raise if a frame was cut off."""
        if self._buffer:
            raise EventStreamError(f"stream ended inside a frame ({len(self._buffer)} bytes)")


_HEADER_CACHE: dict[bytes, Mapping[str, HeaderValue]] = {}
_HEADER_CACHE_SIZE = 64


def _cached_headers(raw: bytes) -> Mapping[str, HeaderValue]:
    """The headers of ``raw``, parsed once: a stream's frames repeat the same few header blocks
    (``:event-type: chunk``...). Read-only, shared between frames."""
    found = _HEADER_CACHE.get(raw)
    if found is None:
        found = MappingProxyType(_headers(raw))
        if len(_HEADER_CACHE) >= _HEADER_CACHE_SIZE:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[raw] = found
    return found


def _headers(raw: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(raw):
            name_length = raw[at]
            name = raw[at + 1 : at + 1 + name_length].decode()
            at += 1 + name_length
            kind = raw[at]
            at += 1
            value: HeaderValue
            if kind in (_STRING, _BYTES):
                (length,) = struct.unpack_from(">H", raw, at)
                data = raw[at + 2 : at + 2 + length]
                if len(data) != length:
                    raise EventStreamError("header value cut off")
                value = data.decode() if kind == _STRING else data
                at += 2 + length
            elif kind in _FIXED:
                width = _FIXED[kind]
                data = raw[at : at + width]
                if len(data) != width:
                    raise EventStreamError("header value cut off")
                value = kind == 0 if width == 0 else (data if kind == 9 else int.from_bytes(data, "big", signed=True))
                at += width
            else:
                raise EventStreamError(f"unknown header value type {kind}")
            if name in headers:
                raise EventStreamError(f"duplicate header {name!r}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"malformed headers: {exc}") from None
    return headers
