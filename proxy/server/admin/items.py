"""The admin API's writes to a session's durable state, and its item routes::

    POST  /admin/v1/sessions/{session}/changes                  {"changes": [...]}, all or nothing
    POST  /admin/v1/sessions/{session}/{kind}                   create one item (201)
    GET   /admin/v1/sessions/{session}/{kind}/{id}              one item (retired ones too)
    PUT   /admin/v1/sessions/{session}/{kind}/{id}              replace the item (an update)
    PATCH /admin/v1/sessions/{session}/{kind}/{id}              change some fields (an update)
    POST  /admin/v1/sessions/{session}/{kind}/{id}/retire       {"source", "retired_at"}

Every write is one ``Store.write_changes`` (the item routes build one change each); a 422 names
every bad field at once, as in the route's body. Mounted by ``routes.add_admin_routes``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from aiohttp import web

from proxy.core.durable import (
    ITEM_TYPES,
    KINDS,
    NOUNS,
    Change,
    Create,
    DurableState,
    FieldError,
    InvalidWrite,
    Kind,
    PendingItem,
    Record,
    Retire,
    Update,
    validate_changes,
    validate_item,
)
from proxy.core.durable_json import RETIRE_FIELDS, change_from_json, change_to_json, item_json
from proxy.core.errors import NotFound
from proxy.server.admin.wire import PREFIX, failed, json_object, json_response, session_of
from proxy.server.appkeys import STORE
from proxy.store.base import Store
from proxy.tenancy.tenants import Tenant

__all__ = [
    "KIND_PATHS",
    "KIND_PATTERN",
    "MAX_CHANGES",
    "create_item",
    "get_item",
    "patch_item",
    "post_changes",
    "record_json",
    "replace_item",
    "retire_item",
]

log = logging.getLogger("context_proxy.admin")

MAX_CHANGES = 1000

KIND_PATHS: Mapping[str, Kind] = {"facts": "fact", "pending": "pending", "evidence": "evidence"}
KIND_PATTERN = "|".join(KIND_PATHS)


def _kind(request: web.Request) -> Kind:
    return KIND_PATHS[request.match_info["kind"]]


# --- JSON views ------------------------------------------------------------------------------


def record_json(record: Record) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "id": record.item_id,
        "version": record.version,
        "retired": record.retired,
        "item": item_json(record.item),
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
        raise failed(errors)
    return changes


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
        raise failed([*extra, *_body_errors(exc.errors)]) from None
    rules = validate_changes(state, [change])
    if extra or rules:
        raise failed([*extra, *_body_errors(rules)])
    return change


async def _write_one(store: Store, tenant: Tenant, session: str, change: Change) -> int:
    """Write one change (the store checks it again, atomically); errors named as in the body."""
    try:
        (version,) = await store.write_changes(tenant.name, session, [change])
    except InvalidWrite as exc:
        raise failed(_body_errors(exc.errors)) from None
    log.info("[admin] tenant=%s session=%s wrote 1 change", tenant.name, session)
    return version


async def _existing(
    store: Store, tenant: Tenant, session: str, kind: Kind, item_id: str
) -> tuple[DurableState, Record]:
    state = await store.current_state(tenant.name, session)
    record = state.record(kind, item_id)
    if record is None:
        raise NotFound(f"{NOUNS[kind]} not found")
    return state, record


def _item_location(request: web.Request, session: str, item_id: str) -> str:
    kind_path = request.match_info["kind"]
    return f"{PREFIX}/sessions/{session}/{kind_path}/{quote(item_id, safe='')}"


# --- handlers --------------------------------------------------------------------------------


async def post_changes(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    body = await json_object(request)
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
        raise failed(problems)
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
    return json_response({"session": session, "applied": applied})


async def create_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    kind = _kind(request)
    item, shape = _item_shape(kind, await json_object(request))
    store = request.app[STORE]
    state = await store.current_state(tenant.name, session)
    change = _one_change({"op": "create", "kind": kind, "item": item}, state, shape)
    assert isinstance(change, Create)
    version = await _write_one(store, tenant, session, change)
    record = Record(kind, change.item.id, version, change.item)
    location = _item_location(request, session, change.item.id)
    return json_response(record_json(record), status=201, headers={"location": location})


async def get_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    _state, record = await _existing(request.app[STORE], tenant, session, kind, item_id)
    return json_response(record_json(record))


def _item_shape(kind: Kind, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """``obj`` with exactly the item's fields (a missing one as ``None``), and what was off, so
    that one answer names the unknown and missing fields and every bad value together."""
    fields = dataclasses.fields(ITEM_TYPES[kind])
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
    session = session_of(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await json_object(request)
    store = request.app[STORE]
    state, _record = await _existing(store, tenant, session, kind, item_id)
    item, shape = _item_shape(kind, {**body, "id": item_id})
    extra = _id_mismatch(body, item_id) + shape
    change = _one_change({"op": "update", "kind": kind, "item": item}, state, extra)
    assert isinstance(change, Update)
    version = await _write_one(store, tenant, session, change)
    return json_response(record_json(Record(kind, item_id, version, change.item)))


async def patch_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    """PATCH: the given fields replace the current ones; the rest stay as they are."""
    session = session_of(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await json_object(request)
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
    item, shape = _item_shape(kind, {**item_json(current), **body, "id": item_id})
    change = _one_change({"op": "update", "kind": kind, "item": item}, state, extra + shape)
    assert isinstance(change, Update)
    version = await _write_one(store, tenant, session, change)
    return json_response(record_json(Record(kind, item_id, version, change.item)))


async def retire_item(request: web.Request, tenant: Tenant) -> web.StreamResponse:
    session = session_of(request)
    kind = _kind(request)
    item_id = request.match_info["item_id"]
    body = await json_object(request)
    store = request.app[STORE]
    state, record = await _existing(store, tenant, session, kind, item_id)
    unknown = [FieldError(key, "unknown field") for key in body if key not in RETIRE_FIELDS]
    known = {key: value for key, value in body.items() if key in RETIRE_FIELDS}
    change = _one_change({**known, "op": "retire", "kind": kind, "id": item_id}, state, unknown)
    version = await _write_one(store, tenant, session, change)
    return json_response(record_json(Record(kind, item_id, version, record.item, retired=True)))
