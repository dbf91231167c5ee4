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
    GET   /admin/v1/audit?session=&status=&since=&until=&after=&limit=   source checks (admin_audit)
    GET   /admin/v1/sessions/{session}/source?pointer=          a pointer's status and content
    GET   /admin/v1/usage[/summary|/sessions|/prices]           the usage ledger (admin_usage)

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
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web

from proxy.console.auth import console_tenant
from proxy.core.durable import (
    KINDS,
    Change,
    Create,
    DurableState,
    Evidence,
    Fact,
    FieldError,
    InvalidWrite,
    Item,
    Kind,
    PendingItem,
    Record,
    Retire,
    Update,
    change_from_json,
    change_to_json,
    validate_changes,
    validate_item,
)
from proxy.core.pointers import is_valid_session_id
from proxy.core.render import render_state
from proxy.errors import (
    AuthenticationFailed,
    InvalidRequest,
    NotFound,
    ProxyError,
    RequestTooLarge,
    ValidationFailed,
    error_body,
    new_request_id,
)
from proxy.server.admin.audit import get_audit
from proxy.server.admin.source import get_source
from proxy.server.admin.transcripts import get_agents, get_transcript
from proxy.server.admin.usage import usage_routes
from proxy.server.appkeys import ADMIN_REQUEST_ID, RESOLVER, SOURCE_CHECKS, STORE, TENANCY
from proxy.server.relay.forward import read_limited
from proxy.sources.checks import SourceChecks
from proxy.store.base import HistoryEntry, Store, StoreError
from proxy.tenants import Tenant

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CHANGES",
    "AdminUnavailable",
    "add_admin_routes",
]

log = logging.getLogger("context_proxy.admin")

PREFIX = "/admin/v1"
MAX_BODY_BYTES = 4 << 20
MAX_CHANGES = 1000
MAX_COMPACTION_ID_CHARS = 256
RESOLUTION_STATUSES = ("available", "missing", "denied", "corrupt", "unsupported")

KIND_PATHS: Mapping[str, Kind] = {"facts": "fact", "pending": "pending", "evidence": "evidence"}
_NOUN: Mapping[Kind, str] = {"fact": "fact", "pending": "pending item", "evidence": "evidence"}
_ITEM_TYPES: Mapping[Kind, type[Fact] | type[PendingItem] | type[Evidence]] = {
    "fact": Fact,
    "pending": PendingItem,
    "evidence": Evidence,
}
_KIND_PATTERN = "|".join(KIND_PATHS)
_RETIRE_FIELDS = ("source", "retired_at")
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)

SESSION_NOT_FOUND = "session not found"
MANIFEST_NOT_FOUND = "manifest not found"
_AUTH_HEADERS = {"www-authenticate": 'Bearer realm="context-proxy admin"'}


class AdminUnavailable(ProxyError):
    """503 api_error: the session store (or the sources, for a preview) cannot be read now."""

    status = 503
    error_type = "api_error"

    def __init__(self, message: str = "the session store is unavailable; retry later") -> None:
        super().__init__(message, headers={"retry-after": "1"})


