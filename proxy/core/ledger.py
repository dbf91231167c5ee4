"""The usage ledger's figures, each defined once (pure: no I/O, no clock).

One ledger row per upstream call keeps the provider's ``usage`` exactly as returned, and the
figures the call is billed for (:class:`Usage`): the top-level ones, or, when the provider lists
``usage.iterations``, their sum (its own compaction is billed there and not in the top-level
figures; :mod:`proxy.core.provider_usage` defines it), with the compaction iterations' share kept
apart (``provider_compaction_*``). Everything else is derived here, and only here, from the
billed figures:

* **total input** = ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
  (what the model read; a missing figure counts as 0);
* **cache hit ratio** = ``cache_read_input_tokens / total input`` (``None`` when total input is 0);
* **cost** (USD) split four ways from a :class:`Price` (USD per million tokens):
  ``input`` = input_tokens x input price; ``cache_write`` = the 1h share
  (``cache_creation.ephemeral_1h_input_tokens``) x 1h write price plus the rest of
  ``cache_creation_input_tokens`` x 5m write price (5 minutes is the provider's default TTL, so
  creation without a split is priced as 5m; per call, ``max(0, creation - 1h share)`` is the 5m
  part); ``cache_read`` = cache_read_input_tokens x read
  price; ``output`` = output_tokens x output price. A model without a price has no cost (``None``,
  never 0);
* **compaction savings** = counterfactual cost - actual cost, where the counterfactual is the
  same call with the uncompacted request, sent with the client's own caching. Model: the tokens
  compaction removed, ``removed = (tokens_before - tokens_after) x total_input / tokens_after``
  (the proxy's estimate scaled to the provider's count of what was actually sent), would have
  been billed like the rest of the prompt the call sent: the call's cache hit ratio ``h`` of them
  at the cache-read price, the rest at the input price. Everything else (the kept prompt, the
  output) is the same in both worlds, so ``savings = removed x (h x read + (1 - h) x input)``.
  Why: the removed part is old history the client re-sends every turn, in the same cached prefix
  as what was kept, so the call's own hit ratio is the best evidence of how it would have been
  billed. What it leaves out: a turn that makes a new plan rewrites the cache (its cache writes
  are in the actual cost, its ``h`` is low), so savings on those turns are overstated by about
  the removed tokens x (input - read) price; later turns that reuse the plan read the compacted
  prefix from cache and are priced right. Calls without compaction figures save 0. Total input and
  ``h`` here are those of what the answer was sampled from: the billed figures minus the
  provider's compaction iterations;
* **provider compaction cost**: the compaction iterations' figures priced the same way (a share
  of the cost, already in it);
* **thinking blocks dropped**: the ``thinking_dropped`` entries of the answer's
  ``input_transformations`` (:mod:`proxy.core.provider_notes`).

The figures are linear in sums kept per model (:class:`Sums`), so the store aggregates in SQL
and :func:`price_sums` prices the groups; :func:`row_figures` prices one row the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol

from proxy.core.model_row import Price
from proxy.core.provider_notes import ProviderNotes
from proxy.core.provider_usage import (
    Usage,
    billing,
    cache_hit_ratio,
    merge_usage,
    total_input,
    usage_from,
)

__all__ = [
    "KINDS",
    "Cost",
    "LedgerEntry",
    "Price",
    "Pricing",
    "ProviderNotes",
    "RowFigures",
    "Sums",
    "Totals",
    "Usage",
    "billing",
    "cache_hit_ratio",
    "merge_usage",
    "price_sums",
    "row_sums",
    "total_input",
    "unpriced_note",
    "usage_from",
]

Kind = Literal["client", "summary", "retrieval"]
KINDS: tuple[Kind, ...] = ("client", "summary", "retrieval")
MILLION = 1_000_000

# -- prices ---------------------------------------------------------------------------------------


class Pricing(Protocol):
    """Where prices come from: :class:`proxy.core.catalogue.Catalogue` (its rows, a config's
    ``models:``/``prices:`` entries first). ``None``: the model is unpriced."""

    def price(self, model: str) -> Price | None: ...


# -- sums and what they cost ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cost:
    input: float = 0.0
    cache_write: float = 0.0
    cache_read: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.cache_write + self.cache_read + self.output

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.input + other.input,
            self.cache_write + other.cache_write,
            self.cache_read + other.cache_read,
            self.output + other.output,
        )

    def to_json(self) -> dict[str, float]:
        return {
            "input": self.input,
            "cache_write": self.cache_write,
            "cache_read": self.cache_read,
            "output": self.output,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True)
class Sums:
    """Additive figures of a group of rows of one model (what the store sums in SQL).

    ``removed_read`` / ``removed_uncached``: the tokens compaction removed, split by the call's
    cache hit ratio (see the module docstring), summed."""

    calls: int = 0
    client_calls: int = 0
    summary_calls: int = 0
    retrieval_calls: int = 0
    errors: int = 0
    input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_5m_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    compaction_events: int = 0
    summary_failures: int = 0
    removed_read: float = 0.0
    removed_uncached: float = 0.0
    # cache creation priced at the 5m price: per row, max(0, creation - its 1h share)
    priced_5m: int = 0
    # the provider's own compaction: its iterations (already counted in the figures above)
    provider_compactions: int = 0
    provider_compaction_input_tokens: int = 0
    provider_compaction_cache_creation_input_tokens: int = 0
    provider_compaction_cache_creation_1h_input_tokens: int = 0
    provider_compaction_cache_read_input_tokens: int = 0
    provider_compaction_output_tokens: int = 0
    priced_5m_provider_compaction: int = 0
    thinking_blocks_dropped: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Sums)))


SUM_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Sums))


def row_sums(
    *,
    kind: str,
    status: int,
    usage: Usage | None,
    tokens_before: int | None,
    tokens_after: int | None,
    plan: str | None,
    summary: str | None,
    compaction_id: str | None,
    provider_compaction: Usage | None = None,
    provider_compactions: int = 0,
    thinking_blocks_dropped: int = 0,
) -> Sums:
    """One row's :class:`Sums` (the store's SQL computes the same, column by column).
    ``usage``: the billed figures; ``provider_compaction``: their compaction iterations' share."""
    u = usage or Usage()
    c = provider_compaction or Usage()
    read = u.cache_read_input_tokens or 0
    # what the answer was sampled from: the billed figures minus the provider's compaction
    sent_read = read - (c.cache_read_input_tokens or 0)
    sent_total = total_input(usage) - total_input(provider_compaction)
    removed_read = removed_uncached = 0.0
    before, after = tokens_before or 0, tokens_after or 0
    if usage is not None and after > 0 and before > after:
        removed_read = (before - after) * sent_read / after
        removed_uncached = (before - after) * (sent_total - sent_read) / after
    return Sums(
        calls=1,
        client_calls=int(kind == "client"),
        summary_calls=int(kind == "summary"),
        retrieval_calls=int(kind == "retrieval"),
        errors=int(status >= 400),
        input_tokens=u.input_tokens or 0,
        cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
        cache_creation_5m_input_tokens=u.cache_creation_5m or 0,
        cache_creation_1h_input_tokens=u.cache_creation_1h or 0,
        cache_read_input_tokens=read,
        output_tokens=u.output_tokens or 0,
        tokens_before=before,
        tokens_after=after,
        compaction_events=int(plan == "new" and bool(compaction_id)),
        summary_failures=int(summary == "failed"),
        removed_read=removed_read,
        removed_uncached=removed_uncached,
        priced_5m=max(0, (u.cache_creation_input_tokens or 0) - (u.cache_creation_1h or 0)),
        provider_compactions=provider_compactions,
        provider_compaction_input_tokens=c.input_tokens or 0,
        provider_compaction_cache_creation_input_tokens=c.cache_creation_input_tokens or 0,
        provider_compaction_cache_creation_1h_input_tokens=c.cache_creation_1h or 0,
        provider_compaction_cache_read_input_tokens=c.cache_read_input_tokens or 0,
        provider_compaction_output_tokens=c.output_tokens or 0,
        priced_5m_provider_compaction=max(
            0, (c.cache_creation_input_tokens or 0) - (c.cache_creation_1h or 0)
        ),
        thinking_blocks_dropped=thinking_blocks_dropped,
    )


