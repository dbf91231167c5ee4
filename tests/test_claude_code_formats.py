"""End to end: Claude Code 2.1.197 in Anthropic, Bedrock, Vertex and Foundry mode through the
proxy, one session that compacts, with the same answer and the same forwarded views in all four.

What Claude Code sends in the platform modes (recorded against a plain recording server first):

* Bedrock (``CLAUDE_CODE_USE_BEDROCK=1``, ``CLAUDE_CODE_SKIP_BEDROCK_AUTH=1``,
  ``ANTHROPIC_BEDROCK_BASE_URL``; region from ``AWS_REGION``, default ``us-east-1``): first
  ``GET /inference-profiles?type=SYSTEM_DEFINED`` (the AWS SDK's control client: ``x-amz-user-agent``,
  ``amz-sdk-invocation-id``, ``amz-sdk-request``, no credential; a 404 is tolerated), then
  ``POST /model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream`` (the
  profile id unencoded, ``:`` kept) with no credential header, ``anthropic-version: 2023-06-01`` and
  ``anthropic-beta: claude-code-20250219`` headers, ``X-Claude-Code-Session-Id``, and a body
  without ``model``/``stream`` carrying ``"anthropic_version": "bedrock-2023-05-31"`` and
  ``"anthropic_beta": [...]`` (the other betas: interleaved thinking, tool search). Once the
  probe answered, it also asks ``GET /inference-profiles/<profile, %3A-encoded>`` (the model
  behind the profile) and, in this scenario (long tool results), counts tokens with
  ``POST /model/<the backing model>/count-tokens`` (``{"input": {"invokeModel": {"body":
  <base64>}}}``); with ``AWS_BEARER_TOKEN_BEDROCK`` unset, no credential on any of them. With
  ``AWS_BEARER_TOKEN_BEDROCK`` instead of the skip variable, every request (the probe too) carries
  ``Authorization: Bearer <token>``; ``ANTHROPIC_CUSTOM_HEADERS`` reaches the inference requests
  in both modes (how a keys-mode tenant's Claude Code presents its key).
* Vertex (``CLAUDE_CODE_USE_VERTEX=1``, ``CLAUDE_CODE_SKIP_VERTEX_AUTH=1``,
  ``ANTHROPIC_VERTEX_BASE_URL``; ``ANTHROPIC_VERTEX_PROJECT_ID`` and ``CLOUD_ML_REGION`` are
  required): no probe; ``POST <base>/projects/<p>/locations/<r>/publishers/anthropic/models/
  claude-sonnet-4-5@20250929:streamRawPredict`` (``<base>`` as given: with or without ``/v1``), no
  credential header, the betas in the ``anthropic-beta`` header, a body with ``"stream": true``
  and ``"anthropic_version": "vertex-2023-10-16"``.
* Foundry (``CLAUDE_CODE_USE_FOUNDRY=1``, ``ANTHROPIC_FOUNDRY_BASE_URL=<proxy>/anthropic``,
  ``ANTHROPIC_FOUNDRY_API_KEY``): ``POST /anthropic/v1/messages?beta=true`` with the key in
  ``x-api-key``, ``anthropic-version: 2023-06-01``, the betas in ``anthropic-beta`` and the
  Messages body, its model the catalogue's Foundry name (``claude-sonnet-4-5``: an alias the
  Claude API takes, so it goes upstream as Claude Code sent it).

The scenario is tests/test_claude_code_retrieval.py's (L1 cuts a long tool result; the model reads
it back through the proxy's hidden retrieval rounds): in Bedrock mode that stream is spliced and
then encoded as event-stream frames. Skipped without the Claude Code CLI.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.core.compaction.retrieval import TOOL_NAME
from tests.harness import LoopThread, ProxyServer
from tests.test_claude_code import (
    RUN_TIMEOUT,
    Tap,
    _describe,
    _proxy_error_answers,
    _strip_cache_control,
    find_claude,
    mode_env,
)
from tests.test_claude_code_retrieval import CODE, PROMPT, RETRIEVE, make_model
from tests.upstream import FakeUpstream, RecordedRequest

INSIDE = "claude-sonnet-4-5-20250929"
MODELS = {
    "anthropic": INSIDE,
    "bedrock": "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
    "vertex": "claude-sonnet-4-5@20250929",
    "foundry": "claude-sonnet-4-5",
}
# what the upstream gets as the model: the Anthropic id, or a Foundry name the Claude API takes
UPSTREAM_MODEL = {**dict.fromkeys(MODELS, INSIDE), "foundry": "claude-sonnet-4-5"}


def _env(mode: str, home: Path, url: str) -> dict[str, str]:
    return {**mode_env(mode, home, url), "ANTHROPIC_MODEL": MODELS[mode]}


def _view(request: RecordedRequest) -> list[Any]:
    """What compaction made of the conversation: each message's tool calls and results (the
    results' text as forwarded: cut, marked, read back), markers and ids as they are but for
    the session id (Claude Code's own, fresh per run) that artifact pointers name."""
    session = request.headers["x-claude-code-session-id"]
    view = []
    for message in request.json()["messages"]:
        content = message["content"]
        if not isinstance(content, list):
            continue
        for block in _strip_cache_control(content):
            if block.get("type") in ("tool_use", "tool_result"):
                view.append(json.loads(json.dumps(block).replace(session, "<session>")))
    return view


def _run(
    mode: str, upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread,
    tmp_path: Path, claude: str,
) -> tuple[str, list[RecordedRequest], str]:
    home = tmp_path / mode / "home"
    work = tmp_path / mode / "work"
    home.mkdir(parents=True)
    work.mkdir(parents=True)
    lines = [f"entry {i:04d}: heartbeat ok" for i in range(1900)]
    lines[1500] = f"entry 1500: the code is {CODE}"
    (work / "big.log").write_text("\n".join(lines) + "\n")
    (work / "notes.txt").write_text("nothing important here\n")
    # the same file paths in every mode: the views compare as they are
    big, notes = "/tmp/cc-formats/big.log", "/tmp/cc-formats/notes.txt"
    Path("/tmp/cc-formats").mkdir(exist_ok=True)
    Path(big).write_text((work / "big.log").read_text())
    Path(notes).write_text((work / "notes.txt").read_text())
    first = len(upstream.requests)
    upstream.script(*[make_model(big, notes)] * 500)
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    try:
        proc = subprocess.run(
            [claude, "-p", PROMPT, "--allowedTools", "Read", "--output-format", "json"],
            cwd=work, env=_env(mode, home, tap.url), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )
    finally:
        loop_thread.run(tap.stop())
    upstream._script.clear()
    tapped = tap.requests()
    context = f"--- {mode} ---\n" + _describe(proc, tapped, upstream)
    assert proc.returncode == 0, context
    result = json.loads(proc.stdout)
    assert result.get("is_error") is False, context
    if mode == "bedrock":
        paths = [r.path for r in tapped]
        assert "/inference-profiles" in paths, context
        assert any(p.startswith("/model/") and p.endswith("/invoke-with-response-stream") for p in paths), context
    if mode == "vertex":
        assert any(r.path.endswith(":streamRawPredict") for r in tapped), context
    if mode == "foundry":
        assert any(r.target == "/anthropic/v1/messages?beta=true" for r in tapped), context
        assert all(r.path.startswith("/anthropic/v1/messages") for r in tapped if r.method == "POST"), context
    assert not any(TOOL_NAME.encode() in r.body for r in tapped), context
    mains = [
        r for r in upstream.requests[first:]
        if r.path == "/v1/messages" and PROMPT.encode() in r.body
    ]
    return str(result.get("result", "")), mains, context


@pytest.mark.claude_code
@pytest.mark.timeout(4 * RUN_TIMEOUT + 60)
def test_claude_code_in_bedrock_vertex_and_foundry_mode_gets_the_same_answer_and_views(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    proxy: ProxyServer = make_proxy(
        compaction={"threshold": 12_000, "hard_limit": 1_000_000, "tool_result_cap": 1000}
    )
    runs = {mode: _run(mode, upstream, proxy, loop_thread, tmp_path, claude) for mode in MODELS}
    answer, mains, context = runs["anthropic"]
    assert f"The code in the log is {CODE}." in answer, context
    continuations = [r for r in mains if RETRIEVE.encode() in r.body]
    assert len(continuations) >= 2, context  # compacted, then read back in hidden rounds
    for mode in ("bedrock", "vertex", "foundry"):
        other_answer, other_mains, other_context = runs[mode]
        assert other_answer == answer, other_context
        assert all(r.json()["model"] == UPSTREAM_MODEL[mode] for r in other_mains), other_context
        assert [_view(r) for r in other_mains] == [_view(r) for r in mains], other_context
    assert _proxy_error_answers(proxy) == [], "\n".join(run[2] for run in runs.values())


@pytest.mark.claude_code
@pytest.mark.timeout(3 * RUN_TIMEOUT + 60)
def test_claude_code_presents_a_proxy_key_in_bedrock_vertex_and_foundry_mode(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``auth.mode: keys``: Claude Code in Bedrock mode presents the proxy key as its bearer
    token (``AWS_BEARER_TOKEN_BEDROCK``), in Vertex mode as a custom ``x-api-key`` header, in
    Foundry mode as its Foundry key (``ANTHROPIC_FOUNDRY_API_KEY``: ``x-api-key``); the tenant's
    provider key goes upstream, the proxy key never does."""
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    key, provider = "cpk-cc-formats-0123456789", "sk-ant-provider-formats-0123456789"
    policies = tmp_path / "policies"
    policies.mkdir()
    digest = hashlib.sha256(key.encode()).hexdigest()
    (policies / "acme.yaml").write_text(
        f"name: acme\napi_keys_sha256: [{digest}]\n"
        "provider: {mode: env, api_key_env: FORMATS_PROVIDER_KEY}\n"
    )
    monkeypatch.setenv("FORMATS_PROVIDER_KEY", provider)
    proxy: ProxyServer = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))
    for mode in ("bedrock", "vertex", "foundry"):
        home, work = tmp_path / mode / "home", tmp_path / mode / "work"
        home.mkdir(parents=True)
        work.mkdir(parents=True)
        env = _env(mode, home, proxy.url)
        if mode == "bedrock":
            del env["CLAUDE_CODE_SKIP_BEDROCK_AUTH"]
            env["AWS_BEARER_TOKEN_BEDROCK"] = key
        elif mode == "vertex":
            env["ANTHROPIC_CUSTOM_HEADERS"] = f"x-api-key: {key}"
        else:
            env["ANTHROPIC_FOUNDRY_API_KEY"] = key
        first = len(upstream.requests)
        upstream.script(*[make_model("/nonexistent/big.log", "/nonexistent/notes.txt")] * 50)
        proc = subprocess.run(
            [claude, "-p", "Say hello.", "--output-format", "json"], cwd=work, env=env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )
        upstream._script.clear()
        context = f"--- {mode} ---\n" + _describe(proc, [], upstream)
        assert proc.returncode == 0, context
        assert json.loads(proc.stdout)["result"] == "ok", context
        sent = upstream.requests[first:]
        assert sent, context
        for request in sent:
            assert request.headers["x-api-key"] == provider, context
            assert "authorization" not in request.headers, context
            assert key.encode() not in request.body, context
