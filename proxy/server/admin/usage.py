"""The admin API of the usage ledger: ``/admin/v1/usage...`` (mounted by ``admin.routes``).

Routes (every one scoped to the admin token's tenant; times are ISO 8601 with an offset, ``since``
inclusive, ``until`` exclusive)::

    GET /admin/v1/usage?since=&until=&session=&model=&kind=&after=&limit=
        rows by increasing id; ``next_after`` is the cursor of the next page (null: last page);
        ``order=desc`` pages newest first with ``before=`` and ``next_before``
    GET /admin/v1/usage/summary?since=&until=&bucket=&session=&model=&kind=
        totals and a series of fixed-length buckets from ``since`` (empty buckets included);
        defaults: the last 24 hours, a bucket length giving at most 200 buckets
    GET /admin/v1/usage/sessions?since=&until=&model=&status=ok|error&sort=recent|cost|savings
                                &limit=&offset=
        one entry per session with calls in the range (all time by default)
    GET /admin/v1/usage/prices
        the price table in force (configured entries first, then the built-in ones)

Figures are derived by :mod:`proxy.core.ledger` (its docstring defines each one); the store sums
per model, this module prices and shapes. A malformed parameter is a 400 naming it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from aiohttp import web

from proxy.core.catalogue import Catalogue, built_in
from proxy.core.errors import InvalidRequest
from proxy.core.ledger import (
    KINDS,
    Pricing,
    Totals,
    cache_hit_ratio,
    price_sums,
    row_figures,
    total_input,
)
from proxy.core.pointers import is_valid_session_id
from proxy.server.appkeys import CATALOGUE, STORE
from proxy.store.usage import (
    MAX_GROUPS,
    MAX_USAGE_LIMIT,
    UsageGroup,
    UsageQuery,
    UsageRow,
    iso_of_ms,
)
from proxy.tenancy.tenants import Tenant

__all__ = ["usage_routes"]

DEFAULT_LIMIT = 100
DEFAULT_SESSIONS_LIMIT = 50
MAX_SESSIONS_LIMIT = 500
MAX_OFFSET = 10**9
MAX_BUCKETS = 1000
DEFAULT_SUMMARY_RANGE = timedelta(days=1)
_AUTO_BUCKETS = 200
_NICE_BUCKETS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
MAX_MODEL_CHARS = 200
_SORTS = ("recent", "cost", "savings")
_STATUSES = ("ok", "error")

AdminHandler = Callable[[web.Request, Tenant], Awaitable[web.StreamResponse]]


def _json(data: object) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


# -- parameters -------------------------------------------------------------------------------


def _time(request: web.Request, name: str) -> datetime | None:
    text = request.query.get(name)
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise InvalidRequest(
            f"{name}: expected an ISO 8601 time with an offset (2026-01-31T12:00:00Z)"
        )
    return value.astimezone(UTC)


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 18) or not low <= int(text) <= high:
        raise InvalidRequest(f"{name}: expected an integer from {low} to {high}")
    return int(text)


def _choice(request: web.Request, name: str, choices: Sequence[str], default: str | None) -> Any:
    text = request.query.get(name)
    if text is None:
        return default
    if text not in choices:
        raise InvalidRequest(f"{name}: expected one of {', '.join(choices)}")
    return text


def _ms(value: datetime | None) -> int | None:
    return None if value is None else math.floor(value.timestamp() * 1000)


def _query(request: web.Request, *, with_kind: bool = True) -> UsageQuery:
    since, until = _time(request, "since"), _time(request, "until")
    if since is not None and until is not None and since >= until:
        raise InvalidRequest("since: expected a time before until")
    session = request.query.get("session")
    if session is not None and not is_valid_session_id(session):
        raise InvalidRequest("session: not a valid session id")
    model = request.query.get("model")
    if model is not None and not 0 < len(model) <= MAX_MODEL_CHARS:
        raise InvalidRequest(f"model: expected a model id of 1-{MAX_MODEL_CHARS} characters")
    kind = _choice(request, "kind", KINDS, None) if with_kind else None
    return UsageQuery(
        since_ms=_ms(since), until_ms=_ms(until), session=session, model=model, kind=kind
    )


def _prices(request: web.Request) -> Catalogue:
    return request.app.get(CATALOGUE) or built_in()


# -- shapes -----------------------------------------------------------------------------------


def row_json(row: UsageRow, prices: Pricing) -> dict[str, Any]:
    e = row.entry
    u = e.usage
    c = e.provider_compaction
    figures = row_figures(e, prices)
    total = total_input(u)
    notes = e.provider_notes
    return {
        "id": row.id,
        "at": e.at,
        "tenant": e.tenant,
        "session": e.session,
        "model": e.model,
        "route": e.route,
        "kind": e.kind,
        "status": e.status,
        "latency_ms": e.latency_ms,
        "tokens_before": e.tokens_before,
        "tokens_after": e.tokens_after,
        "layers": e.layers,
        "plan": e.plan,
        "summary": e.summary,
        "compaction_id": e.compaction_id,
        "request_id": e.request_id,
        "agent": e.agent,
        "input_tokens": None if u is None else u.input_tokens,
        "cache_creation_input_tokens": None if u is None else u.cache_creation_input_tokens,
        "cache_creation_5m": None if u is None else u.cache_creation_5m,
        "cache_creation_1h": None if u is None else u.cache_creation_1h,
        "cache_read_input_tokens": None if u is None else u.cache_read_input_tokens,
        "output_tokens": None if u is None else u.output_tokens,
        "usage": None if u is None else u.to_json(),
        "provider_usage": None if e.provider_usage is None else dict(e.provider_usage),
        "total_input_tokens": total if u is not None else None,
        "cache_hit_ratio": None if u is None else cache_hit_ratio(
            u.cache_read_input_tokens or 0, total
        ),
        "cost_usd": None if figures.cost is None else figures.cost.to_json(),
        "savings_usd": figures.savings,
        "provider_compactions": e.provider_compactions,
        "provider_compaction_input_tokens": None if c is None else c.input_tokens,
        "provider_compaction_cache_creation_input_tokens": (
            None if c is None else c.cache_creation_input_tokens
        ),
        "provider_compaction_cache_creation_5m": None if c is None else c.cache_creation_5m,
        "provider_compaction_cache_creation_1h": None if c is None else c.cache_creation_1h,
        "provider_compaction_cache_read_input_tokens": (
            None if c is None else c.cache_read_input_tokens
        ),
        "provider_compaction_output_tokens": None if c is None else c.output_tokens,
        "provider_compaction_cost_usd": (
            None
            if figures.provider_compaction_cost is None
            else figures.provider_compaction_cost.to_json()
        ),
        "provider_notes": None if notes is None else notes.to_json(),
        "thinking_blocks_dropped": 0 if notes is None else notes.thinking_blocks_dropped,
    }


def _totals(groups: Iterable[UsageGroup], prices: Pricing) -> Totals:
    return price_sums(((g.model, g.sums) for g in groups), prices)


def auto_bucket(span_ms: int) -> int:
    """The bucket length (seconds) for a range: the first "nice" one giving at most 200."""
    for seconds in _NICE_BUCKETS:
        if span_ms / (seconds * 1000) <= _AUTO_BUCKETS:
            return seconds
    return max(_NICE_BUCKETS[-1], math.ceil(span_ms / 1000 / _AUTO_BUCKETS))


def summary_json(
    groups: Sequence[UsageGroup],
    prices: Pricing,
    since_ms: int,
    until_ms: int,
    bucket_s: int,
) -> dict[str, Any]:
    """Totals and the full series of buckets ``[since + i*bucket, since + (i+1)*bucket)``."""
    by_bucket: dict[int, list[UsageGroup]] = {}
    for g in groups:
        assert isinstance(g.key, int)
        by_bucket.setdefault(g.key, []).append(g)
    count = max(1, math.ceil((until_ms - since_ms) / (bucket_s * 1000)))
    series = [
        {
            "start": iso_of_ms(since_ms + i * bucket_s * 1000),
            **_totals(by_bucket.get(i, ()), prices).to_json(),
        }
        for i in range(count)
    ]
    return {
        "since": iso_of_ms(since_ms),
        "until": iso_of_ms(until_ms),
        "bucket_seconds": bucket_s,
        "totals": _totals(groups, prices).to_json(),
        "series": series,
    }


def sessions_json(
    groups: Sequence[UsageGroup],
    prices: Pricing,
    *,
    status: str | None,
    sort: str,
    limit: int,
    offset: int,
) -> dict[str, Any]:
    by_session: dict[str, list[UsageGroup]] = {}
    for g in groups:
        assert isinstance(g.key, str)
        by_session.setdefault(g.key, []).append(g)
    entries: list[tuple[dict[str, Any], int, Totals]] = []
    for session, parts in by_session.items():
        totals = _totals(parts, prices)
        if status == "ok" and totals.sums.errors:
            continue
        if status == "error" and not totals.sums.errors:
            continue
        last = max(g.last_ms for g in parts)
        entry = {
            "session": session,
            "first_at": iso_of_ms(min(g.first_ms for g in parts)),
            "last_at": iso_of_ms(last),
            "models": sorted({g.model for g in parts}),
            **totals.to_json(),
        }
        entries.append((entry, last, totals))
    keys: dict[str, Callable[[tuple[dict[str, Any], int, Totals]], Any]] = {
        "recent": lambda e: (-e[1], e[0]["session"]),
        "cost": lambda e: (-e[2].cost.total, e[0]["session"]),
        "savings": lambda e: (-e[2].savings, e[0]["session"]),
    }
    entries.sort(key=keys[sort])
    return {
        "sessions": [e[0] for e in entries[offset : offset + limit]],
        "total": len(entries),
    }


# -- handlers ---------------------------------------------------------------------------------


def _bounded(groups: Sequence[UsageGroup]) -> None:
    if len(groups) > MAX_GROUPS:
        raise InvalidRequest(
            f"since: the range holds more than {MAX_GROUPS} groups (sessions or buckets x models);"
            " narrow since/until or filter by model"
        )



async def get_usage(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    base = _query(request)
    descending = _choice(request, "order", ("asc", "desc"), "asc") == "desc"
    after = _int(request, "after", 0, 0, 10**18 - 1)
    before = _int(request, "before", 0, 1, 10**18 - 1) if "before" in request.query else None
    if descending and "after" in request.query:
        raise InvalidRequest("after: pages of order=desc continue with before=")
    if not descending and before is not None:
        raise InvalidRequest("before: only with order=desc (order=asc pages with after=)")
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_USAGE_LIMIT)
    query = UsageQuery(
        base.since_ms, base.until_ms, base.session, base.model, base.kind, after, limit + 1,
        before, descending,
    )
    rows = await request.app[STORE].usage_rows(tenant.name, query)
    page = rows[:limit]
    more = len(rows) > limit
    prices = _prices(request)
    answer: dict[str, Any] = {
        "rows": [row_json(r, prices) for r in page],
        "next_after": page[-1].id if more and not descending else None,
    }
    if descending:
        answer["next_before"] = page[-1].id if more else None
    return _json(answer)


async def get_summary(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    base = _query(request)
    until_ms = base.until_ms
    if until_ms is None:
        until_ms = _ms(datetime.now(UTC))
        assert until_ms is not None
        if base.since_ms is not None and base.since_ms >= until_ms:
            raise InvalidRequest("since: expected a time in the past, or give until")
    since_ms = base.since_ms
    if since_ms is None:
        since_ms = until_ms - int(DEFAULT_SUMMARY_RANGE.total_seconds() * 1000)
    span = until_ms - since_ms
    bucket_s = _int(request, "bucket", 0, 1, 10**9) or auto_bucket(span)
    if span / (bucket_s * 1000) > MAX_BUCKETS:
        raise InvalidRequest(
            f"bucket: expected at most {MAX_BUCKETS} buckets in the range; use a bucket of at"
            f" least {math.ceil(span / 1000 / MAX_BUCKETS)} seconds"
        )
    query = UsageQuery(since_ms, until_ms, base.session, base.model, base.kind)
    groups = await request.app[STORE].usage_groups(tenant.name, query, "bucket", bucket_s * 1000)
    _bounded(groups)
    answer = summary_json(groups, _prices(request), since_ms, until_ms, bucket_s)
    return _json({"tenant": tenant.name, **answer})


async def get_sessions(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    if "session" in request.query:
        raise InvalidRequest("session: not a parameter of this route (see /usage?session=)")
    base = _query(request)
    status = _choice(request, "status", _STATUSES, None)
    sort = _choice(request, "sort", _SORTS, "recent")
    limit = _int(request, "limit", DEFAULT_SESSIONS_LIMIT, 1, MAX_SESSIONS_LIMIT)
    offset = _int(request, "offset", 0, 0, MAX_OFFSET)
    groups = await request.app[STORE].usage_groups(tenant.name, base, "session")
    _bounded(groups)
    return _json(
        sessions_json(
            groups, _prices(request), status=status, sort=sort, limit=limit, offset=offset
        )
    )


async def get_prices(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    return _json(
        {
            "unit": "USD per million tokens",
            "prices": [
                {
                    "model": model,
                    "input": p.value.input,
                    "cache_write_5m": p.value.cache_write_5m,
                    "cache_write_1h": p.value.cache_write_1h,
                    "cache_read": p.value.cache_read,
                    "output": p.value.output,
                    "origin": p.origin,
                }
                for model, p in _prices(request).priced()
            ],
        }
    )


def usage_routes() -> list[tuple[str, AdminHandler, str]]:
    """``(path under /admin/v1, handler, route name)`` for ``add_admin_routes``."""
    return [
        ("/usage", get_usage, "admin_usage"),
        ("/usage/summary", get_summary, "admin_usage_summary"),
        ("/usage/sessions", get_sessions, "admin_usage_sessions"),
        ("/usage/prices", get_prices, "admin_usage_prices"),
    ]

