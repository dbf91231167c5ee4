"""``GET /admin/v1/quota``: the admin token's tenant's budgets and rate limits — each limit's
allowance, what the current window used and what remains (mounted by ``admin.routes``).

One entry per limit and scope: the tenant's own, each proxy key with an allowance of its own
(``quota.keys``), and each other key that used its ``per_key`` allowance in the current window
(``key:<id>``, the first 16 hex digits of the key's SHA-256; a key with nothing counted yet has
its whole allowance). Spend is in USD. The figures are the
store's counters (:mod:`proxy.core.quota`): what admitted requests reserved and what their
upstream calls were charged, across every replica.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.core.quota import METRICS, NANO_USD, TENANT_SCOPE, Allowance, iso_ms, window_of
from proxy.server.appkeys import STORE
from proxy.server.quota import QUOTA
from proxy.tenancy.tenants import Tenant

__all__ = ["get_quota"]


def _amount(metric: str, value: int) -> int | float:
    return round(value / NANO_USD, 9) if metric == "spend" else value


def _allowance_json(a: Allowance) -> dict[str, Any]:
    return dataclasses.asdict(a)


def _entries(scope: str, allowance: Allowance, used: dict[tuple[str, str, int], int], now: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for metric in METRICS:
        limit = allowance.limit(metric)
        if limit <= 0:
            continue
        period = allowance.period(metric)
        start, end = window_of(period, now)
        value = used.get((scope, metric, start), 0)
        out.append(
            {
                "scope": scope,
                "metric": "spend_usd" if metric == "spend" else metric,
                "period": period,
                "limit": _amount(metric, limit),
                "used": _amount(metric, value),
                "remaining": _amount(metric, max(0, limit - value)),
                "window_start": iso_ms(start),
                "resets_at": iso_ms(end),
            }
        )
    return out


async def get_quota(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    keeper = request.app.get(QUOTA)
    now = keeper.now_ms() if keeper is not None else int(time.time() * 1000)
    quota = tenant.quota
    body: dict[str, Any] = {"tenant": tenant.name, "at": iso_ms(now), "allowance": None, "limits": []}
    if quota is not None:
        rows = await request.app[STORE].quota_current(tenant.name, now)
        used = {(scope, metric, start): value for scope, metric, start, _end, value in rows}
        limits = _entries(TENANT_SCOPE, quota.tenant, used, now)
        seen = {scope for scope, *_ in rows if scope != TENANT_SCOPE}
        seen |= {f"key:{k}" for k, a in quota.keys if a.active}  # keys of their own: always shown
        for scope in sorted(seen):
            limits += _entries(scope, quota.key_allowance(scope.removeprefix("key:")), used, now)
        body["allowance"] = {
            "tenant": _allowance_json(quota.tenant),
            "per_key": _allowance_json(quota.per_key),
            "keys": {k: _allowance_json(a) for k, a in quota.keys},
        }
        body["limits"] = limits
    return web.Response(body=orjson.dumps(body), content_type="application/json")
