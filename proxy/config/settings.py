"""Configuration: one YAML file, validated once at start-up into frozen dataclasses.

Every key has a default, so the proxy runs with no file at all. Unknown keys and wrong types are
errors that name the file, the key and what was expected. The environment is read here, by
:func:`config_path_from_env` (which file), :func:`admin_tokens_from_env` (an admin token for
the passthrough tenant: ``Config.admin_token_hashes``, never a file key) and
:func:`tracing_from_env` (the standard ``OTEL_*`` variables under ``tracing:``), when ``serve`` starts;
tenant policies read the variables they name in :func:`proxy.tenancy.tenants.load_tenancy`. How a file is
read and a section built and checked is :mod:`proxy.config.schema`; the sections are here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.config.schema import (
    ConfigError,
    build_section,
    check,
    doc,
    http_url,
    non_negative,
    one_of,
    port_number,
    positive,
    ratio,
    read_yaml,
    store_url,
)
from proxy.config.tracing_env import parse_pairs, sdk_disabled, tracing_values
from proxy.core.limits import limit_problem
from proxy.formats.bridging import path_problem

ENV_CONFIG = "CONTEXT_PROXY_CONFIG"
# An admin token for the passthrough tenant (the admin API and the console), as the token itself
# (only its SHA-256 is kept) or as that hash; either turns off the one-time console link.
ENV_ADMIN_TOKEN = "CONTEXT_PROXY_ADMIN_TOKEN"
ENV_ADMIN_TOKEN_SHA256 = "CONTEXT_PROXY_ADMIN_TOKEN_SHA256"
MIN_ADMIN_TOKEN_CHARS = 16


def _admin_port(value: int | None) -> str | None:
    return None if value is None else port_number(value)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = field(
        default="127.0.0.1",
        metadata=doc("The address the proxy listens on (`serve --host` overrides it)."),
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


UPSTREAM_FORMATS = ("anthropic", "bedrock", "vertex")


@dataclass(frozen=True, slots=True)
class BetaFieldsConfig:
    """The body fields one beta enables (``proxy.formats.bridging``): dropped with it."""

    beta: str = field(default="", metadata=check(lambda v: None if v.strip() else "a beta name"))
    fields: tuple[str, ...] = field(
        default=(),
        metadata=check(lambda v: next((p for p in map(path_problem, v) if p), None)),
    )


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Which platform a tenant's requests go to (``upstream:`` in the config and in a policy)."""

    # anthropic (the Messages API at upstream.base_url), bedrock (Bedrock Runtime), vertex
    format: str = field(
        default="anthropic",
        metadata=check(lambda v: None if v in UPSTREAM_FORMATS else "one of " + ", ".join(UPSTREAM_FORMATS)),
    )
    # another endpoint for the platform ("" = its public one: bedrock-runtime.<region>.amazonaws.com,
    # <location>-aiplatform.googleapis.com; upstream.base_url for anthropic)
    endpoint_url: str = field(default="", metadata=check(lambda v: None if v == "" else http_url(v)))
    # bedrock: the AWS region, the inference-profile geography ("us", "eu", "global"; "" = the
    # model id itself), and a named profile of the AWS shared files ("" = the default chain)
    region: str = ""
    profile_geo: str = ""
    aws_profile: str = ""
    # vertex: the Google Cloud project and location, and a credentials JSON file ("" =
    # application-default credentials)
    project: str = ""
    location: str = ""
    credentials_file: str = ""
    # the betas the platform accepts ([] = the built-in list of proxy.formats.bridging), and the
    # body fields a beta enables (before the built-in pairs)
    accepted_betas: tuple[str, ...] = ()
    beta_fields: tuple[BetaFieldsConfig, ...] = ()

    def problems(self, prefix: str) -> list[str]:
        """What the chosen format still needs."""
        out: list[str] = []
        if self.format == "bedrock" and not self.region:
            out.append(f"key '{prefix}.region': expected an AWS region with format bedrock, missing")
        if self.format == "vertex":
            for key in ("project", "location"):
                if not getattr(self, key):
                    out.append(f"key '{prefix}.{key}': expected a value with format vertex, missing")
        for i, entry in enumerate(self.beta_fields):
            if not entry.beta.strip():
                out.append(f"key '{prefix}.beta_fields[{i}].beta': expected a beta name, missing")
        return out


def target_of(upstream: UpstreamTarget) -> UpstreamTarget:
    """The platform part of ``upstream`` (an :class:`UpstreamConfig` is one, with more keys)."""
    return UpstreamTarget(**{f.name: getattr(upstream, f.name) for f in dataclasses.fields(UpstreamTarget)})


