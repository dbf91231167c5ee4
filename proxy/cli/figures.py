"""Figures as people read them: money rounded, counts grouped, shares in percent.

The admin API's JSON keeps the raw values (``5.9006546578888015``); what a person reads is
rounded here (the CLI) and by ``proxy/console/static/dom.js`` (the console), by the same rule:
cents from a dollar up, two significant digits below (``$0.052``, ``$0.00012``), never more than
six decimals. ``None`` (a figure that is not known) is a dash, never ``$0``.
"""

from __future__ import annotations

import math

__all__ = ["DASH", "count", "percent", "usd"]

DASH = "\u2013"  # an en dash: a figure that is not known
_MAX_DECIMALS = 6


def usd(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    size = abs(value)
    sign = "-" if value < 0 else ""
    if size >= 1 or size == 0:
        return f"{sign}${size:,.2f}"
    decimals = min(_MAX_DECIMALS, max(2, 1 - math.floor(math.log10(size))))
    text = f"{size:.{decimals}f}"
    if float(text) == 0:
        return f"{sign}<$0.{'0' * (_MAX_DECIMALS - 1)}1"
    return f"{sign}${text}"


def count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def percent(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio * 100:.1f}%"
