"""The operator console at ``/console/``: sign-in, sign-out, the page shell and its assets.

Read-only. The pages are static files shipped in the package (``proxy/console/static``: HTML,
CSS, vanilla JavaScript modules, a small SVG chart module); they read the same-origin admin API
(``/admin/v1``, authorised by the console cookie for ``GET`` only) and ``/console/api/*``. No
page is rendered with data on the server: the browser builds the DOM with ``textContent``.

Routes::

    GET  /console                 -> 308 /console/
    GET  /console/signin          the sign-in form (static)
    POST /console/signin          form ``token=<admin token>`` (or the one-time link's token,
                                  ``link=1``: see first_signin.py): 303 /console/ with the
                                  cookie, or 200 with the form and why not
    POST /console/signout         ends the session, clears the cookie: 303 /console/signin
    GET  /console/static/{name}   the assets
    GET  /console/api/me          {"tenant", "ledger": bool, "client_port": the API's port when
                                  the console is on an admin listener, else null} (401 when
                                  not signed in)
    GET  /console/api/health      readiness, the store (its reads and writes), upstream errors
    GET  /console/{anything else} the page shell (303 /console/signin when not signed in)

Cookie: a random id (never the token), ``HttpOnly; SameSite=Strict; Path=/; Max-Age=<ttl>``,
``Secure`` and the ``__Host-`` prefix when the page is served over TLS. CSRF: the cookie is
``SameSite=Strict`` and the two POSTs also require an ``Origin`` whose host is this server's
(a cross-site form, or one without ``Origin``, is 403 and changes nothing). Every answer carries
a strict Content-Security-Policy (``default-src 'none'``, scripts, styles, images and fetches from
``'self'`` only, no inline script or style, ``frame-ancestors 'none'``, ``form-action 'self'``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from urllib.parse import parse_qs, urlsplit

import orjson
from aiohttp import web

from proxy.console.auth import (
    CONSOLE_FIRST_SIGNIN,
    CONSOLE_SESSIONS,
    COOKIE,
    SECURE_COOKIE,
    console_tenant,
    cookie_value,
    is_secure,
)
from proxy.console.first_signin import OneTimeSignIn
from proxy.console.sessions import ConsoleSessions, token_hash
from proxy.server.appkeys import CONFIG, FORWARDER, METRICS, STATE, STORE, TENANCY
from proxy.server.http.listeners import LISTENERS
from proxy.server.relay.forward import read_limited

__all__ = ["CSP", "add_console_routes"]

log = logging.getLogger("context_proxy.console")

PREFIX = "/console"
MAX_FORM_BYTES = 4096
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-store",
}
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_ASSET = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.(?:js|css|svg)", re.ASCII)
_SIGNIN_ERROR_SLOT = "<!--error-->"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _load_assets() -> dict[str, bytes]:
    """Every asset of the package, read once: the console never opens a file by a request path."""
    folder = resources.files("proxy.console").joinpath("static")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and (_ASSET.fullmatch(entry.name) or entry.name.endswith(".html"))
    }


def _secured(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        response = await handler(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    wrapped.__name__ = handler.__name__
    return wrapped


def _same_origin(request: web.Request) -> bool:
    """The POST comes from a page of this server: ``Origin``'s host is the request's host."""
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == request.host.lower()


def _forbidden() -> web.Response:
    return web.Response(
        status=403,
        text="Forbidden: the request did not come from this console (Origin check).\n",
    )


_SPENT_LINK = (
    "This sign-in link is not valid: it works once, and only until the proxy restarts."
    " Sign in with an admin token."
)


class Console:
    def __init__(
        self, assets: dict[str, bytes], sessions: ConsoleSessions, first: OneTimeSignIn
    ) -> None:
        self.assets = assets
        self.sessions = sessions
        self.first = first

    def _html(self, name: str, status: int = 200, error: str = "") -> web.Response:
        page = self.assets[name].decode()
        if error:  # a fixed message of ours, never request data
            page = page.replace(_SIGNIN_ERROR_SLOT, f'<p class="error" role="alert">{error}</p>')
        return web.Response(status=status, text=page, content_type="text/html", charset="utf-8")

    async def redirect_root(self, request: web.Request) -> web.StreamResponse:
        return _redirect(PREFIX + "/", 308)

    async def signin_form(self, request: web.Request) -> web.StreamResponse:
        return self._html("signin.html")

    async def signin(self, request: web.Request) -> web.StreamResponse:
        if not _same_origin(request):
            return _forbidden()
        raw = await read_limited(request.content, MAX_FORM_BYTES)
        token, from_link = "", False
        if raw is not None:
            form = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=8)
            token = (form.get("token") or [""])[0].strip()
            from_link = (form.get("link") or [""])[0] == "1"
        tenancy = request.app[TENANCY].current
        tenant = tenancy.admin(token) if token else None
        digest: bytes | None = token_hash(token)
        if tenant is None:
            name = self.first.redeem(token)  # the one-time link's token, spent now
            tenant = tenancy.by_name(name) if name is not None else None
            digest = None
        if tenant is None:
            log.info("[console] sign-in refused")
            # 200, the form again: a failed sign-in is a page, not a failed resource load.
            return self._html(
                "signin.html", error=_SPENT_LINK if from_link else "Invalid admin token."
            )
        session_id = self.sessions.open(tenant.name, digest, time.monotonic())
        how = "with an admin token" if digest is not None else "with the one-time link"
        log.info("[console] tenant=%s signed in %s", tenant.name, how)
        response = _redirect(PREFIX + "/")
        secure = is_secure(request)
        response.set_cookie(
            SECURE_COOKIE if secure else COOKIE,
            session_id,
            max_age=int(self.sessions.ttl_seconds),
            path="/",
            secure=secure,
            httponly=True,
            samesite="Strict",
        )
        return response

    async def signout(self, request: web.Request) -> web.StreamResponse:
        if not _same_origin(request):
            return _forbidden()
        value = cookie_value(request)
        if value:
            self.sessions.close(value)
        response = _redirect(PREFIX + "/signin")
        for name in (COOKIE, SECURE_COOKIE):
            if name in request.cookies:
                response.del_cookie(name, path="/", secure=name == SECURE_COOKIE)
        return response

    async def asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = self.assets.get(name) if _ASSET.fullmatch(name) else None
        if data is None:
            return web.Response(status=404, text="not found\n")
        suffix = name[name.rindex(".") :]
        return web.Response(body=data, content_type=_TYPES[suffix])

    async def page(self, request: web.Request) -> web.StreamResponse:
        if console_tenant(request) is None:
            return _redirect(PREFIX + "/signin")
        return self._html("index.html")

    async def me(self, request: web.Request) -> web.StreamResponse:
        tenant = console_tenant(request)
        if tenant is None:
            return _json({"error": "not signed in"}, status=401)
        return _json(
            {
                "tenant": tenant.name,
                "ledger": _has_ledger(request.app),
                "client_port": _client_port(request.app),
            }
        )

    async def health(self, request: web.Request) -> web.StreamResponse:
        """Readiness as ``/readyz`` decides it, the store's ping, and upstream errors by kind
        (counted by this process since it started; ``/metrics`` has them per replica)."""
        if console_tenant(request) is None:
            return _json({"error": "not signed in"}, status=401)
        app = request.app
        state = app[STATE]
        problems: list[str] = []
        if state.draining:
            problems.append("draining")
        if app[FORWARDER].session.closed:
            problems.append("upstream session closed")
        checks: dict[str, bool] = {}
        for check in state.readiness_checks:
            name = getattr(check, "__name__", "check")
            checks[name] = await check()
            if not checks[name]:
                problems.append(name)
        errors: dict[str, int] = {}
        for metric in app[METRICS].upstream_errors.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    errors[sample.labels["kind"]] = int(sample.value)
        return _json(
            {
                "ready": not problems,
                "problems": problems,
                "store": "ok" if checks.get("store", True) else "unavailable",
                "store_operations": _store_operations(app),
                "upstream_errors": errors,
                "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )


def _store_operations(app: web.Application) -> dict[str, dict[str, object]]:
    """What the store's own operations found lately, by kind (``Store.health``)."""
    store = app.get(STORE)
    if store is None:
        return {}
    now = time.monotonic()
    out: dict[str, dict[str, object]] = {}
    for kind, outcomes in store.health.outcomes.items():
        known = outcomes.at > float("-inf")
        out[kind] = {
            "ok": outcomes.ok,
            "last_failure": outcomes.why or None,  # the store's own text: class and SQLSTATE
            "failures": outcomes.failures,
            "seconds_since_outcome": round(now - outcomes.at, 1) if known else None,
        }
    return out