@dataclass(frozen=True, slots=True)
class UpstreamConfig(UpstreamTarget):
    base_url: str = field(default="https://api.anthropic.com", metadata=check(http_url))
    connect_timeout: float = field(default=10.0, metadata=check(positive))
    # Longest silence between two reads of the upstream response (SSE pings arrive every ~15 s).
    read_timeout: float = field(default=600.0, metadata=check(positive))
    # Keep-alive pool size for the one ClientSession.
    pool_size: int = field(default=512, metadata=check(positive))


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = field(default=32 * 1024 * 1024, metadata=check(positive))
    # Requests handled at once; beyond it the proxy answers 529 overloaded_error.
    max_concurrent_requests: int = field(default=4096, metadata=check(positive))
    # Slow and idle clients (proxy/server/http/connections.py): seconds to receive a complete
    # request head; longest silence while reading a body; keep-alive between requests; open client
    # connections (beyond it the longest-waiting connection without a request in progress is
    # closed, else the new one).
    header_timeout: float = field(default=10.0, metadata=check(positive))
    body_timeout: float = field(default=30.0, metadata=check(positive))
    idle_timeout: float = field(default=75.0, metadata=check(positive))
    max_connections: int = field(default=10_000, metadata=check(positive))
    # The body memo (proxy/core/reparse.py): the latest body of each conversation, parsed, so a
    # re-sent history is not parsed again. Bytes of body text it keeps (its parsed objects take
    # ~4-5x that in memory); 0 turns it off.
    body_memo_bytes: int = field(default=16 * 1024 * 1024, metadata=check(non_negative))


@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    # On SIGTERM: stop accepting, let in-flight requests finish for this long, then exit.
    grace_seconds: float = field(default=30.0, metadata=check(positive))


@dataclass(frozen=True, slots=True)
class StoreConfig:
    # Empty means "<state_dir>/context-proxy.db" (SQLite).
    url: str = field(default="", metadata=check(lambda v: None if v == "" else store_url(v)))


@dataclass(frozen=True, slots=True)
class SummaryConfig:
    model: str = "claude-haiku-4-5"
    max_tokens: int = field(default=2000, metadata=check(positive))
    timeout_seconds: float = field(default=60.0, metadata=check(positive))
    max_retries: int = 2
    # Replicas racing to summarise the same history: one holds a lease in the store and calls,
    # the others wait for its text; it renews the lease while calling, and a crashed holder's
    # lease expires after this many seconds.
    lease_seconds: float = field(default=15.0, metadata=check(positive))
    # Empty means the built-in structured hand-off prompt.
    prompt: str = ""
    # Tokens one summariser call may read; a larger removed region is summarised in parts, as
    # a chain of at most max_calls calls (each reads the previous call's summary).
    input_budget: int = field(default=24_000, metadata=check(positive))
    max_calls: int = field(default=6, metadata=check(positive))
    # who writes the summary: "proxy" (``model`` summarises a rendering of the removed turns) or
    # "provider" (the provider's on-demand compaction, beta compact-2026-09-04, on the request's
    # own model; its signed block leads the view; "proxy" is the fallback when it refuses)
    mode: str = field(
        default="proxy",
        metadata=check(lambda v: None if v in ("proxy", "provider") else '"proxy" or "provider"'),
    )


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    # The context_proxy_retrieve tool, offered once a forwarded view names a pointer the model
    # can redeem (a cut tool result's artifact, the transcript range a prune/summary removed).
    enabled: bool = True
    # Hidden rounds (extra upstream calls answering the tool) per client request.
    max_rounds: int = field(default=3, metadata=check(positive))
    # Characters one tool result returns: the default and the most a call may ask for.
    max_chars: int = field(default=40_000, metadata=check(positive))
    # While a streamed answer waits for a hidden round, a ping goes to the client this often.
    ping_seconds: float = field(default=5.0, metadata=check(positive))


