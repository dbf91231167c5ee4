"""Where the proxy listens: the client listener, and the optional admin listener.

With ``listen.admin_port`` set, ``/admin``, ``/console`` and ``/metrics`` are served only on the
admin listener (``listen.admin_host``, default ``listen.host``), and the client listener answers
404 for them, exactly as for a path that does not exist; the admin listener answers 404 for
everything else (the API, ``HEAD /``). ``/healthz`` and ``/readyz`` are on both: a load balancer
probes the client port, an orchestrator may probe either. Without ``admin_port`` there is one
listener serving everything, and no middleware runs.

One app and one runner serve both (they share the store, the tenancy, the console's sessions and
the metrics); which listener a connection came in on is its local address
(``transport.get_extra_info("sockname")``) against the admin listener's bound addresses. The
admin site is started first, so that no request reaches the client port before its address is
known.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from proxy.config.settings import Config
from proxy.core.errors import NotFound

__all__ = [
    "ADMIN_PREFIXES",
    "LISTENERS",
    "Listeners",
    "is_admin_path",
    "listener_middleware",
    "start_sites",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Address = tuple[str, int]

# served only on the admin listener when there is one
ADMIN_PREFIXES = ("/admin", "/console", "/metrics")
# served on both
BOTH = frozenset(("/healthz", "/readyz"))


def is_admin_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ADMIN_PREFIXES)


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


@dataclass(slots=True)
class Listeners:
    """The bound addresses of each listener (filled by :func:`start_sites`)."""

    client: list[Address] = field(default_factory=list)
    admin: list[Address] = field(default_factory=list)

    def on_admin(self, request: web.Request) -> bool:
        """Whether ``request`` came in on the admin listener."""
        transport = request.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        if not isinstance(local, tuple) or len(local) < 2:
            return False
        host, port = str(local[0]), local[1]
        return any(
            port == a_port and (a_host == host or _wildcard(a_host)) for a_host, a_port in self.admin
        )


LISTENERS = web.AppKey("listeners", Listeners)


@web.middleware
async def listener_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Each route on its listener only (mounted only when ``listen.admin_port`` is set)."""
    path = request.path
    if path not in BOTH and is_admin_path(path) != request.app[LISTENERS].on_admin(request):
        raise NotFound(f"{request.method} {path}: not found")
    return await handler(request)


def _bound(runner: web.AppRunner) -> list[Address]:
    return [(str(a[0]), int(a[1])) for a in runner.addresses if isinstance(a, tuple)]


async def start_sites(
    runner: web.AppRunner, config: Config, app: web.Application, backlog: int = 4096
) -> Listeners:
    """Start the admin listener (when configured), then the client listener; their addresses
    are in ``app[LISTENERS]``."""
    listen = config.listen
    listeners = app[LISTENERS]
    if listen.admin_port is not None:
        admin = web.TCPSite(
            runner, listen.admin_host or listen.host, listen.admin_port, backlog=backlog,
            reuse_address=True,
        )
        await admin.start()
        listeners.admin = _bound(runner)
    site = web.TCPSite(runner, listen.host, listen.port, backlog=backlog, reuse_address=True)
    await site.start()
    listeners.client = [a for a in _bound(runner) if a not in listeners.admin]
    return listeners
