"""The console's cookie: its name and attributes, and the tenant a request's cookie signs in as.

``console_tenant`` is what the admin API calls for a ``GET`` without an ``Authorization`` header:
the console's pages read the same ``/admin/v1`` JSON as ``context-proxy admin``, scoped to the
same tenant, and can never write through it (every other method still needs the bearer token).
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.console.first_signin import OneTimeSignIn
from proxy.console.sessions import ConsoleSessions, hash_listed
from proxy.server.appkeys import TENANCY
from proxy.tenancy.tenants import Tenant

__all__ = [
    "CONSOLE_FIRST_SIGNIN",
    "CONSOLE_SESSIONS",
    "COOKIE",
    "SECURE_COOKIE",
    "console_tenant",
    "cookie_value",
    "is_secure",
]

# Set when the console is enabled (``console.enabled``).
CONSOLE_SESSIONS = web.AppKey("console_sessions", ConsoleSessions)
# The one-time sign-in link's token, when ``serve`` issued one (``proxy.console.first_signin``).
CONSOLE_FIRST_SIGNIN = web.AppKey("console_first_signin", OneTimeSignIn)

COOKIE = "cp_console"
# Over TLS: the __Host- prefix makes the browser refuse it unless Secure, Path=/, no Domain.
SECURE_COOKIE = "__Host-cp_console"


def is_secure(request: web.Request) -> bool:
    """TLS to this server, or a page the browser itself loaded over https (a TLS-terminating
    load balancer in front: the browser's ``Origin`` says https)."""
    return request.secure or request.headers.get("Origin", "").startswith("https://")


def cookie_value(request: web.Request) -> str:
    return request.cookies.get(SECURE_COOKIE) or request.cookies.get(COOKIE) or ""


def console_tenant(request: web.Request, now: float | None = None) -> Tenant | None:
    """The tenant the request's console cookie was signed in as, if that sign-in is still
    valid: not expired, not signed out, and its token still listed in the tenant's policy (a
    sign-in with the one-time link has no token a policy could list)."""
    sessions = request.app.get(CONSOLE_SESSIONS)
    value = cookie_value(request)
    if sessions is None or not value:
        return None
    session = sessions.get(value, time.monotonic() if now is None else now)
    if session is None:
        return None
    tenant = request.app[TENANCY].current.by_name(session.tenant)
    listed = session.token_sha256 is None or hash_listed(
        session.token_sha256, tenant.admin_token_hashes if tenant is not None else ()
    )
    if tenant is None or not listed:
        sessions.close(value)
        return None
    return tenant
