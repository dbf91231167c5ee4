"""End to end: Claude Code through the proxy, where the model reads back, with
``context_proxy_retrieve``, the middle of a tool result that compaction cut.

The fake model: Read ``big.log`` (a long file with a code in its middle), then Read ``notes.txt``
(so the big result is no longer the last message and L1 cuts it, naming its artifact); with the
retrieval tool offered, it pages through the artifact (offset from the note) until it finds the
code, then answers with it. Claude Code must finish with that answer and never see our tool.
Skipped without the Claude Code CLI (see tests/test_claude_code.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.core.compaction.retrieval import TOOL_NAME
from tests.harness import LoopThread, ProxyServer
from tests.test_claude_code import RUN_TIMEOUT, Tap, _clean_env, find_claude, run_through_tap
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    text_stream_events,
    tool_use_stream_events,
)

PROMPT = "Read big.log, then notes.txt, and tell me the code hidden in the log."
CODE = "OCELOT-7731"
READ_BIG, READ_NOTES, RETRIEVE = "toolu_01BigRead0000000000000001", "toolu_01NotesRead00000000000001", "toolu_01Retrieve000000000000"
MARKER = re.compile(r"full text: (artifact:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[0-9a-f]{64})\]")
NEXT = re.compile(r"with offset (\d+)\]")


def _results(body: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                text = inner if isinstance(inner, str) else "".join(
                    b.get("text", "") for b in inner or [] if isinstance(b, dict)
                )
                out[str(block.get("tool_use_id"))] = text
    return out


def make_model(big: str, notes: str) -> Any:
    def answer(req: RecordedRequest) -> Reply | Stream:
        if req.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": max(1, len(req.body) // 4)})
        if not req.path.endswith("/messages"):
            return Reply({"type": "error", "error": {"type": "not_found_error", "message": "fake"}}, status=404)
        body = req.json()
        stream = bool(body.get("stream"))
        if PROMPT not in json.dumps(body.get("messages", [])):
            return Stream(text_stream_events("ok", deltas=1)) if stream else Reply(message_json("ok"))
        results = _results(body)
        ours = [k for k in results if k.startswith(RETRIEVE)]
        if ours:
            last = results[ours[-1]]
            if CODE in last:
                return Stream(text_stream_events(f"The code in the log is {CODE}.", deltas=4))
            found = NEXT.search(last)
            pointer = MARKER.search(json.dumps(body["messages"]))
            assert found and pointer, last[-300:]
            call = {"pointer": pointer.group(1), "offset": int(found.group(1))}
            return Stream(tool_use_stream_events(TOOL_NAME, call, tool_id=f"{RETRIEVE}{len(ours) + 1:02d}"))
        if READ_NOTES in results:
            pointer = MARKER.search(json.dumps(body["messages"]))
            names = [t.get("name") for t in body.get("tools", [])]
            if pointer is None or names[-1:] != [TOOL_NAME]:
                return Stream(text_stream_events("I cannot see the middle of the log.", deltas=2))
            call = {"pointer": pointer.group(1)}
            return Stream(tool_use_stream_events(TOOL_NAME, call, tool_id=f"{RETRIEVE}01"))
        if READ_BIG in results:
            return Stream(tool_use_stream_events("Read", {"file_path": notes}, tool_id=READ_NOTES))
        return Stream(tool_use_stream_events("Read", {"file_path": big}, tool_id=READ_BIG))

    return answer


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_gets_one_answer_after_hidden_retrievals(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    proxy: ProxyServer = make_proxy(
        compaction={"threshold": 12_000, "hard_limit": 1_000_000, "tool_result_cap": 1000}
    )
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    lines = [f"entry {i:04d}: heartbeat ok" for i in range(1900)]
    lines[1500] = f"entry 1500: the code is {CODE}"  # past the first 40,000-character page
    (work / "big.log").write_text("\n".join(lines) + "\n")
    (work / "notes.txt").write_text("nothing important here\n")
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    upstream.script(*[make_model(str(work / "big.log"), str(work / "notes.txt"))] * 500)
    result, tapped, context = run_through_tap(
        claude, ["-p", PROMPT, "--allowedTools", "Read", "--output-format", "json"],
        work=work, env=_clean_env(home, tap.url), tap=tap, loop_thread=loop_thread,
        upstream=upstream,
    )  # fmt: skip
    assert f"The code in the log is {CODE}." in result.get("result", ""), context
    # the proxy paged through the artifact in hidden rounds; Claude Code never saw the tool
    continuations = [r for r in upstream.requests if RETRIEVE.encode() in r.body and b'"tool_result"' in r.body]
    assert len(continuations) >= 2, context
    assert not any(TOOL_NAME.encode() in r.body for r in tapped), context
