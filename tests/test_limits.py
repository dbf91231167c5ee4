"""Limits follow the model: the catalogue's windows, the 1M beta, config overrides, ``auto``
hard limits and relative thresholds, validated by ``check-config`` and applied on the wire."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.config.compaction import limits_for, policy_from_config
from proxy.config.models import catalogue_of
from proxy.config.schema import ConfigError
from proxy.config.settings import CompactionConfig, parse_config
from proxy.core.catalogue import Catalogue, make_entry
from proxy.core.catalogue_data import BETA_1M, DEFAULT_CONTEXT_WINDOW
from proxy.core.limits import betas_of, resolve_limits
from proxy.core.tokens import TokenCounter
from tests.upstream import FakeUpstream, Reply, message_json

KEY = "sk-ant-limits-test-000222"


@pytest.mark.parametrize(
    ("model", "betas", "window"),
    [
        ("claude-sonnet-4-5", (), 200_000),
        ("claude-sonnet-4-5", (BETA_1M,), 1_000_000),
        ("claude-sonnet-4-5-20250929", (BETA_1M, "other-beta"), 1_000_000),
        ("claude-sonnet-4-6", (), 1_000_000),  # 1M on its page, without the beta
        ("claude-opus-4-6", (BETA_1M,), 1_000_000),
        ("claude-opus-4-8", (), 1_000_000),
        ("us.anthropic.claude-opus-4-8", (), 1_000_000),  # any platform's spelling
        ("claude-opus-4-5", (BETA_1M,), 200_000),  # the beta does nothing for it
        ("claude-haiku-4-5", (BETA_1M,), 200_000),
        ("claude-fable-5", (), 1_000_000),
        ("some-other-model", (BETA_1M,), DEFAULT_CONTEXT_WINDOW),
    ],
)
def test_builtin_windows(model: str, betas: tuple[str, ...], window: int) -> None:
    assert Catalogue().window(model, betas) == window


def test_config_entries_come_first_in_their_order() -> None:
    catalogue = Catalogue([
        make_entry("claude-sonnet-4-5*", "models[0]", context_window=150_000),
        make_entry("claude-*", "models[1]", context_window=300_000, context_window_1m=2_000_000),
        make_entry("mine-*", "models[2]", context_window=32_000),
    ])
    assert catalogue.window("claude-sonnet-4-5", (BETA_1M,)) == 150_000  # the entry decides both
    assert catalogue.window("claude-sonnet-4-5", ()) == 150_000
    assert catalogue.window("claude-haiku-4-5", ()) == 300_000
    assert catalogue.window("claude-haiku-4-5", (BETA_1M,)) == 2_000_000
    assert catalogue.window("mine-7b", ()) == 32_000
    assert catalogue.window("Claude-Sonnet-4-5", ()) == DEFAULT_CONTEXT_WINDOW  # case


def test_resolution() -> None:
    assert betas_of(f" a , {BETA_1M},,") == {"a", BETA_1M}
    assert resolve_limits(80_000, "auto", 200_000, 64_000) == resolve_limits(
        80_000, "auto", 200_000, 64_000
    )
    limits = resolve_limits(80_000, "auto", 200_000, 64_000)
    assert (limits.threshold, limits.hard_limit) == (80_000, 136_000)
    limits = resolve_limits("40%", "auto", 1_000_000, 32_000)
    assert (limits.threshold, limits.hard_limit) == (400_000, 968_000)
    limits = resolve_limits("40%", "90%", 200_000, None)
    assert (limits.threshold, limits.hard_limit) == (80_000, 180_000)
    # a threshold over the hard limit is lowered to it; nonsense max_tokens counts as 0
    limits = resolve_limits(150_000, "auto", 200_000, 100_000)
    assert (limits.threshold, limits.hard_limit) == (100_000, 100_000)
    assert resolve_limits(1_000, "auto", 200_000, "lots").hard_limit == 200_000
    assert resolve_limits(1_000, "auto", 200_000, True).hard_limit == 200_000
    # the policy the edge makes for a request
    config = CompactionConfig(threshold="25%")
    limits = limits_for(config, "claude-sonnet-4-5", [BETA_1M], 8_000)
    policy = policy_from_config(config, limits)
    assert (policy.threshold, policy.hard_limit) == (250_000, 992_000)


def test_config_forms_and_check_config(tmp_path: Path) -> None:
    config = parse_config(
        {
            "compaction": {"threshold": "40%", "hard_limit": "95%"},
            "models": [{"match": "mine-*", "context_window": 32_000, "context_window_1m": 64_000}],
        }
    )
    assert config.compaction.threshold == "40%" and config.compaction.hard_limit == "95%"
    mine = catalogue_of(config)
    assert (mine.window("mine-7b"), mine.window("mine-7b", [BETA_1M])) == (32_000, 64_000)
    assert mine.resolve("mine-7b").context_window.origin == "config models[0]"
    assert CompactionConfig().hard_limit == "auto"

    bad = {
        "compaction": {
            "threshold": "40",
            "hard_limit": "automatic",
            "summary": {"input_budget": 1_000, "max_tokens": 2_000, "max_calls": 0},
        },
        "models": [{"match": "", "context_window": -1}, {"match": "x", "context_window_1m": -5}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(bad, "bad.yaml")
    errors = info.value.errors
    assert any("key 'compaction.threshold': expected a positive number of tokens or a share" in e for e in errors)
    assert any("key 'compaction.hard_limit'" in e and '"auto"' in e for e in errors)
    assert any("key 'compaction.summary.max_calls': expected a positive number" in e for e in errors)
    assert any("key 'models[0].context_window': expected a positive number" in e for e in errors)
    assert any("key 'models[0].match': expected a model id or a non-empty glob" in e for e in errors)
    assert any("key 'models[1].context_window_1m': expected a positive number of tokens, or 0" in e for e in errors)
    # the cross-key checks run once every key is well-formed
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "compaction": {"summary": {"input_budget": 1_000, "max_tokens": 2_000}},
                "models": [{"context_window": 1_000}],
            }
        )
    errors = info.value.errors
    assert any("key 'compaction.summary.input_budget': expected at least" in e for e in errors)
    assert any("key 'models[0].match': expected a model id or a non-empty glob" in e for e in errors)
    for text in ("compaction: {threshold: '150%'}\n", "compaction: {threshold: [1]}\n"):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        proc = subprocess.run(
            [sys.executable, "-m", "proxy", "check-config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "CONTEXT_PROXY_CONFIG"},
        )
        assert proc.returncode != 0
        assert "compaction.threshold" in proc.stderr + proc.stdout


# --- on the wire --------------------------------------------------------------------------------


def _messages(tokens: int) -> list[dict[str, Any]]:
    """A request of about ``tokens`` tokens whose size is all in its last message (nothing a
    layer could cut)."""
    counter = TokenCounter()
    words = max(1, tokens - 40)
    last = "word " * words
    messages = [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": last},
    ]
    total = counter.count_request(None, None, messages).total
    return [*messages[:2], {"role": "user", "content": "word " * (words + tokens - total)}]


def _send(proxy: Any, model: str, messages: list[dict[str, Any]], max_tokens: int, **headers: str) -> Any:
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers=headers)
    return client.messages.with_raw_response.create(model=model, max_tokens=max_tokens, messages=messages)  # type: ignore[arg-type]


def test_the_proxy_refuses_only_what_the_provider_would(upstream: FakeUpstream, make_proxy: Any) -> None:
    upstream.script(lambda req: Reply(message_json("ok")))
    # compaction starts late (90% of the window): the hard limit is what is tested
    proxy = make_proxy(compaction={"threshold": "90%"})
    messages = _messages(120_007)

    # 120,007 tokens to claude-sonnet-4-5 (a 200,000 window): forwarded as it came
    r = _send(proxy, "claude-sonnet-4-5", messages, 1_000)
    assert r.http_response.status_code == 200
    assert int(r.headers["x-compaction-tokens-before"]) == 120_007
    assert orjson.loads(upstream.requests[-1].body)["messages"] == messages
    sent = len(upstream.requests)

    # 195,000 tokens + max_tokens 10,000 > 200,000: refused, nothing sent (no summary call either)
    big = _messages(195_000)
    with pytest.raises(anthropic.BadRequestError) as info:
        _send(proxy, "claude-sonnet-4-5", big, 10_000)
    assert "> 190000 maximum" in info.value.body["error"]["message"]  # type: ignore[index]
    assert len(upstream.requests) == sent

    # the same with the 1M beta: the provider would take it, so the proxy forwards it
    r = _send(proxy, "claude-sonnet-4-5", big, 10_000, **{"anthropic-beta": f"other,{BETA_1M}"})
    assert r.http_response.status_code == 200
    assert len(upstream.requests) == sent + 1
    assert upstream.requests[-1].headers["anthropic-beta"] == f"other,{BETA_1M}"

    # ... but not for a model without a 1M window
    with pytest.raises(anthropic.BadRequestError):
        _send(proxy, "claude-haiku-4-5", big, 10_000, **{"anthropic-beta": BETA_1M})
    assert len(upstream.requests) == sent + 1


def test_models_entries_override_the_table(upstream: FakeUpstream, make_proxy: Any) -> None:
    upstream.script(lambda req: Reply(message_json("ok")))
    proxy = make_proxy(
        compaction={"threshold": "90%"},
        models=[{"match": "claude-sonnet-4-5*", "context_window": 100_000}],
    )
    with pytest.raises(anthropic.BadRequestError) as info:
        _send(proxy, "claude-sonnet-4-5-20250929", _messages(120_007), 1_000)
    assert "> 99000 maximum" in info.value.body["error"]["message"]  # type: ignore[index]
    assert upstream.requests == []
