"""``GET /admin/v1/sessions/{session}/source?pointer=...``: what a source pointer shows now.

The pointer goes through :class:`proxy.sources.checks.SourceChecks` exactly as a durable item's
pointer does (strict parse, the tenant's policy, then the backend: a transcript event from the
store, an artifact under the tenant's local roots or in its object store, verified and audited),
so the answer's ``status`` is the one the injected block would carry. Only an ``available``
source has ``content``: the record (a transcript event's JSON line) or the artifact text, the
first :data:`MAX_CONTENT_CHARS` characters (``truncated`` says if there was more). Another
tenant's source is ``missing``, like a pointer that names nothing.

The session in the path must be one of the tenant's sessions (404 otherwise, as for every
session route); the pointer may name another session of the same tenant (durable items may), and
the tenant's policy decides whether it may be read, as it does for the injected block.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from proxy.core.errors import InvalidRequest, NotFound, ProxyError
from proxy.core.pointers import MAX_POINTER_LENGTH, is_valid_session_id
from proxy.server.appkeys import ADMIN_REQUEST_ID, SOURCE_CHECKS, STORE
from proxy.tenancy.tenants import Tenant

__all__ = ["MAX_CONTENT_CHARS", "get_source"]

log = logging.getLogger("context_proxy.admin")

MAX_CONTENT_CHARS = 200_000


class SourcesUnavailable(ProxyError):
    """503 api_error: the sources cannot be read now (resources, not a property of a source)."""

    status = 503
    error_type = "api_error"

    def __init__(self) -> None:
        super().__init__(
            "the sources could not be resolved; retry later", headers={"retry-after": "1"}
        )


async def get_source(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = request.match_info["session"]
    if not is_valid_session_id(session):
        raise InvalidRequest(
            "session: not a valid session id (1-200 characters of [A-Za-z0-9._-], starting with"
            " a letter or a digit)"
        )
    pointer = request.query.get("pointer")
    if pointer is None or not pointer or len(pointer) > MAX_POINTER_LENGTH:
        raise InvalidRequest(
            f"pointer: expected a source pointer (1-{MAX_POINTER_LENGTH} characters):"
            " transcript:<session>:<seq> or artifact:<session>:<name>:<hex>"
        )
    store = request.app[STORE]
    if session not in await store.list_sessions(tenant.name):
        raise NotFound("session not found")
    try:
        fetched = await request.app[SOURCE_CHECKS].fetch(
            tenant.name,
            tenant.sources,
            pointer,
            session=session,
            asked_by=f"admin:{request[ADMIN_REQUEST_ID]}",
        )
    except OSError as exc:
        log.warning("[admin] source could not be resolved: %s", type(exc).__name__)
        raise SourcesUnavailable() from None
    resolution = fetched.resolution
    content = None
    if fetched.data is not None:
        content = fetched.data[: 4 * (MAX_CONTENT_CHARS + 1)].decode("utf-8", "replace")
    truncated = content is not None and (
        len(content) > MAX_CONTENT_CHARS or len(fetched.data or b"") > 4 * (MAX_CONTENT_CHARS + 1)
    )
    if content is not None and truncated:
        content = content[:MAX_CONTENT_CHARS]
    return web.Response(
        body=orjson.dumps(
            {
                "session": session,
                "pointer": pointer,
                "status": resolution.status,
                "evidence_sha256": resolution.evidence_sha256,
                "content": content,
                "truncated": truncated,
            }
        ),
        content_type="application/json",
    )
