"""Claude Code in Anthropic mode, through the proxy, to a Bedrock Runtime (and a Vertex) upstream.

Claude Code sends the betas and body fields of the Anthropic API (``claude-code-20250219``,
``prompt-caching-scope-...``, ``context_management``...); FakeBedrock answers Bedrock's 400
(``invalid beta flag``, "Extra inputs are not permitted") to any it does not accept, exactly the
failure LiteLLM users met (BerriAI/litellm#16561, #27532). The run must finish with the model's
answer and no 400 anywhere: what Bedrock does not take is dropped with its fields.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.harness import LoopThread
from tests.platform_fakes import FakeBedrock, FakeVertex
from tests.test_claude_code import (
    FINAL_TEXT,
    FIXTURES,
    PROMPT,
    RUN_TIMEOUT,
    TOOL_ID,
    _clean_env,
    _has_tool_result,
    _is_main_loop,
    _proxy_error_answers,
    find_claude,
)
from tests.test_upstream_vertex import vertex_proxy
from tests.upstream import message_json


def _model(file_path: str) -> Any:
    def answer(_path: str, body: dict[str, Any]) -> dict[str, Any]:
        if _is_main_loop(body) and _has_tool_result(body, TOOL_ID):
            return message_json(FINAL_TEXT)
        if _is_main_loop(body):
            block = {"type": "tool_use", "id": TOOL_ID, "name": "Read", "input": {"file_path": file_path}}
            return message_json(content=[block], stop_reason="tool_use")
        return message_json("ok")

    return answer


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_through_the_proxy_to_bedrock_meets_no_400(
    aws_env: Path,
    bedrock: FakeBedrock,
    make_proxy: ProxyFactory,
    loop_thread: LoopThread,
    tmp_path: Path,
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found: set CLAUDE_BIN")
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    shutil.copyfile(FIXTURES / "notes.txt", notes)
    bedrock.responder = _model(str(notes))
    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url}
    )
    try:
        proc = subprocess.run(
            [claude, "-p", PROMPT, "--allowedTools", "Read", "--output-format", "json"],
            cwd=work,
            env=_clean_env(home, proxy.url),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"Claude Code did not finish: {exc.stdout!r} {exc.stderr!r}")
    seen = [(s.path, (s.body or {}).get("anthropic_beta")) for s in bedrock.seen]
    context = f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{seen}"
    print(context)
    assert proc.returncode == 0, context
    result = json.loads(proc.stdout)
    assert result.get("is_error") is False, context
    assert FINAL_TEXT in result.get("result", ""), context
    # the proxy answered no error, and Bedrock was asked twice by the main loop, signed
    assert _proxy_error_answers(proxy) == [], context
    main = [s for s in bedrock.seen if s.body is not None and _is_main_loop(s.body)]
    assert len(main) >= 2, context
    sent_betas = {b for s in bedrock.seen if s.body for b in s.body.get("anthropic_beta", [])}
    assert "claude-code-20250219" not in sent_betas, context
    assert all(s.path.endswith("/invoke-with-response-stream") for s in main), context


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_through_the_proxy_to_vertex_meets_no_400(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The same on a Vertex upstream: FakeVertex refuses any beta Vertex does not list
    ("Unsupported beta header") and a body ``model``; Claude Code's request must get through."""
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found: set CLAUDE_BIN")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    proc = subprocess.run(
        [claude, "-p", "Say hello.", "--output-format", "json"],
        cwd=work, env=_clean_env(home, proxy.url), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    seen = [(s.path, s.headers.get("anthropic-beta")) for s in vertex.seen]
    context = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{seen}"
    assert proc.returncode == 0, context
    result = json.loads(proc.stdout)
    assert result.get("is_error") is False, context
    assert "Hello from fake Vertex" in result.get("result", ""), context
    assert _proxy_error_answers(proxy) == [], context
    assert vertex.seen and all(":streamRawPredict" in s.path or ":rawPredict" in s.path for s in vertex.seen), context