def cost_of(sums: Sums, price: Price) -> Cost:
    """The cost of ``sums`` (of one model) at ``price``. Creation beyond the reported 1h share is
    priced as 5m writes (the default TTL, and what a call without the split wrote)."""
    one_hour = sums.cache_creation_1h_input_tokens
    five_min = sums.priced_5m
    return Cost(
        input=sums.input_tokens * price.input / MILLION,
        cache_write=(five_min * price.cache_write_5m + one_hour * price.cache_write_1h) / MILLION,
        cache_read=sums.cache_read_input_tokens * price.cache_read / MILLION,
        output=sums.output_tokens * price.output / MILLION,
    )


def provider_compaction_cost_of(sums: Sums, price: Price) -> Cost:
    """The share of :func:`cost_of` that the provider's compaction iterations cost."""
    return Cost(
        input=sums.provider_compaction_input_tokens * price.input / MILLION,
        cache_write=(
            sums.priced_5m_provider_compaction * price.cache_write_5m
            + sums.provider_compaction_cache_creation_1h_input_tokens * price.cache_write_1h
        )
        / MILLION,
        cache_read=sums.provider_compaction_cache_read_input_tokens * price.cache_read / MILLION,
        output=sums.provider_compaction_output_tokens * price.output / MILLION,
    )


