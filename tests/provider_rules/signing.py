"""The fake provider's signatures: an HMAC, under a secret only the fake knows, over a small
public payload (what the block is bound to).

A token is ``base64(payload JSON || HMAC-SHA256(secret, payload JSON))``: opaque to a client,
like the provider's ``signature`` strings, yet the fake needs no memory to verify one (two
fakes built with the same secret accept each other's blocks). The payload is readable to
whoever decodes it, which is fine for a test double: what matters is that nobody can forge
or alter a token without the secret, and that any byte changed in it fails the check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import orjson

_MAC_BYTES = 32


def canonical(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, so that key order never matters."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def digest(*parts: str | bytes) -> str:
    """A 128-bit hex digest of ``parts``, each length-prefixed so that no two part lists
    collide by concatenation."""
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()[:32]


class Signer:
    """Seals payloads into tokens and opens them again; ``open`` returns ``None`` for anything
    that is not an intact token of this secret (edited, truncated, forged, not a string)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()

    def seal(self, payload: Mapping[str, Any]) -> str:
        raw = canonical(dict(payload))
        return base64.b64encode(raw + self._mac(raw)).decode()

    def open(self, token: object) -> dict[str, Any] | None:
        if not isinstance(token, str) or not token:
            return None
        try:
            raw = base64.b64decode(token.encode(), validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) <= _MAC_BYTES:
            return None
        payload, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None
