"""Limits that follow the model: the threshold and hard limit from its context window.

The provider refuses a request whose input plus ``max_tokens`` is over the model's context
window. The window itself is the catalogue's (:meth:`proxy.core.catalogue.Catalogue.window`:
the model's row, a config's ``models:`` entries first, the ``context-1m-2025-08-07`` beta in the
``anthropic-beta`` header where the row has a 1M window; a model nothing knows gets the default).

``compaction.threshold`` is a token count or a share of the window (``"40%"``);
``compaction.hard_limit`` is a token count, a share of the window, or ``"auto"`` (the default):
the window minus the request's ``max_tokens``, so the proxy refuses only what the provider would.
A threshold over the hard limit is lowered to it (compaction then starts where refusal would).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "AUTO",
    "Limits",
    "betas_of",
    "limit_problem",
    "resolve_limits",
]

AUTO = "auto"
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def betas_of(header: str | None) -> frozenset[str]:
    """The betas of an ``anthropic-beta`` header value (comma-separated)."""
    if not header:
        return frozenset()
    return frozenset(b.strip() for b in header.split(",") if b.strip())


def limit_problem(value: int | str, *, auto: bool) -> str | None:
    """What is wrong with a threshold / hard-limit value, or ``None``: a positive integer, a
    share of the window ``"N%"`` (0 < N <= 100), or (``auto``) the string ``"auto"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value > 0 else "a positive number of tokens"
    expected = (
        'a positive number of tokens, a share of the context window like "40%", or "auto"'
        if auto
        else 'a positive number of tokens or a share of the context window like "40%"'
    )
    if isinstance(value, str):
        if auto and value.strip() == AUTO:
            return None
        found = _PERCENT.match(value)
        if found and 0 < float(found.group(1)) <= 100:
            return None
    return expected


def _tokens(value: int | str, window: int) -> int:
    if isinstance(value, int):
        return value
    found = _PERCENT.match(value)
    if found is None:
        raise ValueError(f"not a token count or a share of the window: {value!r}")
    return max(1, int(window * float(found.group(1)) / 100))


@dataclass(frozen=True, slots=True)
class Limits:
    """The resolved figures for one request (tokens)."""

    context_window: int
    threshold: int
    hard_limit: int


def resolve_limits(
    threshold: int | str, hard_limit: int | str, window: int, max_tokens: object
) -> Limits:
    """The request's threshold and hard limit (see the module docstring). ``max_tokens``: the
    request's own (anything but a non-negative integer counts as 0)."""
    reserve = (
        max_tokens
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 0
        else 0
    )
    if isinstance(hard_limit, str) and hard_limit.strip() == AUTO:
        hard = max(1, window - reserve)
    else:
        hard = _tokens(hard_limit, window)
    return Limits(window, min(_tokens(threshold, window), hard), hard)
