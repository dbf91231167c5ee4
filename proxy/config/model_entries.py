"""The ``models:`` section's entries (:mod:`proxy.core.catalogue`: each overrides or adds to a
built-in row, per value), and the older ``model_ids:`` and ``prices:`` entries, still read as the
``models:`` entries they stand for (:mod:`proxy.config.models` merges them into the catalogue).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.schema import check, doc, non_negative, one_of


def _tokens_or_unset(value: int) -> str | None:
    return None if value >= 0 else "a positive number of tokens, or 0 (the catalogue's figure)"


def _price_or_standard(value: float) -> str | None:
    return None if value >= 0 or value == -1 else "a number >= 0 (or -1: the standard multiplier)"


@dataclass(frozen=True, slots=True)
class ModelPriceConfig:
    """A model's price, USD per million tokens; a cache price left at -1 is the provider's usual
    multiple of ``input``."""

    input: float = field(default=0.0, metadata=check(non_negative, doc="USD per million input tokens."))
    output: float = field(default=0.0, metadata=check(non_negative, doc="USD per million output tokens."))
    cache_write_5m: float = field(
        default=-1.0,
        metadata=check(_price_or_standard, doc="USD per million 5-minute cache-write tokens; -1 = 1.25 x `input`."),
    )
    cache_write_1h: float = field(
        default=-1.0,
        metadata=check(_price_or_standard, doc="USD per million 1-hour cache-write tokens; -1 = 2 x `input`."),
    )
    cache_read: float = field(
        default=-1.0,
        metadata=check(_price_or_standard, doc="USD per million cache-read tokens; -1 = 0.1 x `input`."),
    )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One ``models:`` entry (:mod:`proxy.core.catalogue`): tried in order before the built-in
    catalogue, value by value; a value left out is the catalogue's."""

    match: str = field(
        default="",
        metadata=check(
            lambda v: None if v.strip() else "a model id or a non-empty glob on the model name",
            doc="A model id (`claude-opus-4-8`: that model, by any of its spellings), or a glob on the"
            " model name (`claude-opus-*`, fnmatch: windows, prices and thinking binding only; required).",
        ),
    )
    aliases: tuple[str, ...] = field(
        default=(), metadata=doc("Other names clients use for this model (an id entry only).")
    )
    bedrock: str = field(
        default="",
        metadata=doc(
            "The model's Bedrock id: a base id (`anthropic.claude-opus-4-8`; `upstream.profile_geo` puts"
            " a geography in front), a cross-region profile (`eu.anthropic...`) or an ARN (both sent as"
            ' given); `""` = the catalogue\'s, else the published rule.'
        ),
    )
    vertex: str = field(
        default="",
        metadata=doc('The model\'s Vertex AI name; `""` = the catalogue\'s, else the published rule.'),
    )
    foundry: str = field(
        default="",
        metadata=doc('The model\'s Microsoft Foundry deployment name; `""` = the catalogue\'s, else the model id.'),
    )
    context_window: int = field(
        default=0,
        metadata=check(_tokens_or_unset, doc="The context window in tokens (0 = the catalogue's, else 200,000)."),
    )
    context_window_1m: int = field(
        default=0,
        metadata=check(
            _tokens_or_unset,
            doc="The window when the request carries the `context-1m-2025-08-07` beta (0 = the"
            " catalogue's; an entry that sets either window sets both).",
        ),
    )
    max_output: int = field(
        default=0,
        metadata=check(_tokens_or_unset, doc="The most output tokens (0 = the catalogue's); shown by `context-proxy models`."),
    )
    thinking_binding: str = field(
        default="auto",
        metadata=check(
            one_of("auto", "prefix", "none"),
            doc="Whether the model binds thinking blocks to their prefix: `prefix` (it does), `none`"
            " (it does not), `auto` (the catalogue says).",
        ),
    )
    price: ModelPriceConfig | None = field(
        default=None, metadata=doc("The model's price (USD per million tokens); absent = the catalogue's.")
    )


@dataclass(frozen=True, slots=True)
class ModelIdConfig:
    """The older ``model_ids:`` key, still read: each entry as the ``models:`` entry it stands
    for, after those of ``models:``."""

    anthropic: str = field(
        default="",
        metadata=check(lambda v: None if v.strip() else "a model id", doc="The model's Claude API id (required): a `models:` entry's `match`."),
    )
    bedrock: str = field(default="", metadata=doc("As `models[].bedrock`."))
    vertex: str = field(default="", metadata=doc("As `models[].vertex`."))
    aliases: tuple[str, ...] = field(default=(), metadata=doc("As `models[].aliases`."))


@dataclass(frozen=True, slots=True)
class PriceConfig(ModelPriceConfig):
    """The older ``prices:`` key, still read: each entry as a ``models:`` entry with a ``price``
    (these prices), after those of ``models:`` and ``model_ids:``."""

    model: str = field(
        default="",
        metadata=doc("A model id or glob (fnmatch: `claude-opus-4-5*`; required): a `models:` entry's `match`."),
    )
