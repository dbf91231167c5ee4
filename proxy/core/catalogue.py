"""The one model catalogue: what the proxy knows about each model, and who said so. Pure.

One row per model (:data:`proxy.core.catalogue_data.MODELS`, each citing its source): the Claude
API id and its aliases; the model's id on Amazon Bedrock (the base id; the inference profile is
a geography in front of it), Google Cloud Vertex AI and Microsoft Foundry, exactly as each
platform spells it; the context window (and the window with the ``context-1m-2025-08-07`` beta);
the most output tokens; the prices; whether it binds thinking blocks to their prefix. The betas
each platform accepts and the body fields each beta enables are rows too
(:data:`proxy.core.catalogue_data.BETAS`).

A configuration's ``models:`` entries (and the older ``model_ids:`` and ``prices:`` keys, read
as entries too) come first, value by value: an entry sets only the values it names, the row
gives the rest. An entry's ``match`` is a model id (it then names that model by any of its
spellings, and may give it new ones) or a glob on the model name (``claude-opus-*``: windows,
prices and binding for every model it matches).

Every consumer asks a :class:`Catalogue`: the platform formats (:meth:`anthropic`,
:meth:`bedrock`, :meth:`vertex`, :meth:`foundry`), the limits (:meth:`window`), the ledger and the
console (:meth:`price`), the thinking guard (:meth:`binds_thinking`), the platform upstreams'
``/v1/models`` (:meth:`listed`); ``context-proxy models`` prints :meth:`resolve` with each
value's origin. A model no row or entry knows gets the published id rules of
:mod:`proxy.core.platform_ids`, the default window, no price and no binding.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

from proxy.core import catalogue_data, platform_ids
from proxy.core.model_row import Model, Price

__all__ = [
    "BUILT_IN",
    "DEFAULT",
    "RULE",
    "Catalogue",
    "Entry",
    "Known",
    "Model",
    "Price",
    "Resolved",
    "built_in",
    "make_entry",
    "price_of",
]

T = TypeVar("T")
BUILT_IN = "built-in"
DEFAULT = "default"
RULE = "rule"  # a platform id made by the published rule: the catalogue does not know it
_GLOB = frozenset("*?[")
_MEMO = 10_000


@dataclass(frozen=True, slots=True)
class Entry:
    """A configured entry: ``values`` (a :class:`Model` whose ``id`` is ``match``; ``None``
    fields are not set) and where it was written (``models[2]``)."""

    match: str
    values: Model
    origin: str

    @property
    def is_glob(self) -> bool:
        return any(c in _GLOB for c in self.match)


@dataclass(frozen=True, slots=True)
class Known(Generic[T]):
    """A value and its origin: ``built-in``, ``config <key>[i]``, ``rule`` or ``default``."""

    value: T
    origin: str


@dataclass(frozen=True, slots=True)
class Resolved:
    """Everything the catalogue says of one model name."""

    name: str  # as asked
    id: str  # the Claude API id
    row: Model | None  # the built-in row
    display: Known[str]
    aliases: Known[tuple[str, ...]]
    bedrock: Known[str]
    vertex: Known[str]
    foundry: Known[str]
    context_window: Known[int]
    context_window_1m: Known[int | None]
    max_output: Known[int | None]
    price: Known[Price | None]
    binds_thinking: Known[bool]

    @property
    def known(self) -> bool:
        """A row or a configured exact entry names this model."""
        return self.row is not None or self.display.origin.startswith("config")


class Catalogue:
    """The built-in rows with a configuration's entries first (see the module docstring)."""

    def __init__(
        self,
        entries: Sequence[Entry] = (),
        rows: Sequence[Model] | None = None,
        default_window: int | None = None,
    ) -> None:
        self.rows = tuple(catalogue_data.MODELS if rows is None else rows)
        self.entries = tuple(entries)
        self.default_window = default_window or catalogue_data.DEFAULT_CONTEXT_WINDOW
        self._row_of: dict[str, Model] = {}  # the built-in rows by every spelling
        for row in reversed(self.rows):
            for name in row.spellings():
                self._row_of[name] = row
        self._id_of: dict[str, str] = {}  # every spelling -> the Claude API id
        for row in self.rows:
            for name in row.spellings():
                self._id_of.setdefault(name, row.id)
        self._exact: dict[str, list[Entry]] = {}  # id -> the exact entries naming it, in order
        self._globs = tuple(e for e in self.entries if e.is_glob)
        for entry in self.entries:
            if entry.is_glob:
                continue
            ident = self._id_of.get(entry.match, entry.match)
            self._exact.setdefault(ident, []).append(entry)
        claimed: dict[str, str] = {}
        for ident, named in self._exact.items():
            for entry in named:
                for name in entry.values.spellings():
                    claimed.setdefault(name, ident)
        self._id_of = {**self._id_of, **claimed}  # a configured spelling wins
        self._memo: dict[str, Resolved] = {}

    # -- what one name stands for ----------------------------------------------------------

    def anthropic(self, model: str) -> str:
        """The Claude API id of any spelling (a string nothing knows comes back unchanged)."""
        found = self._id_of.get(model)
        if found is not None:
            return found
        foundation = platform_ids.foundation_of(model)
        found = self._id_of.get(foundation)
        if found is not None:
            return found
        parsed = platform_ids.anthropic_of(model)
        if parsed is None:
            return model
        return self._id_of.get(parsed, parsed)

    def resolve(self, model: str) -> Resolved:
        """Every value for ``model`` with its origin (memoised, bounded)."""
        found = self._memo.get(model)
        if found is None:
            found = self._resolve(model)
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[model] = found
        return found

    def _resolve(self, model: str) -> Resolved:
        ident = self.anthropic(model)
        row = self._row_of.get(ident)
        applying = [
            *self._exact.get(ident, ()),
            *(e for e in self._globs if _matches(e.match, model, ident)),
        ]

        def pick(attr: str) -> Known[object] | None:
            for entry in applying:
                value = getattr(entry.values, attr)
                if value not in (None, (), ""):
                    return Known(value, f"config {entry.origin}")
            if row is not None and getattr(row, attr) not in (None, (), ""):
                return Known(getattr(row, attr), BUILT_IN)
            return None

        def stated(attr: str, default: object) -> Known[Any]:
            """A value whose absence from a row is the row's word (no 1M window, unpriced)."""
            found = pick(attr)
            if found is not None:
                return found
            return Known(default, BUILT_IN if row is not None else DEFAULT)

        def platform(attr: str, rule: str) -> Known[str]:
            found = pick(attr)
            return Known(str(found.value), found.origin) if found is not None else Known(rule, RULE)

        # the two windows come together: an entry that sets either decides both
        window: Known[Any] = Known(self.default_window, DEFAULT)
        window_1m: Known[Any] = Known(None, DEFAULT)
        sets = next((e for e in applying if e.values.context_window or e.values.context_window_1m), None)
        if sets is not None:
            origin = f"config {sets.origin}"
            window = Known(sets.values.context_window or self.default_window, origin)
            window_1m = Known(sets.values.context_window_1m, origin)
        elif row is not None:
            window = Known(row.context_window or self.default_window, BUILT_IN)
            window_1m = Known(row.context_window_1m, BUILT_IN)
        exact = self._exact.get(ident, [])
        display = pick("name")
        named = [*(e.values for e in exact), *([row] if row else [])]
        return Resolved(
            name=model,
            id=ident,
            row=row,
            display=Known(str(display.value), display.origin) if display else Known(
                ident, f"config {exact[0].origin}" if exact else DEFAULT
            ),
            aliases=Known(
                tuple(dict.fromkeys(a for values in named for a in values.aliases)),
                next(
                    (f"config {e.origin}" for e in exact if e.values.aliases),
                    BUILT_IN if row else DEFAULT,
                ),
            ),
            bedrock=platform("bedrock", platform_ids.bedrock_rule(ident)),
            vertex=platform("vertex", platform_ids.vertex_rule(ident)),
            foundry=platform("foundry", ident),
            context_window=window,
            context_window_1m=window_1m,
            max_output=stated("max_output", None),
            price=stated("price", None),
            binds_thinking=stated("binds_thinking", False),
        )

    # -- the questions consumers ask --------------------------------------------------------

    def bedrock(self, model: str, geography: str = "") -> str:
        """Bedrock's id for ``model``: an ARN or an id that carries a geography is sent as
        given; a bare Bedrock id, the catalogue's id or the rule's gets ``geography`` in front."""
        if platform_ids.is_arn(model) or platform_ids.carries_geography(model):
            return model
        if model.startswith("anthropic.") and platform_ids.is_bedrock_form(model):
            return platform_ids.with_geography(model, geography)
        return platform_ids.with_geography(self.resolve(model).bedrock.value, geography)

    def bedrock_foundation(self, model: str) -> str:
        """The foundation model id (count-tokens takes no inference profile)."""
        if platform_ids.is_arn(model) or platform_ids.is_bedrock_form(model):
            return platform_ids.foundation_of(model)
        return platform_ids.foundation_of(self.resolve(model).bedrock.value)

    def vertex(self, model: str) -> str:
        return self.resolve(model).vertex.value

    def foundry(self, model: str) -> str:
        return self.resolve(model).foundry.value

    def derived(self, model: str, platform: str) -> bool:
        """Whether ``model``'s id on ``platform`` was made by the rule (no row or entry knows it)."""
        if platform == "bedrock" and (
            platform_ids.is_arn(model) or platform_ids.is_bedrock_form(model)
        ):
            return False
        known: Known[str] = getattr(self.resolve(model), platform)
        return known.origin == RULE

    def window(self, model: str, betas: Iterable[str] = ()) -> int:
        """The context window of a request for ``model`` carrying ``betas``."""
        resolved = self.resolve(model)
        if resolved.context_window_1m.value is not None and catalogue_data.BETA_1M in betas:
            return resolved.context_window_1m.value
        return resolved.context_window.value

    def price(self, model: str) -> Price | None:
        return self.resolve(model).price.value

    def binds_thinking(self, model: str) -> bool:
        return self.resolve(model).binds_thinking.value

    def listed(self, platform: str | None = None) -> list[Resolved]:
        """The models the catalogue names (configured exact entries first, then the rows), once
        each; with ``platform``, those with a known id there (``/v1/models`` on that platform)."""
        idents = dict.fromkeys([*self._exact, *(row.id for row in self.rows)])
        out = [self.resolve(ident) for ident in idents]
        if platform is not None:
            out = [r for r in out if getattr(r, platform).origin != RULE]
        return out

    def priced(self) -> list[tuple[str, Known[Price]]]:
        """The prices in force: the configured globs' first (a pattern each), then every listed
        model's that has one."""
        out: list[tuple[str, Known[Price]]] = [
            (e.match, Known(e.values.price, f"config {e.origin}"))
            for e in self._globs
            if e.values.price is not None
        ]
        for resolved in self.listed():
            price = resolved.price
            if price.value is not None:
                out.append((resolved.id, Known(price.value, price.origin)))
        return out


def _matches(glob: str, model: str, ident: str) -> bool:
    return fnmatch.fnmatchcase(model, glob) or fnmatch.fnmatchcase(ident, glob)


def make_entry(match: str, origin: str, **values: object) -> Entry:
    """An :class:`Entry` of the values given (the others not set)."""
    known = {f.name for f in fields(Model)}
    unknown = set(values) - known
    if unknown:
        raise TypeError(f"not a model value: {', '.join(sorted(unknown))}")
    return Entry(match, replace(Model(match), **values), origin)  # type: ignore[arg-type]


_BUILT_IN_CATALOGUE: Catalogue | None = None


def built_in() -> Catalogue:
    """The catalogue of the built-in rows alone (made once)."""
    global _BUILT_IN_CATALOGUE
    if _BUILT_IN_CATALOGUE is None:
        _BUILT_IN_CATALOGUE = Catalogue()
    return _BUILT_IN_CATALOGUE


def price_of(model: str, catalogue: Catalogue | None = None) -> Price | None:
    """``model``'s price (USD per million tokens) in ``catalogue`` (the built-in one without);
    ``None``: unpriced."""
    return (catalogue or built_in()).price(model)
