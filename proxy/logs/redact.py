"""Keep credentials out of logs, metrics and error text.

The proxy never logs headers or bodies; this is the safety net for everything else (exception
reprs from libraries, URLs, access-log lines). :class:`RedactingFilter` is installed on the root
logger's handlers by :func:`install`.
"""

from __future__ import annotations

import logging
import re

_PATTERNS = (
    # Anthropic-style keys, wherever they appear.
    re.compile(r"sk-ant-[A-Za-z0-9_\-]{4,}"),
    # Bearer / Basic credentials.
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}"),
    # header-ish "x-api-key: value" / "authorization=value" / "'x-api-key': 'value'".
    re.compile(
        r"(?i)(x-api-key|authorization|proxy-authorization|api[_-]?key)(['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]+"
    ),
)

REDACTED = "[REDACTED]"


def redact(text: str) -> str:
    text = _PATTERNS[0].sub(REDACTED, text)
    text = _PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _PATTERNS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


class RedactingFilter(logging.Filter):
    """Rewrites each record's final message with credentials removed."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if record.exc_info and record.exc_info[1] is not None:
            # Exception text is rendered later by the formatter; pre-render and clean it here
            # (kept apart from the message: the formatter lays a traceback out on its own lines).
            formatter = logging.Formatter()
            record.exc_text = redact(formatter.formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if cleaned != message or record.args:
            record.msg = cleaned
            record.args = None
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Attach the filter to every handler of ``logger`` (the root logger by default)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
