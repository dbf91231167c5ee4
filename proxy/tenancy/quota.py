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
      keys:                             # these keys' own allowances, instead of per_key
        - key_sha256: 3dea9283...       # one of the tenant's api_keys_sha256
          requests_per_minute: 600
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from proxy.config.schema import check, doc, one_of
from proxy.core.quota import Allowance, Quota

__all__ = ["QuotaFile", "build_quota"]

MAX_BUDGET_USD = 1e9


def _count(value: int) -> str | None:
    return None if 0 <= value <= 10**15 else "a whole number >= 0 (0 = no limit)"


def _usd(value: float) -> str | None:
    return None if 0 <= value <= MAX_BUDGET_USD else "a number of USD >= 0 (0 = no budget)"


@dataclass(frozen=True, slots=True)
class AllowanceFile:
    """One allowance: the tenant's own, ``per_key``'s, or a listed key's."""

    requests_per_minute: int = field(
        default=0,
        metadata=check(
            _count,
            doc="Requests to `/v1/messages` per UTC minute (`count_tokens` and the passthrough routes"
            " are not counted); 0 = no limit.",
        ),
    )
    input_tokens_per_minute: int = field(
        default=0,
        metadata=check(
            _count,
            doc="Input tokens per UTC minute as the provider reports them: `input_tokens` +"
            " `cache_creation_input_tokens` (cache reads do not count); 0 = no limit.",
        ),
    )
    output_tokens_per_minute: int = field(
        default=0,
        metadata=check(
            _count,
            doc="Output tokens per UTC minute; a request reserves its `max_tokens` (capped at the"
            " limit) when admitted, settled with the real figure when the answer ends; 0 = no limit.",
        ),
    )
    budget_usd: float = field(
        default=0.0,
        metadata=check(
            _usd,
            doc="Spend per `budget_period`, in USD: every upstream call made for the tenant (its"
            " clients', the summary calls, hidden retrieval rounds) priced as the usage ledger prices"
            " it (a model without a price counts 0); 0 = no budget.",
        ),
    )
    budget_period: str = field(
        default="month",
        metadata=check(
            one_of("day", "month"), doc="`day` (UTC midnight to midnight) or `month` (the UTC calendar month)."
        ),
    )


@dataclass(frozen=True, slots=True)
class KeyAllowanceFile(AllowanceFile):
    key_sha256: str = field(
        default="",
        metadata=doc("One of this policy's `api_keys_sha256`, each once (never echoed in errors)."),
    )


@dataclass(frozen=True, slots=True)
class QuotaFile(AllowanceFile):
    per_key: AllowanceFile = field(
        default=AllowanceFile(),
        metadata=doc(
            "`auth.mode: keys`: what EACH proxy key of the tenant may use, on its own (the key's and"
            " the tenant's limits both apply)."
        ),
    )
    keys: tuple[KeyAllowanceFile, ...] = field(
        default=(),
        metadata=doc("These keys' own allowances, instead of `per_key` (`auth.mode: keys`)."),
    )


_HEX = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)


def _allowance(raw: AllowanceFile) -> Allowance:
    """The policy's allowance as the core's (the same five fields, by name)."""
    return Allowance(**{f.name: getattr(raw, f.name) for f in dataclasses.fields(Allowance)})


def build_quota(
    raw: QuotaFile, mode: str, api_keys_sha256: tuple[str, ...], errors: list[str]
) -> Quota | None:
    """The tenant's quota, ``None`` when it limits nothing (the request path then skips it).
    A ``keys`` entry names one of the tenant's own key hashes (never echoed: it may be a key)."""
    own = {h.lower() for h in api_keys_sha256}
    keys: dict[str, Allowance] = {}
    for i, entry in enumerate(raw.keys):
        digest = entry.key_sha256.lower()
        if not _HEX.fullmatch(digest) or digest not in own:
            errors.append(
                f"key 'quota.keys[{i}].key_sha256': expected one of this policy's"
                f" api_keys_sha256, got a value of {len(entry.key_sha256)} characters that is not"
                " (not shown)"
            )
        elif digest[:16] in keys:
            errors.append(f"key 'quota.keys[{i}].key_sha256': expected each key once, got a repeat")
        else:
            keys[digest[:16]] = _allowance(entry)
    quota = Quota(_allowance(raw), _allowance(raw.per_key), tuple(keys.items()))
    if quota.limits_keys and mode != "keys":
        errors.append(
            "key 'quota.per_key': expected it (and quota.keys) only with auth.mode 'keys'"
            " (passthrough has no proxy keys), got limits"
        )
    return quota if quota.active else None
