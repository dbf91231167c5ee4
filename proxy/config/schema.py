"""How a configuration file is read and checked, whatever its sections: bounded YAML (size, alias
expansion, nesting), frozen dataclasses built key by key with every problem named (file, key,
what was expected; a secret-bearing key's value never printed), and the field checks sections use
(``field(metadata=check(positive))``). The sections themselves are :mod:`proxy.config.settings` (the
proxy's) and :mod:`proxy.tenancy.tenants` (a policy's).
"""

from __future__ import annotations

import dataclasses
import os
import re
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

_T = TypeVar("_T")


# Config and policy files are operator input, but a hostile or broken one must not freeze the
# proxy (a SIGHUP reload) or flood a terminal: bounded size, bounded alias expansion, bounded
# nesting, every printed value cut short, at most MAX_ERRORS_SHOWN problems printed.
MAX_FILE_BYTES = 1024 * 1024
MAX_NODES = 100_000  # YAML nodes after alias expansion
MAX_DEPTH = 64
MAX_ERRORS_SHOWN = 50
MAX_SHOWN_CHARS = 80


def bounded_lines(lines: list[str]) -> str:
    """At most ``MAX_ERRORS_SHOWN`` lines, then how many more there were."""
    shown = lines[:MAX_ERRORS_SHOWN]
    if len(lines) > MAX_ERRORS_SHOWN:
        shown.append(f"... and {len(lines) - MAX_ERRORS_SHOWN} more problem(s) not shown")
    return "\n".join(shown)


