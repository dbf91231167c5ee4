"""Config and policy files as an attack surface: bounded size, bounded alias expansion, every
printed value cut short, and no value of a secret-bearing key ever printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from proxy.config.schema import MAX_FILE_BYTES, ConfigError, parse_yaml, shown
from proxy.config.settings import load_config, parse_config
from tests.harness import ListeningProcess
from tests.upstream import FakeUpstream


def _bomb(levels: int, key: str = "x") -> str:
    """A "billion laughs": each level lists the previous one 9 times (9**levels values)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"{key}: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )


def test_an_alias_bomb_is_refused_at_once_by_check_config(tmp_path: Path) -> None:
    bomb = _bomb(10, key="limits")
    assert len(bomb) < 500
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    started = time.monotonic()
    result = _check_config(path)
    assert result.returncode == 1
    assert time.monotonic() - started < 15  # a process start; it took 36 s and 2 GB on main
    assert len(result.stderr) < 2000, len(result.stderr)
    assert "aliases are expanded" in result.stderr and str(path) in result.stderr


def test_a_moderate_alias_use_is_fine() -> None:
    text = "base: &b {threshold: 1000, hard_limit: 2000}\ncompaction: *b\n"
    data = parse_yaml(text)
    assert data["compaction"] == {"threshold": 1000, "hard_limit": 2000}


def test_recursive_aliases_deep_nesting_and_big_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="recursive alias"):
        parse_yaml("a: &a [*a]\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml("[" * 100 + "]" * 100)
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_yaml("[" * 100_000 + "]" * 100_000)
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(big)


def test_printed_values_are_cut_short() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": {"port": "9" * 100_000}}, "<t>")
    assert len(str(info.value)) < 300
    with pytest.raises(ConfigError) as info:
        parse_config({"limits": [list(range(10_000))] * 10_000}, "<t>")
    assert len(str(info.value)) < 300
    assert len(shown({"k" * 1000: ["v" * 1000] * 1000})) <= 80


def test_many_problems_print_a_bounded_text() -> None:
    data = {f"unknown_{i}": i for i in range(10_000)}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "<t>")
    assert len(info.value.errors) == 10_000
    text = str(info.value)
    assert "9950 more problem(s) not shown" in text
    assert text.count("\n") == 50


@pytest.mark.parametrize(
    "value",
    ["[[cpk-SECRET-0001]]", "[{cpk-SECRET-0001: 1}]", "{a: cpk-SECRET-0001}", "cpk-SECRET-0001", "[12345]"],
)
@pytest.mark.parametrize("key", ["api_keys_sha256", "admin_tokens_sha256"])
def test_no_value_of_a_secret_bearing_key_is_ever_printed(tmp_path: Path, key: str, value: str) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(
        f"name: acme\n{key}: {value}\nprovider: {{mode: env, api_key_env: ACME_KEY}}\n"
    )
    config = tmp_path / "proxy.yaml"
    config.write_text(f"state_dir: '{tmp_path}'\nauth: {{mode: keys}}\npolicies_dir: '{policies}'\n")
    result = _check_config(config)
    assert result.returncode == 1
    assert key in result.stderr
    assert "cpk-SECRET" not in result.stderr + result.stdout
    assert "12345" not in result.stderr


def test_secret_bearing_names_in_the_config() -> None:
    assert "hunter2" not in shown(["hunter2"], "upstream.api_key")
    assert "hunter2" not in shown({"p": "hunter2"}, "x.db_password")
    assert "hunter2" not in shown("hunter2", "tenants[0].client_secret")
    assert "hunter2" in shown("hunter2", "listen.host")


def test_sighup_with_an_alias_bomb_neither_freezes_nor_floods(tmp_path: Path, upstream: FakeUpstream) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text("name: acme\nprovider: {mode: passthrough}\n")
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\npolicies_dir: '{policies}'\n"
    )
    process = ListeningProcess(["serve", "--config", str(config), "--port", "0"])
    try:
        (policies / "acme.yaml").write_text(_bomb(10, key="compaction"))
        process.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not any("policies not reloaded" in line for line in process.lines):
            assert time.monotonic() < deadline, "".join(process.lines)[-2000:]
            started = time.monotonic()
            assert httpx.get(process.url + "/healthz", timeout=5).status_code == 200
            assert time.monotonic() - started < 1
            time.sleep(0.05)
        assert httpx.get(process.url + "/healthz", timeout=5).status_code == 200
        assert max(len(line) for line in process.lines) < 2000
    finally:
        process.stop()
