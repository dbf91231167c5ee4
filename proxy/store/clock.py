"""The time the store records rows at (``created_at``, ``stored_at``, ``applied_at``...).

Families call ``clock.now_iso()`` through this module, so a test that moves the store's time
replaces it here, once, for both backends.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["now_iso"]


def now_iso() -> str:
    """ISO 8601, UTC, microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
