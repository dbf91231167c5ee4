"""Signed artifact manifests: pure values, HMAC-SHA256 over a canonical text.

Every artifact the proxy writes (to an object store, or to a local root when the tenant has
signing keys) gets one entry: tenant, session, name, size, SHA-256, the time it was written and
the id of the key it was signed with. Entries live in the store (``artifact_manifests``), which
every replica shares, not beside the object: whoever can rewrite a bucket object must not also
be able to rewrite its manifest in the same place, and a lookup is one indexed row, not a second
object GET.

Canonical text (one field per line, UTF-8; every field is already restricted: names and sessions
by the pointer grammar, the tenant by the policy name rule, the key id below)::

    context-proxy-artifact-manifest/1
    <tenant>\\n<session>\\n<name>\\n<size>\\n<sha256 hex>\\n<written_at>\\n<key_id>

Rotation: a tenant's ``signing.keys`` lists every key it accepts (id -> environment variable);
``signing.key_id`` names the one new entries are signed with. Add the new key, switch
``key_id``, and remove the old key once no entry signed with it is still needed: an entry whose
key id is no longer listed verifies as invalid, and its artifact renders ``corrupt``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "KEY_ID_RE",
    "ManifestEntry",
    "SigningKeys",
    "sign_entry",
    "verify_entry",
]

KEY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
_HEADER = "context-proxy-artifact-manifest/1"


@dataclass(frozen=True, slots=True)
class SigningKeys:
    """A tenant's manifest keys; ``repr`` shows only the ids."""

    key_id: str
    keys: Mapping[str, bytes] = field(repr=False, hash=False, compare=False)
    # A digest of every (id, key) pair: what equality and hashing use (policies are cache keys).
    fingerprint: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.key_id not in self.keys:
            raise ValueError("signing.key_id must name one of signing.keys")
        for key_id, key in self.keys.items():
            if KEY_ID_RE.fullmatch(key_id) is None or not key:
                raise ValueError("signing keys need valid ids and non-empty values")
        if not self.fingerprint:
            h = hashlib.sha256()
            for key_id in sorted(self.keys):
                h.update(key_id.encode() + b"\0" + hashlib.sha256(self.keys[key_id]).digest())
            object.__setattr__(self, "fingerprint", h.hexdigest())


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    tenant: str
    session: str
    name: str
    size: int
    sha256: str
    written_at: str
    key_id: str
    signature: str

    def canonical(self) -> bytes:
        return canonical_text(
            self.tenant, self.session, self.name, self.size, self.sha256, self.written_at,
            self.key_id,
        )


def canonical_text(
    tenant: str, session: str, name: str, size: int, sha256: str, written_at: str, key_id: str
) -> bytes:
    fields = (_HEADER, tenant, session, name, str(size), sha256, written_at, key_id)
    if any("\n" in f for f in fields):
        raise ValueError("manifest fields cannot contain a line break")
    return "\n".join(fields).encode("utf-8")


def sign_entry(
    keys: SigningKeys,
    tenant: str,
    session: str,
    name: str,
    data_size: int,
    sha256: str,
    written_at: str,
) -> ManifestEntry:
    text = canonical_text(tenant, session, name, data_size, sha256, written_at, keys.key_id)
    signature = hmac.new(keys.keys[keys.key_id], text, hashlib.sha256).hexdigest()
    return ManifestEntry(
        tenant, session, name, data_size, sha256, written_at, keys.key_id, signature
    )


def verify_entry(keys: SigningKeys, entry: ManifestEntry) -> bool:
    """True when the entry's signature is valid under the key its id names (constant time)."""
    key = keys.keys.get(entry.key_id)
    if key is None:
        return False
    try:
        text = entry.canonical()
    except ValueError:
        return False
    expected = hmac.new(key, text, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, entry.signature)
