"""Tenant policy files: one YAML file per tenant in ``policies_dir`` (format:
``docs/guides/tenants.md``), read, checked (every problem of every file named, across files too:
overlapping roots and stores) and built into the :class:`~proxy.tenancy.tenants.Tenancy` the
server holds. A reload (SIGHUP) is :func:`load_tenancy` again.

Environment variables are read in one place: :func:`load_tenancy` (``environ`` for tests): a
tenant's provider key once, at load; no error message built here contains it, nor a value from a
hash or environment-variable-name field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.config.retention import RetentionConfig
from proxy.config.schema import (
    ConfigError,
    bounded_lines,
    build_section,
    check,
    doc,
    one_of,
    read_yaml,
    shown,
)
from proxy.config.settings import CompactionConfig, Config, check_compaction
from proxy.config.upstream import UpstreamTarget, target_of
from proxy.core.pointers import KINDS, is_valid_component
from proxy.sources.policy import SourcePolicy
from proxy.tenancy.quota import QuotaFile, build_quota
from proxy.tenancy.sources import (
    NO_OBJECT_STORE,
    NO_SIGNING,
    ObjectStoreFile,
    SigningFile,
    build_object_store,
    build_signing,
    overlapping_stores,
    read_env,
)
from proxy.tenancy.tenants import DEFAULT_TENANT, ProviderAuth, Tenancy, Tenant

__all__ = ["PolicyError", "PolicyFile", "load_tenancy"]

POLICY_SUFFIXES = (".yaml", ".yml")
MAX_NAME_LENGTH = 64

_HEX_DIGEST_RE = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Printable ASCII without whitespace: header values (a trailing newline from `$(cat file)` is an
# error) and session globs.
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)
_HASH_HINT = 'printf %s "$KEY" | sha256sum'
# a policy's upstream until the config's platform replaces it
_ANTHROPIC = UpstreamTarget()


_NAME_EXPECTED = (
    "a tenant name: [A-Za-z0-9][A-Za-z0-9._-]{0,63}, not ending in '.', not a Windows device name"
)


def _kinds(value: tuple[str, ...]) -> str | None:
    return None if set(value) <= KINDS else "a list of: artifact, transcript"


def _patterns(value: tuple[str, ...]) -> str | None:
    for pattern in value:
        if not pattern or not _PRINTABLE_RE.fullmatch(pattern):
            return "a list of non-empty glob patterns (printable ASCII, no spaces)"
    return None


def _absolute(value: str) -> str | None:
    return None if os.path.isabs(value) and "\x00" not in value else "an absolute path"


def _tenant_name(value: str) -> str | None:
    if is_valid_component(value) and len(value) <= MAX_NAME_LENGTH:
        return None
    return _NAME_EXPECTED


_CONFIG_DEFAULT_COMPACTION = CompactionConfig()
_CONFIG_DEFAULT_RETENTION = RetentionConfig()
_NO_QUOTA = QuotaFile()


@dataclass(frozen=True, slots=True)
class _ProviderFile:
    mode: str = field(
        default="",
        metadata=check(
            one_of("env", "passthrough"),
            doc="Required. `env`: the proxy sends the tenant's own provider key (from `api_key_env`) as"
            " `x-api-key` and removes the client's `Authorization`. `passthrough`: the client's own"
            " credentials go to the provider (in `keys` mode without the header that carried the proxy key).",
        ),
    )
    api_key_env: str = field(
        default="",
        metadata=doc(
            "`env` only: the environment variable holding the tenant's provider key, read when the"
            " policies are loaded (a restart reads a new value); never logged."
        ),
    )


@dataclass(frozen=True, slots=True)
class _SourcesFile:
    kinds: tuple[str, ...] = field(
        default=("transcript", "artifact"),
        metadata=check(_kinds, doc="The pointer kinds this tenant may resolve (`transcript`, `artifact`); `[]` = none."),
    )
    session_patterns: tuple[str, ...] = field(
        default=("*",),
        metadata=check(_patterns, doc="Shell globs over the whole session id: the sessions whose pointers resolve."),
    )
    transcript_root: str = field(
        default="",
        metadata=check(
            _absolute,
            doc="An absolute directory for transcript exports; left out: `<state_dir>/tenants/<name>/transcripts`"
            " (`keys`) or `<state_dir>/sources/transcripts` (`passthrough`). No two tenants' roots may"
            " overlap.",
        ),
    )
    artifact_root: str = field(
        default="",
        metadata=check(
            _absolute,
            doc="An absolute directory for cut tool results; left out: `<state_dir>/tenants/<name>/artifacts`"
            " (`keys`) or `<state_dir>/sources/artifacts` (`passthrough`).",
        ),
    )
    object_store: ObjectStoreFile = field(
        default=NO_OBJECT_STORE,
        metadata=doc("Artifacts in an S3-compatible bucket instead of `artifact_root` (needs `signing`)."),
    )
    signing: SigningFile = field(
        default=NO_SIGNING, metadata=doc("The keys that sign manifest entries of the artifacts written.")
    )


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """One tenant policy file (``policies_dir/*.yaml``)."""

    name: str = field(
        default="",
        metadata=check(
            _tenant_name,
            doc="Required: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`, not ending in `.`; unique across files,"
            " ignoring case (it keys the tenant's stored state).",
        ),
    )
    api_keys_sha256: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "The SHA-256 (64 hex digits) of each proxy-issued key this tenant's clients send"
            " (`x-api-key`, else `api-key`, else `Authorization: Bearer`); `keys` mode only. Every hash appears once"
            " across all files."
        ),
    )
    provider: _ProviderFile = field(
        default=_ProviderFile(), metadata=doc("How this tenant's requests authenticate to the provider.")
    )
    sources: _SourcesFile = field(
        default=_SourcesFile(), metadata=doc("Which source pointers this tenant may resolve, and where its sources live.")
    )
    compaction: CompactionConfig = field(
        default=_CONFIG_DEFAULT_COMPACTION,  # replaced by the config's section
        metadata=doc(
            "Overrides of the configuration's compaction: keys left out keep the config's values,"
            " nested sections merge key by key, lists replace."
        ),
    )
    admin_tokens_sha256: tuple[str, ...] = field(
        default=(),
        metadata=doc("The SHA-256 of each admin token of this tenant (the admin API and the console)."),
    )
    retention: RetentionConfig = field(
        default=_CONFIG_DEFAULT_RETENTION,  # replaced by the config's section
        metadata=doc(
            "Overrides of the configuration's retention kinds, and `enabled` (`false`: the collector"
            " leaves this tenant alone); the schedule keys are the process's (an error here)."
        ),
    )
    quota: QuotaFile = field(default=_NO_QUOTA, metadata=doc("Budgets and rate limits (`0` = no limit)."))
    upstream: UpstreamTarget = field(
        default=_ANTHROPIC,  # replaced by the config's platform
        metadata=doc(
            "Where this tenant's requests go: the platform keys of the configuration's `upstream`"
            " (not `base_url` nor the timeouts). Keys left out keep the config's, unless `format` names"
            " another platform: then they start from the defaults."
        ),
    )


# --- loading ------------------------------------------------------------------------------------


class PolicyError(ConfigError):
    """Invalid tenant policies: ``errors`` lists every problem, each line naming its own file
    (a policy file, or the config for ``auth.mode`` / ``policies_dir``)."""

    def __init__(self, source: str, lines: list[str]) -> None:
        super().__init__(source, lines)
        self.args = (bounded_lines(lines),)


def load_tenancy(
    config: Config, *, environ: Mapping[str, str] | None = None, source: str = "<config>"
) -> Tenancy:
    """Load and validate every policy file of ``config.policies_dir`` for ``config.auth.mode``.

    Raises :class:`PolicyError` (a :class:`ConfigError`) listing every problem found, each naming
    the file, the key and what was expected; ``source`` names the config file in problems with
    ``auth.mode`` or ``policies_dir``. Provider keys come from ``environ`` (default: the process
    environment), read once, here. A reload is this call again.
    """
    env = os.environ if environ is None else environ
    problems: list[str] = []
    mode = config.auth.mode
    if mode not in ("passthrough", "keys"):
        problems.append(f"{source}: key 'auth.mode': expected one of passthrough, keys, got {shown(mode)}")
        raise PolicyError(source, problems)
    state_dir = os.path.abspath(config.state_dir)
    files = _policy_files(config.policies_dir, source, problems)
    loaded: list[Tenant] = []
    for path in files:
        try:
            data = read_yaml(path)
        except ConfigError as exc:
            problems.extend(f"{exc.source}: {e}" for e in exc.errors)
            continue
        errors: list[str] = []
        tenant = _tenant(data, path, config, mode, state_dir, env, errors)
        problems.extend(f"{path}: {e}" for e in errors)
        if tenant is not None:
            loaded.append(tenant)
    if mode == "passthrough" and len(files) > 1:
        names = ", ".join(Path(f).name for f in files)
        problems.append(
            f"{source}: key 'auth.mode': expected 'keys' when policies_dir holds more than one"
            f" policy file ({len(files)}: {names}), got 'passthrough'"
        )
    else:  # (several passthrough files would clash on the shared default roots: noise)
        _check_across_files(loaded, problems)
    if mode == "keys" and not files and not problems:
        problems.append(
            f"{source}: key 'policies_dir': expected a directory holding at least one policy file"
            f" (*.yaml) with auth.mode 'keys', got {shown(config.policies_dir)}"
        )
    if problems:
        raise PolicyError(source, problems)
    if mode == "keys":  # every tenant's admin tokens are in its own policy
        return Tenancy("keys", tuple(loaded), None)
    default = loaded[0] if loaded else _builtin_default(config, state_dir)
    extra = tuple(h for h in config.admin_token_hashes if h not in default.admin_token_hashes)
    if extra:  # the environment's admin token (proxy.config.environment.admin_tokens_from_env)
        default = replace(default, admin_token_hashes=default.admin_token_hashes + extra)
    return Tenancy("passthrough", (default,), default)


def _builtin_default(config: Config, state_dir: str) -> Tenant:
    base = os.path.join(state_dir, "sources")
    return Tenant(
        name=DEFAULT_TENANT,
        api_key_hashes=(),
        provider=ProviderAuth("passthrough"),
        sources=SourcePolicy(
            KINDS, ("*",), os.path.join(base, "transcripts"), os.path.join(base, "artifacts")
        ),
        compaction=config.compaction,
        admin_token_hashes=(),
        upstream=target_of(config.upstream),
    )


def _policy_files(policies_dir: str, source: str, problems: list[str]) -> list[str]:
    """The policy files, in name order: ``*.yaml`` / ``*.yml``, not hidden, not in subfolders."""
    if not policies_dir:
        return []
    try:
        entries = sorted(Path(policies_dir).iterdir())
    except OSError as exc:
        problems.append(
            f"{source}: key 'policies_dir': expected a readable directory, got {shown(policies_dir)}"
            f" ({exc.strerror or type(exc).__name__})"
        )
        return []
    return [
        str(p)
        for p in entries
        if p.suffix in POLICY_SUFFIXES and not p.name.startswith(".") and p.is_file()
    ]


def _tenant(
    data: Any,
    path: str,
    config: Config,
    mode: str,
    state_dir: str,
    env: Mapping[str, str],
    errors: list[str],
) -> Tenant | None:
    """One policy file's tenant, or ``None`` with its problems appended to ``errors``."""
    raw = build_section(
        PolicyFile,
        data,
        "",
        errors,
        PolicyFile(
            compaction=config.compaction,
            retention=config.retention,
            upstream=_upstream_base(data, config),
        ),
    )
    errors.extend(raw.upstream.problems("upstream"))
    _require(data, errors)
    _process_wide_retention(data, errors)
    api_keys = _hashes(raw.api_keys_sha256, "api_keys_sha256", errors)
    admin_tokens = _hashes(raw.admin_tokens_sha256, "admin_tokens_sha256", errors)
    if mode == "passthrough":
        if raw.api_keys_sha256:
            errors.append(
                "key 'api_keys_sha256': expected no keys with auth.mode 'passthrough' (every"
                " client is this tenant; set auth.mode: keys to require keys),"
                f" got {len(raw.api_keys_sha256)}"
            )
        if raw.provider.mode == "env":
            errors.append(
                "key 'provider.mode': expected 'passthrough' with auth.mode 'passthrough' (an env"
                " provider key would serve every client that reaches the proxy; use auth.mode:"
                " keys), got 'env'"
            )
    provider = _provider(raw.provider, env, errors)
    check_compaction(raw.compaction, "compaction", errors)
    quota = build_quota(raw.quota, mode, raw.api_keys_sha256, errors)
    if mode == "passthrough":
        default_base = os.path.join(state_dir, "sources")
    else:
        default_base = os.path.join(state_dir, "tenants", raw.name)
    transcript_root = raw.sources.transcript_root or os.path.join(default_base, "transcripts")
    artifact_root = raw.sources.artifact_root or os.path.join(default_base, "artifacts")
    object_store = build_object_store(raw.sources.object_store, env, errors)
    signing = build_signing(raw.sources.signing, env, errors)
    if object_store is not None and signing is None and raw.sources.signing == NO_SIGNING:
        errors.append(
            "key 'sources.signing': expected signing keys with sources.object_store (every"
            " artifact in an object store needs a signed manifest entry), missing"
        )
    if errors or provider is None:
        return None
    try:
        sources = SourcePolicy(
            frozenset(raw.sources.kinds),
            raw.sources.session_patterns,
            os.path.normpath(transcript_root),
            os.path.normpath(artifact_root),
            object_store,
            signing,
        )
    except ValueError as exc:  # every rule is checked above; a safety net, never a crash
        errors.append(f"key 'sources': expected a valid source policy ({exc})")
        return None
    return Tenant(
        name=raw.name,
        api_key_hashes=api_keys,
        provider=provider,
        sources=sources,
        compaction=raw.compaction,
        admin_token_hashes=admin_tokens,
        policy_file=path,
        retention=raw.retention,
        quota=quota,
        upstream=raw.upstream,
    )


def _upstream_base(data: Any, config: Config) -> UpstreamTarget:
    """What a policy's ``upstream`` keys override: the config's platform, or, when the policy
    names another ``format``, nothing (a Vertex tenant inherits no Bedrock region)."""
    base = target_of(config.upstream)
    section = data.get("upstream") if isinstance(data, Mapping) else None
    chosen = section.get("format") if isinstance(section, Mapping) else None
    return base if chosen in (None, base.format) else UpstreamTarget()


_PROCESS_WIDE_RETENTION = ("interval_seconds", "batch_size", "lease_seconds")


def _process_wide_retention(data: Any, errors: list[str]) -> None:
    """The collector's schedule is the process's (config file), not a tenant's."""
    section = data.get("retention") if isinstance(data, Mapping) else None
    if not isinstance(section, Mapping):
        return
    for key in _PROCESS_WIDE_RETENTION:
        if key in section:
            errors.append(
                f"key 'retention.{key}': expected it in the config file (the collector's schedule"
                " is per process, not per tenant), got a tenant override"
            )


def _require(data: Any, errors: list[str]) -> None:
    """The keys without a default: ``name`` and ``provider.mode``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return  # already reported by build_section
    if "name" not in data:
        errors.append(f"key 'name': expected {_NAME_EXPECTED}, missing")
    provider = data.get("provider")
    if "provider" not in data:
        errors.append("key 'provider': expected a mapping with mode: env or passthrough, missing")
    elif provider is None or (isinstance(provider, Mapping) and "mode" not in provider):
        errors.append("key 'provider.mode': expected one of env, passthrough, missing")


def _hashes(values: tuple[str, ...], key: str, errors: list[str]) -> tuple[bytes, ...]:
    """64 hex digits each, once each. A bad value is never echoed: it may be a pasted key."""
    digests: list[bytes] = []
    seen: dict[bytes, int] = {}
    for i, value in enumerate(values):
        if _HEX_DIGEST_RE.fullmatch(value) is None:
            errors.append(
                f"key '{key}[{i}]': expected 64 hex digits, the SHA-256 of the secret"
                f" ({_HASH_HINT}), got a value of {len(value)} characters (not shown)"
            )
            continue
        digest = bytes.fromhex(value)
        if digest in seen:
            errors.append(
                f"key '{key}[{i}]': expected each hash once, got a repeat of {key}[{seen[digest]}]"
            )
            continue
        seen[digest] = i
        digests.append(digest)
    return tuple(digests)


def _provider(raw: _ProviderFile, env: Mapping[str, str], errors: list[str]) -> ProviderAuth | None:
    """The provider section; for ``env``, the key read from the environment (never echoed)."""
    key = "provider.api_key_env"
    if raw.mode != "env":
        if raw.api_key_env:
            errors.append(
                f"key '{key}': expected no variable with provider.mode 'passthrough' (the"
                " client's own key goes upstream), got a value (not shown)"
            )
        return ProviderAuth("passthrough") if raw.mode == "passthrough" else None
    if not raw.api_key_env:
        errors.append(
            f"key '{key}': expected the name of the environment variable holding the tenant's"
            " provider API key (required with provider.mode 'env'), missing"
        )
        return None
    if _ENV_NAME_RE.fullmatch(raw.api_key_env) is None:
        errors.append(
            f"key '{key}': expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*), got"
            f" a value of {len(raw.api_key_env)} characters that is not one (not shown: it may be"
            " a key)"
        )
        return None
    value = read_env(env, raw.api_key_env, key, errors)
    return None if value is None else ProviderAuth("env", raw.api_key_env, value)


def _overlaps(a: str, b: str) -> bool:
    """Equal, or one inside the other (as written, normalised; symlinks are not resolved)."""
    a_dir, b_dir = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a_dir.startswith(b_dir) or b_dir.startswith(a_dir)


def _check_across_files(tenants: list[Tenant], problems: list[str]) -> None:
    """Names unique (ignoring case), every hash used once, no two tenants' roots overlapping."""
    names: dict[str, str] = {}
    hashes: dict[bytes, tuple[str, str]] = {}
    roots: list[tuple[Tenant, str, str]] = []
    for tenant in tenants:
        path = tenant.policy_file
        folded = tenant.name.casefold()
        if folded in names:
            problems.append(
                f"{path}: key 'name': expected a name no other policy file uses (compared"
                f" ignoring case), got {tenant.name!r}, also in {names[folded]}"
            )
        else:
            names[folded] = path
        labelled = [(f"api_keys_sha256[{i}]", h) for i, h in enumerate(tenant.api_key_hashes)]
        labelled += [(f"admin_tokens_sha256[{i}]", h) for i, h in enumerate(tenant.admin_token_hashes)]
        for label, digest in labelled:
            if digest in hashes:
                other_path, other_label = hashes[digest]
                problems.append(
                    f"{path}: key '{label}': expected a hash used once across every key and admin"
                    f" token of every policy file, got one also in {other_path} key '{other_label}'"
                )
            else:
                hashes[digest] = (path, label)
        for key, root in (
            ("sources.transcript_root", tenant.sources.transcript_root),
            ("sources.artifact_root", tenant.sources.artifact_root),
        ):
            assert root is not None
            for other, other_key, other_root in roots:
                if other is not tenant and _overlaps(root, other_root):
                    problems.append(
                        f"{path}: key '{key}': expected a directory that no other tenant's root"
                        f" contains, equals or is inside, got {shown(root)}, which overlaps"
                        f" {other.policy_file} key '{other_key}' ({shown(other_root)})"
                    )
            roots.append((tenant, key, root))
        store = tenant.sources.object_store
        for other in tenants:
            other_store = other.sources.object_store
            if other is tenant:
                break
            if store is not None and other_store is not None and overlapping_stores(store, other_store):
                problems.append(
                    f"{path}: key 'sources.object_store.prefix': expected a prefix that no other"
                    " tenant's prefix in the same bucket contains, equals or is inside, got"
                    f" {store.prefix!r}, which overlaps {other.policy_file}"
                    f" ({other_store.prefix!r})"
                )
