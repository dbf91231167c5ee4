"""Claude Code itself through a traced proxy: one trace per request it sends, identified by its
own session header, each with its GenAI call span, and none of its prompt, file contents or key
exported (``tracing.capture_content`` is off by default).

The spans are read back by a real OTLP/HTTP receiver (tests/otlp_receiver.py); the attribute
names are the OpenTelemetry GenAI conventions' (see tests/test_tracing.py for the pages).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import LoopThread
from tests.otlp_receiver import OtlpReceiver
from tests.test_claude_code import (
    DUMMY_KEY,
    FINAL_TEXT,
    FIXTURES,
    PROMPT,
    RUN_TIMEOUT,
    Tap,
    _clean_env,
    _is_main_loop,
    find_claude,
    make_model,
    run_through_tap,
)
from tests.test_tracing import _wait
from tests.upstream import FakeUpstream


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_requests_are_traced_by_its_own_session_without_content(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip("Claude Code CLI not found (see tests/test_claude_code.py)")
    receiver = OtlpReceiver()
    loop_thread.run(receiver.start())
    try:
        proxy = make_proxy(
            tracing={"enabled": True, "endpoint": receiver.endpoint, "flush_seconds": 0.05}
        )
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        notes = work / "notes.txt"
        shutil.copyfile(FIXTURES / "notes.txt", notes)
        upstream.script(*[make_model(str(notes))] * 50)
        tap = Tap(proxy.url)
        loop_thread.run(tap.start())
        result, _, context = run_through_tap(
            claude, ["-p", PROMPT, "--allowedTools", "Read", "--output-format", "json"],
            work=work, env=_clean_env(home, tap.url), tap=tap, loop_thread=loop_thread,
            upstream=upstream,
        )  # fmt: skip
        assert FINAL_TEXT in result.get("result", ""), context

        sent = [r for r in upstream.requests if r.path == "/v1/messages"]
        main = [r for r in sent if _is_main_loop(r.json())]
        assert len(main) == 2, context  # the tool call, then the answer
        sessions = {r.headers["x-claude-code-session-id"] for r in sent}
        assert len(sessions) == 1, sessions
        (session,) = sessions
        servers = _wait(
            lambda: len(receiver.named("POST /v1/messages")) >= len(sent)
            and receiver.named("POST /v1/messages"),
            "a server span per request",
        )
        assert len(servers) == len(sent)  # one trace per request Claude Code sent, no more
        assert {s.attributes["context_proxy.session"] for s in servers} == {session}
        calls = _wait(
            lambda: len([s for s in receiver.spans if s.name.startswith("chat ")]) >= len(sent)
            and [s for s in receiver.spans if s.name.startswith("chat ")],
            "a call span per request",
        )
        by_id = {s.span_id: s for s in servers}
        assert all(c.kind == "client" and c.parent_id in by_id for c in calls)
        assert {c.attributes["gen_ai.request.model"] for c in calls} == {
            r.json()["model"] for r in sent
        }
        reasons = sorted(c.attributes["gen_ai.response.finish_reasons"] for c in calls)
        assert ("tool_use",) in reasons and ("end_turn",) in reasons, reasons
        # nothing of the prompt, the file Claude Code read, its answer or its key left the proxy
        exported = b"".join(receiver.bodies)
        for secret in (PROMPT, notes.read_text().strip(), FINAL_TEXT, DUMMY_KEY):
            assert secret.encode() not in exported, secret
    finally:
        loop_thread.run(receiver.stop())
