"""``check_entry``: what the ledger refuses to record, the same on every call (its key checks
are memoised) and for any kind of value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.core.ledger import LedgerEntry, usage_from
from proxy.store.usage import check_entry

GOOD = LedgerEntry(
    at="2026-12-03T10:00:00.000+00:00",
    at_ms=1_796_292_000_000,
    tenant="acme",
    session="sess-0123456789abcdef",
    model="claude-fake-1",
    route="messages",
    kind="client",
    status=200,
    latency_ms=1.5,
    request_id="req_1",
    tokens_before=10,
    tokens_after=10,
    layers="none",
    plan="none",
    summary="skipped",
    compaction_id=None,
    usage=usage_from({"input_tokens": 5, "output_tokens": 3}),
    provider_usage={"input_tokens": 5, "output_tokens": 3},
)


def _fields(entry: Any) -> list[str]:
    return [p.field for p in check_entry(entry)]


def test_a_good_entry_passes_every_time() -> None:
    for _ in range(3):
        assert check_entry(GOOD) == []
    assert check_entry(dataclasses.replace(GOOD, session=None)) == []
    assert check_entry(dataclasses.replace(GOOD, model="modèle-ü")) == []  # non-ASCII text is fine


@pytest.mark.parametrize(
    "changes, fields",
    [
        ({"tenant": "ac me"}, ["entry.tenant"]),
        ({"tenant": ""}, ["entry.tenant"]),
        ({"tenant": ["acme"]}, ["entry.tenant"]),  # not text (and not hashable)
        ({"tenant": 7}, ["entry.tenant"]),
        ({"session": "bad session\n"}, ["entry.session"]),
        ({"session": {"id": 1}}, ["entry.session"]),
        ({"tenant": "ac me", "session": "bad session"}, ["entry.tenant", "entry.session"]),
        ({"model": "bad\x00model"}, ["entry.model"]),
        ({"layers": "\udc80"}, ["entry.layers"]),  # a lone surrogate: not UTF-8
        ({"plan": "x" * 1001}, ["entry.plan"]),
        ({"kind": "other"}, ["entry.kind"]),
    ],
)
def test_bad_fields_are_named_every_time(changes: dict[str, Any], fields: list[str]) -> None:
    entry = dataclasses.replace(GOOD, **changes)
    assert _fields(entry) == fields
    assert _fields(entry) == fields  # the memoised key check answers the same
    assert check_entry(GOOD) == []  # and a good entry after it still passes
