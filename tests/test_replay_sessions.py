"""Every Claude Code session file replays: a subagent's own file (``agent-*.jsonl``, every line
sidechain traffic) as its own conversation, a main file with sidechain lines in it as its main
chain, and a file without a conversation exits non-zero with one line saying so.

Only one real session file is shipped; the subagent and the no-conversation files are derived
from it line by line (real lines, real keys, the invalid lines kept), written by each test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from proxy.replay.readers import ReaderError, load_conversation
from tests.shared_data import CC_SESSION_FILE

MESSAGE_TYPES = (b'"type":"user"', b'"type":"assistant"')


def _lines() -> list[bytes]:
    return CC_SESSION_FILE.read_bytes().splitlines()


def _is_message(line: bytes) -> bool:
    """A user/assistant line, decided on the raw bytes (invalid lines are judged too)."""
    return any(t in line for t in MESSAGE_TYPES) or b'"type": "user"' in line


def _as_sidechain(line: bytes, agent: str) -> bytes:
    """A valid message line as a subagent writes it: ``isSidechain: true`` and its ``agentId``."""
    obj = orjson.loads(line)
    obj["isSidechain"] = True
    obj["agentId"] = agent
    for key in ("uuid", "parentUuid"):  # a subagent's lines have their own ids
        if isinstance(obj.get(key), str):
            obj[key] = f"{agent}-{obj[key]}"
    return orjson.dumps(obj)


def _derive_agent_file(tmp_path: Path, messages: int = 80) -> Path:
    """``agent-<id>.jsonl``: the session's first message lines as subagent traffic (invalid
    lines among them kept as they are, as a reader finds them)."""
    out: list[bytes] = []
    taken = 0
    for line in _lines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if taken:
                out.append(line)  # a cut line, as published
            continue
        if obj.get("type") not in ("user", "assistant"):
            continue
        out.append(_as_sidechain(line, "a1b2c3d"))
        taken += 1
        if taken >= messages:
            break
    path = tmp_path / "agent-a1b2c3d.jsonl"
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def _derive_without_conversation(tmp_path: Path) -> Path:
    """Only the bookkeeping lines (snapshots, summaries, system lines): no conversation."""
    kept = []
    for line in _lines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if obj.get("type") not in ("user", "assistant"):
            kept.append(line)
    assert kept
    path = tmp_path / "bookkeeping-only.jsonl"
    path.write_bytes(b"\n".join(kept) + b"\n")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CONTEXT_PROXY_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "proxy", "replay", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )


def test_a_subagent_file_is_its_own_conversation(tmp_path: Path) -> None:
    path = _derive_agent_file(tmp_path)
    conv = load_conversation(path)
    assert conv.stats["sidechain_lines_replayed"] >= 80
    assert "sidechain_lines_skipped" not in conv.stats
    assert conv.messages[0]["role"] == "user"
    assert conv.messages[0]["content"][0]["text"] == "sync you repo (M-Claude)"
    # the same lines as main-chain traffic read as the same conversation
    main = tmp_path / "main.jsonl"
    main.write_bytes(
        path.read_bytes().replace(b'"isSidechain":true', b'"isSidechain":false')
    )
    assert load_conversation(main).messages == conv.messages


def test_sidechain_lines_inside_a_main_file_are_left_out(tmp_path: Path) -> None:
    lines = _lines()
    # the main file with a subagent's lines interleaved (older Claude Code versions wrote them
    # there): the main chain replays, the subagent's lines are counted and skipped
    agent = [_as_sidechain(x, "feed") for x in lines[:40] if _is_message(x) and x.startswith(b"{")
             and _valid(x)]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join([*lines[:20], *agent, *lines[20:]]) + b"\n")
    plain = load_conversation(CC_SESSION_FILE)
    conv = load_conversation(mixed)
    assert conv.stats["sidechain_lines_skipped"] == len(agent) + plain.stats.get(
        "sidechain_lines_skipped", 0
    )
    assert conv.messages == plain.messages


def _valid(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def test_a_file_without_a_conversation_is_a_reader_error(tmp_path: Path) -> None:
    with pytest.raises(ReaderError, match="no conversation found"):
        load_conversation(_derive_without_conversation(tmp_path))
    only_assistant = tmp_path / "only-assistant.jsonl"
    only_assistant.write_bytes(
        next(x for x in _lines() if b'"type":"assistant"' in x and _valid(x)) + b"\n"
    )
    with pytest.raises(ReaderError, match="no user message"):
        load_conversation(only_assistant)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b'{"messages": []}')
    with pytest.raises(ReaderError, match="no user message"):
        load_conversation(empty)


def test_cli_replays_every_derived_file(tmp_path: Path) -> None:
    agent = _derive_agent_file(tmp_path, messages=200)
    out = tmp_path / "agent.json"
    proc = _cli(str(agent), "--threshold", "20000", "--hard-limit", "120000", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    data = orjson.loads(out.read_bytes())
    assert data["totals"]["invalid_views"] == 0
    assert data["totals"]["requests"] >= 10

    for path, why in (
        (_derive_without_conversation(tmp_path), "no user or assistant message lines"),
        (tmp_path / "missing.jsonl", "cannot read the file"),
    ):
        proc = _cli(str(path))
        assert proc.returncode == 2
        assert proc.stdout == ""
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr  # one line, no traceback
        assert lines[0].startswith("replay: ") and why in lines[0]
        assert "Traceback" not in proc.stderr
