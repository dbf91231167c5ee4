"""Configuration: one YAML file, validated once at start-up into frozen dataclasses.

Every key has a default, so the proxy runs with no file at all. Unknown keys and wrong types are
errors that name the file, the key and what was expected. Environment variables are read in one
place only: :func:`config_path_from_env`.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

ENV_CONFIG = "CONTEXT_PROXY_CONFIG"

_T = TypeVar("_T")


class ConfigError(Exception):
    """An invalid configuration; ``errors`` lists every problem found, one line each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__("\n".join(f"{source}: {e}" for e in errors))


def _positive(value: float) -> str | None:
    return None if value > 0 else "a positive number"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "a port number between 0 and 65535"


def _ratio(value: float) -> str | None:
    return None if 0 < value < 1 else "a number between 0 and 1 (exclusive)"


def _http_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return "a URL without query string or fragment"
    return None


def _store_url(value: str) -> str | None:
    scheme = value.split(":", 1)[0]
    if scheme not in ("sqlite", "postgresql", "postgres"):
        return "a store URL: sqlite:///path/to/file.db or postgresql://..."
    return None


def _check(fn: Any) -> dict[str, Any]:
    return {"check": fn}


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = field(default=8080, metadata=_check(_port))


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    base_url: str = field(default="https://api.anthropic.com", metadata=_check(_http_url))
    connect_timeout: float = field(default=10.0, metadata=_check(_positive))
    # Longest silence between two reads of the upstream response (SSE pings arrive every ~15 s).
    read_timeout: float = field(default=600.0, metadata=_check(_positive))
    # Keep-alive pool size for the one ClientSession.
    pool_size: int = field(default=512, metadata=_check(_positive))


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = field(default=32 * 1024 * 1024, metadata=_check(_positive))
    # Requests handled at once; beyond it the proxy answers 529 overloaded_error.
    max_concurrent_requests: int = field(default=4096, metadata=_check(_positive))


@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    # On SIGTERM: stop accepting, let in-flight requests finish for this long, then exit.
    grace_seconds: float = field(default=30.0, metadata=_check(_positive))


@dataclass(frozen=True, slots=True)
class StoreConfig:
    # Empty means "<state_dir>/context-proxy.db" (SQLite).
    url: str = ""


