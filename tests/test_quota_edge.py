"""Budgets and rate limits on the wire (one replica, SQLite): the official SDK through a real proxy
to the fake upstream. 429 ``rate_limit_error`` before the upstream is called, the allowance
headers, per-key limits, output reservations settled, budgets priced as the ledger prices, period
roll-over with the keeper's clock moved (no sleeping), a running stream never cut, the admin
route, and count_tokens left alone."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
import yaml

from proxy.server.appkeys import METRICS, STORE, TENANCY
from proxy.server.ledger import LEDGER
from proxy.server.quota import QUOTA
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream, Reply, Stream, message_json, message_stream_events

ACME_KEY, ACME_KEY_2, GLOBEX_KEY = "cpk-acme-quota-1", "cpk-acme-quota-2", "cpk-globex-quota-1"
ACME_ADMIN, GLOBEX_ADMIN = "cpa-acme-quota-admin-0001", "cpa-globex-quota-admin-01"
SONNET = "claude-sonnet-4-5"
MESSAGES = [{"role": "user", "content": "hello"}]


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class Clock:
    """The keeper's clock, moved by the test (shared by replicas)."""

    def __init__(self, start: str) -> None:
        self.now = at(start)

    def __call__(self) -> float:
        return self.now

    def set(self, text: str) -> None:
        self.now = at(text)