class ConfigError(Exception):
    """An invalid configuration; ``errors`` lists every problem found, one line each (the text
    shows at most ``MAX_ERRORS_SHOWN`` of them)."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(bounded_lines([f"{source}: {e}" for e in errors]))


# A key whose name says it holds a credential: its value is never printed, whatever its type.
_SECRET_NAME = re.compile(r"(?i)key|token|secret|passw|credential|headers")
_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = MAX_SHOWN_CHARS
_REPR.maxother = MAX_SHOWN_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def secret_bearing(key: str) -> bool:
    """``key`` (a dotted path such as ``api_keys_sha256[0]``) names a secret-bearing key."""
    return any(_SECRET_NAME.search(part) for part in re.split(r"[.\[\]]", key) if part)


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"a value of type {type(value).__name__}"


def shown(value: Any, key: str = "") -> str:
    """``value`` as an error message may print it: never the value of a secret-bearing ``key``
    (only its kind), otherwise a repr cut short (bounded work, whatever the value's size)."""
    if secret_bearing(key):
        return f"{_kind(value)} (not shown: '{short_key(key)}' may hold a secret)"
    text = _REPR.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def short_key(key: object) -> str:
    """A key name as printed: cut short (a key is file content too)."""
    text = str(key)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def positive(value: float) -> str | None:
    return None if value > 0 else "a positive number"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else "a number >= 0 (0 = no limit)"


def port_number(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "a port number between 0 and 65535"


def ratio(value: float) -> str | None:
    return None if 0 < value < 1 else "a number between 0 and 1 (exclusive)"


def http_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return "a URL without query string or fragment"
    return None


def store_url(value: str) -> str | None:
    scheme = value.split(":", 1)[0]
    if scheme not in ("sqlite", "postgresql", "postgres"):
        return "a store URL: sqlite:///path/to/file.db or postgresql://..."
    return None


def check(fn: Any, doc: str = "") -> dict[str, Any]:
    """A field's metadata: the check its value must pass (and, with ``doc``, its description)."""
    return {"check": fn, "doc": doc} if doc else {"check": fn}


def doc(text: str) -> dict[str, Any]:
    """A field's metadata: its description (the configuration reference is made from it)."""
    return {"doc": text}


@dataclass(frozen=True, slots=True)
class OneOf:
    """A check: the value is one of ``choices`` (``fold``: in any case); the configuration
    reference lists the choices."""

    choices: tuple[str, ...]
    fold: bool = False

    def __call__(self, value: str) -> str | None:
        if self.fold:
            ok = value.upper() in {c.upper() for c in self.choices}
        else:
            ok = value in self.choices
        return None if ok else "one of " + ", ".join(self.choices)


def one_of(*choices: str, fold: bool = False) -> OneOf:
    """A check: the value is one of ``choices`` (``fold``: in any case)."""
    return OneOf(choices, fold)


@dataclass(frozen=True, slots=True)
class OrEmpty:
    """A check: the empty string (the key's "not set"), or a value ``inner`` accepts."""

    inner: Callable[[Any], str | None]

    def __call__(self, value: Any) -> str | None:
        return None if value == "" else self.inner(value)


def or_empty(inner: Callable[[Any], str | None]) -> OrEmpty:
    """A check: ``""`` (not set) or a value ``inner`` accepts."""
    return OrEmpty(inner)


def _type_name(tp: Any) -> str:
    names = {
        str: "a string", int: "an integer", float: "a number", bool: "true or false",
        type(None): "nothing (null)",
    }
    if tp in names:
        return names[tp]
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return "a list"


def _convert(tp: Any, value: Any, key: str, errors: list[str], base: Any = None) -> Any:
    """Convert one YAML value to ``tp``, appending an error naming ``key`` on mismatch."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, key, errors, base)
    origin = typing.get_origin(tp)
    if isinstance(tp, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None  # an optional key written as null: unset
        for arm in typing.get_args(tp):
            if arm is type(None):
                continue
            trial: list[str] = []
            converted = _convert(arm, value, key, trial)
            if not trial:
                return converted
        names = " or ".join(_type_name(arm) for arm in typing.get_args(tp))
        errors.append(f"key '{key}': expected {names}, got {value!r}")
        return None
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            errors.append(f"key '{key}': expected a list, got {type(value).__name__}")
            return ()
        return tuple(_convert(item_tp, v, f"{key}[{i}]", errors) for i, v in enumerate(value))
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        errors.append(f"key '{key}': expected {_type_name(tp)}, got {shown(value, key)}")
        return None
    return float(value) if tp is float else value


def _build(cls: type, data: Any, prefix: str, errors: list[str], base: Any = None) -> Any:
    """Build ``cls`` from a YAML mapping; keys absent from ``data`` keep ``base``'s values
    (nested sections merge key by key), or the defaults when there is no ``base``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        errors.append(
            f"key '{prefix or '<top level>'}': expected a mapping, got {shown(data, prefix)}"
        )
        return cls() if base is None else base
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("env")}
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = f"{prefix}.{short_key(raw_key)}" if prefix else short_key(raw_key)
        if raw_key not in known:
            expected = ", ".join(sorted(known))
            errors.append(f"key '{key}': unknown key (expected one of: {expected})")
            continue
        before = len(errors)
        default = known[raw_key].default
        # A nested section starts from its field's default (which may differ from its class's).
        nested_base = (
            getattr(base, raw_key)
            if base is not None
            else (default if dataclasses.is_dataclass(default) else None)
        )
        converted = _convert(hints[raw_key], value, key, errors, nested_base)
        if len(errors) > before:
            continue
        checked = known[raw_key].metadata.get("check")
        problem = checked(converted) if checked else None
        if problem:
            errors.append(f"key '{key}': expected {problem}, got {shown(value, key)}")
            continue
        values[raw_key] = converted
    return cls(**values) if base is None else dataclasses.replace(base, **values)


def build_section(
    cls: type[_T], data: object, prefix: str, errors: list[str], base: _T | None = None
) -> _T:
    """Validate one mapping into the frozen dataclass ``cls``, appending every problem to
    ``errors`` as ``key '<prefix>.<key>': expected ...``. With ``base``, absent keys keep its
    values (overrides). Never raises for bad data: the caller raises one :class:`ConfigError`."""
    built = _build(cls, data, prefix, errors, base)
    assert isinstance(built, cls)
    return built


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Read and parse one YAML file (safe loader); :class:`ConfigError` naming the file if not.

    Bounded: at most ``MAX_FILE_BYTES``, ``MAX_NODES`` nodes once aliases are expanded (a
    few-hundred-byte "billion laughs" is refused before anything walks it), ``MAX_DEPTH`` levels,
    no recursive alias."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError(source, [f"file larger than {MAX_FILE_BYTES} bytes: refused"])
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else None
        raise ConfigError(source, [f"cannot read the file: {reason or exc}"]) from None
    return parse_yaml(text, source)


_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, source: str = "<config>") -> Any:
    """Parse YAML text with the bounds of :func:`read_yaml`."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _expansion_problem(node)
        if problem:
            raise ConfigError(source, [problem])
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}not valid YAML ({short_key(problem)})"]) from None
    finally:
        loader.dispose()


def _expansion_problem(root: yaml.Node) -> str | None:
    """Why the document is refused (too many nodes once aliases are expanded, too deep, a
    recursive alias), or None. Each distinct node is sized once: the work is bounded by the
    file, not by the expansion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    class Refused(Exception):
        pass

    def size(node: yaml.Node, depth: int) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise Refused("a recursive alias (a node that contains itself): refused")
        if depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH} levels: refused")
        total = 1
        if isinstance(node, yaml.SequenceNode | yaml.MappingNode):
            open_nodes.add(id(node))
            children: list[yaml.Node] = (
                list(node.value)
                if isinstance(node, yaml.SequenceNode)
                else [n for pair in node.value for n in pair]
            )
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_NODES:
                    raise Refused(
                        f"more than {MAX_NODES} values once aliases are expanded"
                        " (an alias bomb?): refused"
                    )
            open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    try:
        size(root, 0)
    except Refused as exc:
        return str(exc)
    return None