@dataclass(frozen=True, slots=True)
class SummaryConfig:
    model: str = "claude-haiku-4-5"
    max_tokens: int = field(default=2000, metadata=_check(_positive))
    timeout_seconds: float = field(default=60.0, metadata=_check(_positive))
    max_retries: int = 2
    # Replicas racing to summarise the same history: one holds a lease in the store and calls,
    # the others wait for its text; it renews the lease while calling, and a crashed holder's
    # lease expires after this many seconds.
    lease_seconds: float = field(default=15.0, metadata=_check(_positive))
    # Empty means the built-in structured hand-off prompt.
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class ReadToolConfig:
    name: str = ""
    path_key: str = "path"
    # Only calls whose input has command == this value are reads ("" = every call).
    command: str = ""


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    enabled: bool = True
    threshold: int = field(default=80_000, metadata=_check(_positive))
    hard_limit: int = field(default=120_000, metadata=_check(_positive))
    target_ratio: float = field(default=0.55, metadata=_check(_ratio))
    tool_result_cap: int = field(default=5_000, metadata=_check(_positive))
    keep_recent: int = field(default=6, metadata=_check(_positive))
    max_plans: int = field(default=10_000, metadata=_check(_positive))
    # Requests whose uncached part is larger than this are counted off the event loop.
    offload_bytes: int = field(default=256 * 1024, metadata=_check(_positive))
    summary: SummaryConfig = SummaryConfig()
    # Empty means the defaults: Read(file_path), str_replace_based_edit_tool/str_replace_editor
    # view(path), read_file(path).
    read_tools: tuple[ReadToolConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = "INFO"


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # passthrough: one tenant, the client's own provider key goes upstream (policies_dir holds at
    # most one policy file). keys: clients send proxy-issued keys, one policy file per tenant.
    mode: str = "passthrough"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else "a number >= 0"


def _price_or_standard(value: float) -> str | None:
    return None if value >= 0 or value == -1 else "a number >= 0 (or -1: the standard multiplier)"


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    # One row per upstream call (usage, cost, compaction), written in the background.
    enabled: bool = True
    # Rows older than this are deleted (checked hourly); 0 keeps them for ever.
    retention_days: float = field(default=90.0, metadata=_check(_non_negative))
    # Rows waiting for the store; beyond it new rows are dropped (and counted), never waited on.
    queue_size: int = field(default=10_000, metadata=_check(_positive))
    batch_size: int = field(default=500, metadata=_check(_positive))
    # A batch is written when it is full or this long after its first row.
    flush_seconds: float = field(default=0.5, metadata=_check(_positive))


@dataclass(frozen=True, slots=True)
class PriceConfig:
    # A model id or glob (fnmatch: claude-opus-4-5*); first match wins, before the built-ins.
    model: str = ""
    # USD per million tokens. The cache prices default to the provider's multipliers of
    # ``input`` (5m write 1.25x, 1h write 2x, read 0.1x) when left at -1.
    input: float = field(default=0.0, metadata=_check(_non_negative))
    output: float = field(default=0.0, metadata=_check(_non_negative))
    cache_write_5m: float = field(default=-1.0, metadata=_check(_price_or_standard))
    cache_write_1h: float = field(default=-1.0, metadata=_check(_price_or_standard))
    cache_read: float = field(default=-1.0, metadata=_check(_price_or_standard))


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    # The operator console at /console/ (read-only; signed in with an admin token).
    enabled: bool = True
    # A console sign-in lasts this long (absolute, not sliding); sign-out ends it at once.
    session_ttl_seconds: int = field(default=8 * 3600, metadata=_check(_positive))


@dataclass(frozen=True, slots=True)
class Config:
    listen: ListenConfig = ListenConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    limits: LimitsConfig = LimitsConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    state_dir: str = "./state"
    store: StoreConfig = StoreConfig()
    policies_dir: str = ""
    auth: AuthConfig = AuthConfig()
    compaction: CompactionConfig = CompactionConfig()
    logging: LoggingConfig = LoggingConfig()
    ledger: LedgerConfig = LedgerConfig()
    prices: tuple[PriceConfig, ...] = ()
    console: ConsoleConfig = ConsoleConfig()

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite:///{Path(self.state_dir) / 'context-proxy.db'}"

    def with_listen(self, host: str | None, port: int | None) -> Config:
        listen = dataclasses.replace(
            self.listen,
            host=self.listen.host if host is None else host,
            port=self.listen.port if port is None else port,
        )
        return dataclasses.replace(self, listen=listen)


_EXTRA_CHECKS: dict[tuple[type, str], Any] = {
    (StoreConfig, "url"): lambda v: None if v == "" else _store_url(v),
    (AuthConfig, "mode"): lambda v: None
    if v in ("passthrough", "keys")
    else "one of passthrough, keys",
    (LoggingConfig, "level"): lambda v: None
    if v.upper() in ("DEBUG", "INFO", "WARNING", "ERROR")
    else "one of DEBUG, INFO, WARNING, ERROR",
}


def _type_name(tp: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
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
        errors.append(f"key '{key}': expected {_type_name(tp)}, got {value!r}")
        return None
    return float(value) if tp is float else value


def _build(cls: type, data: Any, prefix: str, errors: list[str], base: Any = None) -> Any:
    """Build ``cls`` from a YAML mapping; keys absent from ``data`` keep ``base``'s values
    (nested sections merge key by key), or the defaults when there is no ``base``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        errors.append(f"key '{prefix or '<top level>'}': expected a mapping, got {data!r}")
        return cls() if base is None else base
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = f"{prefix}.{raw_key}" if prefix else str(raw_key)
        if raw_key not in known:
            expected = ", ".join(sorted(known))
            errors.append(f"key '{key}': unknown key (expected one of: {expected})")
            continue
        before = len(errors)
        nested_base = None if base is None else getattr(base, raw_key)
        converted = _convert(hints[raw_key], value, key, errors, nested_base)
        if len(errors) > before:
            continue
        check = known[raw_key].metadata.get("check") or _EXTRA_CHECKS.get((cls, raw_key))
        problem = check(converted) if check else None
        if problem:
            errors.append(f"key '{key}': expected {problem}, got {value!r}")
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


def check_compaction(c: CompactionConfig, prefix: str, errors: list[str]) -> None:
    """Checks across the keys of a compaction section (after overrides are applied)."""
    if c.hard_limit < c.threshold:
        errors.append(
            f"key '{prefix}.hard_limit': expected a value >= {prefix}.threshold ({c.threshold}),"
            f" got {c.hard_limit}"
        )
    for i, tool in enumerate(c.read_tools):
        if not tool.name:
            errors.append(f"key '{prefix}.read_tools[{i}].name': expected a non-empty string")


def _cross_checks(config: Config, errors: list[str]) -> None:
    check_compaction(config.compaction, "compaction", errors)
    for i, price in enumerate(config.prices):
        if not price.model:
            errors.append(f"key 'prices[{i}].model': expected a model id or glob")


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate already-parsed YAML data; raise :class:`ConfigError` listing every problem."""
    errors: list[str] = []
    config = _build(Config, data, "", errors)
    if not errors:
        _cross_checks(config, errors)
    if errors:
        raise ConfigError(source, errors)
    assert isinstance(config, Config)
    return config


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Read and parse one YAML file (safe loader); :class:`ConfigError` naming the file if not."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else None
        raise ConfigError(source, [f"cannot read the file: {reason or exc}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}not valid YAML ({problem})"]) from None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Load and validate a YAML file; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    return parse_config(read_yaml(path), str(path))


def config_path_from_env(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``--config`` wins; otherwise ``CONTEXT_PROXY_CONFIG``; otherwise no file (defaults)."""
    if explicit:
        return explicit
    env = os.environ if environ is None else environ
    return env.get(ENV_CONFIG) or None
