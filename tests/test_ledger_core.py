"""The ledger's derived figures (proxy.core.ledger), as tables and as properties for any usage."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.models import catalogue_of
from proxy.config.settings import parse_config
from proxy.core.catalogue import Catalogue
from proxy.core.ledger import (
    Price,
    Sums,
    Usage,
    cache_hit_ratio,
    cost_of,
    merge_usage,
    price_sums,
    row_sums,
    savings_of,
    total_input,
    usage_from,
)
from proxy.server.relay.usage import UsageTap
from tests.upstream import frame

SONNET = Price.standard(3, 15)

counts = st.one_of(st.none(), st.integers(0, 10**8))


@st.composite
def usages(draw: st.DrawFn) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"):
        value = draw(counts)
        if value is not None or draw(st.booleans()):
            raw[key] = value
    if draw(st.booleans()):
        raw["cache_creation"] = {"ephemeral_5m_input_tokens": draw(counts), "ephemeral_1h_input_tokens": draw(counts)}
    return raw


def test_usage_keeps_the_provider_figures_and_their_names() -> None:
    raw = {
        "input_tokens": 3,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 5000,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
        "output_tokens": 42,
        "service_tier": "standard",
    }
    usage = usage_from(raw)
    assert usage == Usage(3, 300, 100, 200, 5000, 42)
    assert usage.to_json() == {k: v for k, v in raw.items() if k != "service_tier"}
    assert usage_from({"input_tokens": 5}) == Usage(input_tokens=5)
    assert usage_from({"input_tokens": 5}).to_json()["cache_creation"] is None  # type: ignore[union-attr]
    for junk in (None, [], "usage", {}, {"input_tokens": True}, {"input_tokens": -1}, {"output_tokens": "7"}):
        assert usage_from(junk) is None


def test_a_stream_usage_is_message_start_then_the_last_non_null_of_each_delta() -> None:
    start = {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1,
             "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 0}}
    frozen = copy.deepcopy(start)
    merged = merge_usage(start, {"output_tokens": 5, "input_tokens": None})
    merged = merge_usage(merged, {"output_tokens": 9, "cache_creation": {"ephemeral_1h_input_tokens": 6}})
    assert merged == {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 9,
                      "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 6}}
    assert start == frozen  # never mutated


def test_the_tap_reads_message_start_and_every_message_delta() -> None:
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 7}}}
    text = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "\nevent: message_delta\ndata: {}"}}
    delta1 = {"type": "message_delta", "delta": {"stop_reason": None}, "usage": {"output_tokens": 3}}
    delta2 = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 11, "cache_read_input_tokens": 7}}
    tap = UsageTap(sse=True)
    tap.feed(frame("message_start", start))
    tap.feed(frame("content_block_delta", text) + frame("message_delta", delta1))
    tap.feed(frame("message_delta", delta2) + frame("message_stop", {"type": "message_stop"}))
    assert tap.usage == {"input_tokens": 10, "output_tokens": 11, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 7}
    assert tap.input_tokens == 17
    body = UsageTap(sse=False)
    body.feed(orjson.dumps({"type": "message", "usage": {"input_tokens": 2, "output_tokens": 3}}))
    body.close()
    assert body.usage == {"input_tokens": 2, "output_tokens": 3}


@given(usages())
def test_total_input_and_hit_ratio(raw: dict[str, Any]) -> None:
    usage = usage_from(raw)
    total = total_input(usage)
    if usage is None:
        assert total == 0
        return
    assert total == (usage.input_tokens or 0) + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0
    )
    ratio = cache_hit_ratio(usage.cache_read_input_tokens or 0, total)
    assert ratio is None if total == 0 else 0 <= ratio <= 1


def _sums(raw: dict[str, Any], before: int | None = None, after: int | None = None) -> Sums:
    return row_sums(kind="client", status=200, usage=usage_from(raw), tokens_before=before, tokens_after=after,
                    plan="new", summary="ok", compaction_id="c1")


@given(usages(), usages())
def test_cost_is_additive_non_negative_and_split_exactly(a: dict[str, Any], b: dict[str, Any]) -> None:
    sa, sb = _sums(a), _sums(b)
    ca, cb, cab = cost_of(sa, SONNET), cost_of(sb, SONNET), cost_of(sa + sb, SONNET)
    for name in ("input", "cache_write", "cache_read", "output"):
        assert getattr(cab, name) == pytest.approx(getattr(ca, name) + getattr(cb, name))
        assert getattr(ca, name) >= 0
    assert ca.total == pytest.approx(ca.input + ca.cache_write + ca.cache_read + ca.output)
    assert ca.to_json()["total"] == ca.total


def test_cache_writes_price_the_1h_share_at_the_1h_price() -> None:
    split = _sums({"cache_creation_input_tokens": 1_000_000,
                   "cache_creation": {"ephemeral_5m_input_tokens": 250_000, "ephemeral_1h_input_tokens": 750_000}})
    assert cost_of(split, SONNET).cache_write == pytest.approx(0.25 * 3.75 + 0.75 * 6)
    no_split = _sums({"cache_creation_input_tokens": 1_000_000})  # the default TTL: 5 minutes
    assert cost_of(no_split, SONNET).cache_write == pytest.approx(3.75)
    only_1h = _sums({"cache_creation_input_tokens": 1_000_000, "cache_creation": {"ephemeral_1h_input_tokens": 1_000_000}})
    assert cost_of(only_1h, SONNET).cache_write == pytest.approx(6)


@given(usages(), st.integers(0, 10**6), st.integers(0, 10**6))
def test_savings_follow_the_documented_counterfactual(raw: dict[str, Any], before: int, after: int) -> None:
    usage = usage_from(raw)
    saved = savings_of(_sums(raw, before, after), SONNET)
    assert saved >= 0
    if usage is None or after == 0 or before <= after:
        assert saved == 0
        return
    total = total_input(usage)
    removed = (before - after) * total / after
    hit = (usage.cache_read_input_tokens or 0) / total if total else 0
    assert saved == pytest.approx(removed * (hit * 0.30 + (1 - hit) * 3) / 1e6, rel=1e-9, abs=1e-12)


def test_savings_table() -> None:
    # 100k tokens sent, 200k before compaction; 90% of what was sent came from the cache
    raw = {"input_tokens": 5_000, "cache_creation_input_tokens": 5_000, "cache_read_input_tokens": 90_000}
    # removed = 100k provider tokens: 90k at the read price, 10k at the input price
    assert savings_of(_sums(raw, 200_000, 100_000), SONNET) == pytest.approx((90_000 * 0.30 + 10_000 * 3) / 1e6)


def test_prices_come_from_the_catalogue_with_the_configured_ones_first() -> None:
    table = Catalogue()
    assert table.price("claude-sonnet-4-5-20250929") == Price(3, 3.75, 6, 0.3, 15)
    assert table.price("claude-opus-4-5") == Price(5, 6.25, 10, 0.5, 25)
    assert table.price("claude-opus-4-1-20250805") == Price(15, 18.75, 30, 1.5, 75)
    assert table.price("claude-haiku-4-5") == Price(1, 1.25, 2, 0.1, 5)
    assert table.price("claude-3-5-haiku-20241022") == Price(0.8, 1, 1.6, 0.08, 4)
    assert table.price("claude-fable-5-1") == Price(10, 12.5, 20, 0.25, 50)
    assert table.price("gpt-4") is None
    config = parse_config({"prices": [
        {"model": "claude-sonnet-4*", "input": 2, "output": 10},
        {"model": "my-model", "input": 1, "output": 2, "cache_read": 0.5, "cache_write_1h": 1.5},
    ]})
    mine = catalogue_of(config)
    assert mine.price("claude-sonnet-4-5") == Price(2, 2.5, 4, 0.2, 10)
    assert mine.price("my-model") == Price(1, 1.25, 1.5, 0.5, 2)
    assert mine.price("claude-opus-4-5") == table.price("claude-opus-4-5")
    assert mine.resolve("my-model").price.origin == "config prices[1]"
    assert mine.resolve("claude-opus-4-5").price.origin == "built-in"
    # the same through the models: section, the newer spelling
    newer = catalogue_of(parse_config({"models": [{"match": "claude-sonnet-4*", "price": {"input": 2, "output": 10}}]}))
    assert newer.price("claude-sonnet-4-5") == Price(2, 2.5, 4, 0.2, 10)
    assert newer.resolve("claude-sonnet-4-5").price.origin == "config models[0]"


def test_bad_price_config_is_refused_naming_the_key() -> None:
    from proxy.config.schema import ConfigError

    with pytest.raises(ConfigError) as caught:
        parse_config({"prices": [{"model": "x", "cache_read": -2}, {"model": "y", "input": -1}]})
    text = str(caught.value)
    assert "prices[0].cache_read" in text and "prices[1].input" in text
    with pytest.raises(ConfigError, match=r"prices\[0\]\.model"):
        parse_config({"prices": [{"input": 1}]})


def test_unpriced_models_are_counted_but_not_costed() -> None:
    raw = {"input_tokens": 1_000_000, "output_tokens": 0}
    totals = price_sums([("claude-sonnet-4-5", _sums(raw)), ("mystery", _sums(raw))], Catalogue())
    assert totals.sums.input_tokens == 2_000_000
    assert totals.cost.input == pytest.approx(3)
    assert totals.unpriced_models == ("mystery",)
    shown = totals.to_json()
    assert shown["unpriced_models"] == ["mystery"]
    # a partial figure, flagged: the priced model's cost, and a note naming the other
    assert shown["cost_usd"]["total"] == pytest.approx(3)
    assert shown["unpriced_note"] == (
        "no price for mystery: add it under prices: (its calls have no cost or savings)"
    )


def test_a_session_of_unpriced_models_has_no_cost_or_savings_never_zero() -> None:
    """Nothing priced: cost and savings are unknown (null), and said why; never $0."""
    raw = {"input_tokens": 1_000, "output_tokens": 10}
    totals = price_sums(
        [("claude-x", _sums(raw, 9_000, 3_000)), ("claude-y", _sums(raw))], Catalogue()
    )
    shown = totals.to_json()
    assert shown["cost_usd"] is None and shown["savings_usd"] is None
    assert shown["provider_compaction_cost_usd"] is None
    assert shown["unpriced_note"] == (
        "no price for claude-x, claude-y: add them under prices: (their calls have no cost or savings)"
    )
    assert shown["tokens_saved"] == 6_000 and shown["tokens_saved_ratio"] == pytest.approx(6_000 / 9_000)
    # no tokens at all: nothing to flag, and nothing was spent
    empty = price_sums([], Catalogue()).to_json()
    assert empty["cost_usd"]["total"] == 0 and empty["savings_usd"] == 0
    assert empty["unpriced_note"] is None and empty["tokens_saved_ratio"] is None


def test_the_demo_model_has_its_own_price() -> None:
    """``context-proxy serve --demo``'s model is priced (its catalogue row, the demo's own), so the demo's
    savings are shown in dollars."""
    price = Catalogue().price("claude-demo-1")
    assert price == Price.standard(3, 15)
    totals = price_sums([("claude-demo-1", _sums({"input_tokens": 3_000}, 9_000, 3_000))], Catalogue())
    assert totals.priced and totals.savings == pytest.approx(6_000 * 3 / 1e6)
