"""Configuration: one YAML file, validated once at start-up into frozen dataclasses.

Every key has a default, so the proxy runs with no file at all. Unknown keys and wrong types are
errors that name the file, the key and what was expected. What ``serve`` reads from the
environment (which file, the admin token, the store's password) is :mod:`proxy.config.environment`;
the standard ``OTEL_*`` variables are the base of ``tracing:`` (:func:`tracing_from_env`); tenant
policies read the variables they name in :func:`proxy.tenancy.policies.load_tenancy`. How a file is
read and a section built and checked is :mod:`proxy.config.schema`; the sections are here, but
``upstream:`` (:mod:`proxy.config.upstream`), ``limits:`` (:mod:`proxy.config.limits`),
``models:`` and its older keys (:mod:`proxy.config.model_entries`), ``retention:``
(:mod:`proxy.config.retention`) and ``tracing:`` (:mod:`proxy.config.tracing`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.config.environment import url_with_password
from proxy.config.limits import LimitsConfig
from proxy.config.model_entries import ModelConfig, ModelIdConfig, PriceConfig
from proxy.config.retention import RetentionConfig
from proxy.config.schema import (
    ConfigError,
    build_section,
    check,
    doc,
    one_of,
    or_empty,
    port_number,
    positive,
    ratio,
    read_yaml,
    store_url,
)
from proxy.config.tracing import TracingConfig
from proxy.config.tracing_env import sdk_disabled, tracing_values
from proxy.config.upstream import UpstreamConfig
from proxy.core.catalogue_data import SUMMARY_MODEL
from proxy.core.limits import limit_problem


def _admin_port(value: int | None) -> str | None:
    return None if value is None else port_number(value)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = field(
        default="127.0.0.1",
        metadata=doc(
            "The address the proxy listens on (`serve --host` overrides it); `0.0.0.0` in a container."
        ),
    )
    port: int = field(
        default=8080,
        metadata=check(
            port_number, doc="The client port: the API (`serve --port` overrides it; 0 = any free port)."
        ),
    )
    admin_host: str = field(
        default="",
        metadata=doc(
            "The admin listener's address (`\"\"` = `listen.host`); only with `listen.admin_port`."
        ),
    )
    admin_port: int | None = field(
        default=None,
        metadata=check(
            _admin_port,
            doc="A separate port for `/admin`, `/console` and `/metrics` (`serve --admin-port`"
            " overrides it; 0 = any free port): they are then served only there, the client port"
            " answers 404 for them, and the admin port serves nothing else; `/healthz` and"
            " `/readyz` are on both. Unset (the default): one port serves everything.",
        ),
    )

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.admin_host and self.admin_port is None:
            out.append("key 'listen.admin_host': expected listen.admin_port as well, missing")
        same_host = (self.admin_host or self.host) == self.host
        if self.admin_port is not None and self.admin_port == self.port != 0 and same_host:
            out.append(
                f"key 'listen.admin_port': expected a port other than listen.port ({self.port}),"
                f" got {self.admin_port}"
            )
        return out



@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    grace_seconds: float = field(
        default=30.0,
        metadata=check(
            positive,
            doc="On SIGTERM: stop accepting, let in-flight requests finish for this long, then end"
            " the streams still running (an SSE `overloaded_error`) and exit. Keep it below the"
            " orchestrator's stop timeout.",
        ),
    )


@dataclass(frozen=True, slots=True)
class StoreConfig:
    url: str = field(
        default="",
        metadata=check(
            or_empty(store_url),
            doc="`sqlite:///path/to/file.db` or `postgresql://user@host:5432/db` (replicas share one"
            " PostgreSQL); `\"\"` = `sqlite:///<state_dir>/context-proxy.db`. Keep the password out of"
            " the file: `CONTEXT_PROXY_STORE_PASSWORD` (or a file named by"
            " `CONTEXT_PROXY_STORE_PASSWORD_FILE`) gives it.",
        ),
    )


@dataclass(frozen=True, slots=True)
class SummaryConfig:
    model: str = field(default=SUMMARY_MODEL, metadata=doc("The model that writes L4 summaries (`mode: proxy`)."))
    max_tokens: int = field(default=2000, metadata=check(positive, doc="`max_tokens` of one summary call."))
    timeout_seconds: float = field(
        default=60.0, metadata=check(positive, doc="One summary call's deadline; then the pruned view is kept.")
    )
    max_retries: int = field(default=2, metadata=doc("Retries of a failed summary call (the SDK's retry rules)."))
    lease_seconds: float = field(
        default=15.0,
        metadata=check(
            positive,
            doc="Replicas racing to summarise the same history: one holds a lease in the store and"
            " calls, the others wait for its text; it renews the lease while calling, and a crashed"
            " holder's lease expires after this many seconds.",
        ),
    )
    prompt: str = field(default="", metadata=doc('The summary prompt; `""` = the built-in structured hand-off prompt.'))
    input_budget: int = field(
        default=24_000,
        metadata=check(
            positive,
            doc="Tokens one summary call may read (at least `max_tokens` + 200); a larger removed"
            " region is summarised in parts, as a chain of calls (each reads the previous summary).",
        ),
    )
    max_calls: int = field(
        default=6,
        metadata=check(
            positive,
            doc="Most calls in one compaction's chain; a region that needs more is rendered with"
            " smaller per-piece caps rather than dropping anything.",
        ),
    )
    mode: str = field(
        default="proxy",
        metadata=check(
            one_of("proxy", "provider"),
            doc="Who writes the L4 summary: `proxy` (`model` summarises the removed turns) or"
            " `provider` (the provider's on-demand compaction, beta `compact-2026-09-04`, on the"
            " request's own model; `proxy` is the fallback when it refuses).",
        ),
    )


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    enabled: bool = field(
        default=True,
        metadata=doc(
            "Offer the `context_proxy_retrieve` tool once a forwarded view names a pointer the model"
            " can redeem (a cut tool result's artifact, the transcript range a prune or summary removed)."
        ),
    )
    max_rounds: int = field(
        default=3,
        metadata=check(positive, doc="Hidden retrieval rounds (extra upstream calls) per client request."),
    )
    max_chars: int = field(
        default=40_000,
        metadata=check(positive, doc="Characters one tool result returns: the default and the most a call may ask for."),
    )
    ping_seconds: float = field(
        default=5.0,
        metadata=check(positive, doc="While a streamed answer waits for a hidden round, a `ping` goes to the client this often."),
    )


@dataclass(frozen=True, slots=True)
class ReadToolConfig:
    name: str = field(default="", metadata=doc("The tool's name (required)."))
    path_key: str = field(default="path", metadata=doc("The input key holding the file path."))
    command: str = field(
        default="",
        metadata=doc('Only calls whose input has `command` equal to this are reads (`""` = every call).'),
    )


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    enabled: bool = field(default=True, metadata=doc("`false` forwards every request uncompacted."))
    threshold: int | str = field(
        default=80_000,
        metadata=check(
            lambda v: limit_problem(v, auto=False),
            doc='Compact above this many (calibrated) tokens, or a share of the model\'s context window'
            ' written `"40%"` (lowered to the hard limit when above it).',
        ),
    )
    hard_limit: int | str = field(
        default="auto",
        metadata=check(
            lambda v: limit_problem(v, auto=True),
            doc="Still over this after every layer: 400 `prompt is too long`, without calling the"
            ' provider. `auto` = the model\'s window minus the request\'s `max_tokens` (what the provider'
            ' would refuse); or tokens, or `"95%"` of the window.',
        ),
    )
    target_ratio: float = field(
        default=0.55,
        metadata=check(ratio, doc="Once triggered, compact down to `threshold x target_ratio` (hysteresis: compactions stay rare)."),
    )
    tool_result_cap: int = field(
        default=5_000,
        metadata=check(positive, doc="L1: tool results over this many tokens keep a head and a tail, with a marker naming the full text."),
    )
    keep_recent: int = field(
        default=6,
        metadata=check(positive, doc="L3/L4: recent messages kept whole (fewer when they alone are over the target: `shrink_window`)."),
    )
    max_plans: int = field(default=10_000, metadata=check(positive, doc="Compaction plans remembered in-process."))
    offload_bytes: int = field(
        default=256 * 1024,
        metadata=check(positive, doc="Requests whose uncached part is larger than this are counted off the event loop."),
    )
    summary: SummaryConfig = field(default=SummaryConfig(), metadata=doc("L4: the summary of what prune removed."))
    read_tools: tuple[ReadToolConfig, ...] = field(
        default=(),
        metadata=doc(
            "L2: the tools whose calls read a file (a later read of the same path supersedes an"
            " earlier one). `[]` = `Read(file_path)`, `str_replace_based_edit_tool` /"
            " `str_replace_editor` `view(path)`, `read_file(path)`."
        ),
    )
    shrink_window: bool = field(
        default=True,
        metadata=doc(
            "The recent window shrinks (whole interactions, down to the latest assistant message)"
            " when it alone keeps the view over the target; `false` keeps `keep_recent` messages"
            " whatever they weigh."
        ),
    )
    retrieval: RetrievalConfig = field(
        default=RetrievalConfig(), metadata=doc("The `context_proxy_retrieve` tool: reading back what was cut.")
    )


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = field(
        default="INFO",
        metadata=check(one_of("DEBUG", "INFO", "WARNING", "ERROR", fold=True), doc="The log level."),
    )
    format: str = field(
        default="text",
        metadata=check(
            one_of("text", "json"),
            doc="`text` (`<time> <LEVEL> <logger> <message>`) or `json` (one object per line: `ts`,"
            " `level`, `logger`, `message`, `exc`). Control characters in a message are escaped either way.",
        ),
    )


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: str = field(
        default="passthrough",
        metadata=check(
            one_of("passthrough", "keys"),
            doc="`passthrough`: one tenant, the client's own provider credentials go upstream"
            " (`policies_dir` holds at most one policy file). `keys`: clients send proxy-issued keys,"
            " one policy file per tenant.",
        ),
    )


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    enabled: bool = field(
        default=True,
        metadata=doc("Record one usage-ledger row per upstream call (usage, cost, compaction), written in the background."),
    )
    queue_size: int = field(
        default=10_000,
        metadata=check(
            positive, doc="Rows waiting for the store; beyond it new rows are dropped (and counted), never waited on."
        ),
    )
    batch_size: int = field(default=500, metadata=check(positive, doc="Rows per write."))
    flush_seconds: float = field(
        default=0.5, metadata=check(positive, doc="A batch is written when full or this long after its first row.")
    )


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    enabled: bool = field(
        default=True, metadata=doc("The read-only operator console at `/console/` (signed in with an admin token).")
    )
    session_ttl_seconds: int = field(
        default=8 * 3600,
        metadata=check(positive, doc="A console sign-in lasts this long (absolute, not sliding); sign-out ends it at once."),
    )


@dataclass(frozen=True, slots=True)
class Config:
    listen: ListenConfig = field(default=ListenConfig(), metadata=doc("Where the proxy listens for clients."))
    upstream: UpstreamConfig = field(
        default=UpstreamConfig(),
        metadata=doc("Where requests go: the provider's API, or Bedrock, Vertex or Foundry (a tenant policy may choose another)."),
    )
    limits: LimitsConfig = field(
        default=LimitsConfig(), metadata=doc("Request sizes, concurrency, client connections and the body memo.")
    )
    shutdown: ShutdownConfig = field(default=ShutdownConfig(), metadata=doc("The drain on SIGTERM."))
    state_dir: str = field(
        default="./state",
        metadata=doc("Local state: the SQLite store file, artifacts and transcript exports (relative to the working directory)."),
    )
    store: StoreConfig = field(
        default=StoreConfig(),
        metadata=doc("The session store: durable state, transcripts, plans, summaries, the usage ledger, quota counters."),
    )
    policies_dir: str = field(
        default="",
        metadata=doc(
            "The tenant policies: one YAML file per tenant (keys, provider, sources, overrides, budgets"
            ' and rate limits); `""` = none. Relative to the working directory.'
        ),
    )
    auth: AuthConfig = field(default=AuthConfig(), metadata=doc("How clients are told apart."))
    compaction: CompactionConfig = field(
        default=CompactionConfig(),
        metadata=doc("When and how conversations are compacted (a tenant policy may override any key)."),
    )
    logging: LoggingConfig = field(default=LoggingConfig(), metadata=doc("Log lines."))
    models: tuple[ModelConfig, ...] = field(
        default=(),
        metadata=doc(
            "What the proxy knows of each model (platform ids, windows, prices, thinking binding), tried"
            " in order before its built-in catalogue, value by value (docs/guides/models.md;"
            " `context-proxy models` prints the result)."
        ),
    )
    model_ids: tuple[ModelIdConfig, ...] = field(
        default=(),
        metadata=doc(
            "Older key, still read as `models:` entries (after them): one model's Bedrock id (or"
            " inference profile, or ARN), Vertex name and aliases."
        ),
    )
    retention: RetentionConfig = field(
        default=RetentionConfig(),
        metadata=doc(
            "What the garbage collector deletes, by age and size, per kind (`0` = no limit; limits count"
            " per tenant; a tenant policy may override the kinds)."
        ),
    )
    ledger: LedgerConfig = field(default=LedgerConfig(), metadata=doc("The usage ledger: one row per upstream call."))
    prices: tuple[PriceConfig, ...] = field(
        default=(),
        metadata=doc(
            "Older key, still read as `models:` entries (after `models:` and `model_ids:`): prices in USD"
            " per million tokens (the usage ledger, savings and budgets use them)."
        ),
    )
    console: ConsoleConfig = field(default=ConsoleConfig(), metadata=doc("The operator console."))
    tracing: TracingConfig = field(
        default=TracingConfig(), metadata=doc("OpenTelemetry traces (the standard `OTEL_*` variables apply too).")
    )
    # SHA-256 digests of admin tokens for the passthrough tenant, from the environment
    # (:func:`admin_tokens_from_env`); not a file key.
    admin_token_hashes: tuple[bytes, ...] = field(default=(), repr=False, metadata={"env": True})
    # The store's password, from the environment (:func:`store_password_from_env`); not a file key.
    store_password: str = field(default="", repr=False, metadata={"env": True})

    @property
    def store_url(self) -> str:
        """The store to open: ``store.url`` (with the environment's password, when one was
        given), or SQLite under ``state_dir``. It may hold a password: never print it."""
        url = self.store.url or f"sqlite:///{Path(self.state_dir) / 'context-proxy.db'}"
        return url_with_password(url, self.store_password) if self.store_password else url

    def with_admin_tokens(self, hashes: tuple[bytes, ...]) -> Config:
        return dataclasses.replace(self, admin_token_hashes=hashes)

    def with_store_password(self, password: str) -> Config:
        """The store's password from the environment (``""``: none); :class:`ConfigError` when
        the store cannot take one (SQLite, or a URL that holds its own)."""
        if not password:
            return self
        config = dataclasses.replace(self, store_password=password)
        config.store_url  # noqa: B018 - raises now, at start-up, rather than when the store opens
        return config

    def with_listen(
        self, host: str | None, port: int | None, admin_port: int | None = None
    ) -> Config:
        listen = dataclasses.replace(
            self.listen,
            host=self.listen.host if host is None else host,
            port=self.listen.port if port is None else port,
            admin_port=self.listen.admin_port if admin_port is None else admin_port,
        )
        return dataclasses.replace(self, listen=listen)


def check_compaction(c: CompactionConfig, prefix: str, errors: list[str]) -> None:
    """Checks across the keys of a compaction section (after overrides are applied)."""
    if isinstance(c.hard_limit, int) and isinstance(c.threshold, int) and c.hard_limit < c.threshold:
        errors.append(
            f"key '{prefix}.hard_limit': expected a value >= {prefix}.threshold ({c.threshold}),"
            f" got {c.hard_limit}"
        )
    if c.summary.input_budget < c.summary.max_tokens + 200:
        errors.append(
            f"key '{prefix}.summary.input_budget': expected at least {prefix}.summary.max_tokens"
            f" + 200 ({c.summary.max_tokens + 200}: each call after the first reads the previous"
            f" summary), got {c.summary.input_budget}"
        )
    for i, tool in enumerate(c.read_tools):
        if not tool.name:
            errors.append(f"key '{prefix}.read_tools[{i}].name': expected a non-empty string")


def _cross_checks(config: Config, errors: list[str]) -> None:
    errors.extend(config.listen.problems())
    check_compaction(config.compaction, "compaction", errors)
    for i, model in enumerate(config.models):
        if not model.match.strip():  # an entry that left ``match`` out
            errors.append(f"key 'models[{i}].match': expected a model id or a non-empty glob on the model name")
        elif any(c in model.match for c in "*?[") and (
            model.aliases or model.bedrock or model.vertex or model.foundry
        ):
            errors.append(
                f"key 'models[{i}].match': expected a model id with aliases/bedrock/vertex/foundry"
                f" (a glob names no one model), got {model.match!r}"
            )
    errors.extend(config.upstream.problems("upstream"))
    for i, entry in enumerate(config.model_ids):
        if not entry.anthropic.strip():
            errors.append(f"key 'model_ids[{i}].anthropic': expected a model id, missing")
    for i, price in enumerate(config.prices):
        if not price.model:
            errors.append(f"key 'prices[{i}].model': expected a model id or glob")


def parse_config(data: Any, source: str = "<config>", base: Config | None = None) -> Config:
    """Validate already-parsed YAML data; raise :class:`ConfigError` listing every problem.
    With ``base`` (the environment's values), keys absent from ``data`` keep its values."""
    errors: list[str] = []
    config = build_section(Config, data, "", errors, base)
    if not errors:
        _cross_checks(config, errors)
    if errors:
        raise ConfigError(source, errors)
    assert isinstance(config, Config)
    return config


# the keys the tenant policies are read with: a problem there makes checking them meaningless
_POLICY_KEYS = re.compile(r"key '(?:auth|policies_dir|state_dir|<top level>)[.'\[]")


def check_config_file(path: str | os.PathLike[str]) -> tuple[Config | None, list[str], bool]:
    """``check-config``: every problem of the file (lines as :class:`ConfigError` prints them),
    the config its valid keys make (a bad key at its default, ``None`` when the file cannot be
    read), and whether the tenant policies can be checked with it (not when a key they are read
    with, ``auth``, ``policies_dir`` or ``state_dir``, is wrong)."""
    source = str(path)
    try:
        data = read_yaml(path)
    except ConfigError as exc:
        return None, [f"{exc.source}: {e}" for e in exc.errors], False
    errors: list[str] = []
    config = build_section(Config, data, "", errors)
    if not errors:  # across keys only once each key is valid (as parse_config)
        _cross_checks(config, errors)
    policies = not any(_POLICY_KEYS.search(e) for e in errors)
    return config, [f"{source}: {e}" for e in errors], policies


def load_config(
    path: str | os.PathLike[str] | None,
    *,
    env: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load and validate a YAML file; ``None`` gives the built-in defaults. With ``env``
    (``serve``), the ``OTEL_*`` variables (of ``environ``, else the process's) are the base of
    ``tracing:``: a key in the file wins."""
    base = tracing_from_env(environ) if env else None
    if path is None:
        config = base or Config()
    else:
        config = parse_config(read_yaml(path), str(path), base)
    if env and sdk_disabled(os.environ if environ is None else environ):
        # the SDK's own off switch, whatever the file says (the SDK would record nothing anyway)
        config = dataclasses.replace(config, tracing=dataclasses.replace(config.tracing, enabled=False))
    return config


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Config:
    """The defaults with the ``tracing:`` values the standard ``OTEL_*`` variables give
    (:mod:`proxy.config.tracing_env`); :class:`ConfigError` for a variable the proxy cannot honour."""
    env = os.environ if environ is None else environ
    values, problems = tracing_values(env)
    errors: list[str] = []
    tracing = build_section(TracingConfig, values, "tracing", errors)
    problems += [e.replace("key 'tracing.", "variable for 'tracing.") for e in errors]
    if problems:
        raise ConfigError("<environment>", problems)
    return Config(tracing=tracing)
