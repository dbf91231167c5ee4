"""The provider's ``usage`` object: its figures, a stream's merge, and what a call is billed for
(pure: no I/O).

**Iterations.** With the provider's own compaction (and server-side tool loops, advisors,
fallbacks) ``usage`` carries ``iterations``: one entry per sampling step, each with its own
``input_tokens``, ``cache_creation_input_tokens`` (and ``cache_creation`` 5m/1h split),
``cache_read_input_tokens`` and ``output_tokens``, told apart by ``type`` (``message``,
``compaction``, ``advisor_message``, ``fallback_message``). A ``compaction`` entry's tokens are
*not* in the top-level figures (the SDK's ``BetaUsage.iterations`` docstring; the provider's
"Compaction at a token threshold" page, whose example has top-level 23,000 in / 1,000 out and a
compaction entry of 180,000 / 3,500 beside the message entry of 23,000 / 1,000); an on-demand
compaction answer has top-level figures of 0 and its whole cost in one compaction entry. Billing
is the sum of the iterations.

So a call is billed (:func:`billing`), figure by figure, for

    (the sum of the non-compaction entries, or the top-level figure when there is none)
    + the sum of the compaction entries

which is the sum of every entry when the provider lists its message entries (every token once:
never the top-level figures *and* the message entry that repeats them), and still counts the
top-level figures when a list holds only compaction entries. Without ``iterations`` (or with a
list holding no entry that reports a figure) the top-level figures are billed, as before.

Limit: an entry that names another model (an advisor, a fallback hop) is priced at the call's
model, like the rest of the call (the ledger prices per row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Billing",
    "Usage",
    "billing",
    "cache_hit_ratio",
    "has_compaction",
    "merge_usage",
    "total_input",
    "usage_from",
]

_SPLIT_KEYS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
COMPACTION = "compaction"


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage figures with the provider's meaning; ``None`` where it reported nothing."""

    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation_5m: int | None = None  # cache_creation.ephemeral_5m_input_tokens
    cache_creation_1h: int | None = None  # cache_creation.ephemeral_1h_input_tokens
    cache_read_input_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def has_split(self) -> bool:
        return self.cache_creation_5m is not None or self.cache_creation_1h is not None

    def to_json(self) -> dict[str, Any]:
        """The API's ``usage`` object: the provider's field names."""
        split = (
            {
                "ephemeral_5m_input_tokens": self.cache_creation_5m,
                "ephemeral_1h_input_tokens": self.cache_creation_1h,
            }
            if self.has_split
            else None
        )
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_creation": split,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
        }


def merge_usage(base: Mapping[str, Any] | None, update: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stream's usage: ``message_start``'s, then each ``message_delta``'s non-null figures
    (they are cumulative: the last one wins). Objects (``cache_creation``) merge key by key; a
    list (``iterations``) is the whole breakdown so far, so a later one replaces it whole (never
    merged entry by entry, never appended to). Returns a new dict; neither argument is changed."""
    merged: dict[str, Any] = dict(base) if isinstance(base, Mapping) else {}
    if isinstance(update, Mapping):
        for key, value in update.items():
            if value is None:
                continue
            if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = merge_usage(merged[key], value)
            elif isinstance(value, list):
                merged[key] = list(value)
            else:
                merged[key] = value
    return merged


def usage_from(raw: object) -> Usage | None:
    """The top-level figures of a provider ``usage`` object; ``None`` when it is not one."""
    if not isinstance(raw, Mapping):
        return None
    split = raw.get("cache_creation")
    split = split if isinstance(split, Mapping) else {}
    usage = Usage(
        input_tokens=_count(raw.get("input_tokens")),
        cache_creation_input_tokens=_count(raw.get("cache_creation_input_tokens")),
        cache_creation_5m=_count(split.get(_SPLIT_KEYS[0])),
        cache_creation_1h=_count(split.get(_SPLIT_KEYS[1])),
        cache_read_input_tokens=_count(raw.get("cache_read_input_tokens")),
        output_tokens=_count(raw.get("output_tokens")),
    )
    return None if usage == Usage() else usage


def total_input(usage: Usage | None) -> int:
    """input + cache read + cache creation (missing figures count as 0)."""
    if usage is None:
        return 0
    return (
        (usage.input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


def cache_hit_ratio(cache_read: int | float, total: int | float) -> float | None:
    """cache read / total input; ``None`` when nothing was read at all."""
    return None if total <= 0 else cache_read / total


# -- what a call is billed for ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Billing:
    """What one call is billed for (``usage``) and, of it, the provider's compaction's share."""

    usage: Usage | None = None
    compaction: Usage | None = None  # the sum of the compaction entries (None: there were none)
    compactions: int = 0  # how many compaction entries


def _entries(raw: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The iterations that report at least one figure (None: no such entry)."""
    iterations = raw.get("iterations")
    if not isinstance(iterations, list):
        return None
    entries = [e for e in iterations if isinstance(e, Mapping) and usage_from(e) is not None]
    return entries or None


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _sum(usages: Iterable[Usage | None]) -> Usage:
    total = Usage()
    for u in usages:
        if u is None:
            continue
        total = Usage(
            _add(total.input_tokens, u.input_tokens),
            _add(total.cache_creation_input_tokens, u.cache_creation_input_tokens),
            _add(total.cache_creation_5m, u.cache_creation_5m),
            _add(total.cache_creation_1h, u.cache_creation_1h),
            _add(total.cache_read_input_tokens, u.cache_read_input_tokens),
            _add(total.output_tokens, u.output_tokens),
        )
    return total


def _counted(usage: Usage) -> Usage:
    """The figures with a missing count as 0 (the split stays unknown when nobody reported it)."""
    return Usage(
        usage.input_tokens or 0,
        usage.cache_creation_input_tokens or 0,
        usage.cache_creation_5m,
        usage.cache_creation_1h,
        usage.cache_read_input_tokens or 0,
        usage.output_tokens or 0,
    )


def has_compaction(raw: object) -> bool:
    """Whether a ``usage`` object lists a compaction iteration."""
    if not isinstance(raw, Mapping):
        return False
    entries = _entries(raw)
    return entries is not None and any(e.get("type") == COMPACTION for e in entries)


def billing(raw: object) -> Billing:
    """What a call whose ``usage`` object is ``raw`` is billed for (see the module docstring)."""
    top = usage_from(raw)
    if not isinstance(raw, Mapping):
        return Billing()
    entries = _entries(raw)
    if entries is None:
        return Billing(top)
    compaction = [usage_from(e) for e in entries if e.get("type") == COMPACTION]
    others = [usage_from(e) for e in entries if e.get("type") != COMPACTION]
    sampled = _sum(others) if others else (top or Usage())
    compacted = _sum(compaction)
    return Billing(
        _counted(_sum((sampled, compacted))),
        _counted(compacted) if compaction else None,
        len(compaction),
    )
