"""End to end: the real Claude Code CLI, headless, through the proxy, against the fake upstream.

Claude Code (``npm i @anthropic-ai/claude-code``, a native binary) runs ``claude -p`` with
``ANTHROPIC_BASE_URL`` pointing at a byte-transparent TCP tap in front of the proxy. The tap
records exactly what Claude Code sent (including what the proxy answers itself, such as
``HEAD /``), so the test can check that the bodies the upstream received are byte-identical to the
bodies Claude Code sent.

The fake upstream plays the model: the first main-loop request gets a streamed ``Read`` tool call
for a file in the working directory, the request carrying its ``tool_result`` gets a streamed final
answer, and anything else Claude Code asks for (count_tokens, side requests) gets a sensible reply.

The binary is found via ``CLAUDE_BIN``, then ``<repo>/.ci/node/node_modules/.bin/claude``, then
``claude`` on ``PATH``; without one the test is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from tests.harness import LoopThread, ProxyServer
from tests.upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    message_json,
    text_stream_events,
    tool_use_stream_events,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "claude_code_fixtures"

DUMMY_KEY = "sk-ant-dummy-0123456789abcdefghijklmnopqrstuvwxyz"
TOOL_ID = "toolu_01CcE2eTestReadCall00000001"
FINAL_TEXT = "The notes file says the launch code is PLUM-4417."
PROMPT = "Read notes.txt in the current directory and tell me the launch code."
RUN_TIMEOUT = 120.0

# Request headers that legitimately differ between the client->proxy and proxy->upstream hops.
_HOP_HEADERS = {
    "host",
    "connection",
    "keep-alive",
    "content-length",
    "accept-encoding",
    "transfer-encoding",
}


def find_claude() -> str | None:
    candidates = [
        os.environ.get("CLAUDE_BIN", ""),
        str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"),
        shutil.which("claude") or "",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


# --- a byte-transparent TCP tap in front of the proxy ------------------------------------------


@dataclass(frozen=True)
class TappedRequest:
    method: str
    target: str
    headers: CIMultiDict[str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query_string(self) -> str:
        return self.target.split("?", 1)[1] if "?" in self.target else ""


def parse_http_requests(stream: bytes) -> list[TappedRequest]:
    """The HTTP/1.1 requests in one connection's client->server byte stream (complete ones)."""
    requests: list[TappedRequest] = []
    try:
        _parse_into(stream, requests)
    except (ValueError, IndexError):
        pass  # a request cut short (e.g. the client was killed): keep the complete ones
    return requests


def _parse_into(stream: bytes, requests: list[TappedRequest]) -> None:
    pos = 0
    while pos < len(stream):
        end = stream.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        lines = stream[pos:end].decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
        pos = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                eol = stream.index(b"\r\n", pos)
                size = int(stream[pos:eol].split(b";")[0], 16)
                pos = eol + 2
                if size == 0:
                    pos = stream.index(b"\r\n", pos) + 2  # no trailers expected
                    break
                body += stream[pos : pos + size]
                pos += size + 2
            payload = bytes(body)
        else:
            length = int(headers.get("content-length", "0"))
            if pos + length > len(stream):
                break
            payload = stream[pos : pos + length]
            pos += length
        requests.append(TappedRequest(method, target, headers, payload))


class Tap:
    """Relays TCP connections to ``127.0.0.1:port`` untouched, recording the client's bytes."""

    def __init__(self, target_url: str) -> None:
        self.target_port = int(target_url.rsplit(":", 1)[1])
        self.streams: list[bytearray] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        recorded = bytearray()
        self.streams.append(recorded)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, recorded, half_close=True),
                self._pump(up_reader, writer, None, half_close=False),
            )
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        record: bytearray | None,
        *,
        half_close: bool,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if record is not None:
                    record += data
                writer.write(data)
                await writer.drain()
            if half_close and writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()
        except (ConnectionError, OSError):
            with contextlib.suppress(Exception):
                writer.close()

    def requests(self) -> list[TappedRequest]:
        out: list[TappedRequest] = []
        for stream in self.streams:
            out.extend(parse_http_requests(bytes(stream)))
        return out