@dataclass(frozen=True, slots=True)
class ReadToolConfig:
    name: str = ""
    path_key: str = "path"
    # Only calls whose input has command == this value are reads ("" = every call).
    command: str = ""


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    enabled: bool = True
    # tokens, or a share of the model's context window ("40%")
    threshold: int | str = field(
        default=80_000, metadata=check(lambda v: limit_problem(v, auto=False))
    )
    # tokens, a share of the window, or "auto": the window minus the request's max_tokens
    hard_limit: int | str = field(
        default="auto", metadata=check(lambda v: limit_problem(v, auto=True))
    )
    target_ratio: float = field(default=0.55, metadata=check(ratio))
    tool_result_cap: int = field(default=5_000, metadata=check(positive))
    keep_recent: int = field(default=6, metadata=check(positive))
    max_plans: int = field(default=10_000, metadata=check(positive))
    # Requests whose uncached part is larger than this are counted off the event loop.
    offload_bytes: int = field(default=256 * 1024, metadata=check(positive))
    summary: SummaryConfig = SummaryConfig()
    # Empty means the defaults: Read(file_path), str_replace_based_edit_tool/str_replace_editor
    # view(path), read_file(path).
    read_tools: tuple[ReadToolConfig, ...] = ()
    # The recent window shrinks (whole interactions) when it alone keeps the view over target.
    shrink_window: bool = True
    retrieval: RetrievalConfig = RetrievalConfig()


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # a glob on the request's model name (fnmatch: * ? [..]); entries are tried in order, before
    # the built-in table
    match: str = field(
        default="", metadata=check(lambda v: None if v.strip() else "a non-empty glob on the model name")
    )
    context_window: int = field(default=200_000, metadata=check(positive))
    # the window when the request carries the context-1m-2025-08-07 beta (0: no change)
    context_window_1m: int = field(
        default=0, metadata=check(lambda v: None if v >= 0 else "a positive number of tokens or 0 (no 1M window)")
    )
    # whether these models bind thinking blocks to their prefix: "prefix" (they do), "none"
    # (they do not), "auto" (the built-in table of proxy.core.thinking decides)
    thinking_binding: str = field(
        default="auto",
        metadata=check(lambda v: None if v in ("auto", "prefix", "none") else '"auto", "prefix" or "none"'),
    )


@dataclass(frozen=True, slots=True)
class ModelIdConfig:
    """One model's spellings (``proxy.core.model_ids``), before the built-in table."""

    anthropic: str = field(default="", metadata=check(lambda v: None if v.strip() else "a model id"))
    bedrock: str = ""  # "" = anthropic.<id>-v1:0
    vertex: str = ""  # "" = <name>@<date> for a dated id, the id otherwise
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = field(default="INFO", metadata=check(one_of("DEBUG", "INFO", "WARNING", "ERROR", fold=True)))
    # text, or json: one JSON object per line (proxy/logs/formatting.py)
    format: str = field(default="text", metadata=check(one_of("text", "json")))


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # passthrough: one tenant, the client's own provider key goes upstream (policies_dir holds at
    # most one policy file). keys: clients send proxy-issued keys, one policy file per tenant.
    mode: str = field(default="passthrough", metadata=check(one_of("passthrough", "keys")))


@dataclass(frozen=True, slots=True)
class KindRetention:
    """How long / how much of one kind of stored thing a tenant keeps (0 = no limit)."""

    max_age_days: float = field(default=0.0, metadata=check(non_negative))
    max_rows: int = field(default=0, metadata=check(non_negative))  # newest rows kept per tenant


@dataclass(frozen=True, slots=True)
class ArtifactRetention:
    max_age_days: float = field(default=90.0, metadata=check(non_negative))
    max_bytes: int = field(default=0, metadata=check(non_negative))  # per tenant


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """``retention:``: what the garbage collector deletes (proxy/server/maintenance/retention.py).
    The kinds can be overridden per tenant in its policy file; the scheduling keys are per
    process."""

    enabled: bool = True
    interval_seconds: float = field(default=3600.0, metadata=check(positive))
    batch_size: int = field(default=500, metadata=check(positive))
    lease_seconds: float = field(default=300.0, metadata=check(positive))
    plans: KindRetention = KindRetention(30.0, 100_000)
    summaries: KindRetention = KindRetention(30.0, 100_000)
    manifests: KindRetention = KindRetention(90.0, 100_000)
    calibration: KindRetention = KindRetention(90.0, 1_000)
    transcripts: KindRetention = KindRetention(90.0, 0)
    artifacts: ArtifactRetention = ArtifactRetention()
    usage_ledger: KindRetention = KindRetention(90.0, 0)
    source_audit: KindRetention = KindRetention(90.0, 0)


def _price_or_standard(value: float) -> str | None:
    return None if value >= 0 or value == -1 else "a number >= 0 (or -1: the standard multiplier)"


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    # One row per upstream call (usage, cost, compaction), written in the background.
    enabled: bool = True
    # Rows waiting for the store; beyond it new rows are dropped (and counted), never waited on.
    queue_size: int = field(default=10_000, metadata=check(positive))
    batch_size: int = field(default=500, metadata=check(positive))
    # A batch is written when it is full or this long after its first row.
    flush_seconds: float = field(default=0.5, metadata=check(positive))


@dataclass(frozen=True, slots=True)
class PriceConfig:
    # A model id or glob (fnmatch: claude-opus-4-5*); first match wins, before the built-ins.
    model: str = ""
    # USD per million tokens. The cache prices default to the provider's multipliers of
    # ``input`` (5m write 1.25x, 1h write 2x, read 0.1x) when left at -1.
    input: float = field(default=0.0, metadata=check(non_negative))
    output: float = field(default=0.0, metadata=check(non_negative))
    cache_write_5m: float = field(default=-1.0, metadata=check(_price_or_standard))
    cache_write_1h: float = field(default=-1.0, metadata=check(_price_or_standard))
    cache_read: float = field(default=-1.0, metadata=check(_price_or_standard))


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    # The operator console at /console/ (read-only; signed in with an admin token).
    enabled: bool = True
    # A console sign-in lasts this long (absolute, not sliding); sign-out ends it at once.
    session_ttl_seconds: int = field(default=8 * 3600, metadata=check(positive))


