"""Durable session state: facts, pending items and retrieval evidence, as an append-only history.

Nothing here does I/O. The store keeps the history; this module decides what a write may do and
what the current view is:

* Items are frozen values (:class:`Fact`, :class:`PendingItem`, :class:`Evidence`). Every item
  has a non-empty id (unique per kind), a source pointer that is not corrupt under the grammar
  of :mod:`proxy.core.pointers` (an unknown scheme is accepted; the resolver reports it as
  ``unsupported``) and a ``last_confirmed_at`` timestamp that carries a UTC offset (``Z`` or
  ``+hh:mm``). Content and titles are non-blank and at most :data:`MAX_CONTENT_CHARS`; evidence
  has ``0 <= score <= 1`` and ``rank >= 1``.
* A write is a list of changes (:class:`Create`, :class:`Update`, :class:`Retire`).
  :func:`validate_changes` checks the list against the current state, in order, and returns every
  problem as a :class:`FieldError` naming the field (``changes[2].item.score``), ready for a 422
  answer. :func:`prepare_changes` turns a valid list into versioned :class:`ChangeEvent` values
  (all or nothing: it raises :class:`InvalidWrite` if anything is wrong).
* :func:`apply` folds the history into the current view, :class:`DurableState`. Versions count
  from 1 per item and go up by exactly one per change; ids are never reused, not even after a
  retire.
* Pending items move ``open <-> blocked`` and from either to ``done``; ``done`` is final (new work
  is a new item) and needs a confirming source pointer and a ``last_confirmed_at`` later than the
  item's current one. No update may move ``last_confirmed_at`` back in time.

There is deliberately no function that reads free text (a summary, a model's answer) and yields
changes: the only way into durable state is a list of structured changes through the store's
``write_changes``.

The JSON shapes of changes (the write API's and the store history's) are
:mod:`proxy.core.durable_json`.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple, get_args

from proxy.core.pointers import BadPointer, parse_pointer

__all__ = [
    "EMPTY_STATE",
    "INITIAL_STATUSES",
    "ITEM_TYPES",
    "KINDS",
    "MAX_CONTENT_CHARS",
    "NOUNS",
    "STATUSES",
    "TRANSITIONS",
    "Change",
    "ChangeEvent",
    "Create",
    "DurableState",
    "Evidence",
    "Fact",
    "FieldError",
    "HistoryError",
    "InvalidWrite",
    "Item",
    "Kind",
    "PendingItem",
    "Record",
    "Retire",
    "Status",
    "Update",
    "apply",
    "check_timestamp",
    "kind_of",
    "parse_timestamp",
    "prepare_changes",
    "validate_changes",
    "validate_item",
]

Kind = Literal["fact", "pending", "evidence"]
Status = Literal["open", "blocked", "done"]
KINDS: tuple[Kind, ...] = get_args(Kind)
STATUSES: tuple[Status, ...] = get_args(Status)

#: Allowed status changes of a pending item (staying in the same status is an ordinary update).
TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    "open": frozenset({"open", "blocked", "done"}),
    "blocked": frozenset({"blocked", "open", "done"}),
    "done": frozenset(),
}
#: Statuses a pending item may be created with.
INITIAL_STATUSES: frozenset[Status] = frozenset({"open", "blocked"})

MAX_ID_CHARS = 256
#: Durable items are rendered into every request of the session; keep each one small.
MAX_CONTENT_CHARS = 16_384


# -- values ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fact:
    id: str
    content: str
    source: str
    last_confirmed_at: str


@dataclass(frozen=True, slots=True)
class PendingItem:
    id: str
    content: str
    status: Status
    source: str
    last_confirmed_at: str


@dataclass(frozen=True, slots=True)
class Evidence:
    """What an upstream retrieval selection decided, stored as given (never re-ranked)."""

    id: str  # the memory id
    title: str
    source: str
    captured_at: str
    score: float
    rank: int
    last_confirmed_at: str
    conflict_key: str | None = None  # set when this memory won the conflict named by the key


Item = Fact | PendingItem | Evidence

ITEM_TYPES: Mapping[Kind, type[Fact] | type[PendingItem] | type[Evidence]] = {
    "fact": Fact,
    "pending": PendingItem,
    "evidence": Evidence,
}
NOUNS: Mapping[Kind, str] = {"fact": "fact", "pending": "pending item", "evidence": "evidence"}


def kind_of(item: Item) -> Kind:
    if isinstance(item, Fact):
        return "fact"
    if isinstance(item, PendingItem):
        return "pending"
    return "evidence"


@dataclass(frozen=True, slots=True)
class Create:
    item: Item


@dataclass(frozen=True, slots=True)
class Update:
    """Replaces the whole item with the same kind and id."""

    item: Item


@dataclass(frozen=True, slots=True)
class Retire:
    kind: Kind
    item_id: str
    source: str
    retired_at: str


Change = Create | Update | Retire


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One entry of the append-only history: a change and the item version it produced."""

    version: int
    change: Change

    @property
    def kind(self) -> Kind:
        c = self.change
        return c.kind if isinstance(c, Retire) else kind_of(c.item)

    @property
    def item_id(self) -> str:
        c = self.change
        return c.item_id if isinstance(c, Retire) else c.item.id

    @property
    def op(self) -> Literal["create", "update", "retire"]:
        c = self.change
        return (
            "create" if isinstance(c, Create) else "update" if isinstance(c, Update) else "retire"
        )