def savings_of(sums: Sums, price: Price) -> float:
    """Compaction savings of ``sums`` (of one model), USD (see the module docstring)."""
    return (sums.removed_read * price.cache_read + sums.removed_uncached * price.input) / MILLION


def unpriced_note(models: Sequence[str]) -> str | None:
    """What people are told about models without a price (``None``: there are none): the one
    wording the admin API gives and the CLI and the console show."""
    if not models:
        return None
    if len(models) == 1:
        return f"no price for {models[0]}: add it under prices: (its calls have no cost or savings)"
    return (
        f"no price for {', '.join(models)}: add them under prices:"
        " (their calls have no cost or savings)"
    )


@dataclass(frozen=True, slots=True)
class Totals:
    """Priced sums of any set of rows (several models). ``cost``/``savings`` cover the priced
    models only; ``unpriced_models`` names the others (their tokens are in the counts).
    ``priced``: whether any model with tokens had a price; when none had but some had tokens,
    the JSON's cost and savings are ``null`` (unknown), never 0."""

    sums: Sums = Sums()
    cost: Cost = Cost()
    savings: float = 0.0
    unpriced_models: tuple[str, ...] = ()
    provider_compaction_cost: Cost = Cost()  # the share of ``cost`` the provider's compaction cost
    priced: bool = False

    @property
    def total_input_tokens(self) -> int:
        s = self.sums
        return s.input_tokens + s.cache_read_input_tokens + s.cache_creation_input_tokens

    @property
    def tokens_saved(self) -> int:
        return self.sums.tokens_before - self.sums.tokens_after

    @property
    def tokens_saved_ratio(self) -> float | None:
        """The tokens compaction removed, as a share of the requests' tokens before it."""
        before = self.sums.tokens_before
        return self.tokens_saved / before if before > 0 else None

    @property
    def unknown_cost(self) -> bool:
        """Nothing priced, something unpriced: cost and savings are unknown."""
        return bool(self.unpriced_models) and not self.priced

    def to_json(self) -> dict[str, Any]:
        s = self.sums
        total = self.total_input_tokens
        out: dict[str, Any] = {
            name: getattr(s, name)
            for name in SUM_FIELDS
            if not name.startswith(("removed_", "priced_"))
        }
        unknown = self.unknown_cost
        out["total_input_tokens"] = total
        out["cache_hit_ratio"] = cache_hit_ratio(s.cache_read_input_tokens, total)
        out["tokens_saved"] = self.tokens_saved
        out["tokens_saved_ratio"] = self.tokens_saved_ratio
        out["cost_usd"] = None if unknown else self.cost.to_json()
        out["provider_compaction_cost_usd"] = (
            None if unknown else self.provider_compaction_cost.to_json()
        )
        out["savings_usd"] = None if unknown else self.savings
        out["unpriced_models"] = list(self.unpriced_models)
        out["unpriced_note"] = unpriced_note(self.unpriced_models)
        return out


