"""Limits that follow the model: its context window, and the threshold and hard limit from it.

The provider refuses a request whose input plus ``max_tokens`` is over the model's context
window. The window is 200,000 tokens for the current Claude models; a model that supports the
``context-1m-2025-08-07`` beta gets 1,000,000 when the request carries that beta (in the
``anthropic-beta`` header). The built-in table below says which; a config's ``models:`` entries
(a glob ``match`` on the model name, ``context_window``, optionally ``context_window_1m``) come
first, in their order; a model nothing matches gets ``DEFAULT_CONTEXT_WINDOW``.

``compaction.threshold`` is a token count or a share of the window (``"40%"``);
``compaction.hard_limit`` is a token count, a share of the window, or ``"auto"`` (the default):
the window minus the request's ``max_tokens``, so the proxy refuses only what the provider would.
A threshold over the hard limit is lowered to it (compaction then starts where refusal would).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "AUTO",
    "BETA_1M",
    "BUILTIN_MODELS",
    "DEFAULT_CONTEXT_WINDOW",
    "Limits",
    "ModelWindow",
    "betas_of",
    "context_window",
    "limit_problem",
    "resolve_limits",
]

AUTO = "auto"
BETA_1M = "context-1m-2025-08-07"
DEFAULT_CONTEXT_WINDOW = 200_000
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """The window of the models whose name matches ``match`` (a glob, ``fnmatch`` rules, case
    sensitive); ``context_window_1m``: the window with the 1M beta (``None``: the beta changes
    nothing for these models)."""

    match: str
    context_window: int
    context_window_1m: int | None = None

    def matches(self, model: str) -> bool:
        return fnmatch.fnmatchcase(model, self.match)


# Current Claude models (the SDK's model list, December 2026). The 1M beta: Sonnet 4 and later
# Sonnets, Opus 4.6 and later Opus models (as Claude Code's own table has it); none for Haiku,
# Fable and Mythos (unknown: add a ``models:`` entry when a provider says otherwise).
BUILTIN_MODELS: tuple[ModelWindow, ...] = (
    ModelWindow("claude-sonnet-4*", 200_000, 1_000_000),
    ModelWindow("claude-sonnet-5*", 200_000, 1_000_000),
    ModelWindow("claude-opus-4-6*", 200_000, 1_000_000),
    ModelWindow("claude-opus-4-7*", 200_000, 1_000_000),
    ModelWindow("claude-opus-4-8*", 200_000, 1_000_000),
    ModelWindow("claude-opus-5*", 200_000, 1_000_000),
    ModelWindow("claude-opus-4*", 200_000),
    ModelWindow("claude-haiku-*", 200_000),
    ModelWindow("claude-fable-*", 200_000),
    ModelWindow("claude-mythos-*", 200_000),
    ModelWindow("claude-3*", 200_000),
)


def betas_of(header: str | None) -> frozenset[str]:
    """The betas of an ``anthropic-beta`` header value (comma-separated)."""
    if not header:
        return frozenset()
    return frozenset(b.strip() for b in header.split(",") if b.strip())


def context_window(
    model: str, betas: Iterable[str] = (), overrides: Sequence[ModelWindow] = ()
) -> int:
    """The model's context window for a request with ``betas``."""
    wants_1m = BETA_1M in betas
    for entry in (*overrides, *BUILTIN_MODELS):
        if entry.matches(model):
            if wants_1m and entry.context_window_1m is not None:
                return entry.context_window_1m
            return entry.context_window
    return DEFAULT_CONTEXT_WINDOW


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
