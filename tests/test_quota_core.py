"""The pure side of budgets and rate limits (``proxy.core.quota``): windows and their roll-over,
what admission adds, the decision, the headers, and what a call costs (the ledger's prices)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.core.catalogue import price_of
from proxy.core.ledger import Price
from proxy.core.provider_usage import Usage, billing
from proxy.core.quota import (
    NANO_USD,
    Allowance,
    Charge,
    Quota,
    admission,
    charge_of,
    decide,
    iso_ms,
    rate_headers,
    settlement,
    window_of,
)


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("period", "now", "start", "end"),
    [
        ("minute", "2026-12-04T10:21:59.999", "2026-12-04T10:21:00", "2026-12-04T10:22:00"),
        ("minute", "2026-12-04T10:22:00", "2026-12-04T10:22:00", "2026-12-04T10:23:00"),
        ("day", "2026-12-04T23:59:59.999", "2026-12-04T00:00:00", "2026-12-05T00:00:00"),
        ("day", "2026-12-05T00:00:00", "2026-12-05T00:00:00", "2026-12-06T00:00:00"),
        ("month", "2026-12-31T23:59:59", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
        ("month", "2027-01-01T00:00:00", "2027-01-01T00:00:00", "2027-02-01T00:00:00"),
        ("month", "2028-02-29T12:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00"),
    ],
)
def test_windows_are_utc_minutes_days_and_calendar_months(
    period: str, now: str, start: str, end: str
) -> None:
    assert window_of(period, ms(now)) == (ms(start), ms(end))  # type: ignore[arg-type]


QUOTA = Quota(
    Allowance(
        requests_per_minute=3,
        input_tokens_per_minute=1000,
        output_tokens_per_minute=500,
        budget_usd=1.5,
        budget_period="day",
    ),
    Allowance(requests_per_minute=2),
)
NOW = ms("2026-12-04T10:21:30")


def test_admission_reserves_a_request_and_the_output_cap_in_key_order() -> None:
    counters = admission(QUOTA, "ab12", NOW, 800)
    assert [(c.scope, c.metric, c.delta, c.limit) for c in counters] == [
        ("key:ab12", "requests", 1, 2),
        ("tenant", "input_tokens", 0, 1000),
        ("tenant", "output_tokens", 500, 500),  # max_tokens 800, capped at the limit
        ("tenant", "requests", 1, 3),
        ("tenant", "spend", 0, 1_500_000_000),
    ]
    spend = counters[-1]
    assert (spend.start_ms, spend.end_ms) == (ms("2026-12-04T00:00:00"), ms("2026-12-05T00:00:00"))
    # no key (passthrough), and a max_tokens that is not a count reserves nothing
    assert [c.scope for c in admission(QUOTA, None, NOW, "x")] == ["tenant"] * 4
    assert next(c for c in admission(QUOTA, None, NOW, True) if c.metric == "output_tokens").delta == 0


def _values(counters, **used):  # type: ignore[no-untyped-def]
    return {c.key: used.get(c.metric, c.delta) for c in counters}


def test_requests_are_admitted_up_to_the_limit_exactly() -> None:
    counters = admission(QUOTA, None, NOW, 10)
    assert decide(counters, _values(counters, requests=3), NOW).admitted  # the 3rd of 3
    refused = decide(counters, _values(counters, requests=4), NOW)
    assert not refused.admitted
    assert [s.counter.metric for s in refused.refused] == ["requests"]
    assert refused.retry_after == 30  # the minute ends in 30 s
    assert "requests per minute (3)" in refused.message("acme")


def test_tokens_and_spend_refuse_once_the_window_is_at_the_limit() -> None:
    counters = admission(QUOTA, None, NOW, 10)
    # 999 input tokens used: under the limit, admitted (this request may take it over)
    assert decide(counters, _values(counters, input_tokens=999), NOW).admitted
    assert not decide(counters, _values(counters, input_tokens=1000), NOW).admitted
    # output: the value includes this request's own reservation of 10
    assert decide(counters, _values(counters, output_tokens=499 + 10), NOW).admitted
    assert not decide(counters, _values(counters, output_tokens=500 + 10), NOW).admitted
    spent = decide(counters, _values(counters, spend=1_500_000_000), NOW)
    assert not spent.admitted and spent.retry_after == 13 * 3600 + 38 * 60 + 30  # to midnight
    assert "budget of 1.50 USD per day" in spent.message("acme")


@pytest.mark.parametrize(
    ("budget", "shown"),
    [(0.025, "0.025"), (3, "3.00"), (1.5, "1.50"), (0.1, "0.10"), (1234.5678, "1234.5678"),
     (0.000000001, "0.000000001"), (50, "50.00")],
)
def test_the_refusal_states_the_budget_as_configured(budget: float, shown: str) -> None:
    quota = Quota(Allowance(budget_usd=budget, budget_period="month"))
    counters = admission(quota, None, NOW, 10)
    refused = decide(counters, _values(counters, spend=round(budget * NANO_USD)), NOW)
    assert not refused.admitted
    assert f"tenant budget of {shown} USD per month spent" in refused.message("acme")


def test_headers_show_the_tightest_scope_per_metric() -> None:
    counters = admission(QUOTA, "ab12", NOW, 10)
    values = _values(counters, input_tokens=250, spend=400_000_000)
    values[("key:ab12", "requests", ms("2026-12-04T10:21:00"))] = 2
    values[("tenant", "requests", ms("2026-12-04T10:21:00"))] = 1
    headers = rate_headers(decide(counters, values, NOW).standings)
    reset = iso_ms(ms("2026-12-04T10:22:00"))
    assert reset == "2026-12-04T10:22:00Z"
    assert headers == {
        "x-context-proxy-ratelimit-requests-limit": "2",  # the key's: 0 left, the tenant's 2
        "x-context-proxy-ratelimit-requests-remaining": "0",
        "x-context-proxy-ratelimit-requests-reset": reset,
        "x-context-proxy-ratelimit-input-tokens-limit": "1000",
        "x-context-proxy-ratelimit-input-tokens-remaining": "750",
        "x-context-proxy-ratelimit-input-tokens-reset": reset,
        "x-context-proxy-ratelimit-output-tokens-limit": "500",
        "x-context-proxy-ratelimit-output-tokens-remaining": "490",
        "x-context-proxy-ratelimit-output-tokens-reset": reset,
        "x-context-proxy-budget-limit-usd": "1.500000",
        "x-context-proxy-budget-remaining-usd": "1.100000",
        "x-context-proxy-budget-reset": "2026-12-05T00:00:00Z",
    }


def test_a_call_costs_what_the_ledger_charges_cache_writes_and_reads_at_their_own_prices() -> None:
    # Sonnet 4.5: input 3, 5m write 3.75, 1h write 6, read 0.30, output 15 (USD per million)
    price = price_of("claude-sonnet-4-5")
    assert price == Price(3, 3.75, 6, 0.3, 15)
    raw = {
        "input_tokens": 1000,
        "cache_creation_input_tokens": 30_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 10_000, "ephemeral_1h_input_tokens": 20_000},
        "cache_read_input_tokens": 50_000,
        "output_tokens": 2000,
    }
    charge = charge_of(billing(raw).usage, price)
    expected_usd = (1000 * 3 + 10_000 * 3.75 + 20_000 * 6 + 50_000 * 0.3 + 2000 * 15) / 1e6
    assert expected_usd == pytest.approx(0.2055)
    assert charge == Charge(input_tokens=31_000, output_tokens=2000, spend_nano=205_500_000)
    # without the split, creation is priced as 5-minute writes (the provider's default TTL)
    plain = charge_of(Usage(0, 1000, None, None, 0, 0), price)
    assert plain.spend_nano == round(1000 * 3.75 / 1e6 * NANO_USD)
    assert charge_of(Usage(5, 0, None, None, 0, 5), None) == Charge(5, 5, 0)  # unpriced model
    assert charge_of(None, price) == Charge()


def test_settlement_counts_in_the_admission_windows_and_replaces_the_output_reservation() -> None:
    counters = admission(QUOTA, None, NOW, 300)
    charge = Charge(input_tokens=700, output_tokens=120, spend_nano=9)
    client = {(c.metric, c.delta) for c in settlement(counters, charge, True)}
    assert client == {("input_tokens", 700), ("output_tokens", 120 - 300), ("spend", 9)}
    summary = {(c.metric, c.delta) for c in settlement(counters, charge, False)}
    assert summary == {("input_tokens", 700), ("output_tokens", 120), ("spend", 9)}
    assert {c.start_ms for c in settlement(counters, charge, True)} == {
        c.start_ms for c in counters if c.metric != "requests"
    }


def test_a_listed_key_uses_its_own_allowance_and_others_per_key() -> None:
    quota = Quota(Allowance(), Allowance(requests_per_minute=1), (("ab12", Allowance(requests_per_minute=9)),))
    assert quota.active and quota.limits_keys
    assert [(c.scope, c.limit) for c in admission(quota, "ab12", NOW, 5)] == [("key:ab12", 9)]
    assert [(c.scope, c.limit) for c in admission(quota, "cd34", NOW, 5)] == [("key:cd34", 1)]
    assert admission(quota, None, NOW, 5) == ()  # no key, no tenant-wide limit: nothing to count
    assert not Quota().active and rate_headers(()) == {}