AdminHandler = Callable[[web.Request, Tenant], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- the wire --------------------------------------------------------------------------------


def _json(
    data: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(data),
        content_type="application/json",
        headers=headers,
    )


def _error_response(exc: ProxyError, request_id: str) -> web.Response:
    details = exc.details if isinstance(exc, ValidationFailed) else None
    headers = {"x-should-retry": "true" if exc.status >= 500 else "false", **exc.headers}
    return web.Response(
        status=exc.status,
        body=error_body(exc.error_type, exc.message, request_id, details=details),
        content_type="application/json",
        headers=headers,
    )


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
                raise _failed(exc.errors) from None
            except StoreError as exc:  # said once per interval, not once per request
                request.app[STORE].health.lost("the admin API", exc, "answered 503")
                response = _error_response(AdminUnavailable(), request_id)
        except ProxyError as exc:
            log.info(
                "[admin] %s %s -> %d %s",
                request.method,
                request.match_info.route.name or "admin",
                exc.status,
                exc.error_type,
            )
            response = _error_response(exc, request_id)
        response.headers["request-id"] = request_id
        response.headers["cache-control"] = "no-store"
        return response

    wrapped.__name__ = handler.__name__
    return wrapped


async def _json_object(request: web.Request) -> dict[str, Any]:
    too_large = RequestTooLarge(f"request body exceeds the maximum size of {MAX_BODY_BYTES} bytes")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise too_large
    raw = await read_limited(request.content, MAX_BODY_BYTES)
    if raw is None:
        raise too_large
    if not raw.strip():
        raise InvalidRequest("request body is empty: expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def _session(request: web.Request) -> str:
    session = request.match_info["session"]
    if not is_valid_session_id(session):
        raise InvalidRequest(
            "session: not a valid session id (1-200 characters of [A-Za-z0-9._-], starting with"
            " a letter or a digit)"
        )
    return session


def _kind(request: web.Request) -> Kind:
    return KIND_PATHS[request.match_info["kind"]]


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int | str:
    """The parameter's value, or what is wrong with it."""
    text = request.query.get(name)
    if text is None:
        return default
    expected = f"{name}: expected an integer from {low} to {high}"
    if not _DIGITS.fullmatch(text):
        return expected
    value = int(text)
    return value if low <= value <= high else expected


async def _require_session(store: Store, tenant: Tenant, session: str) -> None:
    if session not in await store.list_sessions(tenant.name):
        raise NotFound(SESSION_NOT_FOUND)


# --- JSON views ------------------------------------------------------------------------------


def _item_json(item: Item) -> dict[str, Any]:
    return dataclasses.asdict(item)


def _record_json(record: Record) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "id": record.item_id,
        "version": record.version,
        "retired": record.retired,
        "item": _item_json(record.item),
    }


def _state_json(session: str, state: DurableState) -> dict[str, Any]:
    live = [r for r in state.records if not r.retired]
    return {
        "session": session,
        "facts": [_record_json(r) for r in live if r.kind == "fact"],
        "pending": [_record_json(r) for r in live if r.kind == "pending"],
        "evidence": [_record_json(r) for r in live if r.kind == "evidence"],
        "retired": [_record_json(r) for r in state.records if r.retired],
    }


def _history_json(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "recorded_at": entry.recorded_at,
        "version": entry.event.version,
        "change": change_to_json(entry.event.change),
    }


# --- changes ---------------------------------------------------------------------------------


def _parse_changes(entries: Sequence[object]) -> list[Change]:
    """Every entry as a change; :class:`ValidationFailed` naming every bad field otherwise.

    When any entry is malformed (unknown or missing fields, bad ``op``/``kind``), the answer
    names those together with every bad value of every entry; the rules against the current
    state are checked by the store, atomically with the write.
    """
    changes: list[Change] = []
    errors: list[FieldError] = []
    malformed = False
    for i, entry in enumerate(entries):
        prefix = f"changes[{i}]"
        shape: list[FieldError] = []
        if (
            isinstance(entry, Mapping)
            and entry.get("op") in ("create", "update")
            and entry.get("kind") in KINDS
            and isinstance(entry.get("item"), Mapping)
        ):
            item, item_shape = _item_shape(entry["kind"], entry["item"])
            shape = [FieldError(f"{prefix}.item.{e.field}", e.message) for e in item_shape]
            entry = {**entry, "item": item}
        try:
            change = change_from_json(entry, prefix)
        except InvalidWrite as exc:
            errors += [*shape, *exc.errors]
            malformed = True
            continue
        changes.append(change)
        errors += shape
        malformed = malformed or bool(shape)
        if isinstance(change, Create | Update):
            errors += validate_item(change.item, f"{prefix}.item")
    if malformed:
        raise _failed(errors)
    return changes


def _failed(errors: Sequence[FieldError]) -> ValidationFailed:
    """A 422 naming each bad field once (its first problem: later ones follow from it)."""
    first: dict[str, FieldError] = {}
    for error in errors:
        first.setdefault(error.field, error)
    return ValidationFailed(list(first.values()))


def _body_field(field: str) -> str:
    """A field of the one change a convenience route built, named as in that route's body."""
    for prefix in ("changes[0].item.", "changes[0].", "change.item.", "change."):
        if field.startswith(prefix):
            return field[len(prefix) :]
    return field


def _body_errors(errors: Sequence[FieldError]) -> list[FieldError]:
    return [FieldError(_body_field(e.field), e.message) for e in errors]


def _one_change(
    obj: Mapping[str, Any], state: DurableState, extra: Sequence[FieldError] = ()
) -> Change:
    """A convenience route's one change, or a 422 naming every problem as in the route's body:
    ``extra`` (the route's own checks), the shape, every field rule and every rule against
    ``state`` (the store checks them again, atomically, when it writes)."""
    try:
        change = change_from_json(dict(obj), "change")
    except InvalidWrite as exc:
        raise _failed([*extra, *_body_errors(exc.errors)]) from None
    rules = validate_changes(state, [change])
    if extra or rules:
        raise _failed([*extra, *_body_errors(rules)])
    return change


async def _write_one(store: Store, tenant: Tenant, session: str, change: Change) -> int:
    """Write one change (the store checks it again, atomically); errors named as in the body."""
    try:
        (version,) = await store.write_changes(tenant.name, session, [change])
    except InvalidWrite as exc:
        raise _failed(_body_errors(exc.errors)) from None
    log.info("[admin] tenant=%s session=%s wrote 1 change", tenant.name, session)
    return version


async def _existing(
    store: Store, tenant: Tenant, session: str, kind: Kind, item_id: str
) -> tuple[DurableState, Record]:
    state = await store.current_state(tenant.name, session)
    record = state.record(kind, item_id)
    if record is None:
        raise NotFound(f"{_NOUN[kind]} not found")
    return state, record


def _item_location(request: web.Request, session: str, item_id: str) -> str:
    kind_path = request.match_info["kind"]
    return f"{PREFIX}/sessions/{session}/{kind_path}/{quote(item_id, safe='')}"


# --- handlers --------------------------------------------------------------------------------


async def list_sessions(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    sessions = await request.app[STORE].list_sessions(tenant.name)
    return _json({"sessions": list(sessions)})


async def get_state(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    store = request.app[STORE]
    await _require_session(store, tenant, session)
    return _json(_state_json(session, await store.current_state(tenant.name, session)))


async def get_history(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    store = request.app[STORE]
    await _require_session(store, tenant, session)
    history = await store.history(tenant.name, session)
    return _json({"session": session, "history": [_history_json(e) for e in history]})


async def post_changes(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    body = await _json_object(request)
    problems = [FieldError(key, "unknown field") for key in body if key != "changes"]
    entries = body.get("changes")
    if "changes" not in body:
        problems.append(FieldError("changes", "required"))
    elif not isinstance(entries, list):
        problems.append(FieldError("changes", "expected a list of changes"))
    elif not entries:
        problems.append(FieldError("changes", "expected at least one change"))
    elif len(entries) > MAX_CHANGES:
        problems.append(FieldError("changes", f"at most {MAX_CHANGES} changes per write"))
    if problems:
        raise _failed(problems)
    assert isinstance(entries, list)
    changes = _parse_changes(entries)
    versions = await request.app[STORE].write_changes(tenant.name, session, changes)
    log.info("[admin] tenant=%s session=%s wrote %d changes", tenant.name, session, len(changes))
    applied = []
    for change, version in zip(changes, versions, strict=True):
        entry = change_to_json(change)
        item_id = entry["id"] if isinstance(change, Retire) else entry["item"]["id"]
        applied.append(
            {"op": entry["op"], "kind": entry["kind"], "id": item_id, "version": version}
        )
    return _json({"session": session, "applied": applied})


async def create_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    kind = _kind(request)
    item, shape = _item_shape(kind, await _json_object(request))
    store = request.app[STORE]
    state = await store.current_state(tenant.name, session)
    change = _one_change({"op": "create", "kind": kind, "item": item}, state, shape)
    assert isinstance(change, Create)
    version = await _write_one(store, tenant, session, change)
    record = Record(kind, change.item.id, version, change.item)
    location = _item_location(request, session, change.item.id)
    return _json(_record_json(record), status=201, headers={"location": location})


async def get_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    _state, record = await _existing(request.app[STORE], tenant, session, kind, item_id)
    return _json(_record_json(record))


def _item_shape(kind: Kind, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """``obj`` with exactly the item's fields (a missing one as ``None``), and what was off, so
    that one answer names the unknown and missing fields and every bad value together."""
    fields = dataclasses.fields(_ITEM_TYPES[kind])
    names = {f.name for f in fields}
    optional = {f.name for f in fields if f.default is not dataclasses.MISSING}
    errors = [FieldError(key, "unknown field") for key in obj if key not in names]
    errors += [
        FieldError(f.name, "required")
        for f in fields
        if f.name not in obj and f.name not in optional
    ]
    return {
        f.name: obj.get(f.name) for f in fields if f.name in obj or f.name not in optional
    }, errors


def _id_mismatch(body: Mapping[str, Any], item_id: str) -> list[FieldError]:
    if "id" in body and body["id"] != item_id:
        return [FieldError("id", "must match the id in the path")]
    return []


async def replace_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    """PUT: the body is the whole new item (``id`` may be left out: the path names it)."""
    session = _session(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await _json_object(request)
    store = request.app[STORE]
    state, _record = await _existing(store, tenant, session, kind, item_id)
    item, shape = _item_shape(kind, {**body, "id": item_id})
    extra = _id_mismatch(body, item_id) + shape
    change = _one_change({"op": "update", "kind": kind, "item": item}, state, extra)
    assert isinstance(change, Update)
    version = await _write_one(store, tenant, session, change)
    return _json(_record_json(Record(kind, item_id, version, change.item)))


async def patch_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    """PATCH: the given fields replace the current ones; the rest stay as they are."""
    session = _session(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await _json_object(request)
    store = request.app[STORE]
    state, record = await _existing(store, tenant, session, kind, item_id)
    extra = _id_mismatch(body, item_id)
    current = record.item
    if (
        isinstance(current, PendingItem)
        and body.get("status") == "done"
        and current.status != "done"
    ):
        extra += [
            FieldError(name, "required when marking a pending item done (the confirmation)")
            for name in ("source", "last_confirmed_at")
            if name not in body
        ]
    item, shape = _item_shape(kind, {**_item_json(current), **body, "id": item_id})
    change = _one_change({"op": "update", "kind": kind, "item": item}, state, extra + shape)
    assert isinstance(change, Update)
    version = await _write_one(store, tenant, session, change)
    return _json(_record_json(Record(kind, item_id, version, change.item)))


async def retire_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = _session(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await _json_object(request)
    store = request.app[STORE]
    state, record = await _existing(store, tenant, session, kind, item_id)
    unknown = [FieldError(key, "unknown field") for key in body if key not in _RETIRE_FIELDS]
    known = {key: value for key, value in body.items() if key in _RETIRE_FIELDS}
    change = _one_change({**known, "op": "retire", "kind": kind, "id": item_id}, state, unknown)
    version = await _write_one(store, tenant, session, change)
    return _json(_record_json(Record(kind, item_id, version, record.item, retired=True)))


async def get_preview(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    """The block exactly as it would be injected now, and what each pointer resolved to."""
    session = _session(request)
    store = request.app[STORE]
    await _require_session(store, tenant, session)
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
    return _json(
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
    return _json(
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
    item = session + "/{kind:" + _KIND_PATTERN + "}"
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
