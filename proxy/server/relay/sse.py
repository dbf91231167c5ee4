"""Split a byte stream into whole Server-Sent Events, so the relay only ever writes complete events.

Sans-I/O: feed it chunks as they arrive; it hands back the bytes that end on an event boundary and
keeps the incomplete tail. If the upstream dies mid-event, the tail is never written, so the
proxy's own ``event: error`` that follows is not glued onto half an event.
"""

from __future__ import annotations

import re

_TERMINAL = re.compile(rb"(?m)^event: ?(message_stop|error)\r?$")
_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def _last_boundary(buffer: bytes) -> int:
    """Index just past the last event boundary in ``buffer``, or 0 when there is none."""
    best = 0
    for sep in _BOUNDARIES:
        i = buffer.rfind(sep)
        if i >= 0:
            best = max(best, i + len(sep))
    return best


class EventSplitter:
    __slots__ = ("_pending", "terminated")

    def __init__(self) -> None:
        self._pending = b""
        # True once a ``message_stop`` or ``error`` event has been seen: the stream ended properly.
        self.terminated = False

    def feed(self, chunk: bytes) -> bytes:
        """Return the complete events now available (possibly ``b""``)."""
        buffer = self._pending + chunk if self._pending else chunk
        end = _last_boundary(buffer)
        if end == 0:
            self._pending = buffer
            return b""
        complete, self._pending = buffer[:end], buffer[end:]
        if not self.terminated and _TERMINAL.search(complete):
            self.terminated = True
        return complete

    def flush(self) -> bytes:
        """At a clean end of stream: whatever is left (a final event without a blank line)."""
        rest, self._pending = self._pending, b""
        if rest and not self.terminated and _TERMINAL.search(rest):
            self.terminated = True
        return rest

    @property
    def pending(self) -> int:
        return len(self._pending)
