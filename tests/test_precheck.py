"""The compaction pre-check: its offload decision (``_seen_before``: a re-sent history says which
messages an earlier request had, so those are neither dumped nor looked up again) and the
request's policy (memoised)."""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.config.compaction import limits_for, policy_from_config
from proxy.core.catalogue_data import BETA_1M
from proxy.core.compaction.digest import Resent, digests
from proxy.core.limits import betas_of
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


def test_the_request_policy_is_memoised_and_follows_every_input(make_proxy: Any) -> None:
    """The policy of a request's limits, looked up per config, model, betas and max_tokens:
    each of them still changes it, and what is memoised equals what is computed."""
    service = make_proxy().app[COMPACTION]
    config = dataclasses.replace(service.config, threshold="50%", hard_limit="auto")

    def expected(model: str, betas: str, max_tokens: object, cfg: Any = config) -> Any:
        return policy_from_config(cfg, limits_for(cfg, model, betas_of(betas), max_tokens))

    cases = [
        ("claude-sonnet-4-5", "", 1000),
        ("claude-sonnet-4-5", BETA_1M, 1000),  # the 1M window
        ("claude-sonnet-4-5", f"other,{BETA_1M}", 1000),
        ("claude-sonnet-4-5", "", 64_000),  # auto hard limit: window less max_tokens
        ("claude-haiku-3", "", 1000),
        ("claude-sonnet-4-5", "", None),
        ("claude-sonnet-4-5", "", True),  # not an int: computed every time, never memoised
        ("claude-sonnet-4-5", "", "1000"),
        ("claude-sonnet-4-5", "", [1]),
    ]
    for _ in range(2):
        got = [service._request_policy(config, *case) for case in cases]
        assert got == [expected(*case) for case in cases]
    assert len({(p.threshold, p.hard_limit) for p in got}) >= 4
    assert len(service._request_policies) == 6  # the int / None ones
    assert service._request_policy(config, *cases[0]) is service._request_policy(config, *cases[0])
    # another config (an equal one too: memoised by identity, and so recomputed) gets its own
    other = dataclasses.replace(config, threshold="40%")
    assert service._request_policy(other, *cases[0]) == expected(*cases[0], cfg=other)
    assert service._request_policy(other, *cases[0]) != service._request_policy(config, *cases[0])
    equal = dataclasses.replace(config)
    assert service._request_policy(equal, *cases[0]) == service._request_policy(config, *cases[0])
