"""Tenants: who a client is, how its requests reach the provider, what it may read.

One YAML file per tenant in ``policies_dir`` (format: ``docs/guides/tenants.md``), validated at
start-up into one immutable :class:`Tenancy` (:mod:`proxy.tenancy.policies`). A reload (SIGHUP) is
:func:`~proxy.tenancy.policies.load_tenancy` again; the server swaps its one reference, so a
request keeps the value it started with.

``auth.mode`` (in the config):

* ``passthrough`` (the default): one tenant, every client is it, and the client's own provider
  credentials go upstream untouched. With no policy file it is the built-in tenant ``default``;
  with exactly one policy file, that file describes it (for admin tokens, source roots, compaction
  overrides). Two or more files are an error. ``Config.admin_token_hashes`` (the environment's
  admin token, ``proxy.config.environment.admin_tokens_from_env``) are added to its admin tokens.
* ``keys``: clients send a proxy-issued key (``x-api-key``, else ``api-key``: Microsoft Foundry's
  key header, else ``Authorization: Bearer``); its SHA-256 is compared, in constant time, with every stored hash of every tenant. No match is
  ``None`` here and a 401 ``authentication_error`` at the edge.

Secrets: proxy-issued keys and admin tokens are stored only as SHA-256 digests. A tenant's provider
key is read from an environment variable once, at load, and lives only in :class:`ProviderAuth`,
whose ``repr`` never shows it; no error message built here contains it, nor a value from a hash or
environment-variable-name field (an operator who pastes a key there must not find it in the logs).

Environment variables are read in one place: :func:`~proxy.tenancy.policies.load_tenancy`
(``environ`` for tests).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from proxy.config.retention import RetentionConfig
from proxy.config.settings import CompactionConfig
from proxy.config.upstream import UpstreamTarget
from proxy.core.quota import Quota
from proxy.sources.policy import SourcePolicy

__all__ = [
    "DEFAULT_TENANT",
    "ProviderAuth",
    "Tenancy",
    "Tenant",
    "key_id",
]

DEFAULT_TENANT = "default"

AuthMode = Literal["passthrough", "keys"]
ProviderMode = Literal["env", "passthrough"]



# --- the values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderAuth:
    """How a tenant's requests authenticate to the provider.

    ``env``: the proxy sends ``api_key`` (read from ``api_key_env`` at load) as ``x-api-key``.
    ``passthrough``: the client's own credentials go upstream.
    """

    mode: ProviderMode
    api_key_env: str | None = None
    api_key: str | None = None

    def __repr__(self) -> str:
        shown = "None" if self.api_key is None else "<hidden>"
        return f"ProviderAuth(mode={self.mode!r}, api_key_env={self.api_key_env!r}, api_key={shown})"


_ANTHROPIC = UpstreamTarget()


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    api_key_hashes: tuple[bytes, ...] = field(repr=False)
    provider: ProviderAuth
    sources: SourcePolicy
    # The config's compaction section with this tenant's overrides applied.
    compaction: CompactionConfig
    admin_token_hashes: tuple[bytes, ...] = field(repr=False)
    # The policy file it came from ("" for the built-in default tenant).
    policy_file: str = ""
    # The config's retention section with this tenant's overrides applied (None: the config's).
    retention: RetentionConfig | None = None
    # Budgets and rate limits (the policy's ``quota``; None: none).
    quota: Quota | None = None
    # Where its requests go: the config's ``upstream`` platform, or the policy's own.
    upstream: UpstreamTarget = _ANTHROPIC


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Every tenant, immutable: swapping one reference to a new value is a safe reload."""

    mode: AuthMode
    tenants: tuple[Tenant, ...]
    # The tenant every client is in passthrough mode; None in keys mode.
    default: Tenant | None

    def authenticate(self, headers: Mapping[str, str]) -> Tenant | None:
        """The tenant whose proxy-issued key the client sent; ``None``: unknown or no key (401).

        The key is taken from ``x-api-key``, else ``api-key`` (Foundry's), else ``Authorization:
        Bearer``. Its SHA-256 is
        compared with every stored hash (no early exit), so the time taken does not depend on
        which key matched, or on how much of a hash matched. Passthrough: the default tenant.
        """
        if self.mode == "passthrough":
            return self.default
        presented = _presented_key(headers)
        if presented is None:
            return None
        return _match(presented[0], ((t, h) for t in self.tenants for h in t.api_key_hashes))

    def admin(self, token: str) -> Tenant | None:
        """The tenant an admin token (the bearer value) belongs to; ``None`` if none."""
        if not token:
            return None
        return _match(token, ((t, h) for t in self.tenants for h in t.admin_token_hashes))

    def upstream_auth_headers(
        self, tenant: Tenant, client_headers: Mapping[str, str]
    ) -> dict[str, str | None]:
        """Auth headers to set on the upstream request (``None``: remove the header).

        * provider ``env``: the tenant's provider key as ``x-api-key``, ``authorization`` and
          ``api-key`` removed;
        * provider ``passthrough`` in auth mode ``passthrough``: ``{}``, the client's headers go
          upstream untouched;
        * provider ``passthrough`` in auth mode ``keys``: the header that carried the
          proxy-issued key is removed (that key is ours, never the provider's); the client's
          other credential header (``authorization`` when the proxy key came in ``x-api-key``)
          goes upstream untouched; ``api-key`` never does (Foundry clients send the proxy key in
          both ``x-api-key`` and ``api-key``; no provider takes it).
        """
        if tenant.provider.mode == "env":
            if tenant.provider.api_key is None:  # load_tenancy never builds this
                raise ValueError("an env provider without a key")
            return {"x-api-key": tenant.provider.api_key, "authorization": None, "api-key": None}
        if self.mode == "passthrough":
            return {}
        presented = _presented_key(client_headers)
        return {"api-key": None} if presented is None else {presented[1]: None, "api-key": None}

    def by_name(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """``name`` (lowercase) looked up case-insensitively, in a CIMultiDict or a plain dict."""
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def _presented_key(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """(the proxy-issued key, the header it came in), or None when the client sent none."""
    for name in ("x-api-key", "api-key"):
        key = _header(headers, name)
        if key:
            return key, name
    authorization = _header(headers, "authorization")
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            return token, "authorization"
    return None


def key_id(headers: Mapping[str, str]) -> str | None:
    """The proxy key's id (``auth.mode: keys``): the first 16 hex digits of its SHA-256, what
    per-key counters are kept under (never the key)."""
    presented = _presented_key(headers)
    return None if presented is None else _digest(presented[0]).hex()[:16]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _match(secret: str, candidates: Iterable[tuple[Tenant, bytes]]) -> Tenant | None:
    digest = _digest(secret)
    found: Tenant | None = None
    for tenant, stored in candidates:  # every candidate, always: no early exit
        if hmac.compare_digest(stored, digest):
            found = tenant
    return found

