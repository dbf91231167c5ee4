"""The compaction pre-check's offload decision (``_seen_before``): a re-sent history says which
messages an earlier request had, so those are neither dumped nor looked up again."""

from __future__ import annotations

from typing import Any

from proxy.core.compaction.digest import Resent, digests
from proxy.server.appkeys import COMPACTION

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "start"},
    {"role": "assistant", "content": [{"type": "text", "text": "ok " * 50}]},
    {"role": "user", "content": "more"},
    {"role": "assistant", "content": [{"type": "text", "text": "fine"}]},
    {"role": "user", "content": "next"},
]


def test_a_resent_history_is_seen_before_from_its_digests(make_proxy: Any) -> None:
    service = make_proxy().app[COMPACTION]
    known = digests(HISTORY[:3])
    # The counter has never seen these messages: only the digests say they were sent before.
    assert not service.counter.seen_message(HISTORY[2])
    resent = Resent(HISTORY, known)
    assert service._seen_before(resent, 10_000)
    # the new messages must be small: over the limit, it is cold work (a thread's)
    assert not service._seen_before(resent, 20)
    # an equal message that is another object was not sent before (as far as the digests go)
    copied = Resent([*HISTORY[:2], dict(HISTORY[2]), *HISTORY[3:]], known)
    assert not service._seen_before(copied, 10_000)
    # the whole request re-sent: nothing is new
    assert service._seen_before(Resent(HISTORY, digests(HISTORY)), 1)


def test_without_digests_the_token_memo_decides(make_proxy: Any) -> None:
    service = make_proxy().app[COMPACTION]
    assert not service._seen_before(list(HISTORY[:2]), 10_000)  # too short to be a next turn
    assert not service._seen_before(list(HISTORY), 10_000)  # never counted
    assert not service._seen_before(Resent(HISTORY, None), 10_000)
    service.counter.count_request(None, None, HISTORY[:3], keys=digests(HISTORY[:3]).keys)
    assert service._seen_before(list(HISTORY), 10_000)
    assert service._seen_before(Resent(HISTORY, None), 10_000)
    assert not service._seen_before(list(HISTORY), 20)
