"""End to end: Claude Code itself is offered ``context_proxy_retrieve`` on each conversation's
first compacted request, never a request later (issue 25, item 6).

The fake model makes Claude Code spawn a subagent that reads one long log and ends right at its
first compacted request: there L1 has cut the log (its marker names the artifact) and Claude Code
2.1.197, on its default model, ends that request with a ``role: "system"`` entry (its agent list,
a mid-conversation system message) -- the request that used to go without the tool. Offered the
tool, the subagent reads the cut middle back (the proxy answers in a hidden round) and reports the
code it found there. The main conversation reads six files itself until it is compacted (a
summary, and a bridge naming its removed turns), reads its bridge's first pointer back, and
finishes with the subagent's code.

Checked, per conversation: the first forwarded request whose view names a pointer carries the
tool (the subagent's is also its last); from then on every forwarded body (hidden rounds too)
carries one and the same ``tools`` byte string; each read its pointer back; Claude Code finished
with the main conversation's answer and never saw our tool. Skipped without the Claude Code CLI
(see tests/test_claude_code.py).
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
from tests.test_claude_code_agents import Model, bridge_pointers
from tests.test_retrieval_offer import named_pointers, offers_tool, tools_bytes
from tests.upstream import FakeUpstream, RecordedRequest, Reply, Stream

PROMPT = "Spawn a helper to find the code in big.log, read the b files yourself, then report."
CODE = "HERON-4471"
FILES = 6
ARTIFACT = re.compile(r"full text: (artifact:[A-Za-z0-9._-]+:[A-Za-z0-9._-]+:[0-9a-f]{64})\]")


class FirstCompaction(Model):
    """The subagent: read big.log; at its first compacted request, read the cut middle back if
    offered the tool, and end. The main conversation: spawn it, read b0..b5, read its bridge's
    first pointer back once offered the tool, then report."""

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.spawned = False
        self.reads = 0
        self.report = ""

    def __call__(self, req: RecordedRequest) -> Reply | Stream:
        if not req.path.endswith("/messages") or not req.headers.get("x-claude-code-agent-id"):
            return self._main(req)
        body = req.json()
        stream = bool(body.get("stream"))
        results = self._results(body)
        ours = [k for k in results if k.startswith("toolu_sub_r")]
        if ours:  # the hidden round: what the proxy read back
            self.retrieved["sub"] = results[ours[-1]]
            found = CODE if CODE in results[ours[-1]] else "no code"
            return self._say(f"SUB-DONE {found}", stream)
        if "toolu_sub_big" not in results:
            return self._tool("Read", {"file_path": str(self.work / "big.log")}, "toolu_sub_big", stream)
        text = json.dumps(body["messages"])
        pointer = ARTIFACT.search(text)
        if offers_tool(body) and pointer is not None:
            return self._retrieve("sub", pointer.group(1), stream)
        return self._say("SUB-DONE without the tool" if "[context-proxy" in text else "SUB-DONE uncut", stream)

    def _main(self, req: RecordedRequest) -> Reply | Stream:
        if req.path.endswith("/messages"):
            body = req.json()
            if body.get("model") != "summary-model" and PROMPT in json.dumps(body.get("messages", [])):
                return self._main_loop(body)
        return super().__call__(req)

    def _main_loop(self, body: dict[str, Any]) -> Reply | Stream:
        # what the main conversation did is kept here: its compacted view no longer shows it all
        results = self._results(body)
        stream = bool(body.get("stream"))
        ours = [k for k in results if k.startswith("toolu_main_r")]
        if ours:
            self.retrieved["main"] = results[ours[-1]]
        elif offers_tool(body) and bridge_pointers(body) and "main" not in self.asked:
            return self._retrieve("main", bridge_pointers(body)[0], stream)
        if "toolu_main_agent" in results:
            self.report = results["toolu_main_agent"]
        if not self.spawned:
            self.spawned = True
            names = [t.get("name") for t in body.get("tools", [])]
            args = {"description": "find the code", "prompt": f"Find the code in {self.work / 'big.log'}.", "subagent_type": "general-purpose"}
            return self._tool("Agent" if "Agent" in names else "Task", args, "toolu_main_agent", stream)
        if self.reads < FILES:
            self.reads += 1
            path = str(self.work / f"b{self.reads - 1}.txt")
            return self._tool("Read", {"file_path": path}, f"toolu_main_b{self.reads - 1}", stream)
        return self._say(f"MAIN-DONE {CODE if CODE in self.report else 'no code'}", stream)

    @staticmethod
    def _results(body: dict[str, Any]) -> dict[str, str]:
        from tests.test_claude_code_agents import _tool_results

        return _tool_results(body)


def _write_files(work: Path) -> None:
    lines = [f"entry {i:04d}: heartbeat ok" for i in range(1900)]
    lines[900] = f"entry 0900: the code is {CODE}"  # in the part L1 cuts, within the first page
    (work / "big.log").write_text("\n".join(lines) + "\n")
    for i in range(FILES):
        rows = [f"TAG-main-b{i}: the code of b{i}"]
        rows += [f"b{i} line {n:04d}: " + "filler words " * 6 for n in range(260)]
        (work / f"b{i}.txt").write_text("\n".join(rows) + "\n")


def _is_round(body: dict[str, Any]) -> bool:
    """A hidden round: the proxy's continuation carries our own call in its messages."""
    return TOOL_NAME in json.dumps(body.get("messages", [])) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == TOOL_NAME
        for m in body["messages"] if isinstance(m.get("content"), list) for b in m["content"]
    )


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 90)
def test_claude_code_is_offered_the_tool_on_each_conversations_first_compacted_request(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    proxy: ProxyServer = make_proxy(
        compaction={
            "threshold": 22_000,
            "hard_limit": 1_000_000,
            "keep_recent": 4,
            "tool_result_cap": 8_000,  # the long log is cut, the b files are not
            "summary": {"model": "summary-model"},
        }
    )
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    _write_files(work)
    model = FirstCompaction(work)
    upstream.script(*[model] * 400)
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    result, tapped, context = run_through_tap(
        claude, ["-p", PROMPT, "--allowedTools", "Read", "Agent", "Task", "--output-format", "json"],
        work=work, env=_clean_env(home, tap.url), tap=tap, loop_thread=loop_thread,
        upstream=upstream, timeout=RUN_TIMEOUT + 60,
    )  # fmt: skip
    messages = [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != "summary-model"]
    sub = [r for r in messages if r.headers.get("x-claude-code-agent-id")]
    main = [r for r in messages if not r.headers.get("x-claude-code-agent-id") and PROMPT in r.body.decode(errors="replace")]
    assert sub and main, context
    for name, requests in (("sub", sub), ("main", main)):
        bodies = [r.json() for r in requests]
        named = [bool(named_pointers(b)) for b in bodies]
        assert True in named, (name, context)
        first = named.index(True)
        assert offers_tool(bodies[first]), (name, context)  # on the first compacted request
        assert [offers_tool(b) for b in bodies] == named, (name, context)  # never without a pointer
        # tools changed once, with the messages: one byte string from the first compaction on
        assert len({tools_bytes(r.body) for r in requests[first:]}) == 1, (name, context)
        if name == "sub":
            clients = [b for b in bodies if not _is_round(b)]
            assert clients[-1] is bodies[first], context  # the subagent ended there...
            assert bodies[first]["messages"][-1]["role"] == "system", context  # ...the late case
    # each read its own pointer back on that request: the subagent the cut middle of its log
    assert CODE in model.retrieved.get("sub", ""), model.retrieved
    # the main conversation one of its own removed turns (an event, not an error result)
    assert "toolu_main_" in model.retrieved.get("main", ""), model.retrieved
    assert not model.retrieved["main"].startswith("[context-proxy]"), model.retrieved
    assert result.get("result", "") == f"MAIN-DONE {CODE}", context
    assert not any(TOOL_NAME.encode() in r.body for r in tapped), context  # Claude Code never saw it
