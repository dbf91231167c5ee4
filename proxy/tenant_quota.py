"""The ``quota`` section of a tenant policy: budgets and rate limits (``proxy.core.quota``).

.. code-block:: yaml

    quota:
      requests_per_minute: 600          # 0 (the default) = no limit, for each key
      input_tokens_per_minute: 400000
      output_tokens_per_minute: 80000
      budget_usd: 250.0
      budget_period: month              # day | month (UTC)
      per_key:                          # each proxy key on its own (auth.mode: keys)
        requests_per_minute: 60
        budget_usd: 20.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, cast

from proxy.core.quota import Allowance, Quota

__all__ = ["QuotaFile", "build_quota"]

MAX_BUDGET_USD = 1e9


def _count(value: int) -> str | None:
    return None if 0 <= value <= 10**15 else "a whole number >= 0 (0 = no limit)"


def _usd(value: float) -> str | None:
    return None if 0 <= value <= MAX_BUDGET_USD else "a number of USD >= 0 (0 = no budget)"


def _period(value: str) -> str | None:
    return None if value in ("day", "month") else "one of day, month"


@dataclass(frozen=True, slots=True)
class AllowanceFile:
    requests_per_minute: int = field(default=0, metadata={"check": _count})
    input_tokens_per_minute: int = field(default=0, metadata={"check": _count})
    output_tokens_per_minute: int = field(default=0, metadata={"check": _count})
    budget_usd: float = field(default=0.0, metadata={"check": _usd})
    budget_period: str = field(default="month", metadata={"check": _period})


@dataclass(frozen=True, slots=True)
class QuotaFile:
    requests_per_minute: int = field(default=0, metadata={"check": _count})
    input_tokens_per_minute: int = field(default=0, metadata={"check": _count})
    output_tokens_per_minute: int = field(default=0, metadata={"check": _count})
    budget_usd: float = field(default=0.0, metadata={"check": _usd})
    budget_period: str = field(default="month", metadata={"check": _period})
    per_key: AllowanceFile = AllowanceFile()


def _allowance(raw: AllowanceFile | QuotaFile) -> Allowance:
    period = cast(Literal["day", "month"], raw.budget_period)
    return Allowance(
        raw.requests_per_minute,
        raw.input_tokens_per_minute,
        raw.output_tokens_per_minute,
        float(raw.budget_usd),
        period,
    )


def build_quota(raw: QuotaFile, mode: str, errors: list[str]) -> Quota | None:
    """The tenant's quota, ``None`` when it limits nothing (the request path then skips it)."""
    quota = Quota(_allowance(raw), _allowance(raw.per_key))
    if quota.per_key.active and mode != "keys":
        errors.append(
            "key 'quota.per_key': expected it only with auth.mode 'keys' (passthrough has no"
            " proxy keys), got limits"
        )
    return quota if quota.active else None