def _client_port(app: web.Application) -> int | None:
    """Where clients send requests when that is not the console's own port (an admin
    listener): the pages tell how to send the first request."""
    listeners = app.get(LISTENERS)
    if listeners is None or not listeners.admin or not listeners.client:
        return None
    return listeners.client[0][1]


def _has_ledger(app: web.Application) -> bool:
    """Whether this proxy serves the usage ledger's admin API (the pages need it for figures)."""
    return any(
        resource.canonical == "/admin/v1/usage/summary" for resource in app.router.resources()
    )


async def _api_not_found(request: web.Request) -> web.StreamResponse:
    return _json({"error": "not found"}, status=404)


def _redirect(location: str, status: int = 303) -> web.Response:
    return web.Response(status=status, headers={"Location": location})


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def add_console_routes(app: web.Application) -> None:
    """Mount ``/console`` on ``app`` (it must hold ``CONFIG``, ``TENANCY``, ``STATE``,
    ``METRICS``; ``FORWARDER`` once started)."""
    config = app[CONFIG].console
    if not config.enabled:
        return
    sessions = ConsoleSessions(config.session_ttl_seconds)
    app[CONSOLE_SESSIONS] = sessions
    app[CONSOLE_FIRST_SIGNIN] = first = OneTimeSignIn()  # armed by ``serve``, if at all
    console = Console(_load_assets(), sessions, first)
    r = app.router
    r.add_get(PREFIX, _secured(console.redirect_root), name="console_root")
    r.add_get(PREFIX + "/signin", _secured(console.signin_form), name="console_signin_form")
    r.add_post(PREFIX + "/signin", _secured(console.signin), name="console_signin")
    r.add_post(PREFIX + "/signout", _secured(console.signout), name="console_signout")
    r.add_get(PREFIX + "/static/{name}", _secured(console.asset), name="console_asset")
    r.add_get(PREFIX + "/api/me", _secured(console.me), name="console_me")
    r.add_get(PREFIX + "/api/health", _secured(console.health), name="console_health")
    r.add_route("*", PREFIX + "/api/{tail:.*}", _secured(_api_not_found), name="console_api")
    r.add_get(PREFIX + "/{tail:.*}", _secured(console.page), name="console_page")
