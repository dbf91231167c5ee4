"""The keyless demo's parts: the demo model's agent loop (pure), the demo provider as the official
SDK sees it (JSON and streamed tool calls), ``serve --demo``'s admin token file and its errors.
The whole demo, followed as the quick start says, is tests/test_quickstart.py.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from proxy.demo import model
from proxy.demo import upstream as demo_upstream
from proxy.demo.serve import admin_token, demo_config
from tests.demo_process import DemoServe, clean_env, serve_demo
from tests.harness import LoopThread

READ = [{"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
PLAN = "Read these:\n- a.py\n- b.py\n- a.py"


def _result(call: dict[str, Any], text: str = "x" * 10) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": text}]}


def test_the_demo_model_walks_its_plan_one_call_a_turn() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    paths = []
    for _ in range(3):
        content, stop = model.content_of({"system": PLAN, "tools": READ, "messages": messages})
        assert stop == "tool_use" and content[0]["type"] == "text"
        call = content[1]
        assert call["type"] == "tool_use" and call["name"] == "read_file"
        paths.append(call["input"]["path"])
        messages += [{"role": "assistant", "content": content}, _result(call)]
    assert paths == ["a.py", "b.py", "a.py"]  # a path listed twice is read twice
    content, stop = model.content_of({"system": PLAN, "tools": READ, "messages": messages})
    assert stop == "end_turn" and content == [
        {"type": "text", "text": "Done: I read 3 files, step by step. The last file was 10 characters long."}
    ]


def test_the_next_step_survives_compaction() -> None:
    """The proxy removes old turns: the step comes from the last tool result's id, not a count."""
    first, _ = model.content_of({"system": PLAN, "tools": READ, "messages": [{"role": "user", "content": "go"}]})
    second, _ = model.content_of({
        "system": PLAN, "tools": READ,
        "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": first}, _result(first[1])],
    })
    pruned = [{"role": "user", "content": "[a summary of the earlier turns]"},
              {"role": "assistant", "content": second}, _result(second[1])]
    third, _ = model.content_of({"system": PLAN, "tools": READ, "messages": pruned})
    assert third[1]["input"] == {"path": "a.py"}  # step 3, though only one call is left in view


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hello"}]},  # no tools: a text answer
        {"tools": READ, "messages": [{"role": "user", "content": "no plan here"}]},
        {"system": PLAN, "messages": [{"role": "user", "content": "go"}],
         "tools": [{"name": "context_proxy_retrieve", "input_schema": {"properties": {"path": {}}}}]},
    ],
)
def test_without_a_reading_tool_or_a_plan_the_answer_is_text(body: dict[str, Any]) -> None:
    content, stop = model.content_of(body)
    assert stop == "end_turn" and [b["type"] for b in content] == ["text"]
    assert content[0]["text"].startswith("Demo upstream: your last message was")


@pytest.fixture
def provider(loop_thread: LoopThread) -> Iterator[str]:
    runner, url = loop_thread.run(demo_upstream.start("127.0.0.1", 0))
    yield url
    loop_thread.run(runner.cleanup())


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdk_reads_the_demo_providers_tool_calls(provider: str, stream: bool) -> None:
    with anthropic.Anthropic(base_url=provider, api_key="no-key", max_retries=0) as client:
        request: dict[str, Any] = {
            "model": model.MODEL, "max_tokens": 100, "system": PLAN, "tools": READ,
            "messages": [{"role": "user", "content": "go"}],
        }
        if stream:
            with client.messages.stream(**request) as events:
                answer = events.get_final_message()
        else:
            answer = client.messages.create(**request)
    assert answer.stop_reason == "tool_use" and answer.model == model.MODEL
    call = answer.content[1]
    assert call.type == "tool_use" and call.input == {"path": "a.py"}  # type: ignore[union-attr]
    assert call.id.startswith("toolu_demo_0000_")  # type: ignore[union-attr]
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0


def test_the_admin_token_file(tmp_path: Path) -> None:
    token, path = admin_token(tmp_path / "demo")
    assert path == tmp_path / "demo" / "admin-token" and len(token) >= 16
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the token is the admin API's key
    assert admin_token(tmp_path / "demo") == (token, path)  # kept between runs
    path.write_text("short\n")
    renewed, _ = admin_token(tmp_path / "demo")
    assert renewed != token and len(renewed) >= 16
    config = demo_config("http://127.0.0.1:9", tmp_path, token)
    assert config.compaction.threshold == 30_000 and config.compaction.summary.model == model.MODEL
    assert len(config.admin_token_hashes) == 1 and token.encode() not in config.admin_token_hashes[0]


def _serve_demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        serve_demo(*args), cwd=cwd,
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )


def test_serve_demo_refuses_a_config(tmp_path: Path) -> None:
    refused = _serve_demo(tmp_path, "--config", "proxy.yaml")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "serve --demo: runs on the demo's own settings; drop --config" in refused.stderr
    assert not (tmp_path / "state").exists()  # nothing made


def test_serve_demo_without_a_usable_folder_says_so(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the demo's folder goes")
    refused = _serve_demo(tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("serve --demo: cannot use state/demo for the demo's store and token:")
    assert "Traceback" not in refused.stderr


def test_serve_demo_refuses_an_unusable_admin_token_in_the_environment(tmp_path: Path) -> None:
    refused = subprocess.run(
        serve_demo(), cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=clean_env({"CONTEXT_PROXY_ADMIN_TOKEN": "short"}),
    )
    assert refused.returncode == 2 and "variable CONTEXT_PROXY_ADMIN_TOKEN: expected at least 16" in refused.stderr
    assert "short" not in refused.stderr  # the value is never shown
    assert not (tmp_path / "state").exists()


def test_serve_demo_on_a_taken_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = _serve_demo(tmp_path, "--port", str(port))
    assert refused.returncode == 2
    assert "serve --demo: cannot listen" in refused.stderr and "--port" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_serve_on_a_taken_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--port", str(port)], cwd=tmp_path,
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )
    assert refused.returncode == 2 and "serve: cannot listen" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_serve_demo_takes_the_environments_admin_token_too(tmp_path: Path) -> None:
    """A shell that already holds an admin token keeps using it with the demo."""
    token = "cpa-from-the-environment-0001"
    served = DemoServe(serve_demo("--port", "0"), tmp_path,
                       env=clean_env({"CONTEXT_PROXY_ADMIN_TOKEN": token}))
    try:
        banner = served.banner()
        for bearer in (token, (tmp_path / banner.token_file).read_text().strip()):
            answer = httpx.get(banner.url + "/admin/v1/sessions",
                               headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
            assert answer.status_code == 200, answer.text
        assert banner.next_commands[0] == f"python examples/demo_agent_loop.py --url {banner.url}"
    finally:
        assert served.stop() == 0  # SIGTERM: drained, a clean exit
    assert os.path.isfile(tmp_path / "state" / "demo" / "context-proxy.db")