def price_sums(by_model: Iterable[tuple[str, Sums]], prices: Pricing) -> Totals:
    """Price groups of rows, each of one model, and add them up."""
    sums, cost, compaction, savings = Sums(), Cost(), Cost(), 0.0
    unpriced: set[str] = set()
    priced = False
    for model, group in by_model:
        sums = sums + group
        price = prices.price(model)
        tokens = bool(
            group.input_tokens
            or group.output_tokens
            or group.cache_read_input_tokens
            or group.cache_creation_input_tokens
        )
        if price is None:
            if tokens:
                unpriced.add(model)
            continue
        priced = priced or tokens
        cost = cost + cost_of(group, price)
        compaction = compaction + provider_compaction_cost_of(group, price)
        savings += savings_of(group, price)
    return Totals(sums, cost, savings, tuple(sorted(unpriced)), compaction, priced)


# -- one row --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One upstream call, as the edge records it (the store adds ``id``)."""

    at: str  # ISO 8601, UTC, with the offset
    at_ms: int  # the same instant, milliseconds since the epoch
    tenant: str
    session: str | None
    model: str
    route: str
    kind: Kind
    status: int
    latency_ms: float
    request_id: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    layers: str | None = None
    plan: str | None = None
    summary: str | None = None
    compaction_id: str | None = None
    usage: Usage | None = None  # the billed figures (provider_usage.billing)
    provider_usage: Mapping[str, Any] | None = None  # the provider's object, as returned
    provider_compaction: Usage | None = None  # the compaction iterations' share of ``usage``
    provider_compactions: int = 0  # how many compaction iterations
    provider_notes: ProviderNotes | None = None
    agent: str | None = None

    def sums(self) -> Sums:
        return row_sums(
            kind=self.kind,
            status=self.status,
            usage=self.usage,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            plan=self.plan,
            summary=self.summary,
            compaction_id=self.compaction_id,
            provider_compaction=self.provider_compaction,
            provider_compactions=self.provider_compactions,
            thinking_blocks_dropped=(
                self.provider_notes.thinking_blocks_dropped if self.provider_notes else 0
            ),
        )

    def with_usage(self, raw: Mapping[str, Any] | None) -> LedgerEntry:
        """This row with the provider's ``usage`` object ``raw`` and what it bills."""
        billed = billing(raw)
        return replace(
            self,
            usage=billed.usage,
            provider_usage=raw,
            provider_compaction=billed.compaction,
            provider_compactions=billed.compactions,
        )


@dataclass(frozen=True, slots=True)
class RowFigures:
    """One row priced: ``None`` everywhere for a model without a price."""

    cost: Cost | None = None
    savings: float | None = None
    provider_compaction_cost: Cost | None = None  # None also when the call had no compaction


def row_figures(entry: LedgerEntry, prices: Pricing) -> RowFigures:
    """One row's cost, savings and provider compaction cost."""
    price = prices.price(entry.model)
    if price is None:
        return RowFigures()
    sums = entry.sums()
    compaction = (
        provider_compaction_cost_of(sums, price) if entry.provider_compaction is not None else None
    )
    return RowFigures(cost_of(sums, price), savings_of(sums, price), compaction)


def group_by_model(rows: Sequence[tuple[str, Sums]]) -> list[tuple[str, Sums]]:
    """Merge ``(model, sums)`` pairs of the same model (order of first appearance)."""
    merged: dict[str, Sums] = {}
    for model, sums in rows:
        merged[model] = merged.get(model, Sums()) + sums
    return list(merged.items())