def _pairs(value: str) -> str | None:
    return None if parse_pairs(value) is not None else "key=value pairs separated by commas"


@dataclass(frozen=True, slots=True)
class TracingConfig:
    # OpenTelemetry traces over OTLP/HTTP (protobuf); off unless configured here or by the
    # standard OTEL_* variables (proxy/config/tracing_env.py; a key in this file wins over a variable).
    enabled: bool = False
    endpoint: str = field(default="http://localhost:4318/v1/traces", metadata=check(http_url))
    # Sent with every export (a collector's credentials): ``k1=v1,k2=v2``; never printed.
    headers: str = field(default="", repr=False, metadata=check(_pairs))
    service_name: str = "context-proxy"
    resource_attributes: str = field(default="", metadata=check(_pairs))
    # Message content (prompts, answers) on spans: never unless true.
    capture_content: bool = False
    # Spans waiting for export; beyond it new spans are dropped (and counted), never waited on.
    queue_size: int = field(default=2048, metadata=check(positive))
    batch_size: int = field(default=512, metadata=check(positive))
    # A batch leaves when full or this long after the previous one.
    flush_seconds: float = field(default=5.0, metadata=check(positive))
    # One export's deadline, retries included; then its spans are dropped (and counted).
    export_timeout: float = field(default=10.0, metadata=check(positive))
    # The exports' body: none or gzip.
    compression: str = field(default="none", metadata=check(one_of("none", "gzip")))


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
    models: tuple[ModelConfig, ...] = ()
    model_ids: tuple[ModelIdConfig, ...] = ()
    retention: RetentionConfig = RetentionConfig()
    ledger: LedgerConfig = LedgerConfig()
    prices: tuple[PriceConfig, ...] = ()
    console: ConsoleConfig = ConsoleConfig()
    tracing: TracingConfig = TracingConfig()
    # SHA-256 digests of admin tokens for the passthrough tenant, from the environment
    # (:func:`admin_tokens_from_env`); not a file key.
    admin_token_hashes: tuple[bytes, ...] = field(default=(), repr=False, metadata={"env": True})

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite:///{Path(self.state_dir) / 'context-proxy.db'}"

    def with_admin_tokens(self, hashes: tuple[bytes, ...]) -> Config:
        return dataclasses.replace(self, admin_token_hashes=hashes)

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
            errors.append(f"key 'models[{i}].match': expected a non-empty glob on the model name")
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


def config_path_from_env(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``--config`` wins; otherwise ``CONTEXT_PROXY_CONFIG``; otherwise no file (defaults)."""
    if explicit:
        return explicit
    env = os.environ if environ is None else environ
    return env.get(ENV_CONFIG) or None


_TOKEN_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)  # printable ASCII, no whitespace: a header value
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)


def admin_tokens_from_env(environ: Mapping[str, str] | None = None) -> tuple[bytes, ...]:
    """The SHA-256 of the passthrough tenant's admin token named by the environment:
    ``CONTEXT_PROXY_ADMIN_TOKEN`` (the token: hashed here, the value not kept) and/or
    ``CONTEXT_PROXY_ADMIN_TOKEN_SHA256`` (its hash). Unset or empty: none. :class:`ConfigError`
    for a value that cannot be one, never showing it."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    hashes: list[bytes] = []
    token = env.get(ENV_ADMIN_TOKEN, "")
    if token:
        if not _TOKEN_RE.fullmatch(token) or len(token) < MIN_ADMIN_TOKEN_CHARS:
            problems.append(
                f"variable {ENV_ADMIN_TOKEN}: expected at least {MIN_ADMIN_TOKEN_CHARS} printable"
                " ASCII characters without spaces (e.g. `openssl rand -hex 24`), got a value of"
                f" {len(token)} characters (not shown)"
            )
        else:
            hashes.append(hashlib.sha256(token.encode("ascii")).digest())
    digest = env.get(ENV_ADMIN_TOKEN_SHA256, "").strip()
    if digest:
        if not _SHA256_RE.fullmatch(digest):
            problems.append(
                f"variable {ENV_ADMIN_TOKEN_SHA256}: expected 64 hex digits, the SHA-256 of the"
                f' token (printf %s "$TOKEN" | sha256sum), got a value of {len(digest)}'
                " characters (not shown)"
            )
        elif bytes.fromhex(digest) not in hashes:
            hashes.append(bytes.fromhex(digest))
    if problems:
        raise ConfigError("<environment>", problems)
    return tuple(hashes)
