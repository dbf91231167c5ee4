"""Read the real input size the provider reports, from the answer the relay passes through.

Sans-I/O and bounded: the tap sees the bytes the relay writes (whole SSE events, or body chunks),
keeps at most ``limit`` bytes of a JSON body, and never delays the relay. The real input size is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` (a count_tokens answer
has only ``input_tokens``).

``usage`` is the provider's whole ``usage`` object for the usage ledger: a JSON answer's, or a
stream's ``message_start`` usage merged with each ``message_delta``'s (cumulative figures: the
last non-null value of each field wins, so ``output_tokens`` is the final count; a later
``iterations`` list replaces an earlier one whole).

``notes`` are what the provider says it did to the request (:mod:`proxy.core.provider_notes`):
``context_management`` (its ``applied_edits``) and ``input_transformations``, from a JSON
Message's top level, or from a stream's ``message_start`` message and ``message_delta`` events
(top level; the last one present wins). The events are read as the relay writes them: nothing is
held back.

An answer whose usage lists a provider compaction iteration gives no ``input_tokens``: its
top-level input is what the model read *after* the provider compacted, not the size of the request
(and the compaction iteration's is the summariser's, not the request's either), so it is no
evidence for calibrating the proxy's estimate of what it forwarded.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.ledger import ProviderNotes, merge_usage
from proxy.core.provider_notes import notes_from
from proxy.core.provider_usage import has_compaction

_MESSAGE_START = b"event: message_start"
_MESSAGE_DELTA = b"event: message_delta"


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

    __slots__ = (
        "_body", "_context_management", "_done", "_input_tokens", "_limit", "_sse",
        "_transformations", "message_id", "model", "stop_reason", "usage",
    )  # fmt: skip

    def __init__(self, *, sse: bool, limit: int = 4 * 1024 * 1024) -> None:
        self._sse = sse
        self._limit = limit
        self._body: list[bytes] = []
        self._done = False
        self._input_tokens: int | None = None
        self._context_management: Any = None
        self._transformations: Any = None
        self.usage: dict[str, Any] | None = None
        # the answer's id, model and stop reason (for its trace span), once seen
        self.message_id: str | None = None
        self.model: str | None = None
        self.stop_reason: str | None = None

    def _identify(self, message: Any) -> None:
        if isinstance(message, dict):
            self.message_id = _text(message.get("id"))
            self.model = _text(message.get("model"))
            self.stop_reason = _text(message.get("stop_reason")) or self.stop_reason

    @property
    def input_tokens(self) -> int | None:
        """The provider's count of the request's input (None after a provider compaction)."""
        return None if has_compaction(self.usage) else self._input_tokens

    @property
    def notes(self) -> ProviderNotes | None:
        """The answer's applied edits and input transformations, bounded; None without either."""
        return notes_from(self._context_management, self._transformations)

    def _note(self, holder: Any) -> None:
        """Keep ``holder``'s (a Message's or a message_delta's) notes, when it has them."""
        if not isinstance(holder, dict):
            return
        if holder.get("context_management") is not None:
            self._context_management = holder["context_management"]
        if holder.get("input_transformations") is not None:
            self._transformations = holder["input_transformations"]

    def feed(self, data: bytes) -> None:
        if self._sse:
            self._feed_events(data)
            return
        if self._done:
            return
        self._body.append(data)
        if sum(len(part) for part in self._body) > self._limit:
            self._done = True
            self._body = []

    def _feed_events(self, data: bytes) -> None:
        if not self._done:
            start = data.find(_MESSAGE_START)
            if start >= 0:
                self._done = True  # message_start comes once, first
                event = _event_data(data, start)
                message = event.get("message") if isinstance(event, dict) else None
                usage = message.get("usage") if isinstance(message, dict) else None
                self._input_tokens = total_input_tokens(usage)
                if isinstance(usage, dict):
                    self.usage = merge_usage(self.usage, usage)
                self._note(message)
                self._identify(message)
        delta = data.find(_MESSAGE_DELTA)
        while delta >= 0:
            if delta == 0 or data[delta - 1] == 0x0A:  # a line of its own, not text in a data line
                event = _event_data(data, delta)
                usage = event.get("usage") if isinstance(event, dict) else None
                if isinstance(usage, dict):
                    self.usage = merge_usage(self.usage, usage)
                self._note(event)
                delta_body = event.get("delta") if isinstance(event, dict) else None
                if isinstance(delta_body, dict):
                    self.stop_reason = _text(delta_body.get("stop_reason")) or self.stop_reason
            delta = data.find(_MESSAGE_DELTA, delta + len(_MESSAGE_DELTA))

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
            self._input_tokens = total_input_tokens(body.get("usage"))
            if isinstance(body.get("usage"), dict):
                self.usage = body["usage"]
            self._note(body)
            self._identify(body)
        elif isinstance(body.get("input_tokens"), int) and "type" not in body:
            self._input_tokens = body["input_tokens"]


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _event_data(data: bytes, at: int) -> Any:
    """The JSON of the ``data:`` line of the event starting at ``at``; None if unreadable."""
    line_start = data.find(b"\ndata:", at)
    if line_start < 0:
        return None
    line_end = data.find(b"\n", line_start + 1)
    payload = data[line_start + 6 : line_end if line_end >= 0 else len(data)]
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
