"""What ``serve`` reads from the environment, in one place: which configuration file
(``CONTEXT_PROXY_CONFIG``), the passthrough tenant's admin token and the store's password (the
standard ``OTEL_*`` variables are :mod:`proxy.config.tracing_env`'s).

Secrets come from a variable, or a file that ``<VARIABLE>_FILE`` names. Containers get secrets as files (Docker and Compose secrets under ``/run/secrets``, Kubernetes
Secret volumes) or as variables (Kubernetes ``secretKeyRef``, a ``.env`` file): the proxy's own
secrets, the passthrough tenant's admin token (``CONTEXT_PROXY_ADMIN_TOKEN``) and the store's
password (``CONTEXT_PROXY_STORE_PASSWORD``), may come either way, the convention the official
``postgres`` image follows (``POSTGRES_PASSWORD_FILE``). Read when ``serve`` starts
(:mod:`proxy.config.settings`); no message here ever holds a secret's value.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from proxy.config.schema import ConfigError

__all__ = [
    "ENV_ADMIN_TOKEN",
    "ENV_ADMIN_TOKEN_SHA256",
    "ENV_CONFIG",
    "ENV_STORE_PASSWORD",
    "FILE_SUFFIX",
    "admin_tokens_from_env",
    "config_path_from_env",
    "secret_from_env",
    "store_password_from_env",
    "url_with_password",
]

ENV_CONFIG = "CONTEXT_PROXY_CONFIG"
# An admin token for the passthrough tenant (the admin API and the console), as the token itself
# (only its SHA-256 is kept) or as that hash; either turns off the one-time console link.
ENV_ADMIN_TOKEN = "CONTEXT_PROXY_ADMIN_TOKEN"
ENV_ADMIN_TOKEN_SHA256 = "CONTEXT_PROXY_ADMIN_TOKEN_SHA256"
MIN_ADMIN_TOKEN_CHARS = 16
ENV_STORE_PASSWORD = "CONTEXT_PROXY_STORE_PASSWORD"
FILE_SUFFIX = "_FILE"
MAX_SECRET_BYTES = 64 * 1024
SOURCE = "<environment>"


def secret_from_env(name: str, environ: Mapping[str, str]) -> str:
    """The value of the variable ``name``, or the content of the file ``name_FILE`` names
    (trailing line breaks dropped); ``""`` when neither is set. :class:`ConfigError` when both
    are set, or the file cannot be read, is empty or is larger than ``MAX_SECRET_BYTES``."""
    value = environ.get(name, "")
    path = environ.get(name + FILE_SUFFIX, "")
    if not path:
        return value
    variable = name + FILE_SUFFIX
    if value:
        raise ConfigError(SOURCE, [f"variables {name} and {variable}: expected one of them, got both"])
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            SOURCE, [f"variable {variable}: cannot read {path!r} ({exc.strerror or type(exc).__name__})"]
        ) from None
    if len(raw) > MAX_SECRET_BYTES:
        raise ConfigError(SOURCE, [f"variable {variable}: {path!r} is larger than {MAX_SECRET_BYTES} bytes"])
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(SOURCE, [f"variable {variable}: {path!r} is not UTF-8 text"]) from None
    if not text:
        raise ConfigError(SOURCE, [f"variable {variable}: {path!r} is empty"])
    return text


def url_with_password(url: str, password: str) -> str:
    """``url`` (``postgresql://user@host:port/db?...``) with ``password`` percent-encoded into it.

    :class:`ConfigError` when the store is not PostgreSQL, or the URL holds a password already
    (two sources for one secret: which one wins would be a guess)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            SOURCE,
            [f"variable {ENV_STORE_PASSWORD}: expected a PostgreSQL store.url (postgresql://...)"
             " to give the password to, got a SQLite store"],
        )
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if ":" in userinfo:
        raise ConfigError(
            SOURCE,
            [f"variable {ENV_STORE_PASSWORD}: expected a store.url without a password (the"
             " variable gives it), got a URL that holds one"],
        )
    netloc = f"{userinfo}:{quote(password, safe='')}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def config_path_from_env(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``--config`` wins; otherwise ``CONTEXT_PROXY_CONFIG``; otherwise no file (defaults)."""
    if explicit:
        return explicit
    env = os.environ if environ is None else environ
    return env.get(ENV_CONFIG) or None


_TOKEN_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)  # printable ASCII, no whitespace: a header value
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)


def store_password_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The store's password: ``CONTEXT_PROXY_STORE_PASSWORD``, or the file
    ``CONTEXT_PROXY_STORE_PASSWORD_FILE`` names (a Docker or Kubernetes secret); ``""``: none."""
    return secret_from_env(ENV_STORE_PASSWORD, os.environ if environ is None else environ)


def admin_tokens_from_env(environ: Mapping[str, str] | None = None) -> tuple[bytes, ...]:
    """The SHA-256 of the passthrough tenant's admin token named by the environment:
    ``CONTEXT_PROXY_ADMIN_TOKEN`` (the token: hashed here, the value not kept) and/or
    ``CONTEXT_PROXY_ADMIN_TOKEN_SHA256`` (its hash), each also as a file named by the variable
    with ``_FILE`` added (:func:`proxy.config.secrets.secret_from_env`). Unset or empty: none. :class:`ConfigError`
    for a value that cannot be one, never showing it."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    hashes: list[bytes] = []
    token = secret_from_env(ENV_ADMIN_TOKEN, env)
    if token:
        if not _TOKEN_RE.fullmatch(token) or len(token) < MIN_ADMIN_TOKEN_CHARS:
            problems.append(
                f"variable {ENV_ADMIN_TOKEN}: expected at least {MIN_ADMIN_TOKEN_CHARS} printable"
                " ASCII characters without spaces (e.g. `openssl rand -hex 24`), got a value of"
                f" {len(token)} characters (not shown)"
            )
        else:
            hashes.append(hashlib.sha256(token.encode("ascii")).digest())
    digest = secret_from_env(ENV_ADMIN_TOKEN_SHA256, env).strip()
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