def write_policies(tmp: Path, acme_quota: dict[str, Any]) -> Path:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    tenants = (
        ("acme", [ACME_KEY, ACME_KEY_2], ACME_ADMIN, acme_quota),
        ("globex", [GLOBEX_KEY], GLOBEX_ADMIN, None),
    )
    for name, keys, admin, quota in tenants:
        policy: dict[str, Any] = {
            "name": name,
            "api_keys_sha256": [sha(k) for k in keys],
            "provider": {"mode": "passthrough"},
            "admin_tokens_sha256": [sha(admin)],
            "sources": {
                "transcript_root": str(tmp / "roots" / name / "t"),
                "artifact_root": str(tmp / "roots" / name / "a"),
            },
        }
        if quota is not None:
            policy["quota"] = quota
        (policies / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    return policies


def limited(make_proxy: Any, tmp_path: Path, quota: dict[str, Any], clock: Clock, **sections: Any) -> ProxyServer:
    proxy: ProxyServer = make_proxy(
        auth={"mode": "keys"}, policies_dir=str(write_policies(tmp_path, quota)),
        ledger={"flush_seconds": 0.01}, **sections,
    )  # fmt: skip
    proxy.app[QUOTA].clock = clock
    return proxy


def client(proxy: ProxyServer, key: str = ACME_KEY, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, default_headers=headers)


def create(proxy: ProxyServer, key: str = ACME_KEY, max_tokens: int = 50, **kw: Any) -> Any:
    return client(proxy, key).messages.with_raw_response.create(
        model=SONNET, max_tokens=max_tokens, messages=MESSAGES, **kw  # type: ignore[arg-type]
    )


def refused(proxy: ProxyServer, key: str = ACME_KEY, max_tokens: int = 50) -> anthropic.RateLimitError:
    with pytest.raises(anthropic.RateLimitError) as info:
        create(proxy, key, max_tokens)
    return info.value


def settle(proxy: ProxyServer, loop: LoopThread) -> None:
    loop.run(proxy.app[QUOTA].drain(), timeout=10)
    loop.run(proxy.app[LEDGER].flush(), timeout=10)


def quota_json(proxy: ProxyServer, loop: LoopThread, token: str = ACME_ADMIN) -> dict[str, Any]:
    settle(proxy, loop)
    answer = httpx.get(proxy.url + "/admin/v1/quota", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def used(body: dict[str, Any], metric: str, scope: str = "tenant") -> Any:
    return next(e["used"] for e in body["limits"] if e["metric"] == metric and e["scope"] == scope)


def answer_with(usage: dict[str, Any]) -> Reply:
    body = message_json("ok", model=SONNET)
    body["usage"] = usage
    return Reply(body)


def test_requests_over_the_limit_are_429_before_the_upstream_and_the_minute_rolls_over(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:15")
    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 3}, clock)
    remaining = []
    for _ in range(3):
        raw = create(proxy)
        remaining.append(raw.headers["x-context-proxy-ratelimit-requests-remaining"])
        assert raw.headers["x-context-proxy-ratelimit-requests-limit"] == "3"
        assert raw.headers["x-context-proxy-ratelimit-requests-reset"] == "2026-12-04T10:22:00Z"
    assert remaining == ["2", "1", "0"]
    error = refused(proxy)
    assert error.status_code == 429
    assert error.body["type"] == "error" and error.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert error.body["request_id"].startswith("req_cp")  # type: ignore[index]
    assert "requests per minute (3)" in error.body["error"]["message"]  # type: ignore[index]
    headers = error.response.headers
    assert headers["retry-after"] == "45" and headers["x-should-retry"] == "true"
    assert headers["x-context-proxy-ratelimit-requests-remaining"] == "0"
    assert len(upstream.requests) == 3  # the refused request never reached the provider
    registry = proxy.app[METRICS].registry
    assert registry.get_sample_value(
        "context_proxy_quota_refusals_total", {"tenant": "acme", "limit": "requests"}
    ) == 1
    # another tenant without limits: no headers, never refused
    raw = create(proxy, GLOBEX_KEY)
    assert not any(h.startswith("x-context-proxy-") for h in raw.headers)
    # the refusal took its own increment back: the counter shows the 3 admitted
    assert used(quota_json(proxy, loop_thread), "requests") == 3
    clock.set("2026-12-04T10:22:00")  # the next minute
    assert create(proxy).headers["x-context-proxy-ratelimit-requests-remaining"] == "2"


def test_each_proxy_key_has_its_own_allowance_inside_the_tenants(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(
        make_proxy, tmp_path, {"requests_per_minute": 3, "per_key": {"requests_per_minute": 2}}, clock
    )
    create(proxy, ACME_KEY)
    assert create(proxy, ACME_KEY).headers["x-context-proxy-ratelimit-requests-remaining"] == "0"
    assert "per key requests per minute (2)" in refused(proxy, ACME_KEY).message
    # the other key still has its own two, but the tenant only one more
    assert create(proxy, ACME_KEY_2).headers["x-context-proxy-ratelimit-requests-remaining"] == "0"
    assert "tenant requests per minute (3)" in refused(proxy, ACME_KEY_2).message
    body = quota_json(proxy, loop_thread)
    scopes = {(e["scope"], e["used"]) for e in body["limits"]}
    assert scopes == {("tenant", 3), (f"key:{sha(ACME_KEY)[:16]}", 2), (f"key:{sha(ACME_KEY_2)[:16]}", 1)}
    assert body["allowance"]["per_key"]["requests_per_minute"] == 2
    # globex's admin sees its own tenant only: no limits, none of acme's figures
    other = quota_json(proxy, loop_thread, GLOBEX_ADMIN)
    assert other == {"tenant": "globex", "at": "2026-12-04T10:21:00Z", "allowance": None, "limits": []}
    assert len(upstream.requests) == 3


def test_output_tokens_reserve_max_tokens_and_settle_with_the_real_figure(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(make_proxy, tmp_path, {"output_tokens_per_minute": 100}, clock)
    upstream.script(answer_with({"input_tokens": 10, "output_tokens": 30}))
    raw = create(proxy, max_tokens=60)
    assert raw.headers["x-context-proxy-ratelimit-output-tokens-remaining"] == "40"  # 60 reserved
    assert used(quota_json(proxy, loop_thread), "output_tokens") == 30  # settled: 30 produced
    upstream.script(answer_with({"input_tokens": 10, "output_tokens": 75}))
    assert create(proxy, max_tokens=90).headers["x-context-proxy-ratelimit-output-tokens-remaining"] == "0"
    settle(proxy, loop_thread)
    assert used(quota_json(proxy, loop_thread), "output_tokens") == 105  # over: 30 + 75
    refusal = refused(proxy, max_tokens=1)
    assert "output tokens per minute (100)" in refusal.message


def test_a_request_refused_by_the_proxy_after_admission_gives_its_reservation_back(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(
        make_proxy, tmp_path, {"output_tokens_per_minute": 100, "requests_per_minute": 5}, clock,
        compaction={"threshold": 50, "hard_limit": 100},
    )  # fmt: skip
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client(proxy).messages.create(model=SONNET, max_tokens=80, messages=long)  # type: ignore[arg-type]
    assert "prompt is too long" in info.value.message
    assert info.value.response.headers["x-context-proxy-ratelimit-output-tokens-remaining"] == "20"
    body = quota_json(proxy, loop_thread)
    assert (used(body, "output_tokens"), used(body, "requests")) == (0, 1)  # a request, no output
    assert upstream.requests == []


CACHED = {
    "input_tokens": 1000,
    "cache_creation_input_tokens": 300_000,
    "cache_creation": {"ephemeral_5m_input_tokens": 100_000, "ephemeral_1h_input_tokens": 200_000},
    "cache_read_input_tokens": 500_000,
    "output_tokens": 20_000,
}
# Sonnet 4.5: 3 input, 3.75 5m write, 6 1h write, 0.30 read, 15 output (USD per million)
CACHED_USD = (1000 * 3 + 100_000 * 3.75 + 200_000 * 6 + 500_000 * 0.3 + 20_000 * 15) / 1e6


def test_a_spent_budget_refuses_until_the_day_rolls_over(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    assert CACHED_USD == pytest.approx(2.028)
    clock = Clock("2026-12-04T23:59:00")
    proxy = limited(make_proxy, tmp_path, {"budget_usd": 3, "budget_period": "day"}, clock)
    upstream.script(answer_with(CACHED), answer_with(CACHED))
    raw = create(proxy)
    assert raw.headers["x-context-proxy-budget-limit-usd"] == "3.000000"
    assert raw.headers["x-context-proxy-budget-remaining-usd"] == "3.000000"
    assert raw.headers["x-context-proxy-budget-reset"] == "2026-12-05T00:00:00Z"
    settle(proxy, loop_thread)
    assert used(quota_json(proxy, loop_thread), "spend_usd") == pytest.approx(CACHED_USD, abs=1e-9)
    second = create(proxy)  # 0.972 USD left: admitted, and overshoots
    assert second.headers["x-context-proxy-budget-remaining-usd"] == f"{3 - CACHED_USD:.6f}"
    settle(proxy, loop_thread)
    error = refused(proxy)
    assert "budget of 3.00 USD per day spent" in error.message
    assert error.response.headers["retry-after"] == "60"  # to midnight UTC
    assert error.response.headers["x-should-retry"] == "false"  # a budget: no automatic retry
    assert error.response.headers["x-context-proxy-budget-remaining-usd"] == "0.000000"
    assert len(upstream.requests) == 2
    clock.set("2026-12-05T00:00:00")
    assert create(proxy).headers["x-context-proxy-budget-remaining-usd"] == "3.000000"


def test_a_monthly_budget_rolls_over_with_the_calendar_month(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-31T23:00:00")
    proxy = limited(make_proxy, tmp_path, {"budget_usd": 1, "budget_period": "month"}, clock)
    upstream.script(answer_with(CACHED))
    create(proxy)
    settle(proxy, loop_thread)
    clock.set("2026-12-31T23:59:59")
    error = refused(proxy)
    assert "per month" in error.message and error.response.headers["retry-after"] == "1"
    clock.set("2027-01-01T00:00:00")
    raw = create(proxy)
    assert raw.headers["x-context-proxy-budget-reset"] == "2027-02-01T00:00:00Z"


def test_a_running_stream_is_never_cut_when_a_limit_is_reached(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(make_proxy, tmp_path, {"budget_usd": 1}, clock)
    message = message_json("a long streamed answer", model=SONNET)
    message["usage"] = {"input_tokens": 10, "output_tokens": 5}
    hold = asyncio.Event()
    upstream.script(Stream(events=message_stream_events(message), hold={3: hold}), answer_with(CACHED))
    sync = client(proxy)
    with sync.messages.stream(model=SONNET, max_tokens=50, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        events = iter(stream)
        first = next(events)
        assert first.type == "message_start"
        create(proxy)  # meanwhile another request spends the budget
        settle(proxy, loop_thread)
        assert "budget" in refused(proxy).message
        loop_thread.loop.call_soon_threadsafe(hold.set)
        rest = list(events)
    assert rest[-1].type == "message_stop"
    assert stream.get_final_message().content[0].text == "a long streamed answer"  # type: ignore[union-attr]


def test_count_tokens_is_not_limited(upstream: FakeUpstream, make_proxy: Any, tmp_path: Path) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 1}, clock)
    create(proxy)
    for _ in range(3):
        counted = client(proxy).messages.count_tokens(model=SONNET, messages=MESSAGES)  # type: ignore[arg-type]
        assert counted.input_tokens > 0
    refused(proxy)


def test_the_store_down_at_admission_lets_requests_through(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 1}, clock)
    store = proxy.app[STORE]

    async def down(*args: Any, **kwargs: Any) -> Any:
        from proxy.store import StoreUnavailable

        raise StoreUnavailable("the store failed (test)")

    original = store.quota_add
    store.quota_add = down  # type: ignore[method-assign]
    try:
        for _ in range(3):
            raw = create(proxy)
            assert not any(h.startswith("x-context-proxy-") for h in raw.headers)
    finally:
        store.quota_add = original  # type: ignore[method-assign]
    create(proxy)
    refused(proxy)


def test_policy_keys_are_validated(tmp_path: Path) -> None:
    from proxy.config.settings import parse_config
    from proxy.tenancy.policies import PolicyError, load_tenancy

    bad = {"requests_per_minute": -1, "budget_usd": "lots", "budget_period": "week"}
    config = parse_config(
        {"auth": {"mode": "keys"}, "policies_dir": str(write_policies(tmp_path, bad)), "state_dir": str(tmp_path)}
    )
    with pytest.raises(PolicyError) as info:
        load_tenancy(config)
    text = str(info.value)
    assert "key 'quota.requests_per_minute': expected a whole number >= 0 (0 = no limit)" in text
    assert "key 'quota.budget_usd'" in text
    assert "key 'quota.budget_period': expected one of day, month" in text
    passthrough = tmp_path / "pass"
    passthrough.mkdir()
    (passthrough / "one.yaml").write_text(
        yaml.safe_dump({"name": "one", "provider": {"mode": "passthrough"}, "quota": {"per_key": {"requests_per_minute": 5}}})
    )
    config = parse_config({"policies_dir": str(passthrough), "state_dir": str(tmp_path)})
    with pytest.raises(PolicyError, match=r"key 'quota\.per_key': expected it \(and quota\.keys\) only with auth\.mode 'keys'"):
        load_tenancy(config)
    (passthrough / "one.yaml").write_text(
        yaml.safe_dump({"name": "one", "provider": {"mode": "passthrough"}, "quota": {"requests_per_minute": 5}})
    )
    assert load_tenancy(config).default.quota is not None  # type: ignore[union-attr]


def test_the_429_body_is_exactly_the_anthropic_shape(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 1}, clock)
    create(proxy)
    raw = httpx.post(
        proxy.url + "/v1/messages", headers={"x-api-key": ACME_KEY},
        content=orjson.dumps({"model": SONNET, "max_tokens": 5, "messages": MESSAGES}),
    )  # fmt: skip
    assert raw.status_code == 429 and raw.headers["content-type"].startswith("application/json")
    body = raw.json()
    assert set(body) == {"type", "error", "request_id"} and set(body["error"]) == {"type", "message"}
    assert body["request_id"] == raw.headers["request-id"]
    assert ACME_KEY not in raw.text and sha(ACME_KEY) not in raw.text
    # every value, in the provider's shape (docs.anthropic.com/en/api/errors, "Error shapes":
    # type "error", an error object with type and message, request_id; 429 = rate_limit_error)
    assert raw.headers["request-id"].startswith("req_")
    assert body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "rate limit exceeded for tenant acme: tenant requests per minute (1)"
            " (the proxy's own limits); retry after 60s",
        },
        "request_id": raw.headers["request-id"],
    }
    assert raw.headers["retry-after"] == "60" and raw.headers["x-should-retry"] == "true"


def test_the_example_policies_load_with_their_quota(tmp_path: Path) -> None:
    from proxy.config.settings import parse_config
    from proxy.core.quota import Allowance
    from proxy.tenancy.policies import load_tenancy

    root = Path(__file__).resolve().parent.parent / "policies"
    config = parse_config({"auth": {"mode": "keys"}, "policies_dir": str(root), "state_dir": str(tmp_path)})
    tenancy = load_tenancy(config, environ={"ACME_ANTHROPIC_KEY": "sk-x", "GLOBEX_ANTHROPIC_KEY": "sk-y"})
    acme = tenancy.by_name("acme")
    assert acme is not None and acme.quota is not None
    assert acme.quota.tenant == Allowance(600, 0, 80000, 250.0, "month")
    assert acme.quota.per_key == Allowance(requests_per_minute=120)


@pytest.mark.parametrize("stream", [False, True])
def test_hidden_retrieval_rounds_count_to_the_tenant(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread, stream: bool
) -> None:
    from tests.test_retrieval import CUT, SESSION, _ask, _call, _client, _round, _scripted, _text

    policies = tmp_path / "solo"
    policies.mkdir()
    quota = {"input_tokens_per_minute": 10**6, "output_tokens_per_minute": 10**6}
    (policies / "solo.yaml").write_text(
        yaml.safe_dump({"name": "solo", "provider": {"mode": "passthrough"}, "quota": quota,
                        "admin_tokens_sha256": [sha(ACME_ADMIN)]})
    )  # fmt: skip
    proxy: ProxyServer = make_proxy(compaction=dict(CUT), policies_dir=str(policies))
    proxy.app[QUOTA].clock = Clock("2026-12-04T10:21:00")
    first = _round([_text("Reading."), _call()], "tool_use", 100, 20)
    second = _round([_text("Again."), _call(offset=10, tool_id="toolu_r2")], "tool_use", 7000, 15)
    third = _round([_text("Found it.")], "end_turn", 7100, 9)
    upstream.script(*[_scripted(m, stream) for m in (first, second, third)])
    final, headers = _ask(_client(proxy, SESSION), stream)
    assert final.usage.input_tokens == 14200
    assert headers["x-context-proxy-ratelimit-output-tokens-remaining"] == str(10**6 - 100)  # max_tokens
    body = quota_json(proxy, loop_thread)
    assert (used(body, "input_tokens"), used(body, "output_tokens")) == (14200, 44)


def test_the_quota_route_answers_503_when_the_store_is_down_and_401_without_a_token(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    from proxy.store import StoreUnavailable

    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 5}, Clock("2026-12-04T10:21:00"))
    store = proxy.app[STORE]

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the store failed (test)")

    assert httpx.get(proxy.url + "/admin/v1/quota").status_code == 401
    original = store.quota_current
    store.quota_current = down  # type: ignore[method-assign]
    try:
        answer = httpx.get(proxy.url + "/admin/v1/quota", headers={"Authorization": f"Bearer {ACME_ADMIN}"})
    finally:
        store.quota_current = original  # type: ignore[method-assign]
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["type"] == "api_error"


def test_a_key_listed_in_keys_has_its_own_allowance_instead_of_per_key(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    clock = Clock("2026-12-04T10:21:00")
    quota = {"per_key": {"requests_per_minute": 1}, "keys": [{"key_sha256": sha(ACME_KEY_2), "requests_per_minute": 3}]}
    proxy = limited(make_proxy, tmp_path, quota, clock)
    second = f"key:{sha(ACME_KEY_2)[:16]}"
    body = quota_json(proxy, loop_thread)  # a key of its own is shown before it is used
    assert [(e["scope"], e["limit"], e["used"]) for e in body["limits"]] == [(second, 3, 0)]
    assert body["allowance"]["keys"][sha(ACME_KEY_2)[:16]]["requests_per_minute"] == 3
    create(proxy, ACME_KEY)
    assert "per key requests per minute (1)" in refused(proxy, ACME_KEY).message
    assert [create(proxy, ACME_KEY_2).headers["x-context-proxy-ratelimit-requests-remaining"] for _ in range(3)] == ["2", "1", "0"]
    assert "per key requests per minute (3)" in refused(proxy, ACME_KEY_2).message
    assert len(upstream.requests) == 4


def test_a_keys_entry_must_name_one_of_the_tenants_own_keys(tmp_path: Path) -> None:
    from proxy.config.settings import parse_config
    from proxy.tenancy.policies import PolicyError, load_tenancy

    pasted = "cpk-a-key-pasted-by-mistake-0001"
    quota = {"keys": [{"key_sha256": pasted, "requests_per_minute": 3}, {"key_sha256": sha(GLOBEX_KEY), "requests_per_minute": 3},
                      {"key_sha256": sha(ACME_KEY)}, {"key_sha256": sha(ACME_KEY).upper()}]}
    config = parse_config(
        {"auth": {"mode": "keys"}, "policies_dir": str(write_policies(tmp_path, quota)), "state_dir": str(tmp_path)}
    )
    with pytest.raises(PolicyError) as info:
        load_tenancy(config)
    text = str(info.value)
    assert "key 'quota.keys[0].key_sha256': expected one of this policy's api_keys_sha256" in text
    assert "key 'quota.keys[1].key_sha256': expected one of this policy's api_keys_sha256" in text  # globex's
    assert "key 'quota.keys[3].key_sha256': expected each key once, got a repeat" in text
    assert pasted not in text and sha(GLOBEX_KEY) not in text


def test_a_client_gone_during_admission_gives_its_counts_back(
    upstream: FakeUpstream, make_proxy: Any, tmp_path: Path, loop_thread: LoopThread
) -> None:
    """A request cancelled while the store counts its admission (the client went away: aiohttp
    cancels the handler) must not keep its request and its output reservation: the store's
    statement runs on, so what it added is taken back once it has."""
    clock = Clock("2026-12-04T10:21:00")
    proxy = limited(
        make_proxy, tmp_path, {"requests_per_minute": 5, "output_tokens_per_minute": 1000}, clock
    )
    tenant = proxy.app[TENANCY].current.by_name("acme")
    assert tenant is not None

    async def cancelled_while_counting() -> None:
        keeper = proxy.app[QUOTA]
        admitting = asyncio.ensure_future(keeper.admit(tenant, {"x-api-key": ACME_KEY}, 300))
        await asyncio.sleep(0)  # inside the store call now
        admitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admitting

    loop_thread.run(cancelled_while_counting())
    loop_thread.run(asyncio.sleep(0.5))  # the statement ends; its give-back is queued and written
    body = quota_json(proxy, loop_thread)
    assert (used(body, "requests"), used(body, "output_tokens")) == (0, 0)
