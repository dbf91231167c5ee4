"""Claude Code 2.1.197 with its DEFAULT model through the proxy to a Microsoft Foundry upstream,
in Anthropic mode and in its own Foundry mode.

FakeFoundry (tests/foundry_fake.py) checks what a Foundry resource checks: the resource's key
(Anthropic mode here) or an Entra ID token its managed-identity endpoint issued (Foundry mode
here: the proxy's azure-identity chain), the deployment -- only the Foundry names of Claude
Code's own catalogue (read from the pinned bundle, tests/claude_code_catalogue.py), Foundry's
404 ``DeploymentNotFound`` for any other -- and the betas and the fields they enable. Each run
must exit 0 with the model's answer, and no request anywhere may be answered 4xx. In Foundry
mode, every beta Claude Code sent reaches Foundry: what it sends to Foundry is accepted there
(the catalogue's rows), so the proxy drops none.

Names read from the 2.1.197 bundle: ``CLAUDE_CODE_USE_FOUNDRY``, ``ANTHROPIC_FOUNDRY_BASE_URL``
(used as given: the proxy's ``/anthropic``), ``ANTHROPIC_FOUNDRY_RESOURCE`` (else
``https://<resource>.services.ai.azure.com/anthropic/``), ``ANTHROPIC_FOUNDRY_API_KEY`` (sent as
``x-api-key``), ``CLAUDE_CODE_SKIP_FOUNDRY_AUTH`` (a token provider answering ``""``; without a key
Claude Code uses ``DefaultAzureCredential`` with ``https://cognitiveservices.azure.com/.default``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import claude_code_catalogue as cc
from tests.conftest import ProxyFactory
from tests.foundry_fake import FakeFoundry
from tests.harness import LoopThread
from tests.test_claude_code import (
    RUN_TIMEOUT,
    Tap,
    _describe,
    _proxy_error_answers,
    find_claude,
    mode_env,
)
from tests.test_upstream_foundry import KEY_VARIABLE, foundry_key, foundry_proxy  # noqa: F401
from tests.upstream import FakeUpstream


def _deployments() -> frozenset[str]:
    path = cc.bundle()
    if path is None or find_claude() is None:
        pytest.skip("Claude Code CLI not found (.ci/run installs it)")
    return frozenset(m.foundry for m in cc.read_models(path) if m.foundry)


def _betas(headers: dict[str, str] | object) -> set[str]:
    value = headers.get("anthropic-beta", "") if hasattr(headers, "get") else ""
    return {b.strip() for b in str(value).split(",") if b.strip()}


@pytest.mark.claude_code
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("mode", ["anthropic", "foundry"])
def test_claude_codes_default_model_reaches_a_foundry_deployment(
    mode: str,
    azure_env: FakeFoundry,
    foundry_key: str,  # noqa: F811
    make_proxy: ProxyFactory,
    loop_thread: LoopThread,
    upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    fake = azure_env
    fake.deployments = _deployments()
    proxy = foundry_proxy(make_proxy, fake, key=mode == "anthropic")  # Foundry mode: Entra ID
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    try:
        proc = subprocess.run(
            [find_claude() or "claude", "-p", "Say hello.", "--output-format", "json"],
            cwd=work, env=mode_env(mode, home, tap.url), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )  # fmt: skip
    finally:
        loop_thread.run(tap.stop())
    tapped = tap.requests()
    seen = [(s.path, s.body.get("model") if s.body else None, s.headers.get("anthropic-beta")) for s in fake.seen]
    context = _describe(proc, tapped, upstream) + f"\n--- Foundry saw ---\n{seen}"
    print(context)
    assert proc.returncode == 0, context
    result = json.loads(proc.stdout)
    assert result.get("is_error") is False and "fake Foundry" in result.get("result", ""), context
    assert _proxy_error_answers(proxy) == [], context
    assert upstream.requests == [], context  # everything went to Foundry
    assert fake.seen and all(s.body["model"] in fake.deployments for s in fake.seen), context
    if mode == "anthropic":  # Claude Code's default model, as Foundry's deployment
        assert any(s.body["model"] == "claude-opus-4-8" for s in fake.seen), context
        assert {s.headers.get("x-api-key") for s in fake.seen} == {foundry_key}, context
    else:
        assert all(r.path.startswith("/anthropic/v1/messages") for r in tapped), context
        assert fake.token_grants == 1, context
        assert all(s.headers["Authorization"].startswith("Bearer eyJ") for s in fake.seen), context
        # what Claude Code sends to Foundry reaches Foundry: no beta dropped on the way
        sent = set().union(*(_betas(r.headers) for r in tapped if r.method == "POST"))
        received = set().union(*(_betas(s.headers) for s in fake.seen))
        assert sent and sent <= received, (sorted(sent - received), context)


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_2_1_197_cannot_skip_foundry_auth_without_a_key(
    upstream: FakeUpstream, make_proxy: ProxyFactory, loop_thread: LoopThread, tmp_path: Path
) -> None:
    """``CLAUDE_CODE_SKIP_FOUNDRY_AUTH=1`` without ``ANTHROPIC_FOUNDRY_API_KEY``: Claude Code
    2.1.197 hands its Foundry client a token provider answering ``""``, which that client refuses
    ("Expected azureADTokenProvider function argument to return a string") before sending
    anything. So the docs tell Foundry-mode users to set ``ANTHROPIC_FOUNDRY_API_KEY`` (the proxy
    key, or any value in passthrough mode). When a later Claude Code fixes this, this test fails:
    then skip-auth works against the proxy (tests/formats/test_foundry_client.py serves a request
    without credentials) and the docs' line goes."""
    if find_claude() is None:
        pytest.skip("Claude Code CLI not found (.ci/run installs it)")
    proxy = make_proxy()
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = mode_env("foundry", home, proxy.url)
    del env["ANTHROPIC_FOUNDRY_API_KEY"]
    env["CLAUDE_CODE_SKIP_FOUNDRY_AUTH"] = "1"
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    env["ANTHROPIC_FOUNDRY_BASE_URL"] = tap.url + "/anthropic"
    try:
        proc = subprocess.run(
            [find_claude() or "claude", "-p", "Say hello.", "--output-format", "json"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
    finally:
        loop_thread.run(tap.stop())
    context = _describe(proc, tap.requests(), upstream)
    result = json.loads(proc.stdout)
    assert result.get("is_error") is True, context
    assert "Expected azureADTokenProvider function argument to return a string" in result["result"], context
    assert tap.requests() == [] and upstream.requests == [], context
