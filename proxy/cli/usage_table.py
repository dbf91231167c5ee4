"""``context-proxy admin usage``: what the usage ledger's figures say, as tables for people.

Pure: the admin API's answers (``/usage/summary``, ``/usage/sessions``) in, text out. The raw
figures are the API's (``--json`` prints them as they came); here money is rounded, counts
grouped, and a model without a price is named with the API's own note, never shown as $0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.cli.figures import DASH, count, percent, usd

__all__ = ["parse_when", "render"]

_DURATION = re.compile(r"(\d{1,6})([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
WHEN_HELP = (
    "an ISO 8601 time with an offset (2026-12-01T12:00:00Z), a date (2026-12-01, midnight UTC)"
    " or a time back from now (30m, 24h, 7d, 2w)"
)


def parse_when(text: str, now: datetime) -> datetime:
    """``--since`` / ``--until``: ``ValueError`` naming what is accepted."""
    value = text.strip()
    duration = _DURATION.fullmatch(value)
    if duration:
        amount, unit = duration.groups()
        return now - timedelta(**{_UNITS[unit]: int(amount)})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"expected {WHEN_HELP}, got {value!r}") from None
    if parsed.tzinfo is None:
        if len(value) != 10:  # a time without an offset: which zone is unknown
            raise ValueError(f"expected {WHEN_HELP}, got {value!r} (no offset: add Z)")
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _short_time(text: str | None) -> str:
    if not text:
        return DASH
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return text
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")


def _money(totals: Mapping[str, Any], value: float | None) -> str:
    """A sum of money, or why there is none (no model with tokens has a price)."""
    if value is None and totals.get("unpriced_models"):
        return "no price"
    return usd(value)


def _columns(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def totals_lines(t: Mapping[str, Any]) -> list[str]:
    cost = t.get("cost_usd") or {}
    rows = [
        ("requests", count(t.get("client_calls")),
         f"{count(t.get('errors'))} errors; {count(t.get('calls'))} upstream calls:"
         f" {count(t.get('summary_calls'))} summary, {count(t.get('retrieval_calls'))} retrieval"),
        ("tokens before", count(t.get("tokens_before")), "compaction's input (the proxy's count)"),
        ("tokens after", count(t.get("tokens_after")), "what was forwarded"),
        ("tokens saved", count(t.get("tokens_saved")), f"{percent(t.get('tokens_saved_ratio'))} of input"),
        ("compactions", count(t.get("compaction_events")),
         f"{count(t.get('summary_failures'))} summary failures"),
        ("input tokens", count(t.get("total_input_tokens")),
         f"uncached {count(t.get('input_tokens'))} · cache write"
         f" {count(t.get('cache_creation_input_tokens'))} · cache read"
         f" {count(t.get('cache_read_input_tokens'))} (the provider's count)"),
        ("cache hit ratio", percent(t.get("cache_hit_ratio")), "cache read / input tokens"),
        ("output tokens", count(t.get("output_tokens")), ""),
        ("cost", _money(t, cost.get("total") if cost else None),
         (f"input {usd(cost.get('input'))} · cache write {usd(cost.get('cache_write'))} · cache"
          f" read {usd(cost.get('cache_read'))} · output {usd(cost.get('output'))}") if cost else ""),
        ("savings", _money(t, t.get("savings_usd")),
         "what the uncompacted requests would have cost, minus what they cost"),
    ]
    lines = ["  " + line for line in _columns(rows, (False, True, False))]
    note = t.get("unpriced_note")
    if note:
        lines += ["", f"  {note}"]
    return lines


def sessions_lines(sessions: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    if not sessions:
        return []
    rows: list[tuple[str, ...]] = [
        ("session", "last activity", "requests", "tokens saved", "saved", "compactions", "cost", "savings")
    ]
    for s in sessions:
        cost = s.get("cost_usd") or {}
        rows.append((
            str(s.get("session")),
            _short_time(s.get("last_at")),
            count(s.get("client_calls")),
            count(s.get("tokens_saved")),
            percent(s.get("tokens_saved_ratio")),
            count(s.get("compaction_events")),
            _money(s, cost.get("total") if cost else None),
            _money(s, s.get("savings_usd")),
        ))
    shown = f"{len(sessions)} most recent of {total}" if total > len(sessions) else f"all {total}"
    return [f"Sessions ({shown}):", *("  " + line for line in _columns(
        rows, (False, False, True, True, True, True, True, True)
    ))]


def render(
    summary: Mapping[str, Any],
    sessions: Mapping[str, Any] | None,
    session: str | None = None,
) -> str:
    """The whole report: the range, the totals, then the sessions (when listed)."""
    scope = f"session {session} of tenant" if session else "tenant"
    lines = [
        f"Usage of {scope} {summary.get('tenant', '?')},"
        f" {_short_time(summary.get('since'))} to {_short_time(summary.get('until'))}",
        "",
        *totals_lines(summary.get("totals") or {}),
    ]
    if sessions is not None and sessions.get("sessions"):
        lines += ["", *sessions_lines(sessions["sessions"], int(sessions.get("total", 0)))]
    return "\n".join(lines)
