"""Claude Code 2.1.197 with its DEFAULT model (no ``--model``, no ``ANTHROPIC_MODEL``), through the
proxy to Bedrock and Vertex upstreams, in Anthropic mode and in the platforms' own client modes.

The platform fakes check what the platforms check: FakeBedrock the SigV4 signature and the model
id -- only the inference profiles of the models in Claude Code's own catalogue (read from the
pinned bundle, tests/claude_code_catalogue.py): a base id is AWS's on-demand refusal, anything
else "The provided model identifier is invalid." (what Bedrock answered the invented
``us.anthropic.claude-opus-4-8-v1:0``) -- the betas in its body and the fields they enable;
FakeVertex the OAuth token its token endpoint issued, the model name (Claude Code's catalogue's
Vertex names) and the betas in the header. Each run must exit 0 with the model's answer, and no
request anywhere may be answered 4xx: not by the proxy, not by the platform.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import claude_code_catalogue as cc
from tests.conftest import ProxyFactory
from tests.harness import ProxyServer
from tests.platform_fakes import FakeBedrock, FakeVertex
from tests.test_claude_code import RUN_TIMEOUT, _proxy_error_answers, find_claude, mode_env
from tests.test_upstream_bedrock import bedrock_proxy
from tests.test_upstream_vertex import vertex_proxy


def _oracle() -> list[cc.CcModel]:
    path = cc.bundle()
    if path is None or find_claude() is None:
        pytest.skip("Claude Code CLI not found (.ci/run installs it)")
    return cc.read_models(path)


def _bedrock_models(models: list[cc.CcModel]) -> frozenset[str]:
    """The base ids behind Claude Code's Bedrock profiles (``us.anthropic.x`` -> ``anthropic.x``)."""
    return frozenset(m.bedrock.partition(".")[2] for m in models if m.bedrock)


def _run(mode: str, proxy: ProxyServer, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    home, work = tmp_path / mode / "home", tmp_path / mode / "work"
    home.mkdir(parents=True)
    work.mkdir(parents=True)
    proc = subprocess.run(
        [find_claude() or "claude", "-p", "Say hello.", "--output-format", "json"],
        cwd=work, env=mode_env(mode, home, proxy.url), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    return proc, f"--- {mode} mode: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _seen(fake: FakeBedrock | FakeVertex) -> list[tuple[str, Any]]:
    return [(s.path, s.headers.get("anthropic-beta") or (s.body or {}).get("anthropic_beta")) for s in fake.seen]


def _answered(
    mode: str, proxy: ProxyServer, fake: FakeBedrock | FakeVertex, tmp_path: Path, answer: str
) -> str:
    """Claude Code's run in ``mode``: exit 0 with the fake's answer, no 4xx from the proxy (the
    fake refuses what the platform would: any refusal ends the run in an error)."""
    proc, context = _run(mode, proxy, tmp_path)
    context += f"\n{_seen(fake)}"
    print(context)
    assert proc.returncode == 0, context
    result = json.loads(proc.stdout)
    assert result.get("is_error") is False and answer in result.get("result", ""), context
    assert _proxy_error_answers(proxy) == [], context
    return context


@pytest.mark.claude_code
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("mode", ["anthropic", "bedrock"])
def test_claude_codes_default_model_reaches_bedrock_as_a_model_it_serves(
    mode: str, aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    models = _oracle()
    bedrock.models = _bedrock_models(models)
    proxy = bedrock_proxy(make_proxy, bedrock)  # profile_geo left at "auto": us-east-1 -> us
    context = _answered(mode, proxy, bedrock, tmp_path, "fake Bedrock")
    invoked = [s.path for s in bedrock.seen if "/invoke" in s.path]
    assert invoked, context
    # every model id Bedrock saw is one of Claude Code's own (the fake refused any other), and
    # the main loop's is Claude Code's default model's profile in Anthropic mode
    profiles = {m.bedrock for m in models if m.bedrock}
    for path in invoked:
        assert path.split("/")[2].replace("%3A", ":") in profiles, context
    if mode == "anthropic":
        assert any(p.startswith("/model/us.anthropic.claude-opus-4-8/") for p in invoked), context


@pytest.mark.claude_code
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("mode", ["anthropic", "vertex"])
def test_claude_codes_default_model_reaches_vertex_with_its_betas(
    mode: str, vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    models = _oracle()
    vertex.models = frozenset(m.vertex for m in models if m.vertex)
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    context = _answered(mode, proxy, vertex, tmp_path, "fake Vertex")
    predicted = [s for s in vertex.seen if "RawPredict" in s.path]
    assert predicted, context
    if mode == "anthropic":
        main = [s for s in predicted if "/models/claude-opus-4-8:" in s.path]
        assert main, context
        # Claude Code sends the effort beta with its default model (an effort model): Vertex gets it
        assert all("effort-2025-11-24" in s.headers["anthropic-beta"].split(",") for s in main), context
    # what Claude Code sends to Vertex itself reaches Vertex through the proxy: its own beta and
    # effort (with output_config.effort when it sets one)
    for s in predicted:
        betas = set((s.headers.get("anthropic-beta") or "").split(","))
        assert "claude-code-20250219" in betas or "haiku" in s.path, context
        effort = (s.body or {}).get("output_config", {}).get("effort")
        if effort is not None:
            assert "effort-2025-11-24" in betas, context
