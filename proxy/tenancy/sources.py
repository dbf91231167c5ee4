"""The ``sources.object_store`` and ``sources.signing`` sections of a tenant policy.

Credentials and signing keys are never written in YAML: the policy names environment variables
(``*_env`` keys), read once here, at load. No error message contains a value read from one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from proxy.config.schema import check, doc, one_of, or_empty, positive
from proxy.sources.manifests import KEY_ID_RE, SigningKeys
from proxy.sources.object_store import (
    Credentials,
    ObjectStoreSettings,
    check_bucket,
    check_endpoint,
    check_prefix,
    check_region,
    dns_host,
)

__all__ = [
    "NO_OBJECT_STORE",
    "NO_SIGNING",
    "ObjectStoreFile",
    "SigningFile",
    "build_object_store",
    "build_signing",
    "overlapping_stores",
]

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)
MIN_SIGNING_KEY_BYTES = 32


def _env_name(value: str) -> str | None:
    return None if value == "" or _ENV_NAME_RE.fullmatch(value) else "an environment variable name"


def _key_id(value: str) -> str | None:
    return None if value == "" or KEY_ID_RE.fullmatch(value) else "a key id [A-Za-z0-9._-]{1,64}"


@dataclass(frozen=True, slots=True)
class ObjectStoreFile:
    bucket: str = field(
        default="", metadata=check(or_empty(check_bucket), doc="Required: the bucket (3-63 of `[a-z0-9.-]`).")
    )
    prefix: str = field(
        default="",
        metadata=check(
            or_empty(check_prefix),
            doc="Required: where every key of this tenant starts (segments `[A-Za-z0-9][A-Za-z0-9._-]*`,"
            " ending in `/`); no two tenants' prefixes in one bucket may be equal or nested.",
        ),
    )
    endpoint: str = field(
        default="",
        metadata=check(
            or_empty(check_endpoint),
            doc="Required: `http(s)://host[:port]`, no path; pinned: requests go there and nowhere else.",
        ),
    )
    region: str = field(
        default="", metadata=check(or_empty(check_region), doc="Required: the SigV4 region, pinned.")
    )
    addressing: str = field(
        default="path",
        metadata=check(
            one_of("path", "virtual"), doc="`path`, or `virtual` (the bucket in the host name: `bucket.endpoint-host`)."
        ),
    )
    access_key_id_env: str = field(
        default="", metadata=check(_env_name, doc="Required: the NAME of the variable holding the access key id.")
    )
    secret_access_key_env: str = field(
        default="",
        metadata=check(_env_name, doc="Required: the NAME of the variable holding the secret access key."),
    )
    session_token_env: str = field(
        default="",
        metadata=check(_env_name, doc="The NAME of the variable holding a session token (temporary credentials)."),
    )
    connect_timeout: float = field(default=2.0, metadata=check(positive, doc="Seconds to connect."))
    read_timeout: float = field(
        default=5.0, metadata=check(positive, doc="Seconds between reads (the total is both added).")
    )
    max_concurrency: int = field(default=8, metadata=check(positive, doc="Requests at once for this tenant."))
    max_object_bytes: int = field(
        default=64 << 20,
        metadata=check(positive, doc="A larger object is `corrupt` (never read past this)."),
    )


@dataclass(frozen=True, slots=True)
class SigningKeyFile:
    id: str = field(default="", metadata=check(_key_id, doc="The key's id (`[A-Za-z0-9._-]{1,64}`)."))
    env: str = field(
        default="",
        metadata=check(
            _env_name,
            doc="The NAME of the variable holding the key: an HMAC-SHA256 key of at least 32 bytes"
            " (`openssl rand -hex 32`).",
        ),
    )


@dataclass(frozen=True, slots=True)
class SigningFile:
    key_id: str = field(
        default="", metadata=check(_key_id, doc="The id of the key new manifest entries are signed with.")
    )
    keys: tuple[SigningKeyFile, ...] = field(
        default=(), metadata=doc("Every key that verifies (rotation: add one, point `key_id` at it, restart).")
    )


NO_OBJECT_STORE = ObjectStoreFile()
NO_SIGNING = SigningFile()


def read_env(
    env: Mapping[str, str], name: str, key: str, errors: list[str], *, printable: bool = True
) -> str | None:
    """The value of the environment variable ``name`` a policy key names; ``None`` with the problem
    added to ``errors`` when it is unset, empty or (``printable``) not printable ASCII without
    whitespace. The value is never put in a message (it may be a key)."""
    value = env.get(name)
    if value is None:
        errors.append(f"key '{key}': expected environment variable {name} to be set, it is not")
        return None
    if not value:
        errors.append(f"key '{key}': expected environment variable {name} to be non-empty, it is empty")
        return None
    if printable and _PRINTABLE_RE.fullmatch(value) is None:
        errors.append(
            f"key '{key}': expected environment variable {name} to hold printable ASCII without"
            " whitespace (check for a trailing newline), it does not (value not shown)"
        )
        return None
    return value


def build_signing(
    raw: SigningFile | None, env: Mapping[str, str], errors: list[str]
) -> SigningKeys | None:
    """``sources.signing`` -> keys read from the environment, or ``None`` when absent."""
    if raw is None or (not raw.key_id and not raw.keys):
        return None
    keys: dict[str, bytes] = {}
    for i, item in enumerate(raw.keys):
        where = f"sources.signing.keys[{i}]"
        if not item.id or not item.env:
            errors.append(f"key '{where}': expected both id and env, missing one")
            continue
        if item.id in keys:
            errors.append(f"key '{where}.id': expected each key id once, got a repeat")
            continue
        value = read_env(env, item.env, f"{where}.env", errors)
        if value is None:
            continue
        if len(value.encode()) < MIN_SIGNING_KEY_BYTES:
            errors.append(
                f"key '{where}.env': expected environment variable {item.env} to hold at least"
                f" {MIN_SIGNING_KEY_BYTES} bytes (e.g. openssl rand -hex 32), it holds fewer"
            )
            continue
        keys[item.id] = value.encode()
    if not raw.key_id:
        errors.append("key 'sources.signing.key_id': expected the id of the key to sign with, missing")
        return None
    if raw.key_id not in {k.id for k in raw.keys}:
        errors.append(
            "key 'sources.signing.key_id': expected one of the ids in sources.signing.keys,"
            f" got {raw.key_id!r}"
        )
        return None
    if raw.key_id not in keys:
        return None  # its variable was reported above
    return SigningKeys(raw.key_id, keys)


def build_object_store(
    raw: ObjectStoreFile | None, env: Mapping[str, str], errors: list[str]
) -> ObjectStoreSettings | None:
    """``sources.object_store`` -> settings with credentials from the environment, or ``None``."""
    if raw is None or raw == NO_OBJECT_STORE:
        return None
    before = len(errors)
    for name in ("bucket", "prefix", "endpoint", "region", "access_key_id_env", "secret_access_key_env"):
        if not getattr(raw, name):
            errors.append(f"key 'sources.object_store.{name}': expected a value, missing")
    if len(errors) > before:
        return None
    key_id = read_env(env, raw.access_key_id_env, "sources.object_store.access_key_id_env", errors)
    secret = read_env(
        env, raw.secret_access_key_env, "sources.object_store.secret_access_key_env", errors
    )
    token = None
    if raw.session_token_env:
        token = read_env(env, raw.session_token_env, "sources.object_store.session_token_env", errors)
    if key_id is None or secret is None or (raw.session_token_env and token is None):
        return None
    if raw.addressing == "virtual" and not dns_host(raw.endpoint):
        errors.append(
            "key 'sources.object_store.addressing': expected path with an endpoint that is an IP"
            f" address (virtual addressing puts the bucket in the host name), got {raw.addressing!r}"
        )
        return None
    return ObjectStoreSettings(
        bucket=raw.bucket,
        prefix=raw.prefix,
        endpoint=raw.endpoint.rstrip("/"),
        region=raw.region,
        addressing="virtual" if raw.addressing == "virtual" else "path",
        credentials=Credentials(key_id, secret, token),
        connect_timeout=raw.connect_timeout,
        read_timeout=raw.read_timeout,
        max_concurrency=raw.max_concurrency,
        max_object_bytes=raw.max_object_bytes,
    )


def overlapping_stores(a: ObjectStoreSettings, b: ObjectStoreSettings) -> bool:
    """Same endpoint and bucket, and one prefix equal to or inside the other."""
    return (
        a.endpoint == b.endpoint
        and a.bucket == b.bucket
        and (a.prefix.startswith(b.prefix) or b.prefix.startswith(a.prefix))
    )
