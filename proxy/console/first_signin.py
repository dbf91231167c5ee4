"""The console out of the box: a one-time sign-in link when the passthrough tenant has no admin
token (no policy file, or one without ``admin_tokens_sha256``, and no
``CONTEXT_PROXY_ADMIN_TOKEN``).

At ``serve`` start, :func:`first_signin` makes a random token (256 bits), keeps only its SHA-256
here, in memory, and returns the link that carries it; ``serve`` prints that one line on its
terminal. The token signs in to the console once: the first sign-in with it spends it, and a
restart forgets it. It is never an admin token: the admin API (``Authorization: Bearer``) does
not accept it; the console session it opens reads the admin API with its cookie, as any other.

The link is ``http://<host>:<port>/console/signin#token=<token>``: the token is in the URL's
*fragment*, which a browser never sends (not in a request line, so in no access log of the proxy
or of anything in front of it; not in a ``Referer``, which never carries a fragment). The
sign-in page's script reads it, removes it from the address bar and the history entry
(``history.replaceState``), and posts it as the sign-in form does, with the same ``Origin``
check. (A ``?token=`` query would be sent in the request line: logged by whatever sits in front,
and a GET that signs in is a login-CSRF target.)

Printed only on a terminal: when stderr is not one, it is a log stream (a container's, a
service manager's) that may be shipped and kept elsewhere, so no token is made and ``serve``
logs how to set an admin token instead (:func:`hint`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from proxy.config.environment import ENV_ADMIN_TOKEN, ENV_ADMIN_TOKEN_SHA256
from proxy.tenancy.tenants import Tenancy, Tenant

__all__ = [
    "OneTimeSignIn",
    "announcement",
    "hint",
    "signin_link",
    "tenant_without_admin_token",
]

_TOKEN_BYTES = 32


def hint(tenant: str, console: bool) -> str:
    """The log line when no link is printed (no terminal, or no console): how to get in."""
    how = f"set {ENV_ADMIN_TOKEN} (or {ENV_ADMIN_TOKEN_SHA256}) when starting the proxy"
    if console:
        how += "; a one-time console sign-in link is printed only when stderr is a terminal"
    return f"no admin token for tenant {tenant}: the admin API answers 401; {how}"


def announcement(tenant: str, link: str) -> str:
    """The one line ``serve`` prints on its terminal."""
    return (
        f"Console sign-in for tenant {tenant}, a one-time link (valid once, until the proxy"
        f" restarts; {ENV_ADMIN_TOKEN} sets a lasting admin token): {link}"
    )


class OneTimeSignIn:
    """At most one live one-time token: its SHA-256 and its tenant, until redeemed."""

    def __init__(self) -> None:
        self._digest: bytes | None = None
        self._tenant = ""

    @property
    def pending(self) -> bool:
        return self._digest is not None

    def issue(self, tenant: str) -> str:
        """A new token for ``tenant`` (any earlier one is void); the caller shows it once."""
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        self._digest = hashlib.sha256(token.encode("ascii")).digest()
        self._tenant = tenant
        return token

    def redeem(self, token: str) -> str | None:
        """The tenant, if ``token`` is the live one-time token (then spent); else ``None``."""
        if self._digest is None or not token:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        if not hmac.compare_digest(digest, self._digest):
            return None
        self._digest = None
        return self._tenant


def tenant_without_admin_token(tenancy: Tenancy) -> Tenant | None:
    """The passthrough tenant when no admin token can sign in to it; ``None`` otherwise
    (``auth.mode: keys``: every tenant's tokens are its policy's business)."""
    default = tenancy.default
    if tenancy.mode != "passthrough" or default is None or default.admin_token_hashes:
        return None
    return default


def signin_link(host: str, port: int, token: str) -> str:
    """The link for the address the proxy listens on (an any-address: this machine)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        shown = host  # a name
    else:
        if address.is_unspecified:
            address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
        shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}/console/signin#token={token}"
