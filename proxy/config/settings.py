"""Configuration: one YAML file, validated once at start-up into frozen dataclasses.

Every key has a default, so the proxy runs with no file at all. Unknown keys and wrong types are
errors that name the file, the key and what was expected. What ``serve`` reads from the
environment (which file, the admin token, the store's password) is :mod:`proxy.config.environment`;
the standard ``OTEL_*`` variables are the base of ``tracing:`` (:func:`tracing_from_env`); tenant
policies read the variables they name in :func:`proxy.tenancy.tenants.load_tenancy`. How a file is
read and a section built and checked is :mod:`proxy.config.schema`; the sections are here, but
``upstream:`` (:mod:`proxy.config.upstream`), ``retention:`` (:mod:`proxy.config.retention`) and
``tracing:`` (:mod:`proxy.config.tracing`).
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
from proxy.config.retention import RetentionConfig
from proxy.config.schema import (
    ConfigError,
    build_section,
    check,
    doc,
    non_negative,
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



def _cache_bound(value: int) -> str | None:
    return None if value >= 0 else "a number >= 0 (0 keeps nothing)"


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata=check(
            positive,
            doc="Larger request bodies get 413 `request_too_large`, without contacting the upstream"
            " (32 MiB: the provider's own limit).",
        ),
    )
    max_concurrent_requests: int = field(
        default=4096,
        metadata=check(positive, doc="Requests handled at once; beyond it 529 `overloaded_error` with `retry-after`."),
    )
    header_timeout: float = field(
        default=10.0,
        metadata=check(
            positive,
            doc="Seconds to receive a complete request head, from a new connection's start or a"
            " kept-alive one's first byte; then 408 (if part of a head came) and the connection closes.",
        ),
    )
    body_timeout: float = field(
        default=30.0,
        metadata=check(
            positive,
            doc="Longest silence while reading a request body (not counted while the proxy itself is"
            " not reading); then the connection closes and the request is abandoned (nothing left upstream).",
        ),
    )
    idle_timeout: float = field(
        default=75.0,
        metadata=check(positive, doc="Keep-alive: an idle connection between requests closes after this many seconds."),
    )
    max_connections: int = field(
        default=10_000,
        metadata=check(
            positive,
            doc="Open client connections; one more closes the oldest connection with no request in"
            " progress (idle or still sending its head), or the new one when every connection is busy:"
            " a request in progress is never cut for room. Capped by the open-files limit, whose soft"
            " value is raised to the hard one at start.",
        ),
    )
    # The bounded caches (`proxy/core/bounded.py`): what the proxy keeps per session, conversation,
    # tenant or key, each bounded (least recently used out first), so that a replica that is never
    # restarted holds at most their sum whatever number of sessions passes through. A miss only
    # costs work, never another answer (docs/operations/memory.md).
    body_memo_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=check(
            _cache_bound,
            doc="The body memo (`proxy/core/reparse.py`): the latest body of each conversation (per"
            " tenant and credential) kept parsed, so the next turn parses only its new bytes. Bytes of"
            " body text kept; with its parsed objects it takes ~3.3x that in memory. A miss: the whole"
            " body parsed, validated and hashed again. `0` turns it off.",
        ),
    )
    token_memo_blocks: int = field(
        default=50_000,
        metadata=check(
            _cache_bound,
            doc="Token counts of content blocks, by content hash (~180 bytes each). A miss: the block"
            " is tokenised again. `0` turns it off.",
        ),
    )
    token_memo_messages: int = field(
        default=50_000,
        metadata=check(
            _cache_bound,
            doc="Token counts of whole messages, by their marker-free hash (~180 bytes each). A miss:"
            " the message is counted block by block (through the block memo). `0` turns it off.",
        ),
    )
    thinking_records: int = field(
        default=20_000,
        metadata=check(
            _cache_bound,
            doc="What each thinking block an answer brought was made under, on models that bind"
            " thinking to its prefix (~240 bytes each). A miss: the block is judged as one made"
            " elsewhere: stale when the proxy changed what precedes it, so it is dropped (or the"
            " provider asked to drop it) though it may have been valid. `0` keeps none.",
        ),
    )
    plan_cache_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata=check(
            _cache_bound,
            doc="Compaction plans kept in memory, as bytes of their JSON (their objects take ~3.8x"
            " that; `compaction.max_plans` bounds their number too; the conversation served last keeps"
            " its plans whatever their size). A miss: the conversation's plans are read from the store"
            " again before its next turn.",
        ),
    )
    durable_states: int = field(
        default=512,
        metadata=check(
            _cache_bound,
            doc="Sessions whose folded durable state the store keeps (~2.5 KB for a state of a few"
            " items). A miss: the session's whole durable history is read and folded again, instead of"
            " the rows after the cached one.",
        ),
    )
    transcript_exports: int = field(
        default=4096,
        metadata=check(
            _cache_bound,
            doc="Transcript files (a session's, or one agent's) whose length the JSONL export"
            " remembers as it left them (~680 bytes each). A miss: the export reads the file's last"
            " line back from the store and counts the file's lines before appending.",
        ),
    )
    source_checks: int = field(
        default=1024,
        metadata=check(
            _cache_bound,
            doc="Verified source pointers: a local artifact's or transcript's digest and excerpt, by"
            " the file's identity, and an object-store artifact's, by its ETag (up to ~4 KB each). A"
            " miss: the file (or object) is read and hashed again.",
        ),
    )
    calibration_keys: int = field(
        default=1024,
        metadata=check(
            _cache_bound,
            doc="Tenant and model pairs whose real/estimate token ratio the process keeps (~720 bytes"
            " each). A miss: the figure is read from the store again (the default ratio when it has"
            " none).",
        ),
    )


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
class PriceConfig(ModelPriceConfig):
    """The older ``prices:`` key, still read: each entry as a ``models:`` entry with a ``price``
    (these prices), after those of ``models:`` and ``model_ids:``."""

    model: str = field(
        default="",
        metadata=doc("A model id or glob (fnmatch: `claude-opus-4-5*`; required): a `models:` entry's `match`."),
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
