"""Typed application keys and the per-process state the handlers share.

Modules of the edge (routes, admin API, lifecycle) import the keys from here, not from each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from proxy.config.settings import Config
from proxy.core.catalogue import Catalogue
from proxy.server.compaction.service import CompactionService
from proxy.server.compaction.thinking import ThinkingGuard
from proxy.server.context.durable import DurableContext
from proxy.server.http.metrics import Metrics
from proxy.server.relay.forward import Forwarder
from proxy.server.upstream.platforms import Platforms
from proxy.sources.checks import SourceChecks
from proxy.sources.resolver import SourceResolver
from proxy.store.base import Store
from proxy.tenancy.tenants import Tenancy, Tenant

ReadinessCheck = Callable[[], Awaitable[bool]]


@dataclass(slots=True)
class TenancyHolder:
    """The tenant policies in force; SIGHUP swaps ``current`` for a freshly validated value."""

    current: Tenancy


@dataclass(slots=True)
class ProxyState:
    """Mutable per-process state the handlers share."""

    draining: bool = False
    inflight: int = 0
    # entries forgotten by the idle sweeps (``maintenance/idle_caches.py``) since the memory release
    # (``maintenance/idle_trim.py``) last looked: many of them make the next quiet moment a release
    forgotten: int = 0
    readiness_checks: list[ReadinessCheck] = field(default_factory=list)


CONFIG = web.AppKey("config", Config)
# What the proxy knows of the models (the config's ``models:`` entries, then the built-in rows).
CATALOGUE = web.AppKey("catalogue", Catalogue)
METRICS = web.AppKey("metrics", Metrics)
STATE = web.AppKey("state", ProxyState)
FORWARDER = web.AppKey("forwarder", Forwarder)
# The tenants' Bedrock, Vertex and Foundry upstreams (proxy.server.upstream.platforms).
PLATFORMS = web.AppKey("platforms", Platforms)
COMPACTION = web.AppKey("compaction", CompactionService)
THINKING = web.AppKey("thinking", ThinkingGuard)

STORE = web.AppKey("store", Store)
RESOLVER = web.AppKey("resolver", SourceResolver)
DURABLE = web.AppKey("durable", DurableContext)
SOURCE_CHECKS = web.AppKey("source_checks", SourceChecks)
TENANCY = web.AppKey("tenancy", TenancyHolder)
# The request's tenant, set by the auth middleware on every /v1/* request.
REQUEST_TENANT = web.RequestKey("tenant", Tenant)
# The admin API's request id (the ``request-id`` header), set by the admin wrapper.
ADMIN_REQUEST_ID = web.RequestKey("admin_request_id", str)
