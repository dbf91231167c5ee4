"""The admin API: ``/admin/v1/...``, a tenant's durable state, transcripts and manifests over HTTP.

Mounted with :func:`add_admin_routes`. Every request carries ``Authorization: Bearer <admin
token>``; the token names one tenant (``Tenancy.admin``) and every answer is scoped to it.
Another tenant's session, item or manifest is indistinguishable from a missing one: the same
404 with the same text. Routes (``{kind}`` is ``facts``, ``pending`` or ``evidence``)::

    GET   /admin/v1/sessions                                    the tenant's session ids
    GET   /admin/v1/sessions/{session}/state                    current state (404: no session)
    GET   /admin/v1/sessions/{session}/history                  every change, in order
    POST  /admin/v1/sessions/{session}/changes                  {"changes": [...]}, all or nothing
    POST  /admin/v1/sessions/{session}/{kind}                   create one item (201)
    GET   /admin/v1/sessions/{session}/{kind}/{id}              one item (retired ones too)
    PUT   /admin/v1/sessions/{session}/{kind}/{id}              replace the item (an update)
    PATCH /admin/v1/sessions/{session}/{kind}/{id}              change some fields (an update)
    POST  /admin/v1/sessions/{session}/{kind}/{id}/retire       {"source", "retired_at"}
    GET   /admin/v1/sessions/{session}/preview                  the injected block + resolutions
    GET   /admin/v1/sessions/{session}/transcript?after=&limit= recorded events, paged by seq
    GET   /admin/v1/manifests/{compaction_id}                   a manifest, by ``x-compaction-id``
    GET   /admin/v1/audit?session=&status=&since=&until=&after=&limit=   source checks (audit)
    GET   /admin/v1/sessions/{session}/source?pointer=          a pointer's status and content
    GET   /admin/v1/usage[/summary|/sessions|/prices]           the usage ledger (usage)
    GET   /admin/v1/quota                                       budgets and rate limits (quota)

Writes go through ``Store.write_changes`` only, in the JSON change format of
:mod:`proxy.core.durable`; the item routes build one change each. Order of checks: token (401),
path and query parameters, body is a JSON object (400), the named item exists (404), then every
rule at once (422, nothing written): ``error.details`` has one ``{field, message}`` per bad field
(unknown and missing fields together with bad values and the rules against the current state),
named ``changes[i].item.<field>`` for a change list and as in the body for the item routes. A
store that cannot be read or written is a 503 ``api_error`` with ``retry-after: 1``.

Decisions:

* A session exists once anything was recorded for it (a write, a transcript event, a manifest);
  reads of an unknown session are 404, a write creates it.
* ``PATCH`` merges the given fields onto the current item. The store has no conditional write, so
  two concurrent ``PATCH``-es of one item are last-writer-wins per item (each one is still
  validated against the state it lands on). Marking a pending item ``done`` through ``PATCH``
  needs ``source`` and ``last_confirmed_at`` in the body: the pointer that confirms it is done.
* The preview resolves every pointer with excerpts (the only place excerpts are ever shown) and
  renders the block from the same resolutions: :func:`proxy.core.render.render_state` reads only
  each resolution's status and digest, so the block is byte for byte the one injected.
* Errors are rendered here (the admin routes must answer in the Anthropic shape with
  ``error.details`` whatever app they are mounted on); ``request-id`` is on every answer.

This module authenticates, mounts every route and answers the session reads (sessions, state,
history, preview, manifests); the writes and item routes are ``items``; ``wire`` has what they
share (JSON answers and errors, request bodies, the session in the path); ``audit``, ``source``,
``transcripts``, ``usage`` and ``quota`` have their own routes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.console.auth import console_tenant
from proxy.core.durable import (
    DurableState,
    InvalidWrite,
    Item,
)
from proxy.core.durable_json import change_to_json
from proxy.core.errors import (
    AuthenticationFailed,
    InvalidRequest,
    NotFound,
    ProxyError,
    new_request_id,
)
from proxy.core.render import render_state
from proxy.server.admin.audit import get_audit
from proxy.server.admin.items import (
    KIND_PATTERN,
    create_item,
    get_item,
    patch_item,
    post_changes,
    record_json,
    replace_item,
    retire_item,
)
from proxy.server.admin.quota import get_quota
from proxy.server.admin.source import get_source
from proxy.server.admin.transcripts import get_agents, get_transcript
from proxy.server.admin.usage import usage_routes
from proxy.server.admin.wire import (
    PREFIX,
    AdminUnavailable,
    error_response,
    failed,
    json_response,
    require_session,
    session_of,
)
from proxy.server.appkeys import ADMIN_REQUEST_ID, RESOLVER, SOURCE_CHECKS, STORE, TENANCY
from proxy.sources.checks import SourceChecks
from proxy.store.base import HistoryEntry, StoreError
from proxy.tenancy.tenants import Tenant

__all__ = ["add_admin_routes"]

log = logging.getLogger("context_proxy.admin")

MAX_COMPACTION_ID_CHARS = 256
RESOLUTION_STATUSES = ("available", "missing", "denied", "corrupt", "unsupported")

MANIFEST_NOT_FOUND = "manifest not found"
_AUTH_HEADERS = {"www-authenticate": 'Bearer realm="context-proxy admin"'}

AdminHandler = Callable[[web.Request, Tenant], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- authentication --------------------------------------------------------------------------


def _authenticate(request: web.Request) -> Tenant:
    if request.method in ("GET", "HEAD") and "Authorization" not in request.headers:
        # The console's pages read with their sign-in cookie (GET only: it never writes).
        signed_in = console_tenant(request)
        if signed_in is not None:
            return signed_in
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed(
            "missing admin token: send Authorization: Bearer <admin token>",
            headers=_AUTH_HEADERS,
        )
    tenant = request.app[TENANCY].current.admin(token)
    if tenant is None:
        raise AuthenticationFailed("invalid admin token", headers=_AUTH_HEADERS)
    return tenant


def _admin(handler: AdminHandler) -> Handler:
    """Authenticate, run, translate the store's errors, render errors the Anthropic way."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        request_id = new_request_id()
        request[ADMIN_REQUEST_ID] = request_id
        try:
            tenant = _authenticate(request)
            try:
                response = await handler(request, tenant)
            except InvalidWrite as exc:
                raise failed(exc.errors) from None
            except StoreError as exc:  # said once per interval, not once per request
                request.app[STORE].health.lost("the admin API", exc, "answered 503")
                response = error_response(AdminUnavailable(), request_id)
        except ProxyError as exc:
            log.info(
                "[admin] %s %s -> %d %s",
                request.method,
                request.match_info.route.name or "admin",
                exc.status,
                exc.error_type,
            )
            response = error_response(exc, request_id)
        response.headers["request-id"] = request_id
        response.headers["cache-control"] = "no-store"
        return response

    wrapped.__name__ = handler.__name__
    return wrapped