@dataclass(frozen=True, slots=True)
class Record:
    """An item's latest version; a retired item keeps its last value (its id stays taken)."""

    kind: Kind
    item_id: str
    version: int
    item: Item
    retired: bool = False


@dataclass(frozen=True, slots=True)
class DurableState:
    """The current view: every record, sorted by (kind, id)."""

    records: tuple[Record, ...] = ()

    def _live(self, kind: Kind) -> tuple[Item, ...]:
        return tuple(r.item for r in self.records if r.kind == kind and not r.retired)

    @property
    def facts(self) -> tuple[Fact, ...]:
        return tuple(i for i in self._live("fact") if isinstance(i, Fact))

    @property
    def pending(self) -> tuple[PendingItem, ...]:
        return tuple(i for i in self._live("pending") if isinstance(i, PendingItem))

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        return tuple(i for i in self._live("evidence") if isinstance(i, Evidence))

    def record(self, kind: Kind, item_id: str) -> Record | None:
        for r in self.records:
            if r.kind == kind and r.item_id == item_id:
                return r
        return None


EMPTY_STATE = DurableState()


# -- errors ---------------------------------------------------------------------------------------


class FieldError(NamedTuple):
    field: str  # e.g. "changes[0].item.last_confirmed_at"
    message: str


class InvalidWrite(ValueError):
    """A write that breaks the rules; ``errors`` names every bad field. Nothing was written."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in self.errors))


class HistoryError(ValueError):
    """A history that could not have been produced by valid writes (versions out of order...)."""


# -- field checks ---------------------------------------------------------------------------------


def parse_timestamp(value: object) -> datetime | None:
    """The aware datetime of an ISO 8601 string with an offset; ``None`` for anything else."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return None
    return parsed


def check_timestamp(value: object) -> str | None:
    """``None`` if ``value`` is an ISO 8601 timestamp with an offset, else what is wrong."""
    if not isinstance(value, str):
        return "expected an ISO 8601 timestamp string"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return "not an ISO 8601 timestamp"
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return "the timestamp needs a UTC offset (Z or +hh:mm)"
    return None


