"""The durable-state rules as tables: item fields, transitions, versions, JSON shapes."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from proxy.core import durable
from proxy.core.durable import (
    EMPTY_STATE,
    STATUSES,
    TRANSITIONS,
    Change,
    ChangeEvent,
    Create,
    DurableState,
    Evidence,
    Fact,
    HistoryError,
    InvalidWrite,
    PendingItem,
    Retire,
    Status,
    Update,
    apply,
    check_timestamp,
    prepare_changes,
    validate_changes,
    validate_item,
)
from proxy.core.durable_json import change_from_json, change_to_json, changes_from_json
from proxy.core.render import render_state

T0 = "2025-03-01T10:00:00Z"
T1 = "2025-03-01T10:05:00+00:00"
T2 = "2025-03-01T12:10:00+02:00"  # 10:10Z
SRC = "transcript:s1:1"

FACT = Fact("f1", "the store is SQLite", SRC, T0)
TODO = PendingItem("p1", "write the tests", "open", SRC, T0)
EVIDENCE = Evidence("m1", "ADR 7", SRC, T0, 0.75, 1, T0, "db-choice")


def fields_of(errors: list[durable.FieldError]) -> list[str]:
    return [e.field for e in errors]


# -- fields -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("2025-03-01T10:00:00Z", True),
        ("2025-03-01T10:00:00+05:30", True),
        ("2025-03-01T10:00:00.123456-08:00", True),
        ("2025-03-01T10:00:00", False),  # naive
        ("2025-03-01", False),
        ("yesterday", False),
        ("", False),
        (1_740_823_200, False),
        (None, False),
    ],
)
def test_timestamps_need_an_offset(value: object, ok: bool) -> None:
    assert (check_timestamp(value) is None) is ok


def _bad(item: Any, **changes: Any) -> list[str]:
    return fields_of(validate_item(dataclasses.replace(item, **changes)))


@pytest.mark.parametrize(
    ("item", "changes", "bad_fields"),
    [
        (FACT, {}, []),
        (FACT, {"id": ""}, ["item.id"]),
        (FACT, {"id": "   "}, ["item.id"]),
        (FACT, {"id": "a\nb"}, ["item.id"]),
        (FACT, {"id": "x" * 257}, ["item.id"]),
        (FACT, {"id": 7}, ["item.id"]),
        (FACT, {"content": ""}, ["item.content"]),
        (FACT, {"content": " \n\t"}, ["item.content"]),
        (FACT, {"content": "line one\nline two"}, []),  # multi-line content is fine (escaped)
        (FACT, {"content": "x" * 16_385}, ["item.content"]),
        (FACT, {"source": ""}, ["item.source"]),
        (FACT, {"source": "transcript:s1:0"}, ["item.source"]),  # corrupt pointer
        (FACT, {"source": "transcript:s1:1\n"}, ["item.source"]),
        (FACT, {"source": "newscheme:anything"}, []),  # unsupported, reported by the resolver
        (FACT, {"last_confirmed_at": "2025-03-01T10:00:00"}, ["item.last_confirmed_at"]),
        (
            FACT,
            {"content": "", "source": "", "last_confirmed_at": ""},
            [
                "item.content",
                "item.source",
                "item.last_confirmed_at",
            ],
        ),
        (TODO, {}, []),
        (TODO, {"status": "closed"}, ["item.status"]),
        (EVIDENCE, {}, []),
        (EVIDENCE, {"conflict_key": None}, []),
        (EVIDENCE, {"conflict_key": ""}, ["item.conflict_key"]),
        (EVIDENCE, {"title": ""}, ["item.title"]),
        (EVIDENCE, {"captured_at": "2025-03-01"}, ["item.captured_at"]),
        (EVIDENCE, {"score": 0}, []),
        (EVIDENCE, {"score": 1}, []),
        (EVIDENCE, {"score": 1.0000001}, ["item.score"]),
        (EVIDENCE, {"score": -0.1}, ["item.score"]),
        (EVIDENCE, {"score": float("nan")}, ["item.score"]),
        (EVIDENCE, {"score": float("inf")}, ["item.score"]),
        (EVIDENCE, {"score": True}, ["item.score"]),
        (EVIDENCE, {"score": "0.5"}, ["item.score"]),
        (EVIDENCE, {"rank": 0}, ["item.rank"]),
        (EVIDENCE, {"rank": -3}, ["item.rank"]),
        (EVIDENCE, {"rank": 1.0}, ["item.rank"]),
        (EVIDENCE, {"rank": True}, ["item.rank"]),
    ],
)
def test_item_field_rules(item: Any, changes: dict[str, Any], bad_fields: list[str]) -> None:
    assert _bad(item, **changes) == bad_fields


def test_not_an_item() -> None:
    assert fields_of(validate_item("a fact", "changes[0].item")) == ["changes[0].item"]


# -- rules against the state -----------------------------------------------------------------------


def state_of(*changes: Change) -> DurableState:
    return apply(prepare_changes(EMPTY_STATE, changes))


def test_unique_ids_per_kind() -> None:
    state = state_of(Create(FACT))
    assert fields_of(validate_changes(state, [Create(FACT)])) == ["changes[0].item.id"]
    # The same id in another kind is a different item.
    assert validate_changes(state, [Create(dataclasses.replace(TODO, id="f1"))]) == []
    # ... and twice in one batch is a duplicate too.
    assert fields_of(validate_changes(EMPTY_STATE, [Create(FACT), Create(FACT)])) == [
        "changes[1].item.id"
    ]


def test_update_and_retire_need_a_live_item() -> None:
    assert fields_of(validate_changes(EMPTY_STATE, [Update(FACT)])) == ["changes[0].item.id"]
    retire = Retire("fact", "f1", SRC, T1)
    assert fields_of(validate_changes(EMPTY_STATE, [retire])) == ["changes[0].id"]
    retired = state_of(Create(FACT), retire)
    for change in (Update(FACT), retire, Create(FACT)):
        errors = validate_changes(retired, [change])
        assert len(errors) == 1 and "retired" in errors[0].message


def test_retire_fields() -> None:
    bad = Retire("note", "", "", "today")  # type: ignore[arg-type]
    assert fields_of(validate_changes(state_of(Create(FACT)), [bad])) == [
        "changes[0].kind",
        "changes[0].id",
        "changes[0].source",
        "changes[0].retired_at",
    ]


def test_last_confirmed_at_never_goes_back() -> None:
    state = state_of(Create(dataclasses.replace(FACT, last_confirmed_at=T1)))
    back = Update(dataclasses.replace(FACT, last_confirmed_at=T0))
    assert fields_of(validate_changes(state, [back])) == ["changes[0].item.last_confirmed_at"]
    same_instant = Update(dataclasses.replace(FACT, last_confirmed_at="2025-03-01T11:05:00+01:00"))
    assert validate_changes(state, [same_instant]) == []


def test_one_mistake_is_reported_once() -> None:
    """A create with a bad field still counts as existing for the later changes of the batch."""
    bad_create = Create(dataclasses.replace(TODO, content=""))
    update = Update(dataclasses.replace(TODO, status="blocked"))
    assert fields_of(validate_changes(EMPTY_STATE, [bad_create, update])) == [
        "changes[0].item.content"
    ]


def test_not_a_change_and_empty_batch() -> None:
    summary = "persistence uses plain JSON; no pending work"
    assert fields_of(validate_changes(EMPTY_STATE, [summary])) == ["changes[0]"]
    assert fields_of(validate_changes(EMPTY_STATE, [])) == ["changes"]


# -- pending transitions -------------------------------------------------------------------------


def test_transition_table() -> None:
    assert dict(TRANSITIONS) == {
        "open": {"open", "blocked", "done"},
        "blocked": {"blocked", "open", "done"},
        "done": set(),
    }


@pytest.mark.parametrize(("old", "new"), list(itertools.product(STATUSES, STATUSES)))
def test_every_status_pair(old: Status, new: Status) -> None:
    start: list[Change] = [Create(TODO)]
    if old != "open":
        start.append(Update(dataclasses.replace(TODO, status=old, last_confirmed_at=T1)))
    state = state_of(*start)
    change = Update(dataclasses.replace(TODO, status=new, last_confirmed_at=T2))
    errors = validate_changes(state, [change])
    if new in TRANSITIONS[old]:
        assert errors == []
    else:
        assert fields_of(errors) == ["changes[0].item.status"]


@pytest.mark.parametrize(
    ("source", "at", "bad_fields"),
    [
        ("transcript:s1:9", T1, []),
        ("", T1, ["changes[0].item.source"]),
        ("transcript:s1:9", T0, ["changes[0].item.last_confirmed_at"]),
        ("transcript:s1:9", "2025-03-01T11:00:00+01:00", ["changes[0].item.last_confirmed_at"]),
        ("transcript:s1:9", "2025-03-01T09:00:00Z", ["changes[0].item.last_confirmed_at"]),
        ("", T0, ["changes[0].item.source", "changes[0].item.last_confirmed_at"]),
    ],
)
def test_done_needs_a_pointer_and_a_newer_confirmation(
    source: str, at: str, bad_fields: list[str]
) -> None:
    done = Update(PendingItem("p1", "write the tests", "done", source, at))
    assert fields_of(validate_changes(state_of(Create(TODO)), [done])) == bad_fields


def test_pending_items_are_born_open_or_blocked() -> None:
    assert (
        validate_changes(EMPTY_STATE, [Create(dataclasses.replace(TODO, status="blocked"))]) == []
    )
    born_done = Create(dataclasses.replace(TODO, status="done"))
    assert fields_of(validate_changes(EMPTY_STATE, [born_done])) == ["changes[0].item.status"]


# -- versions and history -----------------------------------------------------------------------


def test_prepare_assigns_versions_and_is_all_or_nothing() -> None:
    events = prepare_changes(
        EMPTY_STATE,
        [Create(FACT), Update(dataclasses.replace(FACT, content="v2")), Create(TODO)],
    )
    assert [(e.item_id, e.version, e.op) for e in events] == [
        ("f1", 1, "create"),
        ("f1", 2, "update"),
        ("p1", 1, "create"),
    ]
    with pytest.raises(InvalidWrite) as caught:
        prepare_changes(EMPTY_STATE, [Create(TODO), Create(dataclasses.replace(FACT, id=""))])
    assert [e.field for e in caught.value.errors] == ["changes[1].item.id"]
    assert "changes[1].item.id" in str(caught.value)


def test_apply_derives_the_current_view() -> None:
    history = prepare_changes(
        EMPTY_STATE,
        [
            Create(EVIDENCE),
            Create(FACT),
            Create(TODO),
            Update(dataclasses.replace(FACT, content="v2", last_confirmed_at=T1)),
            Retire("evidence", "m1", SRC, T1),
        ],
    )
    state = apply(history)
    assert state.facts == (dataclasses.replace(FACT, content="v2", last_confirmed_at=T1),)
    assert state.pending == (TODO,)
    assert state.evidence == ()
    assert [(r.kind, r.item_id, r.version, r.retired) for r in state.records] == [
        ("fact", "f1", 2, False),
        ("pending", "p1", 1, False),
        ("evidence", "m1", 2, True),
    ]
    # Folding in two parts is folding once.
    assert apply(history[3:], apply(history[:3])) == state


@pytest.mark.parametrize(
    "history",
    [
        [ChangeEvent(2, Create(FACT))],
        [ChangeEvent(1, Create(FACT)), ChangeEvent(1, Create(FACT))],
        [ChangeEvent(1, Create(FACT)), ChangeEvent(3, Update(FACT))],
        [ChangeEvent(1, Create(FACT)), ChangeEvent(1, Update(FACT))],
        [ChangeEvent(1, Update(FACT))],
        [
            ChangeEvent(1, Create(FACT)),
            ChangeEvent(2, Retire("fact", "f1", SRC, T1)),
            ChangeEvent(3, Update(FACT)),
        ],
    ],
)
def test_apply_refuses_inconsistent_history(history: list[ChangeEvent]) -> None:
    with pytest.raises(HistoryError):
        apply(history)


# -- JSON ---------------------------------------------------------------------------------------


def test_json_round_trip() -> None:
    changes: list[Change] = [
        Create(FACT),
        Update(TODO),
        Create(EVIDENCE),
        Create(dataclasses.replace(EVIDENCE, id="m2", conflict_key=None)),
        Retire("fact", "f1", SRC, T1),
    ]
    for change in changes:
        assert change_from_json(change_to_json(change)) == change
    assert changes_from_json([change_to_json(c) for c in changes]) == tuple(changes)


def test_json_structure_errors_name_fields() -> None:
    body: list[Any] = [
        {"op": "create", "kind": "fact", "item": {"id": "f1", "content": "x", "source": SRC}},
        {"op": "delete", "kind": "memo"},
        "persistence uses plain JSON; no pending work",
        {"op": "retire", "kind": "fact", "id": "f1", "source": SRC, "retired_at": T0, "why": 1},
        {"op": "update", "kind": "pending", "item": ["p1"]},
    ]
    with pytest.raises(InvalidWrite) as caught:
        changes_from_json(body)
    assert [e.field for e in caught.value.errors] == [
        "changes[0].item.last_confirmed_at",
        "changes[1].op",
        "changes[1].kind",
        "changes[2]",
        "changes[3].why",
        "changes[4].item",
    ]
    with pytest.raises(InvalidWrite) as caught:
        changes_from_json("persistence uses plain JSON; no pending work")
    assert [e.field for e in caught.value.errors] == ["changes"]


def test_json_types_are_checked_by_the_same_rules() -> None:
    item = {
        "id": "m1",
        "title": "t",
        "source": SRC,
        "captured_at": T0,
        "score": "high",
        "rank": "1",
        "last_confirmed_at": T0,
    }
    (change,) = changes_from_json([{"op": "create", "kind": "evidence", "item": item}])
    assert fields_of(validate_changes(EMPTY_STATE, [change])) == [
        "changes[0].item.score",
        "changes[0].item.rank",
    ]


# -- model output has no way in ---------------------------------------------------------------------


def test_a_summary_text_is_refused_as_a_change_and_a_state_cannot_be_edited() -> None:
    """The only way to a new state is structured changes through prepare_changes + apply.

    A model's summary (or answer) is text: it is not a change, is refused as one, and its
    existence does not alter the state or its rendering by a single byte. (That the proxy never
    writes a summary into the store: ``test_durable_edge.py::test_a_summary_cannot_change_durable_state``.)
    """
    state = state_of(
        Create(dataclasses.replace(FACT, content="persistence uses SQLite")), Create(TODO)
    )
    before = render_state(state, {})
    summary = "persistence uses plain JSON; no pending work"

    with pytest.raises(InvalidWrite):
        prepare_changes(state, [summary])
    with pytest.raises(InvalidWrite):
        changes_from_json(summary)
    with pytest.raises(InvalidWrite):
        changes_from_json([{"op": "update", "kind": "fact", "item": summary}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.records = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.facts[0].content = summary  # type: ignore[misc]

    assert render_state(state, {}) == before
    assert state.pending == (TODO,)
    assert "plain JSON" not in before