# --- JSON views ------------------------------------------------------------------------------


def _state_json(session: str, state: DurableState) -> dict[str, Any]:
    live = [r for r in state.records if not r.retired]
    return {
        "session": session,
        "facts": [record_json(r) for r in live if r.kind == "fact"],
        "pending": [record_json(r) for r in live if r.kind == "pending"],
        "evidence": [record_json(r) for r in live if r.kind == "evidence"],
        "retired": [record_json(r) for r in state.records if r.retired],
    }


def _history_json(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "recorded_at": entry.recorded_at,
        "version": entry.event.version,
        "change": change_to_json(entry.event.change),
    }


# --- handlers --------------------------------------------------------------------------------


async def list_sessions(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    sessions = await request.app[STORE].list_sessions(tenant.name)
    return json_response({"sessions": list(sessions)})


async def get_state(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    store = request.app[STORE]
    await require_session(store, tenant, session)
    return json_response(_state_json(session, await store.current_state(tenant.name, session)))


async def get_history(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    store = request.app[STORE]
    await require_session(store, tenant, session)
    history = await store.history(tenant.name, session)
    return json_response({"session": session, "history": [_history_json(e) for e in history]})


async def get_preview(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    """The block exactly as it would be injected now, and what each pointer resolved to."""
    session = session_of(request)
    store = request.app[STORE]
    await require_session(store, tenant, session)
    state = await store.current_state(tenant.name, session)
    items: tuple[Item, ...] = (*state.facts, *state.pending, *state.evidence)
    pointers = sorted({item.source for item in items})
    try:
        resolutions = await request.app[SOURCE_CHECKS].resolve_many(
            tenant.name,
            tenant.sources,
            pointers,
            excerpt=True,
            session=session,
            asked_by=f"admin:{request[ADMIN_REQUEST_ID]}",
        )
    except (OSError, StoreError) as exc:  # resources (EMFILE...), not a property of a source
        if isinstance(exc, StoreError):
            request.app[STORE].health.lost("the admin API", exc, "answered 503")
        else:
            log.warning("[admin] sources could not be resolved: %s", type(exc).__name__)
        raise AdminUnavailable("the sources could not be resolved; retry later") from None
    by_pointer = dict(zip(pointers, resolutions, strict=True))
    used_by: dict[str, list[dict[str, str]]] = {p: [] for p in pointers}
    for record in state.records:
        if not record.retired:
            used_by[record.item.source].append({"kind": record.kind, "id": record.item_id})
    counts = dict.fromkeys(RESOLUTION_STATUSES, 0)
    for resolution in resolutions:
        counts[resolution.status] = counts.get(resolution.status, 0) + 1
    return json_response(
        {
            "session": session,
            # None: nothing would be injected (the session has no live items).
            "block": render_state(state, by_pointer) if items else None,
            "counts": counts,
            "sources": [
                {
                    "pointer": pointer,
                    "status": resolution.status,
                    "evidence_sha256": resolution.evidence_sha256,
                    "excerpt": resolution.excerpt,
                    "used_by": used_by[pointer],
                }
                for pointer, resolution in by_pointer.items()
            ],
        }
    )


async def get_manifest(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    compaction_id = request.match_info["compaction_id"]
    if not compaction_id.strip() or len(compaction_id) > MAX_COMPACTION_ID_CHARS:
        raise InvalidRequest(
            f"compaction_id: expected the x-compaction-id of a response (1-{MAX_COMPACTION_ID_CHARS}"
            " characters)"
        )
    manifest = await request.app[STORE].get_manifest(tenant.name, compaction_id)
    if manifest is None:
        raise NotFound(MANIFEST_NOT_FOUND)
    return json_response(
        {
            "compaction_id": manifest.compaction_id,
            "session": manifest.session,
            "stored_at": manifest.stored_at,
            "manifest": orjson.loads(manifest.manifest_json),  # checked JSON when stored
        }
    )


async def not_found(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    raise NotFound(f"{request.method} {request.path}: not found")


# --- assembly --------------------------------------------------------------------------------


def add_admin_routes(app: web.Application) -> None:
    """Mount ``/admin/v1/...`` on ``app``; it must hold ``STORE``, ``RESOLVER`` and ``TENANCY``."""
    session = PREFIX + "/sessions/{session}"
    item = session + "/{kind:" + KIND_PATTERN + "}"
    one = item + "/{item_id}"
    r = app.router
    r.add_get(PREFIX + "/sessions", _admin(list_sessions), name="admin_sessions")
    r.add_get(session + "/state", _admin(get_state), name="admin_state")
    r.add_get(session + "/history", _admin(get_history), name="admin_history")
    r.add_post(session + "/changes", _admin(post_changes), name="admin_changes")
    r.add_get(session + "/preview", _admin(get_preview), name="admin_preview")
    r.add_get(session + "/transcript", _admin(get_transcript), name="admin_transcript")
    r.add_get(session + "/agents", _admin(get_agents), name="admin_agents")
    r.add_post(item, _admin(create_item), name="admin_item_create")
    r.add_get(one, _admin(get_item), name="admin_item")
    r.add_put(one, _admin(replace_item), name="admin_item_replace")
    r.add_patch(one, _admin(patch_item), name="admin_item_patch")
    r.add_post(one + "/retire", _admin(retire_item), name="admin_item_retire")
    r.add_get(PREFIX + "/manifests/{compaction_id}", _admin(get_manifest), name="admin_manifest")
    r.add_get(PREFIX + "/audit", _admin(get_audit), name="admin_audit")
    r.add_get(session + "/source", _admin(get_source), name="admin_source")
    for path, handler, name in usage_routes():  # the usage ledger: proxy.server.admin.usage
        r.add_get(PREFIX + path, _admin(handler), name=name)
    r.add_get(PREFIX + "/quota", _admin(get_quota), name="admin_quota")
    r.add_route("*", PREFIX + "/{tail:.*}", _admin(not_found), name="admin_other")
    app.cleanup_ctx.append(_source_checks)


async def _source_checks(app: web.Application) -> AsyncIterator[None]:
    """An app without the proxy's lifecycle (the admin API alone) gets its own source checks."""
    own = SOURCE_CHECKS not in app
    if own:
        app[SOURCE_CHECKS] = SourceChecks(app[RESOLVER], app[STORE])
    yield
    if own:
        await app[SOURCE_CHECKS].close()
