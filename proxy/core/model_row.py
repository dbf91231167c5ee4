"""What one row of the model catalogue holds: a model (:class:`Model`), its price
(:class:`Price`), a beta and the platforms that accept it (:class:`Beta`). Values only; the rows
are :mod:`proxy.core.catalogue_data`, the lookups :mod:`proxy.core.catalogue`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Beta", "Model", "Price"]


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float
    output: float

    @classmethod
    def standard(cls, input: float, output: float, cache_read: float | None = None) -> Price:
        """The provider's usual multipliers: 1.25x (5m write), 2x (1h write), 0.1x (read)."""
        return cls(
            input,
            round(input * 1.25, 9),
            round(input * 2, 9),
            round(input * 0.1, 9) if cache_read is None else cache_read,
            output,
        )


@dataclass(frozen=True, slots=True)
class Model:
    """One model's row. ``None``: not known (not published, or not on that platform)."""

    id: str  # the Claude API id: the name the proxy uses inside
    name: str = ""  # the display name
    aliases: tuple[str, ...] = ()  # other Claude API spellings (the undated alias)
    bedrock: str | None = None  # Bedrock's base model id (a profile puts a geography first)
    vertex: str | None = None
    foundry: str | None = None
    context_window: int | None = None
    context_window_1m: int | None = None  # with the context-1m beta (None: the beta changes nothing)
    max_output: int | None = None
    price: Price | None = None
    binds_thinking: bool | None = None
    source: str = ""  # where the values come from (pages, Claude Code's catalogue)
    note: str = ""  # what is derived, not published, or left out

    def spellings(self) -> tuple[str, ...]:
        names = (self.id, *self.aliases, self.bedrock, self.vertex, self.foundry)
        return tuple(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True, slots=True)
class Beta:
    """A beta (``anthropic-beta``), the body fields it enables (paths of
    :mod:`proxy.formats.bridging`: dropped with it), and the platforms that accept it, each with
    its evidence: a platform page, or what Claude Code itself sends in that platform's mode."""

    name: str
    fields: tuple[str, ...] = ()
    fields_source: str = ""
    accepted: Mapping[str, str] = field(default_factory=dict)  # platform -> its source
