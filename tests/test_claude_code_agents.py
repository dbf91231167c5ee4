"""End to end: Claude Code itself, a main conversation and a subagent it spawns, through the proxy.

The fake model makes Claude Code spawn a subagent (its ``Agent`` tool) that reads six files while
the main conversation waits for it, then reads six files itself. Every file carries a tag of its
own. Claude Code sends both conversations with one ``x-claude-code-session-id``, the subagent's
with its ``x-claude-code-agent-id`` (Claude Code's "Gateway protocol reference"; 2.1.197), and
moves its ``cache_control`` marker to the newest message every turn. The threshold is low, so
both conversations are compacted (pruned and summarised); once a conversation's view names its
removed turns and offers ``context_proxy_retrieve``, its model reads back the first pointer of
its own bridge and answers with the tag it found there.

Run in Anthropic mode and in Foundry mode (``CLAUDE_CODE_USE_FOUNDRY``, the proxy's ``/anthropic``
as the resource's base URL): the same checks hold in both.

Checked: both conversations were compacted and offered the tool; every pointer a bridge names is
an event of that bridge's own conversation; each conversation's retrieval returned a tag of its
own files; Claude Code finished with the main conversation's answer and never saw our tool.
Skipped without the Claude Code CLI (see tests/test_claude_code.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.core.compaction.retrieval import TOOL_NAME
from proxy.core.pointers import TranscriptPointer, parse_pointer
from proxy.server.appkeys import DURABLE, STORE
from tests.harness import LoopThread, ProxyServer, cache_figures
from tests.test_claude_code import (
    RUN_TIMEOUT,
    Tap,
    _proxy_error_answers,
    find_claude,
    mode_env,
    run_through_tap,
)
from tests.test_retrieval_offer import named_pointers, offers_tool, tools_bytes
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    text_stream_events,
    tool_use_stream_events,
)

PROMPT = "Spawn a helper for the a files, read the b files yourself, then report."
FILES = 6
BRIDGE = re.compile(r"\[context-proxy: the compacted turns[^\]]*\]")
POINTER = re.compile(r"transcript:[A-Za-z0-9._-]+(?::[A-Za-z0-9._-]+)?:\d+")
TAG = re.compile(r"TAG-(main|sub)-[ab]\d")


def _tool_results(body: dict[str, Any]) -> dict[str, str]:
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


def bridge_pointers(body: dict[str, Any]) -> list[str]:
    return POINTER.findall(" ".join(BRIDGE.findall(json.dumps(body.get("messages", [])))))


class Model:
    """Answers by what a request is: a summary call, the subagent's loop, the main loop."""

    def __init__(self, work: Path, pause: float = 0.0) -> None:
        self.work = work
        # seconds the main conversation's first retrieval answer takes: long after the subagent
        # ended, while the main conversation waits (its caches idle too)
        self.pause = pause
        self.retrieved: dict[str, str] = {}  # "main"/"sub" -> the tool result our call got
        self.asked: dict[str, list[str]] = {}  # the pointers each asked for

    def _retrieve(self, who: str, pointer: str, stream: bool) -> Reply | Stream:
        asked = self.asked.setdefault(who, [])
        asked.append(pointer)
        return self._tool(TOOL_NAME, {"pointer": pointer}, f"toolu_{who}_r{len(asked)}", stream)

    def __call__(self, req: RecordedRequest) -> Reply | Stream:
        if req.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": max(1, len(req.body) // 4)})
        if not req.path.endswith("/messages"):
            return Reply({"type": "error", "error": {"type": "not_found_error", "message": "fake"}}, status=404)
        body = req.json()
        if body.get("model") == "summary-model":
            return Reply(message_json("Summary: files were read; their tags are in the transcript."))
        stream = bool(body.get("stream"))
        who = "sub" if req.headers.get("x-claude-code-agent-id") else "main"
        if who == "main" and PROMPT not in json.dumps(body.get("messages", [])):
            return self._say("ok", stream)  # a side request
        results = _tool_results(body)
        ours = [k for k in results if k.startswith(f"toolu_{who}_r")]
        if ours:  # our hidden round: the proxy answered the retrieval
            text = results[ours[-1]]
            tags = sorted(set(re.findall(rf"TAG-{who}-[ab]\d", text)))
            asked = self.asked[who]
            if not tags and len(asked) < 6:  # not one of its files yet: read the next event
                head, _, seq = asked[-1].rpartition(":")
                return self._retrieve(who, f"{head}:{int(seq) + 1}", stream)
            self.retrieved[who] = text
            return self._say(f"{who.upper()}-DONE {' '.join(tags) or 'no tag'}", stream)
        names = [t.get("name") for t in body.get("tools", [])]
        pointers = bridge_pointers(body)
        if names[-1:] == [TOOL_NAME] and pointers and who not in self.asked:
            retrieve = self._retrieve(who, pointers[0], stream)
            if who == "main" and self.pause and isinstance(retrieve, Stream):
                return dataclasses.replace(retrieve, pace=self.pause / 4)
            if who == "main" and self.pause and isinstance(retrieve, Reply):
                return dataclasses.replace(retrieve, delay=self.pause)
            return retrieve
        letter = "a" if who == "sub" else "b"
        done = sum(1 for k in results if k.startswith(f"toolu_{who}_{letter}"))
        if who == "main" and "toolu_main_agent" not in results:
            prompt = f"Read the files a0.txt to a{FILES - 1}.txt in {self.work}, one at a time, then report."
            agent = "Agent" if "Agent" in names else "Task"
            args = {"description": "read the a files", "prompt": prompt, "subagent_type": "general-purpose"}
            return self._tool(agent, args, "toolu_main_agent", stream)
        if done < FILES:
            path = str(self.work / f"{letter}{done}.txt")
            return self._tool("Read", {"file_path": path}, f"toolu_{who}_{letter}{done}", stream)
        return self._say(f"{who.upper()}-DONE without retrieval", stream)

    @staticmethod
    def _say(text: str, stream: bool) -> Reply | Stream:
        return Stream(text_stream_events(text, deltas=2)) if stream else Reply(message_json(text))

    @staticmethod
    def _tool(name: str, args: dict[str, Any], tool_id: str, stream: bool) -> Reply | Stream:
        if stream:
            return Stream(tool_use_stream_events(name, args, tool_id=tool_id))
        block = {"type": "tool_use", "id": tool_id, "name": name, "input": args}
        return Reply(message_json(content=[block], stop_reason="tool_use"))


