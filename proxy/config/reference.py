"""The configuration reference, made from the sections themselves (pure: classes in, rows and
Markdown out).

Every key of a config or policy section carries its description in its field metadata
(``check(fn, doc="...")`` or ``doc("...")``, :mod:`proxy.config.schema`). :func:`rows` walks a
section class (nested sections, lists of mappings) into one :class:`Key` per key path with its
type, default, allowed values and description; :func:`undescribed` names the keys without a
description (a test fails on one); :func:`markdown` renders the rows grouped by section. The docs
site's configuration page is made from them at build time (``docs/hooks/reference.py``), so it
cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from proxy.config.schema import (
    OneOf,
    OrEmpty,
    http_url,
    non_negative,
    port_number,
    positive,
    ratio,
    store_url,
)

__all__ = ["Key", "cell", "markdown", "rows", "undescribed"]

# What the shared field checks accept, as the reference prints it (a check of its own is
# described in the key's text).
_ALLOWED: dict[Callable[..., Any], str] = {
    positive: "> 0",
    non_negative: ">= 0",
    port_number: "0 to 65535",
    ratio: "between 0 and 1 (exclusive)",
    http_url: "an `http://` or `https://` URL",
    store_url: "`sqlite:///<path>`, `postgresql://...`",
}


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a section, as the reference shows it."""

    path: str  # "compaction.summary.model", "models[].match"
    type: str  # "string", "integer", "mapping", "list of mappings", ...
    default: str  # as YAML would write it; "" for a section
    allowed: str  # the values the key's check accepts, when it says ("" otherwise)
    doc: str
    # the config section this policy key takes the keys of ("" when none)
    same_as: str = ""


def _item_type(tp: Any) -> Any:
    """The item type of ``tuple[X, ...]``, else None."""
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0]
    return None


def _type_name(tp: Any) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp in names:
        return names[tp]
    if isinstance(tp, types.UnionType):
        return " or ".join(_type_name(arm) for arm in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "mapping"
    item = _item_type(tp)
    if item is not None:
        if dataclasses.is_dataclass(item):
            return "list of mappings"
        return f"list of {_type_name(item)}s"
    return str(tp)


def _shown(value: Any) -> str:
    """A default as it would be written in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    if isinstance(value, str):
        if value == "":
            return '""'
        try:
            plain = yaml.safe_load(value) == value
        except yaml.YAMLError:
            plain = False
        return value if plain else json.dumps(value)
    if isinstance(value, tuple):
        if any(dataclasses.is_dataclass(v) for v in value):
            return "[...]"
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def _allowed(fn: Any) -> str:
    if isinstance(fn, OneOf):
        return ", ".join(f"`{c}`" for c in fn.choices) + (" (any case)" if fn.fold else "")
    if isinstance(fn, OrEmpty):
        inner = _allowed(fn.inner)
        return f'`""` or {inner}' if inner else ""
    try:
        return _ALLOWED.get(fn, "")
    except TypeError:  # an unhashable check
        return ""


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def rows(cls: type, refer: Mapping[type, str] | None = None) -> tuple[Key, ...]:
    """Every key of the section class ``cls``, nested sections and list items included (in
    field order). ``refer``: section classes documented elsewhere (the policy's ``compaction``
    takes the config's keys): one row naming that section, not its keys again."""
    out: list[Key] = []
    _walk(cls, "", None, refer or {}, out)
    return tuple(out)


def _walk(cls: type, prefix: str, base: Any, refer: Mapping[type, str], out: list[Key]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("env"):  # from the environment, not a file key
            continue
        path = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        default = getattr(base, f.name) if base is not None else _default(f)
        text = str(f.metadata.get("doc", "")).strip()
        item = _item_type(tp)
        if tp in refer:
            out.append(Key(path, "mapping", "", "", text, same_as=refer[tp]))
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.append(Key(path, "mapping", "", "", text))
            _walk(tp, path, default, refer, out)
        elif isinstance(item, type) and dataclasses.is_dataclass(item):
            out.append(Key(path, "list of mappings", _shown(default), "", text))
            _walk(item, path + "[]", None, refer, out)
        else:
            allowed = _allowed(f.metadata.get("check"))
            out.append(Key(path, _type_name(tp), _shown(default), allowed, text))


def undescribed(cls: type, refer: Mapping[type, str] | None = None) -> list[str]:
    """The key paths of ``cls`` whose field metadata has no description."""
    return [key.path for key in rows(cls, refer) if not key.doc]


def cell(text: str) -> str:
    """``text`` in a table cell: ``|`` escaped outside code spans (Markdown's table extension
    leaves a code span's pipes alone)."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _group(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def markdown(
    keys: Iterable[Key], *, level: int = 2, anchor_prefix: str = "", links: str = ""
) -> str:
    """``keys`` as Markdown: one heading per top-level section (``{#anchor_prefix + name}``),
    its description, then a table of its keys sorted by path (key, type, default, allowed values,
    description); the top-level scalar keys first, under "Top-level keys". ``links``: the
    anchor prefix a ``same_as`` row links to."""
    by_group: dict[str, list[Key]] = {}
    for key in keys:
        by_group.setdefault(_group(key.path), []).append(key)
    scalars = [
        group[0]
        for group in by_group.values()
        if len(group) == 1 and group[0].type not in ("mapping", "list of mappings")
    ]
    hashes = "#" * level
    parts: list[str] = []
    if scalars:
        parts.append(f"{hashes} Top-level keys {{#{anchor_prefix}top-level}}\n")
        parts.append(_table(scalars, links))
    for name in sorted(by_group):
        group = by_group[name]
        root = group[0]
        if root in scalars:
            continue
        parts.append(f"{hashes} `{name}` {{#{anchor_prefix}{name}}}\n")
        if root.type == "mapping":
            parts.append(_about(root, links) + "\n")
            group = group[1:]
        if group:
            parts.append(_table(group, links))
    return "\n".join(parts)


def _about(key: Key, links: str) -> str:
    if key.same_as:
        return (
            f"{key.doc} The keys of the configuration's"
            f" [`{key.same_as}`](#{links}{key.same_as}) section."
        )
    return key.doc


def _table(keys: list[Key], links: str) -> str:
    lines = [
        "| key | type | default | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for key in sorted(keys, key=lambda k: k.path):
        default = f"`{key.default}`" if key.default else ""
        lines.append(
            f"| `{key.path}` | {key.type} | {cell(default)} | {cell(key.allowed)}"
            f" | {cell(_about(key, links))} |"
        )
    return "\n".join(lines) + "\n"
