"""``context-proxy models``: what the proxy knows, each value marked built in or from the config,
run as a user runs it (a subprocess, a config file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from proxy.core.catalogue_data import MODELS

CONFIG = """
models:
  - match: claude-opus-4-8
    bedrock: arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc
    context_window: 900000
  - match: claude-haiku-*
    price: {input: 7, output: 8}
  - match: claude-brand-new-1
    aliases: [brand-new]
    max_output: 64000
prices:
  - model: claude-sonnet-5
    input: 1.5
    output: 9
"""


def _models(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CONTEXT_PROXY_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "proxy", "models", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_the_table_lists_every_built_in_model_unmarked(tmp_path: Path) -> None:
    proc = _models()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["MODEL", "WINDOW", "1M"]
    for row in MODELS:
        assert any(line.split()[0] == row.id for line in lines[1:]), row.id
    opus = next(line for line in lines if line.startswith("claude-opus-4-8 "))
    assert opus.split() == [
        "claude-opus-4-8", "1M", "-", "128K", "$5/$25", "no", "anthropic.claude-opus-4-8",
        "claude-opus-4-8", "claude-opus-4-8",
    ]
    mythos = next(line for line in lines if line.startswith("claude-mythos-5 "))
    assert "anthropic.claude-mythos-5~" in mythos.split()  # made by the rule: no platform id known
    assert "From the config:" not in proc.stdout


def test_values_from_the_config_are_marked_and_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    proc = _models("--config", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("claude-opus-4-8 ")  # configured entries first
    opus = lines[1].split()
    assert opus[1] == "900K*" and opus[6].startswith("arn:aws:bedrock:") and opus[6].endswith("*")
    assert opus[4] == "$5/$25"  # not configured: built in
    haiku = next(line for line in lines if line.startswith("claude-haiku-4-5-20251001 ")).split()
    assert haiku[4] == "$7/$8*"
    new = next(line for line in lines if line.startswith("claude-brand-new-1 ")).split()
    assert new[1:4] == ["200K", "-", "64K*"] and new[4] == "unpriced"
    assert (
        "  claude-opus-4-8: bedrock from config models[0]; context_window from config models[0];"
        " context_window_1m from config models[0]"
    ) in proc.stdout
    assert "  claude-brand-new-1: display from config models[2]; aliases from config models[2];" in proc.stdout
    assert "claude-sonnet-5: price from config prices[0]" in proc.stdout
    assert "glob 'claude-haiku-*' (config models[1]) applies to every model it matches" in proc.stdout


def test_named_models_show_every_value_with_its_origin(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    proc = _models("--config", str(path), "us.anthropic.claude-opus-4-8", "brand-new", "claude-opus-9")
    assert proc.returncode == 0, proc.stderr
    first, second, third = proc.stdout.split("\n\n")[:3]
    assert first.startswith("us.anthropic.claude-opus-4-8  (Claude API id claude-opus-4-8)  Claude Opus 4.8")
    assert "context window  900,000" in first and "config models[0]" in first
    assert "vertex          claude-opus-4-8" in first and "built in" in first
    assert "source          ids: Claude Code 2.1.197 catalogue" in first
    assert second.startswith("brand-new  (Claude API id claude-brand-new-1)")
    assert "the published id rule" in second and "anthropic.claude-brand-new-1 " in second
    assert "claude-opus-9" in third and "default (nothing knows this model)" in third
    assert "price $/MTok    unpriced" in third


def test_json_gives_every_value_and_origin(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    proc = _models("--config", str(path), "--json", "claude-haiku-4-5")
    assert proc.returncode == 0, proc.stderr
    [haiku] = orjson.loads(proc.stdout)
    assert haiku["id"] == "claude-haiku-4-5-20251001"
    assert haiku["price"] == {
        "value": {"input": 7.0, "cache_write_5m": 8.75, "cache_write_1h": 14.0, "cache_read": 0.7, "output": 8.0},
        "origin": "config models[1]",
    }
    assert haiku["bedrock"] == {"value": "anthropic.claude-haiku-4-5-20251001-v1:0", "origin": "built-in"}
    assert haiku["source"].startswith("ids, window: Claude Code 2.1.197 catalogue")


def test_a_bad_config_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models: [{match: 'claude-*', vertex: x}]\n")
    proc = _models("--config", str(path))
    assert proc.returncode == 2
    assert "models[0].match" in proc.stderr