def _write_files(work: Path) -> None:
    for letter, who in (("a", "sub"), ("b", "main")):
        for i in range(FILES):
            lines = [f"TAG-{who}-{letter}{i}: the code of {letter}{i}"]
            lines += [f"{letter}{i} line {n:04d}: " + "filler words " * 6 for n in range(260)]
            (work / f"{letter}{i}.txt").write_text("\n".join(lines) + "\n")


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 90)
@pytest.mark.parametrize(("mode", "idle"), [("anthropic", 600), ("foundry", 600), ("anthropic", 1)])
def test_claude_code_main_and_subagent_each_compacted_and_reading_back_their_own_turns(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path, mode: str,
    idle: int,
) -> None:
    """``idle`` (``limits.cache_idle_seconds``): at 1 s, with the model taking 3 s over the main
    conversation's first retrieval, the proxy forgets what it kept of both conversations (the
    ended subagent's for good, the main one's while it waits): the same checks hold, the plans
    coming back from the store."""
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    proxy: ProxyServer = make_proxy(
        compaction={
            "threshold": 30_000,
            "hard_limit": 1_000_000,
            "keep_recent": 4,
            "tool_result_cap": 100_000,
            "summary": {"model": "summary-model"},
            # the model steps through its removed turns one event at a time until it finds one
            # of its files: a round each
            "retrieval": {"max_rounds": 8},
        },
        limits={"cache_idle_seconds": idle},
    )
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    _write_files(work)
    model = Model(work, pause=3.0 if idle == 1 else 0.0)
    upstream.script(*[model] * 800)
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    result, tapped, context = run_through_tap(
        claude, ["-p", PROMPT, "--allowedTools", "Read", "Agent", "Task", "--output-format", "json"],
        work=work, env=mode_env(mode, home, tap.url), tap=tap, loop_thread=loop_thread,
        upstream=upstream, timeout=RUN_TIMEOUT + 60,
    )  # fmt: skip
    loop_thread.run(proxy.app[DURABLE].drain())

    main = [r for r in upstream.requests if r.path == "/v1/messages" and not r.headers.get("x-claude-code-agent-id") and PROMPT in r.body.decode(errors="replace")]
    sub = [r for r in upstream.requests if r.path == "/v1/messages" and r.headers.get("x-claude-code-agent-id")]
    assert main and sub, context
    session = main[0].headers["x-claude-code-session-id"]
    agent = sub[0].headers["x-claude-code-agent-id"]
    assert {r.headers["x-claude-code-session-id"] for r in sub} == {session}  # one session
    # both were compacted and offered the tool: on the first request whose view names a pointer,
    # and from then on in one byte string (tools changed once per conversation)
    for name, requests in (("main", main), ("sub", sub)):
        named = [bool(named_pointers(r.json())) for r in requests]
        assert True in named, (name, context)
        first = named.index(True)
        assert [offers_tool(r.json()) for r in requests] == [k >= first for k in range(len(requests))], (name, context)
        assert len({tools_bytes(r.body) for r in requests[first:]}) == 1, (name, context)
    # every pointer a bridge names is an event of that bridge's own conversation
    store = proxy.app[STORE]
    foreign = 0
    for requests, own in ((main, ""), (sub, agent)):
        for request in requests:
            for text in bridge_pointers(request.json()):
                pointer = parse_pointer(text)
                assert isinstance(pointer, TranscriptPointer)
                if (pointer.session, pointer.agent) != (session, own):
                    foreign += 1
                    continue
                events = loop_thread.run(
                    store.transcript_events("default", session, pointer.sequence - 1, 1, agent=own)
                )
                assert events, (text, context)
    assert foreign == 0
    # each read back its own turn: the subagent an "a" tag, the main conversation a "b" tag
    assert re.search(r"TAG-sub-a\d", model.retrieved.get("sub", "")), model.retrieved
    assert re.search(r"TAG-main-b\d", model.retrieved.get("main", "")), model.retrieved
    assert "TAG-main" not in model.retrieved["sub"]  # (the main conversation's own events hold
    # the subagent's report: the Agent tool's result, which quotes a sub tag)
    assert result.get("result", "").startswith("MAIN-DONE TAG-main-b"), context
    # Claude Code never saw our tool
    assert not any(TOOL_NAME.encode() in r.body for r in tapped), context
    if mode == "foundry":  # every request it made was Foundry's, answered without an error
        assert tapped and all(r.path.startswith("/anthropic/v1/messages") for r in tapped), context
    assert _proxy_error_answers(proxy) == [], context
    if idle == 1:  # it did forget plans, while Claude Code was running
        expired = {name: f["expired"] for name, f in cache_figures(proxy.url).items() if f.get("expired")}
        assert expired.get("compaction_plans", 0) > 0, expired
