"""``GET /admin/v1/audit``: the tenant's source-check audit trail, filtered and paged.

Query parameters (all optional): ``session`` (exact), ``status`` (one of the five), ``since`` and
``until`` (ISO 8601 timestamps with a UTC offset; ``since`` inclusive, ``until`` exclusive),
``after`` (the ``next_after`` of the previous page), ``limit`` (1-1000, default 100). Rows are
oldest first. Only the authenticated tenant's rows are ever read.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import orjson
from aiohttp import web

from proxy.core.errors import InvalidRequest
from proxy.core.pointers import is_valid_session_id
from proxy.server.appkeys import SOURCE_CHECKS, STORE
from proxy.store.source_records import MAX_AUDIT_LIMIT, AuditQuery, list_audit
from proxy.tenancy.tenants import Tenant

__all__ = ["get_audit"]

DEFAULT_AUDIT_LIMIT = 100
STATUSES = ("available", "missing", "denied", "corrupt", "unsupported")
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)


def _timestamp(text: str | None, name: str, problems: list[str]) -> str | None:
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        problems.append(f"{name}: expected an ISO 8601 timestamp with a UTC offset")
        return None
    return parsed.astimezone(UTC).isoformat(timespec="microseconds")


def _integer(text: str | None, name: str, default: int, low: int, high: int, problems: list[str]) -> int:
    if text is None:
        return default
    if _DIGITS.fullmatch(text) and low <= int(text) <= high:
        return int(text)
    problems.append(f"{name}: expected an integer from {low} to {high}")
    return default


async def get_audit(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    q = request.query
    problems: list[str] = []
    session = q.get("session")
    if session is not None and not is_valid_session_id(session):
        problems.append("session: expected a session id")
    status = q.get("status")
    if status is not None and status not in STATUSES:
        problems.append(f"status: expected one of {', '.join(STATUSES)}")
    since = _timestamp(q.get("since"), "since", problems)
    until = _timestamp(q.get("until"), "until", problems)
    after = _integer(q.get("after"), "after", 0, 0, 10**18 - 1, problems)
    limit = _integer(q.get("limit"), "limit", DEFAULT_AUDIT_LIMIT, 1, MAX_AUDIT_LIMIT, problems)
    if problems:
        raise InvalidRequest("; ".join(problems))
    # Rows recorded by this replica and not yet written appear once its batch is flushed.
    await request.app[SOURCE_CHECKS].audit.flush()
    rows = await list_audit(
        request.app[STORE],
        AuditQuery(tenant.name, session, status, since, until, after, limit + 1),
    )
    page = rows[:limit]
    body = {
        "checks": [r.to_json() for r in page],
        "next_after": page[-1].id if len(rows) > limit else None,
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")
