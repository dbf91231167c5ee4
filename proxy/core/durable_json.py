"""Durable changes as JSON: the shapes the write API takes and the store's history keeps.

    {"op": "create" | "update", "kind": "fact" | "pending" | "evidence", "item": {...}}
    {"op": "retire", "kind": ..., "id": "...", "source": "...", "retired_at": "..."}

Structure only: :func:`change_from_json` names every missing or unknown field as a
:class:`~proxy.core.durable.FieldError`; the rules on the values themselves are
:func:`proxy.core.durable.validate_item`'s, one rule set for JSON and Python callers alike.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, cast

from proxy.core.durable import (
    ITEM_TYPES,
    KINDS,
    Change,
    Create,
    Evidence,
    FieldError,
    InvalidWrite,
    Item,
    Kind,
    Retire,
    Update,
    kind_of,
)

__all__ = ["RETIRE_FIELDS", "change_from_json", "change_to_json", "changes_from_json", "item_json"]


def item_json(item: Item) -> dict[str, Any]:
    """An item's fields as JSON (every field, by name)."""
    return {f.name: getattr(item, f.name) for f in fields(item)}


def change_to_json(change: Change) -> dict[str, Any]:
    if isinstance(change, Retire):
        return {
            "op": "retire",
            "kind": change.kind,
            "id": change.item_id,
            "source": change.source,
            "retired_at": change.retired_at,
        }
    op = "create" if isinstance(change, Create) else "update"
    return {"op": op, "kind": kind_of(change.item), "item": item_json(change.item)}


_OPS = ("create", "update", "retire")
#: What a retire carries besides its kind and id.
RETIRE_FIELDS = ("source", "retired_at")


def _keys(
    obj: Mapping[str, Any], required: Iterable[str], optional: Iterable[str], prefix: str
) -> list[FieldError]:
    required, optional = tuple(required), tuple(optional)
    errors = [FieldError(f"{prefix}.{k}", "required") for k in required if k not in obj]
    errors += [
        FieldError(f"{prefix}.{k}", "unknown field")
        for k in obj
        if k not in required and k not in optional
    ]
    return errors


def _change_or_errors(obj: object, prefix: str) -> Change | list[FieldError]:
    if not isinstance(obj, Mapping):
        return [FieldError(prefix, "expected an object")]
    op, kind = obj.get("op"), cast(Kind, obj.get("kind"))
    errors: list[FieldError] = []
    if op not in _OPS:
        errors.append(FieldError(f"{prefix}.op", f"expected one of {', '.join(_OPS)}"))
    if kind not in KINDS:
        errors.append(FieldError(f"{prefix}.kind", f"expected one of {', '.join(KINDS)}"))
    if errors:
        return errors
    if op == "retire":
        errors = _keys(obj, ("op", "kind", "id", *RETIRE_FIELDS), (), prefix)
        if errors:
            return errors
        return Retire(kind, obj["id"], obj["source"], obj["retired_at"])
    errors = _keys(obj, ("op", "kind", "item"), (), prefix)
    if errors:
        return errors
    item_obj = obj["item"]
    if not isinstance(item_obj, Mapping):
        return [FieldError(f"{prefix}.item", "expected an object")]
    cls = ITEM_TYPES[kind]
    names = [f.name for f in fields(cls)]
    optional = ("conflict_key",) if cls is Evidence else ()
    required = [n for n in names if n not in optional]
    errors = _keys(item_obj, required, optional, f"{prefix}.item")
    if errors:
        return errors
    # Types are checked by validate_item, one rule set for JSON and Python callers alike.
    item = cls(**{n: item_obj[n] for n in names if n in item_obj})
    return Create(item) if op == "create" else Update(item)


def change_from_json(obj: object, prefix: str = "change") -> Change:
    """One change from its JSON shape (structure only: field rules are :func:`validate_item`)."""
    result = _change_or_errors(obj, prefix)
    if isinstance(result, list):
        raise InvalidWrite(result)
    return result


def changes_from_json(obj: object) -> tuple[Change, ...]:
    """A write API body's ``changes`` list; :class:`InvalidWrite` names every structural error."""
    if not isinstance(obj, list):
        raise InvalidWrite([FieldError("changes", "expected a list of changes")])
    changes: list[Change] = []
    errors: list[FieldError] = []
    for i, entry in enumerate(obj):
        result = _change_or_errors(entry, f"changes[{i}]")
        if isinstance(result, list):
            errors += result
        else:
            changes.append(result)
    if errors:
        raise InvalidWrite(errors)
    return tuple(changes)