# --- the fake model ------------------------------------------------------------------------------


def _has_tool_result(body: dict[str, Any], tool_id: str) -> bool:
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            for block in content:
                if (
                    isinstance(block, dict)
                    and block.get("type") == "tool_result"
                    and block.get("tool_use_id") == tool_id
                ):
                    return True
    return False


def _is_main_loop(body: dict[str, Any]) -> bool:
    """A main-loop request: it offers the Read tool and carries our prompt."""
    tools = {t.get("name") for t in body.get("tools", []) if isinstance(t, dict)}
    return "Read" in tools and PROMPT in json.dumps(body.get("messages", []))


def make_model(file_path: str) -> Any:
    """A script entry that answers every request by what it is, not by its position."""

    def answer(req: RecordedRequest) -> Reply | Stream:
        if req.method == "POST" and req.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": max(1, len(req.body) // 4)})
        if req.method == "POST" and req.path.endswith("/messages"):
            body = req.json()
            stream = bool(body.get("stream"))
            if _is_main_loop(body) and _has_tool_result(body, TOOL_ID):
                if stream:
                    return Stream(text_stream_events(FINAL_TEXT, deltas=6))
                return Reply(message_json(FINAL_TEXT))
            if _is_main_loop(body):
                tool_input = {"file_path": file_path}
                if stream:
                    return Stream(tool_use_stream_events("Read", tool_input, tool_id=TOOL_ID))
                block = {"type": "tool_use", "id": TOOL_ID, "name": "Read", "input": tool_input}
                return Reply(message_json(content=[block], stop_reason="tool_use"))
            # A side request (title, quota probe, ...): a short plain answer.
            if stream:
                return Stream(text_stream_events("ok", deltas=1))
            return Reply(message_json("ok"))
        if req.method == "GET" and req.path.endswith("/models"):
            return Reply(
                {
                    "data": [
                        {
                            "type": "model",
                            "id": "claude-fake-1",
                            "display_name": "Fake",
                            "created_at": "2026-01-01T00:00:00Z",
                        }
                    ],
                    "has_more": False,
                    "first_id": "claude-fake-1",
                    "last_id": "claude-fake-1",
                }
            )
        return Reply(
            {
                "type": "error",
                "error": {"type": "not_found_error", "message": "fake: no such path"},
            },
            status=404,
        )

    return answer


# --- the run -------------------------------------------------------------------------------------


def _clean_env(home: Path, base_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "CLAUDE_", "CLAUDECODE", "AWS_", "GOOGLE_", "VERTEX_"))
        and k
        not in {"HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"}
        and "PROXY" not in k.upper()
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY=DUMMY_KEY,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def mode_env(mode: str, home: Path, url: str) -> dict[str, str]:
    """Claude Code's environment for ``mode``: ``anthropic`` (``ANTHROPIC_BASE_URL``), or the
    platforms' own client modes at ``url`` (``bedrock``, ``vertex``: their auth skipped, the
    proxy holds the credentials; ``foundry``: the proxy's ``/anthropic`` as the resource's base
    URL, ``ANTHROPIC_FOUNDRY_API_KEY`` carrying the key: Claude Code 2.1.197's
    ``CLAUDE_CODE_SKIP_FOUNDRY_AUTH`` alone ends every request before it is sent, its token
    provider answering "" -- see tests/test_claude_code_foundry.py)."""
    env = _clean_env(home, url)
    if mode == "bedrock":
        del env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]
        env.update(
            CLAUDE_CODE_USE_BEDROCK="1", CLAUDE_CODE_SKIP_BEDROCK_AUTH="1",
            ANTHROPIC_BEDROCK_BASE_URL=url, AWS_REGION="us-east-1",
        )
    elif mode == "vertex":
        del env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]
        env.update(
            CLAUDE_CODE_USE_VERTEX="1", CLAUDE_CODE_SKIP_VERTEX_AUTH="1",
            ANTHROPIC_VERTEX_BASE_URL=url + "/v1", ANTHROPIC_VERTEX_PROJECT_ID="proj-x",
            CLOUD_ML_REGION="us-east5",
        )
    elif mode == "foundry":
        del env["ANTHROPIC_BASE_URL"]
        env.update(
            CLAUDE_CODE_USE_FOUNDRY="1", ANTHROPIC_FOUNDRY_BASE_URL=url + "/anthropic",
            ANTHROPIC_FOUNDRY_API_KEY=env.pop("ANTHROPIC_API_KEY"),
        )
    return env


