"""``context-proxy replay``: readers (Messages JSON, raw Claude Code .jsonl), the turn-by-turn
replay through the real engine, the figures, and the command line end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.config.settings import CompactionConfig, ReadToolConfig, SummaryConfig
from proxy.core.compaction import DEFAULT_READ_TOOLS, CompactionPolicy, SummaryRequest
from proxy.core.protocol import validate_messages
from proxy.core.tokens import TokenCounter
from proxy.replay.readers import (
    MISSING_RESULT_TEXT,
    Conversation,
    load_conversation,
    parse_claude_code_lines,
    repair_messages,
)
from proxy.replay.report import format_report, to_json
from proxy.replay.runner import (
    ReplayResult,
    policy_from_config,
    request_units,
    run_replay,
    shared_prefix_tokens,
    with_overrides,
)
from proxy.replay.summarisers import ExtractiveSummariser, UpstreamSummariser
from tests.shared_data import CC_SESSION_FILE, CC_TRANSCRIPT
from tests.upstream import FakeUpstream, Reply

TRANSCRIPT = CC_TRANSCRIPT
RAW = CC_SESSION_FILE

POLICY = CompactionPolicy(threshold=40_000, hard_limit=120_000)


def _line(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def _assistant(mid: str, block: dict[str, Any], uuid: str, **extra: Any) -> str:
    message = {"id": mid, "role": "assistant", "model": "claude-x", "content": [block]}
    return _line(
        {"type": "assistant", "uuid": uuid, "isSidechain": False, "message": message, **extra}
    )


def _user(content: Any, uuid: str, **extra: Any) -> str:
    message = {"role": "user", "content": content}
    return _line({"type": "user", "uuid": uuid, "isSidechain": False, "message": message, **extra})


def _result(tool_use_id: str, text: str) -> dict[str, Any]:
    return {"tool_use_id": tool_use_id, "type": "tool_result", "content": text, "is_error": False}


def _use(tool_use_id: str, name: str = "Read", **inp: Any) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": tool_use_id,
        "name": name,
        "input": inp or {"file_path": "/a.py"},
    }


# --- readers -----------------------------------------------------------------------------------


def test_jsonl_reader_merges_lines_skips_noise_and_counts_invalid_lines() -> None:
    lines = [
        _line({"type": "file-history-snapshot", "messageId": "x", "snapshot": {}}),
        _user("read a.py and b.py", "u1"),
        _line({"type": "summary", "summary": "old session title", "leafUuid": "u1"}),
        _assistant("msg_A", {"type": "thinking", "thinking": "hm", "signature": "s"}, "a1"),
        _assistant("msg_A", {"type": "text", "text": "Reading both."}, "a2"),
        _assistant("msg_A", _use("t1", file_path="/a.py"), "a3"),
        _assistant("msg_A", _use("t2", file_path="/b.py"), "a4"),
        '{"type":"user","message":{"role":"user","content":[{"tool_use_id":"t9", "cut by the pub',
        _user([_result("t2", "B")], "u2"),  # parallel results: one line each, any order
        _user([_result("t1", "A")], "u3"),
        _assistant("msg_S", {"type": "text", "text": "subagent"}, "s1", isSidechain=True),
        _line({"type": "system", "subtype": "turn_duration", "uuid": "sys1"}),
        _assistant("msg_B", _use("t3", "Bash", command="ls /src"), "a5"),
        "not json at all",  # the line with t3's result was lost
        _line(
            {
                "type": "system",
                "subtype": "compact_boundary",
                "uuid": "cb",
                "compactMetadata": {"trigger": "auto", "preTokens": 155_000},
            }
        ),
        _user("This session is being continued ... summary", "cs", isCompactSummary=True),
        _user("go on", "u4"),
        _assistant("msg_C", {"type": "text", "text": "Done."}, "a6"),
        _assistant("msg_C", {"type": "text", "text": "Done."}, "a6"),  # written twice: same uuid
        "",
    ]
    conv = parse_claude_code_lines(lines, "t.jsonl")
    assert conv.invalid_lines == 2
    assert conv.model == "claude-x"
    roles = [m["role"] for m in conv.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    # one assistant message from four lines, thinking dropped
    assert conv.messages[1]["content"] == [
        {"type": "text", "text": "Reading both."},
        _use("t1", file_path="/a.py"),
        _use("t2", file_path="/b.py"),
    ]
    # two user lines -> one message, results in tool_use order
    assert [b["tool_use_id"] for b in conv.messages[2]["content"]] == ["t1", "t2"]
    # the lost result is synthesised, ahead of the user's text
    repaired = conv.messages[4]["content"]
    assert repaired[0] == {
        "type": "tool_result",
        "tool_use_id": "t3",
        "content": MISSING_RESULT_TEXT,
        "is_error": True,
    }
    assert repaired[1] == {"type": "text", "text": "go on"}
    assert conv.messages[5]["content"] == [{"type": "text", "text": "Done."}]
    assert validate_messages(conv.messages) is None
    # Claude Code's own compaction: its summary is not replayed, the boundary is recorded
    assert all("being continued" not in str(m) for m in conv.messages)
    (boundary,) = conv.boundaries
    assert (boundary.message_index, boundary.trigger, boundary.pre_tokens) == (4, "auto", 155_000)
    assert boundary.line == 15
    stats = conv.stats
    assert stats["thinking_blocks_dropped"] == 1
    assert stats["assistant_lines_merged"] == 3
    assert stats["sidechain_lines_skipped"] == 1
    assert stats["duplicate_lines_skipped"] == 1
    assert stats["missing_tool_results_synthesised"] == 1
    # tool definitions are not in the session file: stubs, in order of first use
    assert [t["name"] for t in conv.tools] == ["Read", "Bash"]


def test_repair_messages() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [_use("t1"), _use("t1")]},  # duplicate id
        {"role": "user", "content": [{"type": "text", "text": "x"}, _result("t1", "r")]},
        {"role": "user", "content": [_result("zz", "orphan")]},  # only an orphan: goes
        {"role": "assistant", "content": []},  # empty: goes
        {"role": "assistant", "content": [_use("t2")]},  # trailing, unanswered
    ]
    out, stats = repair_messages(messages)
    assert validate_messages(out) is None
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user"]
    assert out[2]["content"][0]["tool_use_id"] == "t1"  # results first
    assert out[4]["content"][0]["content"] == MISSING_RESULT_TEXT
    assert stats == {
        "duplicate_tool_use_dropped": 1,
        "orphan_tool_results_dropped": 1,
        "empty_messages_dropped": 1,
        "same_role_messages_merged": 1,  # the orphan-only user joins the previous one
        "missing_tool_results_synthesised": 1,
    }
    assert messages[2]["content"][0] == {"type": "text", "text": "x"}  # input untouched
    again, none = repair_messages(out)
    assert again == out and none == {}


def test_messages_json_reader_keeps_the_transcript_as_it_is() -> None:
    conv = load_conversation(TRANSCRIPT)
    data = orjson.loads(TRANSCRIPT.read_bytes())
    assert conv.format == "messages-json"
    assert conv.messages == data["messages"]
    assert conv.tools == data["tools"] and conv.system is None
    assert validate_messages(conv.messages) is None
    assert conv.stats == {}
    (boundary,) = conv.boundaries
    assert (boundary.message_index, boundary.pre_tokens) == (197, 155_554)
    assert conv.source_context[197] == 32_473


def test_raw_session_reads_like_its_published_transcript() -> None:
    """The reader on the raw .jsonl gives the published transcript's conversation.

    The one difference: the transcript's converter dropped ``"is_error": false`` from tool
    results (false is the default); the reader keeps the blocks as Claude Code sent them. Tools
    also differ: the session file does not record definitions, so the reader makes stubs.
    """
    raw = load_conversation(RAW)
    published = load_conversation(TRANSCRIPT)
    meta = orjson.loads(TRANSCRIPT.read_bytes())["meta"]
    assert raw.format == "claude-code-jsonl"
    assert raw.invalid_lines == meta["repairs"]["undecodable_lines_skipped"] == 35
    assert len(raw.messages) == len(published.messages) == 216
    assert raw.tool_uses == published.tool_uses == 168
    assert raw.stats["missing_tool_results_synthesised"] == 16
    assert raw.stats["thinking_blocks_dropped"] == meta["repairs"]["thinking_dropped"]
    assert validate_messages(raw.messages) is None
    assert [b.message_index for b in raw.boundaries] == [197]
    assert raw.boundaries[0].pre_tokens == 155_554
    assert {t["name"] for t in raw.tools} == {t["name"] for t in published.tools}

    def norm(block: Mapping[str, Any]) -> Mapping[str, Any]:
        if block.get("type") == "tool_result" and block.get("is_error") is False:
            return {k: v for k, v in block.items() if k != "is_error"}
        return block

    for a, b in zip(raw.messages, published.messages, strict=True):
        assert a["role"] == b["role"]
        assert [norm(x) for x in a["content"]] == b["content"]
    # the source's recorded usage lines up with the transcript's
    assert raw.source_context == published.source_context


# --- the replay --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture(scope="module")
def transcript_replay(counter: TokenCounter) -> ReplayResult:
    conv = load_conversation(TRANSCRIPT)
    return run_replay(
        conv, POLICY, ExtractiveSummariser(counter.count_text), offline=True, counter=counter
    )


def test_replay_of_the_transcript(transcript_replay: ReplayResult) -> None:
    result = transcript_replay
    conv = result.conversation
    users = [k for k in range(1, len(conv.messages) + 1) if conv.messages[k - 1]["role"] == "user"]
    assert [t.messages for t in result.turns] == users
    assert result.invalid_views == 0
    assert all(t.valid for t in result.turns)
    assert result.compaction_events >= 1
    assert result.summary_calls <= result.compaction_events
    assert result.prefix_stable_share >= 0.90, result.prefix_stable_share
    assert result.over_hard_limit == 0
    last = result.turns[-1]
    assert last.tokens_before > 2 * POLICY.threshold > last.tokens_after
    # the counted forwarded request is the engine's own figure (system and tools included)
    assert all(t.request_tokens == t.tokens_after for t in result.turns)
    # the source client's compaction is placed at the request it sent right after it
    (marked,) = [t for t in result.turns if t.client_compacted is not None]
    assert marked.messages == 197 and marked.source_context_tokens == 32_473
    totals = to_json(result)["totals"]
    assert totals["compaction_events"] == result.compaction_events
    assert totals["plans"]["new"] == result.compaction_events
    text = format_report(result)
    assert "offline extractive summaries" in text
    assert "prefix-stable share" in text and "COMPACTED" in text


def test_replay_of_the_raw_session(counter: TokenCounter) -> None:
    conv = load_conversation(RAW)
    summaries: list[str] = []
    extractive = ExtractiveSummariser(counter.count_text)

    class Recording:
        name = extractive.name

        def __call__(self, request: SummaryRequest) -> str | None:
            text = extractive(request)
            assert text is not None
            summaries.append(text)
            return text

    result = run_replay(conv, POLICY, Recording(), offline=True, counter=counter)
    assert result.invalid_views == 0
    assert 1 <= result.compaction_events and result.summary_calls <= result.compaction_events
    assert result.prefix_stable_share >= 0.90
    assert summaries and all(s.startswith("[offline extractive summary") for s in summaries)
    assert len(summaries) == result.summary_calls


def test_extractive_summary_is_deterministic_and_bounded(counter: TokenCounter) -> None:
    rendered = "\n\n".join(
        [
            "<previous_summary>\nUser requests:\n- sync the repo\n</previous_summary>",
            "<transcript>\nUSER:\nplease fix /src/app/main.py and run the tests",
            'ASSISTANT:\nOn it.\ntool_use Read({"file_path":"/src/app/main.py"})',
            "USER:\ntool_result (error): File does not exist.\nsecond line of the result",
            'ASSISTANT:\ntool_use Bash({"command":"pytest tests/test_main.py"})\n</transcript>',
        ]
    )
    summarise = ExtractiveSummariser(counter.count_text)
    request = SummaryRequest("m", 2000, "sys", rendered)
    text = summarise(request)
    assert text is not None and text == summarise(request)
    assert text.startswith("[offline extractive summary: no model was called]")
    assert "- please fix /src/app/main.py and run the tests" in text
    assert "second line of the result" not in text.split("Last lines")[0]
    assert "Tools used: Bash x1, Read x1" in text
    assert "Files mentioned: /src/app/main.py" in text
    assert "Failed tool calls: 1" in text
    assert "sync the repo" in text  # the earlier summary is carried
    # its own earlier summary is merged, not nested
    later = summarise(
        SummaryRequest(
            "m",
            2000,
            "sys",
            f"<previous_summary>\n{text}\n</previous_summary>\n\n<transcript>\nUSER:\n"
            'now deploy it\n\nASSISTANT:\ntool_use Bash({"command":"make deploy"})\n</transcript>',
        )
    )
    assert later is not None and later.count("[offline extractive summary") == 1
    assert "- please fix /src/app/main.py and run the tests\n- now deploy it" in later
    assert "Tools used: Bash x2, Read x1" in later and "Failed tool calls: 1" in later
    small = summarise(SummaryRequest("m", 40, "sys", rendered * 50))
    assert small is not None and counter.count_text(small) <= 40


def test_shared_prefix_is_block_level_and_ignores_markers(counter: TokenCounter) -> None:
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    first = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    marked = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]
    a = request_units("sys", tools, first, counter)
    total = counter.count_request("sys", tools, first).total
    assert sum(t for _, t in a) == total
    assert shared_prefix_tokens(None, a) == 0
    assert shared_prefix_tokens(a, request_units("sys", tools, marked, counter)) == total
    # same blocks, split over two messages: the prefix stops at the message boundary
    split = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
    ]
    b = request_units("sys", tools, split, counter)
    assert shared_prefix_tokens(a, b) == total - counter.count_block({"type": "text", "text": "b"})
    # a different system prompt: only the tools are shared
    c = request_units("other", tools, first, counter)
    assert shared_prefix_tokens(a, c) == counter.count_request(None, tools, []).tools


def test_policy_from_config_maps_every_key() -> None:
    config = CompactionConfig(
        threshold=1000,
        hard_limit=5000,
        target_ratio=0.5,
        keep_recent=3,
        summary=SummaryConfig(
            model="claude-x", max_tokens=300, prompt="be brief", input_budget=9_000, max_calls=3
        ),
        read_tools=(ReadToolConfig(name="cat", path_key="file", command="view"),),
        shrink_window=False,
    )
    policy = policy_from_config(config)
    assert (policy.threshold, policy.hard_limit, policy.target_ratio, policy.keep_recent) == (1000, 5000, 0.5, 3)
    assert (policy.summary_model, policy.summary_max_tokens, policy.summary_prompt) == ("claude-x", 300, "be brief")
    assert (policy.summary_input_cap, policy.summary_max_calls, policy.shrink_window) == (9_000, 3, False)
    assert [(t.name, t.path_key, t.command) for t in policy.read_tools] == [("cat", "file", "view")]
    assert policy_from_config(CompactionConfig()).read_tools == DEFAULT_READ_TOOLS
    # the default hard limit is "auto": the window (200k without a model) less max_tokens (none)
    policy = with_overrides(policy_from_config(CompactionConfig()), 40_000, None)
    assert (policy.threshold, policy.hard_limit) == (40_000, 200_000)
    with pytest.raises(ValueError, match="hard_limit"):
        with_overrides(policy, 250_000, None)


def test_upstream_summaries_make_the_edges_call(upstream: FakeUpstream) -> None:
    summarise = UpstreamSummariser(upstream.url, "sk-ant-replay-test", SummaryConfig(max_retries=0))
    request = SummaryRequest("claude-haiku-4-5", 123, "the prompt", "the transcript")
    try:
        assert summarise(request) == "Hello from the fake upstream."
        upstream.script(
            Reply({"type": "error", "error": {"type": "api_error", "message": "x"}}, status=500)
        )
        assert summarise(request) is None
    finally:
        summarise.close()
    first = upstream.requests[0]
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == "sk-ant-replay-test"
    assert first.json() == request.body()
    assert summarise.failures == ["InternalServerError"]


def test_replay_with_upstream_summaries(upstream: FakeUpstream, counter: TokenCounter) -> None:
    summarise = UpstreamSummariser(upstream.url, "sk-ant-replay-test", SummaryConfig(max_retries=0))
    try:
        result = run_replay(
            load_conversation(TRANSCRIPT), POLICY, summarise, offline=False, counter=counter
        )
    finally:
        summarise.close()
    assert result.summary_calls == len(upstream.requests) >= 1
    assert all(t.summary == "ok" for t in result.turns if t.summary_call)
    assert result.invalid_views == 0
    assert not result.offline and result.summariser == f"upstream {upstream.url}"
    assert (
        "offline"
        not in format_report(result).split("totals")[0].split("summaries:")[1].split("\n")[0]
    )


# --- the command line --------------------------------------------------------------------------


def _cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CONTEXT_PROXY_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "proxy", "replay", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


def test_cli_replay_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _cli(str(TRANSCRIPT), "--threshold", "40000", "--json", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "offline extractive summaries" in proc.stdout
    assert proc.stderr == ""  # --no-progress: nothing on stderr
    data = orjson.loads(out.read_bytes())
    totals = data["totals"]
    assert data["offline"] is True and data["policy"]["threshold"] == 40_000
    assert totals["invalid_views"] == 0
    assert totals["compaction_events"] >= 1
    assert totals["summary_calls"] <= totals["compaction_events"]
    assert totals["prefix_stable_share"] >= 0.90
    assert len(data["turns"]) == totals["requests"]
    assert data["reader"]["client_compactions"][0]["message_index"] == 197


def test_cli_replay_of_the_raw_session_with_a_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "tokens.png"
    proc = _cli(str(RAW), "--threshold", "40000", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "35 invalid lines skipped" in proc.stdout
    assert "source client compacted" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nothing": 1}')
    proc = _cli(str(bad), "--no-progress")
    assert proc.returncode == 2 and "messages" in proc.stderr
    proc = _cli(str(bad), "--upstream", "http://127.0.0.1:9", env={"ANTHROPIC_API_KEY": ""})
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr


def test_conversation_helpers() -> None:
    conv = Conversation("s", "messages-json", None, None, [{"role": "user", "content": "x"}], "m")
    assert conv.tool_uses == 0 and conv.boundaries == ()
