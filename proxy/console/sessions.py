"""Console sign-ins: a random session id (the cookie) -> the tenant and the admin token's hash.

The cookie carries only the random id (256 bits from :mod:`secrets`), never the token. The table
lives in this process's memory, bounded, with an absolute expiry; the clock is passed in.

Why memory and not the store: a console session is a bearer credential. In memory it is never
written to disk, a database or a backup, a restart or sign-out ends it at once, and a stolen
database copy holds no live session. With several replicas behind one address, the console (and
the ``/admin/v1`` GETs it makes) needs session affinity at the load balancer (a cookie or
client-IP sticky rule); without it, a replica that does not know the cookie answers like a
signed-out one (it fails closed: the operator signs in again), never with another tenant's data.

Each session also keeps the SHA-256 of the token it was opened with: every use checks that the
tenant's policy still lists that hash, so removing a token (``SIGHUP`` reload) ends its sessions.
A session opened with the one-time sign-in link (``proxy.console.first_signin``) has no token
hash: no policy lists its token; it ends with its expiry, sign-out or a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["ConsoleSession", "ConsoleSessions", "token_hash"]

MAX_SESSIONS = 10_000
_ID_BYTES = 32


def token_hash(token: str) -> bytes:
    """As the tenant policies hash admin tokens (``proxy.tenancy.tenants``)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    tenant: str
    token_sha256: bytes | None  # None: opened with the one-time link
    expires_at: float


class ConsoleSessions:
    """Session id -> :class:`ConsoleSession`; the oldest are dropped beyond ``max_sessions``."""

    def __init__(self, ttl_seconds: float, max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_sessions = max_sessions
        self._by_key: OrderedDict[bytes, ConsoleSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    @staticmethod
    def _key(session_id: str) -> bytes:
        # Keyed by a hash of the id: a lookup's dict probe does not compare the secret itself.
        return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()

    def open(self, tenant: str, token_sha256: bytes | None, now: float) -> str:
        """A new session for ``tenant``; returns its id (the cookie value)."""
        self._expire(now)
        session_id = secrets.token_urlsafe(_ID_BYTES)
        self._by_key[self._key(session_id)] = ConsoleSession(
            tenant, token_sha256, now + self.ttl_seconds
        )
        while len(self._by_key) > self.max_sessions:
            self._by_key.popitem(last=False)
        return session_id

    def get(self, session_id: str, now: float) -> ConsoleSession | None:
        if not session_id or len(session_id) > 128:
            return None
        key = self._key(session_id)
        session = self._by_key.get(key)
        if session is None:
            return None
        if session.expires_at <= now:
            del self._by_key[key]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._by_key.pop(self._key(session_id), None)

    def _expire(self, now: float) -> None:
        # Insertion order is expiry order (one ttl for all): drop from the front.
        while self._by_key:
            key, session = next(iter(self._by_key.items()))
            if session.expires_at > now:
                break
            del self._by_key[key]


def hash_listed(digest: bytes, listed: tuple[bytes, ...]) -> bool:
    """Whether ``digest`` is one of ``listed``, comparing every entry in constant time."""
    found = False
    for candidate in listed:
        found |= hmac.compare_digest(digest, candidate)
    return found