def _describe(
    proc: subprocess.CompletedProcess[str] | None,
    tapped: list[TappedRequest],
    upstream: FakeUpstream,
) -> str:
    lines = []
    if proc is not None:
        lines += [
            f"exit code: {proc.returncode}",
            "--- stdout ---",
            proc.stdout[-8000:],
            "--- stderr ---",
            proc.stderr[-8000:],
        ]
    lines.append("--- Claude Code -> proxy ---")
    lines += [f"{r.method} {r.target} ({len(r.body)} bytes)" for r in tapped]
    lines.append("--- proxy -> upstream ---")
    lines += [f"{r.method} {r.raw_path} ({len(r.body)} bytes)" for r in upstream.requests]
    return "\n".join(lines)


def run_through_tap(
    claude: str,
    args: list[str],
    *,
    work: Path,
    env: dict[str, str],
    tap: Tap,
    loop_thread: LoopThread,
    upstream: FakeUpstream,
    timeout: float = RUN_TIMEOUT,
) -> tuple[dict[str, Any], list[TappedRequest], str]:
    """Claude Code run once (``claude *args``) through ``tap``, which is stopped after: it must
    end without error. Its JSON result, what the tap saw, and a description for assertions."""
    proc: subprocess.CompletedProcess[str] | None = None
    try:
        proc = subprocess.run(
            [claude, *args], cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
    finally:
        loop_thread.run(tap.stop())
    tapped = tap.requests()
    context = _describe(proc, tapped, upstream)
    assert proc.returncode == 0, context
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result.get("is_error") is False, context
    return result, tapped, context


def _strip_cache_control(value: Any) -> Any:
    """Claude Code moves its ``cache_control`` marker to the newest block on every turn."""
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _proxy_error_answers(proxy: ProxyServer) -> list[str]:
    """Requests the proxy answered with a status >= 400, from its own /metrics."""
    with urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    errors = []
    for line in text.splitlines():
        match = re.match(r"context_proxy_requests_total\{(.*)\} (\S+)$", line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if int(labels.get("status", "0")) >= 400 and float(match.group(2)) > 0:
            errors.append(line)
    return errors


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_reads_a_file_through_the_proxy(
    upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip(
            "Claude Code CLI not found: set CLAUDE_BIN, or run "
            "`npm install --prefix .ci/node @anthropic-ai/claude-code`, or put `claude` on PATH"
        )

    home = tmp_path / "home"  # a fresh HOME: no real config is read or written; none is needed
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    shutil.copyfile(FIXTURES / "notes.txt", notes)
    file_lines = notes.read_text().splitlines()

    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    upstream.script(*[make_model(str(notes))] * 500)

    proc: subprocess.CompletedProcess[str] | None = None
    timed_out: subprocess.TimeoutExpired | None = None
    try:
        proc = subprocess.run(
            [claude, "-p", PROMPT, "--allowedTools", "Read", "--output-format", "json"],
            cwd=work,
            env=_clean_env(home, tap.url),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        timed_out = exc
    finally:
        loop_thread.run(tap.stop())
    if timed_out is not None:
        pytest.fail(
            f"Claude Code did not finish within {RUN_TIMEOUT}s\n"
            f"stdout: {timed_out.stdout!r}\nstderr: {timed_out.stderr!r}\n"
            + _describe(None, tap.requests(), upstream)
        )
    assert proc is not None

    tapped = tap.requests()
    context = _describe(proc, tapped, upstream)
    print(context)  # shown by pytest on failure (and with -s)

    # -- Claude Code finished, with the fake model's answer ----------------------------------
    assert proc.returncode == 0, context
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"Claude Code's stdout is not JSON\n{context}")
    assert result.get("is_error") is False, context
    assert FINAL_TEXT in result.get("result", ""), context

    # -- the two main-loop requests, as the upstream received them ----------------------------
    main = [
        r
        for r in upstream.requests
        if r.method == "POST" and r.path == "/v1/messages" and _is_main_loop(r.json())
    ]
    first = [r for r in main if not _has_tool_result(r.json(), TOOL_ID)]
    second = [r for r in main if _has_tool_result(r.json(), TOOL_ID)]
    assert first and second, context
    first_req, second_req = first[0], second[-1]
    session_ids = set()
    for req in (first_req, second_req):
        assert "beta=true" in req.query_string.split("&"), context
        assert req.json().get("stream") is True, context
        assert req.headers.get("x-api-key") == DUMMY_KEY, context
        assert req.headers.get("anthropic-version"), context
        session_ids.add(req.headers.get("X-Claude-Code-Session-Id"))
    assert len(session_ids) == 1 and None not in session_ids, (
        f"session ids: {session_ids}\n{context}"
    )
    if result.get("session_id"):
        assert session_ids == {result["session_id"]}, context

    # The second request is the first conversation plus our tool call and Claude Code's result.
    body1, body2 = first_req.json(), second_req.json()
    history = _strip_cache_control(body1["messages"])
    messages = _strip_cache_control(body2["messages"])
    assert messages[: len(history)] == history, context
    assistant = messages[len(history)]
    assert assistant["role"] == "assistant", context
    assert {
        "type": "tool_use",
        "id": TOOL_ID,
        "name": "Read",
        "input": {"file_path": str(notes)},
    } in assistant["content"]
    last = messages[-1]
    assert last["role"] == "user" and isinstance(last["content"], list), context
    tool_result = last["content"][0]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == TOOL_ID, (
        tool_result
    )
    content = tool_result["content"]
    text = (
        content
        if isinstance(content, str)
        else "".join(b.get("text", "") for b in content if isinstance(b, dict))
    )
    for number, line in enumerate(file_lines, start=1):
        assert f"{number}\t{line}" in text, f"Read result lacks line {number}: {text!r}"

    # -- the proxy forwarded every API request byte for byte -----------------------------------
    sent_to_api = [r for r in tapped if r.path.startswith("/v1/")]
    assert len(sent_to_api) == len(upstream.requests), context
    unmatched = list(upstream.requests)
    for sent in sent_to_api:
        match = next(
            (
                u
                for u in unmatched
                if (u.method, u.raw_path, u.body) == (sent.method, sent.target, sent.body)
            ),
            None,
        )
        assert match is not None, (
            f"{sent.method} {sent.target} did not reach the upstream unchanged\n{context}"
        )
        unmatched.remove(match)
        received = {
            (k.lower(), v) for k, v in match.headers.items() if k.lower() not in _HOP_HEADERS
        }
        original = {
            (k.lower(), v) for k, v in sent.headers.items() if k.lower() not in _HOP_HEADERS
        }
        assert received == original, (
            f"headers changed: +{received - original} -{original - received}"
        )

    # -- and answered nothing with an error ----------------------------------------------------
    assert _proxy_error_answers(proxy) == [], context
    assert upstream.cancelled == 0, context

    # What Claude Code sent, for the docs (visible with -s).
    print("--- summary ---")
    print("HEAD sent:", [f"{r.method} {r.target}" for r in tapped if r.method == "HEAD"])
    print("paths:", sorted({f"{r.method} {r.target}" for r in tapped}))
    print("anthropic-beta:", first_req.headers.get("anthropic-beta"))
    print("anthropic-version:", first_req.headers.get("anthropic-version"))
    print(
        "user-agent:",
        first_req.headers.get("user-agent"),
        "| x-app:",
        first_req.headers.get("x-app"),
    )
    print(
        "body bytes (main loop):",
        [len(r.body) for r in main],
        "| tools:",
        len(body1.get("tools", [])),
    )
    print(
        "model:",
        body1.get("model"),
        "| max_tokens:",
        body1.get("max_tokens"),
        "| keys:",
        sorted(body1),
    )
