"""Validation resumed from a checkpoint gives exactly what validating the whole list gives.

The edge keeps the validator's state after the last messages of a valid request and, on the next
turn (whose first messages are the very same objects), validates only from there. Here: for lists
``A[:k] + T`` -- the first ``k`` messages of a list ``A`` validated before, then anything (valid,
broken, malformed) -- resuming from ``A``'s checkpoint ``k`` must equal ``validate_messages``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.protocol import Checkpoint, Violation, scan_messages, validate_messages
from tests.shared_data import CC_TRANSCRIPT
from tests.strategies import conversations
from tests.test_protocol import CASES, Q, asst, result, srv, srv_result, text, use, user

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Msg = dict[str, Any]


def checkpoints_of(messages: list[Any]) -> dict[int, Checkpoint]:
    _, kept = scan_messages(messages, None, range(len(messages) + 1))
    return {cp.index: cp for cp in kept}


def assert_resumes(base: list[Any], tail: list[Any]) -> None:
    """Every checkpoint of ``base`` at ``k``, applied to ``base[:k] + tail``."""
    for k, cp in checkpoints_of(base).items():
        messages = [*base[:k], *tail]
        before = copy.deepcopy(messages)
        resumed, _ = scan_messages(messages, cp)
        assert resumed == validate_messages(messages), (k, resumed)
        assert messages == before  # never mutates its input


def test_checkpoints_are_kept_only_where_asked_and_while_nothing_is_wrong() -> None:
    messages = [Q, asst(use("a")), user(result("a")), asst(text())]
    violation, kept = scan_messages(messages, None, {0, 2, 4, 9})
    assert violation is None
    assert [cp.index for cp in kept] == [0, 2, 4]
    # a violation found before a point: no checkpoint there (the request is refused anyway)
    broken = [Q, asst(use("a")), user(text()), asst(text()), user(text())]
    violation, kept = scan_messages(broken, None, range(6))
    assert violation is not None
    assert kept == []


def test_a_malformed_message_stops_the_scan_without_checkpoints() -> None:
    violation, kept = scan_messages([Q, "not a message", Q], None, range(4))
    assert violation == Violation(
        'messages.1: each message must be an object with "role" and "content"'
    )
    assert kept == []


def test_resuming_past_the_end_is_refused() -> None:
    cp = checkpoints_of([Q, asst(text()), Q])[3]
    with pytest.raises(ValueError, match="past the end"):
        scan_messages([Q], cp)


def test_a_checkpoint_is_a_frozen_value_that_resumes_twice() -> None:
    base = [Q, asst(use("a"), use("b")), user(result("a"), result("b")), asst(srv("s"))]
    cp = checkpoints_of(base)[2]  # two calls pending, nothing answered yet
    good = [*base[:2], user(result("b"), result("a"))]
    bad = [*base[:2], user(result("a"))]
    for _ in range(2):  # resuming must not change the checkpoint
        assert scan_messages(good, cp)[0] is None
        assert scan_messages(bad, cp)[0] == validate_messages(bad) is not None
    with pytest.raises(AttributeError):
        cp.index = 0  # type: ignore[misc]


@pytest.mark.parametrize(("name", "messages", "expected"), CASES, ids=[c[0] for c in CASES])
def test_every_table_case_resumed_from_every_prefix_of_itself(
    name: str, messages: object, expected: str | None
) -> None:
    if not isinstance(messages, list):
        return
    for k, cp in checkpoints_of(messages).items():
        resumed, _ = scan_messages(messages, cp)
        assert (resumed.message if resumed else None) == expected, (name, k)


@pytest.mark.parametrize(("name", "messages", "expected"), CASES, ids=[c[0] for c in CASES])
def test_every_table_case_after_a_valid_history(
    name: str, messages: object, expected: str | None
) -> None:
    """A valid history, then a table case's messages (their indices shift; so do the texts)."""
    if not isinstance(messages, list):
        return
    history = [Q, asst(use("h1"), srv("hs")), user(result("h1")), asst(srv_result("hs"))]
    assert_resumes(history, messages)


def test_a_real_transcript_resumed_at_every_message() -> None:
    messages: list[Msg] = json.loads(CC_TRANSCRIPT.read_text())["messages"]
    cps = checkpoints_of(messages)
    assert len(cps) == len(messages) + 1
    for k in range(0, len(messages) + 1, 7):
        assert scan_messages(messages, cps[k])[0] is None
        # ... and the same history broken after the checkpoint: dropped results
        for cut in range(k, min(len(messages), k + 6)):
            broken = [*messages[:cut], *messages[cut + 1 :]]
            assert scan_messages(broken, cps[k])[0] == validate_messages(broken), (k, cut)


def _garbage() -> st.SearchStrategy[Any]:
    """Messages the validator must refuse or judge: wrong shapes, stray tool blocks."""
    block = st.one_of(
        st.builds(text),
        st.builds(use, st.sampled_from(["a", "b", "toolu_0001"])),
        st.builds(result, st.sampled_from(["a", "b", "toolu_0001", "zz"])),
        st.builds(srv, st.sampled_from(["s", "t"])),
        st.builds(srv_result, st.sampled_from(["s", "t"])),
        st.just({"type": 3}),
        st.just({"type": "tool_use"}),
        st.just("a bare string"),
    )
    message = st.one_of(
        st.builds(lambda bs: user(*bs), st.lists(block, max_size=3)),
        st.builds(lambda bs: asst(*bs), st.lists(block, max_size=3)),
        st.just({"role": "system", "content": "note"}),
        st.just({"role": "robot", "content": "x"}),
        st.just({"role": "user", "content": 5}),
        st.just(["not", "a", "message"]),
    )
    return st.lists(message, max_size=4)


@SETTINGS
@given(conversations(max_turns=8), conversations(max_turns=4), _garbage(), st.data())
def test_resumed_validation_equals_full_validation(
    base: Any, other: Any, garbage: list[Any], data: st.DataObject
) -> None:
    """``A[:k] + T`` for a drawn valid ``A`` and ``T`` made of: another conversation's messages
    (ids clash, roles may not alternate), stray or malformed messages, or ``A``'s own tail with
    a message dropped."""
    a = base.messages
    own_tail = list(a[data.draw(st.integers(0, len(a))) :])
    if own_tail:
        del own_tail[data.draw(st.integers(0, len(own_tail) - 1))]
    tail = data.draw(
        st.sampled_from([other.messages, garbage, own_tail, [*other.messages[1:], *garbage]])
    )
    assert_resumes(a, tail)


def test_checkpoints_share_the_ids_while_none_is_added() -> None:
    """The set of tool_use ids only grows: checkpoints keep one frozenset until it does."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(3):
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "t", "input": {}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "ok"}]})
    messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    violation, kept = scan_messages(messages, None, range(len(messages) + 1))
    assert violation is None
    by_index = {cp.index: cp for cp in kept}
    assert by_index[7].client_ids == {"toolu_0", "toolu_1", "toolu_2"}
    assert by_index[7].client_ids is by_index[8].client_ids is by_index[9].client_ids
    assert by_index[2].client_ids is not by_index[7].client_ids
    # resuming keeps sharing the checkpoint's set, and gives what a whole scan gives
    again, later = scan_messages(messages, by_index[8], range(8, len(messages) + 1))
    assert again is None and later[0].client_ids is by_index[8].client_ids
    assert later == [cp for cp in kept if cp.index >= 8]
