"""Log lines that a client cannot forge, flood or use to drive a terminal.

* :func:`escape` makes client-supplied text safe in one log line: C0 and C1 control characters
  (CR, LF, ESC, ...), DEL, the Unicode line and paragraph separators and the bidirectional
  overrides become ``\\xHH`` / ``\\uHHHH``; the text is cut at ``limit`` characters.
* The formatters apply it to every record's message (one record = one line; a traceback follows
  on lines of its own, each indented, so a line starting at column 0 is always a real record):
  ``text`` (the default) or ``json`` (one JSON object per line: ``ts``, ``level``, ``logger``,
  ``message`` and, for an exception, ``exc``).
* :class:`RepeatLimiter` bounds repeats of one kind of line (a flood of malformed requests): at
  most ``burst`` lines per kind per window; the rest are counted and reported in one
  "N similar ... suppressed" line.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson

from proxy.logs import redact

# C0 (but TAB), DEL, C1, U+2028/2029 (line/paragraph separators), bidi embeddings/overrides and
# isolates, the BOM / zero-width no-break space.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
MAX_LOGGED_CHARS = 2000


def _hex(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """``text`` with every control / line-breaking character escaped, at most ``limit`` chars
    (then ``...[N more]``). Idempotent on its own output."""
    cut = ""
    if len(text) > limit:
        cut = f"...[{len(text) - limit} more]"
        text = text[:limit]
    return _UNSAFE.sub(_hex, text) + cut


def _traceback_lines(text: str) -> str:
    return "\n".join("    | " + escape(line, 10 * MAX_LOGGED_CHARS) for line in text.splitlines())


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger> <message>``, the message escaped to one line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message, 10 * MAX_LOGGED_CHARS)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _traceback_lines(super().formatException(ei))

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_text and not record.exc_text.startswith("    | "):
            record.exc_text = _traceback_lines(record.exc_text)
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": escape(record.getMessage(), 10 * MAX_LOGGED_CHARS),
        }
        exc = record.exc_text
        if record.exc_info and not exc:
            exc = self.formatException(record.exc_info)
        if exc:
            entry["exc"] = exc
        return orjson.dumps(entry).decode()


FORMATS = ("text", "json")


def setup(level: str, fmt: str = "text") -> None:
    """The root handler on stderr with the chosen format, credentials redacted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # Neither format shows where a line was logged from, nor its thread or process: records
    # skip the frame walk and those lookups (the logging docs' "Optimization" settings).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    redact.install()


class RepeatLimiter:
    """At most ``burst`` lines per kind per ``window`` seconds; the rest are counted.

    ``allow(kind, now)`` says whether to log this one; ``take_suppressed(now)`` returns, per
    kind whose window has ended, how many were held back (to report in one line). Not
    thread-safe: used on the event loop."""

    def __init__(self, burst: int = 5, window: float = 1.0) -> None:
        self.burst = burst
        self.window = window
        self._start: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._held: dict[str, int] = {}

    def allow(self, kind: str, now: float) -> bool:
        start = self._start.get(kind)
        if start is None or now - start >= self.window:
            self._start[kind] = now
            self._count[kind] = 0
        self._count[kind] += 1
        if self._count[kind] <= self.burst:
            return True
        self._held[kind] = self._held.get(kind, 0) + 1
        return False

    def take_suppressed(self, now: float) -> list[tuple[str, int, float]]:
        """``(kind, count, seconds)`` for each kind with lines held back in an ended window."""
        out: list[tuple[str, int, float]] = []
        for kind, held in list(self._held.items()):
            if now - self._start.get(kind, now) >= self.window:
                out.append((kind, held, self.window))
                del self._held[kind]
        return out