def _has_control(value: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") for ch in value)


def _check_text(value: object, *, what: str, limit: int, single_line: bool) -> str | None:
    if not isinstance(value, str):
        return f"expected {what} (a string)"
    if not value.strip():
        return f"{what} must not be empty"
    if len(value) > limit:
        return f"{what} is longer than {limit} characters"
    if single_line and _has_control(value):
        return f"{what} must not contain control characters or line breaks"
    if not single_line and any(unicodedata.category(ch) == "Cs" for ch in value):
        return f"{what} must be valid Unicode"
    return None


def _check_id(value: object) -> str | None:
    return _check_text(value, what="an id", limit=MAX_ID_CHARS, single_line=True)


def _check_pointer(value: object) -> str | None:
    """Non-empty and not corrupt under the pointer grammar (an unknown scheme is accepted: the
    resolver reports it as ``unsupported``, and a newer writer may use it)."""
    if not isinstance(value, str):
        return "expected a source pointer (a string)"
    if not value:
        return "a source pointer must not be empty"
    parsed = parse_pointer(value)
    if isinstance(parsed, BadPointer) and parsed.status == "corrupt":
        return f"not a valid source pointer ({parsed.reason})"
    return None


def _check_content(value: object, what: str = "content") -> str | None:
    return _check_text(value, what=what, limit=MAX_CONTENT_CHARS, single_line=False)


def _check_score(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "expected a number between 0 and 1"
    if not math.isfinite(value) or not 0 <= value <= 1:
        return "the score must be between 0 and 1"
    return None


def _check_rank(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "expected an integer rank >= 1"
    if value < 1:
        return "the rank must be >= 1"
    return None


def _check_status(value: object) -> str | None:
    if value not in STATUSES:
        return f"expected one of {', '.join(STATUSES)}"
    return None


def _check_conflict_key(value: object) -> str | None:
    if value is None:
        return None
    return _check_text(value, what="a conflict key", limit=MAX_ID_CHARS, single_line=True)


def validate_item(item: object, prefix: str = "item") -> list[FieldError]:
    """The field rules for one item, regardless of the current state."""
    if not isinstance(item, Fact | PendingItem | Evidence):
        return [FieldError(prefix, "expected a fact, a pending item or evidence")]
    checks: list[tuple[str, str | None]] = [("id", _check_id(item.id))]
    if isinstance(item, Fact | PendingItem):
        checks.append(("content", _check_content(item.content)))
    if isinstance(item, PendingItem):
        checks.append(("status", _check_status(item.status)))
    if isinstance(item, Evidence):
        checks += [
            ("title", _check_content(item.title, "a title")),
            ("captured_at", check_timestamp(item.captured_at)),
            ("score", _check_score(item.score)),
            ("rank", _check_rank(item.rank)),
            ("conflict_key", _check_conflict_key(item.conflict_key)),
        ]
    checks += [
        ("source", _check_pointer(item.source)),
        ("last_confirmed_at", check_timestamp(item.last_confirmed_at)),
    ]
    return [FieldError(f"{prefix}.{name}", problem) for name, problem in checks if problem]


# -- rules against the state ----------------------------------------------------------------------


def _index(state: DurableState) -> dict[tuple[Kind, str], Record]:
    return {(r.kind, r.item_id): r for r in state.records}


def _later_or_equal(new: object, old: object) -> bool | None:
    """``new >= old`` as instants; ``None`` when either is not a valid timestamp."""
    a, b = parse_timestamp(new), parse_timestamp(old)
    if a is None or b is None:
        return None
    return a >= b


def _state_rules(
    change: Change, index: Mapping[tuple[Kind, str], Record], prefix: str
) -> list[FieldError]:
    if isinstance(change, Retire):
        key = (change.kind, change.item_id)
        id_field = f"{prefix}.id"
    else:
        key = (kind_of(change.item), change.item.id)
        id_field = f"{prefix}.item.id"
    noun = NOUNS.get(key[0], "item")
    current = index.get(key)
    if isinstance(change, Create):
        if current is not None:
            why = "was retired (ids are never reused)" if current.retired else "already exists"
            return [FieldError(id_field, f"a {noun} with this id {why}")]
        item = change.item
        if isinstance(item, PendingItem) and item.status not in INITIAL_STATUSES:
            return [FieldError(f"{prefix}.item.status", "a new pending item is open or blocked")]
        return []
    if current is None:
        return [FieldError(id_field, f"no {noun} with this id")]
    if current.retired:
        return [FieldError(id_field, f"this {noun} was retired")]
    if isinstance(change, Retire):
        return []
    errors: list[FieldError] = []
    old, new = current.item, change.item
    if isinstance(old, PendingItem) and isinstance(new, PendingItem):
        allowed = TRANSITIONS.get(old.status, frozenset())
        if new.status in STATUSES and new.status not in allowed:
            if old.status == "done":
                message = "a done item is final; record new work as a new pending item"
            else:
                message = f"cannot go from {old.status} to {new.status}"
            errors.append(FieldError(f"{prefix}.item.status", message))
        elif new.status == "done" and old.status != "done":
            if _later_or_equal(old.last_confirmed_at, new.last_confirmed_at) is True:
                errors.append(
                    FieldError(
                        f"{prefix}.item.last_confirmed_at",
                        "marking an item done needs a last_confirmed_at later than its current"
                        f" one ({old.last_confirmed_at})",
                    )
                )
            return errors
    if _later_or_equal(new.last_confirmed_at, old.last_confirmed_at) is False:
        errors.append(
            FieldError(
                f"{prefix}.item.last_confirmed_at",
                f"must not be earlier than the current one ({old.last_confirmed_at})",
            )
        )
    return errors


def _retire_fields(change: Retire, prefix: str) -> list[FieldError]:
    checks = [
        ("kind", None if change.kind in KINDS else f"expected one of {', '.join(KINDS)}"),
        ("id", _check_id(change.item_id)),
        ("source", _check_pointer(change.source)),
        ("retired_at", check_timestamp(change.retired_at)),
    ]
    return [FieldError(f"{prefix}.{name}", problem) for name, problem in checks if problem]


def _step(
    index: dict[tuple[Kind, str], Record], change: Change, version: int | None = None
) -> Record:
    """Apply one (already checked) change to ``index``; return the new record."""
    if isinstance(change, Retire):
        key = (change.kind, change.item_id)
        old = index[key]
        new_version = old.version + 1 if version is None else version
        record = Record(old.kind, old.item_id, new_version, old.item, True)
    else:
        key = (kind_of(change.item), change.item.id)
        old_record = index.get(key)
        next_version = 1 if old_record is None else old_record.version + 1
        record = Record(key[0], key[1], next_version if version is None else version, change.item)
    index[key] = record
    return record


def validate_changes(state: DurableState, changes: Sequence[object]) -> list[FieldError]:
    """Every problem with applying ``changes`` to ``state`` in order (empty list: all valid).

    Each change is checked against the state as left by the changes before it, so one list can
    create an item and then update it. A change with bad fields still takes effect for the checks
    of the later ones (so one mistake is not reported again as "no item with this id").
    """
    if not changes:
        return [FieldError("changes", "expected at least one change")]
    index = _index(state)
    errors: list[FieldError] = []
    for i, change in enumerate(changes):
        prefix = f"changes[{i}]"
        if isinstance(change, Retire):
            field_errors = _retire_fields(change, prefix)
            if field_errors:
                errors += field_errors
                continue
        elif isinstance(change, Create | Update):
            field_errors = validate_item(change.item, f"{prefix}.item")
            if any(e.field in (f"{prefix}.item", f"{prefix}.item.id") for e in field_errors):
                errors += field_errors
                continue
        else:
            errors.append(FieldError(prefix, "expected a create, update or retire change"))
            continue
        rule_errors = _state_rules(change, index, prefix)
        errors += field_errors + rule_errors
        if not any(e.field.endswith(".id") for e in rule_errors):
            _step(index, change)
    return errors


def prepare_changes(state: DurableState, changes: Sequence[object]) -> tuple[ChangeEvent, ...]:
    """The versioned events for ``changes``, or :class:`InvalidWrite` naming every problem."""
    errors = validate_changes(state, changes)
    if errors:
        raise InvalidWrite(errors)
    index = _index(state)
    events: list[ChangeEvent] = []
    for change in changes:
        assert isinstance(change, Create | Update | Retire)
        events.append(ChangeEvent(_step(index, change).version, change))
    return tuple(events)


def apply(history: Iterable[ChangeEvent], base: DurableState = EMPTY_STATE) -> DurableState:
    """The current view of an append-only history, checking that its versions are consistent.

    ``base`` is the view of the events before ``history`` (so a reader can fold new events only):
    ``apply(b, apply(a)) == apply([*a, *b])``.
    """
    index = _index(base)
    for n, event in enumerate(history):
        key = (event.kind, event.item_id)
        current = index.get(key)
        expected = 1 if current is None else current.version + 1
        if isinstance(event.change, Create) and current is not None:
            raise HistoryError(f"history[{n}]: {key} created twice")
        if not isinstance(event.change, Create) and (current is None or current.retired):
            raise HistoryError(f"history[{n}]: {key} changed while absent or retired")
        if event.version != expected:
            raise HistoryError(f"history[{n}]: {key} version {event.version}, expected {expected}")
        _step(index, event.change, event.version)
    order = {kind: n for n, kind in enumerate(KINDS)}
    records = sorted(index.values(), key=lambda r: (order[r.kind], r.item_id))
    return DurableState(tuple(records))
