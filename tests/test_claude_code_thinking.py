"""End to end: Claude Code itself on a model that binds thinking blocks to their prefix, thinking
on, through a compacting proxy, against a provider that enforces the published rules.

Claude Code runs with ``--model claude-fable-5-1`` (its main loop sends ``thinking: adaptive``).
The fake upstream plays the provider by ``tests/provider_rules`` (platform.claude.com/docs/en/
build-with-claude/thinking, "Preserved thinking": a block replayed under another prefix is the
400 ``Invalid `signature` in `thinking` block. The block is bound to a different conversation.``
unless the request asks for ``drop_block``; Claude Code answers that 400 by turning thinking off
for the rest of the conversation). Its model reads ten files, each answer starting with a signed
thinking block, while the proxy compacts the conversation (a low threshold) and injects a
durable fact. Checked: not one request was refused, thinking stayed on to the end (every main
request kept ``thinking`` and its blocks), the proxy asked the provider to drop the stale blocks
and the provider dropped only those, and Claude Code finished with the model's answer.
Skipped without the Claude Code CLI (see tests/test_claude_code.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.core.durable import Create, Fact
from proxy.core.thinking import BINDING_BETA
from proxy.server.appkeys import STORE
from tests.harness import LoopThread, ProxyServer
from tests.provider_rules import ProviderRules, Turn
from tests.test_claude_code import RUN_TIMEOUT, Tap, _clean_env, find_claude, run_through_tap
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

MODEL = "claude-fable-5-1"
PROMPT = "Read f0.txt to f9.txt one at a time, then tell me the last line of f9.txt."
FILES = 10
SESSION = "5b0c1d2e-0000-4000-8000-000000000bbb"


def model_for(work: Path) -> Any:
    def answer(req: RecordedRequest) -> Reply | Turn:
        if req.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": max(1, len(req.body) // 4)})
        body = req.json()
        if body.get("model") == "summary-model":
            return Reply(message_json("Summary: the files were read in order.", model="summary-model"))
        text = json.dumps(body.get("messages", []))
        if PROMPT not in text:
            return Turn(text="ok")  # a side request
        # the newest file read (the recent turns survive compaction; older reads may not)
        done = 1 + max((i for i in range(FILES) if f"f{i}.txt contents" in text), default=-1)
        if done < FILES:
            return Turn(thinking=f"Next I read f{done}.txt.", tool_use=("Read", {"file_path": str(work / f"f{done}.txt")}))
        return Turn(thinking="All files are read.", text="The last line of f9.txt is: f9.txt contents end.")

    return answer


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 90)
def test_claude_code_on_a_binding_model_keeps_thinking_through_compaction(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    rules = ProviderRules()
    upstream.use_rules(rules)
    proxy: ProxyServer = make_proxy(
        compaction={"threshold": 30_000, "hard_limit": 1_000_000, "keep_recent": 4,
                    "tool_result_cap": 100_000, "summary": {"model": "summary-model"}},
    )
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    for i in range(FILES):
        lines = [f"f{i}.txt contents line {n}: " + "filler words " * 8 for n in range(260)]
        (work / f"f{i}.txt").write_text("\n".join([*lines, f"f{i}.txt contents end."]) + "\n")
    # a durable fact for the session: the proxy's block in system (one more prefix rewrite)
    upstream.script(*[model_for(work)] * 600)
    fact = Fact("layout", "the files are f0 to f9", f"transcript:{SESSION}:1", "2026-12-01T10:00:00Z")
    loop_thread.run(proxy.app[STORE].write_changes("default", SESSION, [Create(fact)]))
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    result, _, context = run_through_tap(
        claude,
        ["-p", PROMPT, "--model", MODEL, "--session-id", SESSION, "--allowedTools", "Read",
         "--output-format", "json"],
        work=work, env=_clean_env(home, tap.url), tap=tap, loop_thread=loop_thread,
        upstream=upstream, timeout=RUN_TIMEOUT + 60,
    )  # fmt: skip
    assert "f9.txt contents end." in result.get("result", ""), context

    refused = [v.rejection.message for v in upstream.verdicts if v.rejection is not None]
    assert refused == [], refused  # not one 400: Claude Code never turned thinking off
    main = [r for r in upstream.requests if r.path == "/v1/messages" and PROMPT in r.body.decode(errors="replace")]
    assert len(main) >= FILES, context
    assert all(r.json().get("thinking", {}).get("type") == "adaptive" for r in main), context
    # the last request still replays thinking blocks (Claude Code kept them), and the proxy
    # compacted on the way and asked the provider to drop what its rewrites made stale
    last = main[-1].json()
    assert any(b.get("type") == "thinking" for m in last["messages"] if isinstance(m.get("content"), list) for b in m["content"])
    assert any("[context-proxy" in r.body.decode(errors="replace") for r in main), context
    asked = [r for r in main if BINDING_BETA in r.headers.get("anthropic-beta", "")]
    assert asked, context
    for r in asked:
        assert r.json()["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    assert sum(len(v.dropped) for v in upstream.verdicts) > 0  # stale blocks were replayed, and dropped
