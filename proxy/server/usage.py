"""Read the real input size the provider reports, from the answer the relay passes through.

Sans-I/O and bounded: the tap sees the bytes the relay writes (whole SSE events, or body chunks),
keeps at most ``limit`` bytes of a JSON body, and never delays the relay. The real input size is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` (a count_tokens answer
has only ``input_tokens``).
"""

from __future__ import annotations

from typing import Any

import orjson

_MESSAGE_START = b"event: message_start"


def total_input_tokens(usage: Any) -> int | None:
    if not isinstance(usage, dict):
        return None
    total = 0
    seen = False
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
            seen = True
    return total if seen else None


class UsageTap:
    """Feed it what the relay writes; ``input_tokens`` is the provider's figure, once known."""

    __slots__ = ("_body", "_done", "_limit", "_sse", "input_tokens")

    def __init__(self, *, sse: bool, limit: int = 4 * 1024 * 1024) -> None:
        self._sse = sse
        self._limit = limit
        self._body: list[bytes] = []
        self._done = False
        self.input_tokens: int | None = None

    def feed(self, data: bytes) -> None:
        if self._done:
            return
        if self._sse:
            self._feed_events(data)
            return
        self._body.append(data)
        if sum(len(part) for part in self._body) > self._limit:
            self._done = True
            self._body = []

    def _feed_events(self, data: bytes) -> None:
        start = data.find(_MESSAGE_START)
        if start < 0:
            return
        self._done = True  # message_start comes once, first
        line_start = data.find(b"\ndata:", start)
        if line_start < 0:
            return
        line_end = data.find(b"\n", line_start + 1)
        payload = data[line_start + 6 : line_end if line_end >= 0 else len(data)]
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        message = event.get("message") if isinstance(event, dict) else None
        self.input_tokens = total_input_tokens(message.get("usage") if isinstance(message, dict) else None)

    def close(self) -> None:
        """At the end of a complete JSON body: parse it."""
        if self._sse or self._done or not self._body:
            return
        self._done = True
        try:
            body = orjson.loads(b"".join(self._body))
        except orjson.JSONDecodeError:
            return
        finally:
            self._body = []
        if not isinstance(body, dict):
            return
        if body.get("type") == "message":
            self.input_tokens = total_input_tokens(body.get("usage"))
        elif isinstance(body.get("input_tokens"), int) and "type" not in body:
            self.input_tokens = body["input_tokens"]
