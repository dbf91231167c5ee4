"""The catalogue a configuration asks for: its ``models:`` entries (and the older ``model_ids:``
and ``prices:`` keys, read as entries after them) before the built-in rows.

Shared by the server, ``replay`` and ``context-proxy models``. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.config.model_entries import ModelConfig, ModelIdConfig, ModelPriceConfig, PriceConfig
from proxy.config.settings import Config
from proxy.core.catalogue import Catalogue, Entry, make_entry
from proxy.core.model_row import Price

__all__ = ["catalogue_of", "entries_of", "price_of_config"]

_BINDING = {"prefix": True, "none": False, "auto": None}


def price_of_config(p: ModelPriceConfig | PriceConfig) -> Price:
    """A configured price, a cache price left at -1 made the provider's usual multiple."""
    standard = Price.standard(p.input, p.output)
    return Price(
        p.input,
        standard.cache_write_5m if p.cache_write_5m < 0 else p.cache_write_5m,
        standard.cache_write_1h if p.cache_write_1h < 0 else p.cache_write_1h,
        standard.cache_read if p.cache_read < 0 else p.cache_read,
        p.output,
    )


def _model_entry(i: int, m: ModelConfig, key: str = "models") -> Entry:
    return make_entry(
        m.match.strip(),
        f"{key}[{i}]",
        aliases=tuple(m.aliases),
        bedrock=m.bedrock or None,
        vertex=m.vertex or None,
        foundry=m.foundry or None,
        context_window=m.context_window or None,
        context_window_1m=m.context_window_1m or None,
        max_output=m.max_output or None,
        price=price_of_config(m.price) if m.price is not None else None,
        binds_thinking=_BINDING[m.thinking_binding],
    )


def _id_entry(i: int, m: ModelIdConfig) -> Entry:
    """An older ``model_ids:`` entry, read as the ``models:`` entry it stands for."""
    as_model = ModelConfig(match=m.anthropic, aliases=m.aliases, bedrock=m.bedrock, vertex=m.vertex)
    return _model_entry(i, as_model, "model_ids")


def entries_of(
    models: Iterable[ModelConfig] = (),
    model_ids: Iterable[ModelIdConfig] = (),
    prices: Iterable[PriceConfig] = (),
) -> list[Entry]:
    """The entries, in the order they are tried: ``models:``, ``model_ids:``, ``prices:``."""
    return [
        *(_model_entry(i, m) for i, m in enumerate(models)),
        *(_id_entry(i, m) for i, m in enumerate(model_ids)),
        *(
            make_entry(p.model.strip(), f"prices[{i}]", price=price_of_config(p))
            for i, p in enumerate(prices)
        ),
    ]


def catalogue_of(config: Config) -> Catalogue:
    """The configuration's catalogue."""
    return Catalogue(entries_of(config.models, config.model_ids, config.prices))
