"""The command line, the config file, and the process lifecycle (SIGTERM drain), as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from proxy.config.environment import config_path_from_env
from proxy.config.schema import ConfigError
from proxy.config.settings import Config, load_config
from tests.harness import ListeningProcess
from tests.upstream import FakeUpstream, Stream, text_stream_events

KEY = "sk-ant-cli-canary-1234567890"
GOOD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config == Config()
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 8080)
    assert config.upstream.base_url == "https://api.anthropic.com"
    assert config.limits.max_body_bytes == 32 * 1024 * 1024
    assert config.store_url.startswith("sqlite:///") and config.store_url.endswith("context-proxy.db")


def test_a_full_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: {host: 0.0.0.0, port: 9000}\n"
        "upstream: {base_url: 'http://up:1/prefix', connect_timeout: 2, read_timeout: 30}\n"
        "limits: {max_body_bytes: 1000}\n"
        "store: {url: 'sqlite:///tmp/x.db'}\n"
        "policies_dir: ./policies\n"
        "compaction: {threshold: 1000, hard_limit: 2000, read_tools: [{name: cat, path_key: file}]}\n"
    )
    config = load_config(path)
    assert config.listen.port == 9000
    assert config.upstream.connect_timeout == 2.0
    assert config.compaction.read_tools[0].name == "cat"
    assert config.store_url == "sqlite:///tmp/x.db"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: {port: eighty}\n", "key 'listen.port': expected an integer, got 'eighty'"),
        ("listen: {port: 70000}\n", "key 'listen.port': expected a port number"),
        ("upstream: {base_url: 'ftp://x'}\n", "key 'upstream.base_url': expected an http:// or https:// URL"),
        ("upstream: {read_timeout: -1}\n", "key 'upstream.read_timeout': expected a positive number"),
        ("limits: {max_body_bytes: true}\n", "key 'limits.max_body_bytes': expected an integer"),
        ("bogus: 1\n", "key 'bogus': unknown key"),
        ("listen: [1, 2]\n", "key 'listen': expected a mapping"),
        ("store: {url: 'mysql://x'}\n", "key 'store.url': expected a store URL"),
        ("compaction: {threshold: 100, hard_limit: 50}\n", "key 'compaction.hard_limit': expected a value >="),
        ("listen: {port: 1\n", "not valid YAML"),
    ],
)
def test_invalid_files_name_the_file_the_key_and_the_expectation(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("listen: {port: x, nope: 1}\nupstream: {connect_timeout: 0}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(info.value.errors) == 3


def test_config_path_from_env() -> None:
    assert config_path_from_env("a.yaml", {"CONTEXT_PROXY_CONFIG": "b.yaml"}) == "a.yaml"
    assert config_path_from_env(None, {"CONTEXT_PROXY_CONFIG": "b.yaml"}) == "b.yaml"
    assert config_path_from_env(None, {}) is None


def test_check_config_command(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("listen: {port: 9001}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: nine}\n")
    ok = _run_cli("check-config", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    failed = _run_cli("check-config", str(bad))
    assert failed.returncode != 0
    assert f"{bad}: key 'listen.port': expected an integer" in failed.stderr
    missing = _run_cli("check-config", str(tmp_path / "absent.yaml"))
    assert missing.returncode != 0 and "cannot read the file" in missing.stderr


def test_committed_example_configs_are_valid() -> None:
    root = Path(__file__).resolve().parent.parent
    for path in sorted((root / "examples").glob("*.yaml")):
        load_config(path)


class ServeProcess(ListeningProcess):
    """``context-proxy serve --port 0`` as a child process."""

    def __init__(self, config_path: Path | None, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        config = ["--config", str(config_path)] if config_path else []
        super().__init__(["serve", "--port", "0", *args, *config], env)


@pytest.fixture
def served(tmp_path: Path, upstream: FakeUpstream) -> Iterator[ServeProcess]:
    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {{base_url: '{upstream.url}'}}\nshutdown: {{grace_seconds: 5}}\nlogging: {{level: DEBUG}}\nstate_dir: '{tmp_path}'\n")
    process = ServeProcess(config)
    yield process
    process.stop()


def test_serve_forwards_and_sigterm_drains_in_flight_streams(served: ServeProcess, upstream: FakeUpstream) -> None:
    events = text_stream_events("drain " * 40, deltas=30)
    upstream.script(Stream(events, pace=0.05))  # ~1.6 s
    got: dict[str, bytes] = {}

    def stream() -> None:
        with httpx.stream("POST", served.url + "/v1/messages", content=orjson.dumps(GOOD), headers={"x-api-key": KEY}, timeout=30) as r:
            got["body"] = r.read()

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 10
    while upstream.active == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    served.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):
        httpx.get(served.url + "/healthz", timeout=2)
    t.join(20)
    assert got["body"] == b"".join(events)  # the in-flight stream finished, untouched
    assert served.proc.wait(20) == 0
    log = "".join(served.lines)
    assert "draining" in log and "stopped" in log
    assert KEY not in log


def test_sigterm_past_the_grace_period_ends_streams_with_an_overloaded_error(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {{base_url: '{upstream.url}'}}\nshutdown: {{grace_seconds: 0.5}}\nstate_dir: '{tmp_path}'\n")
    process = ServeProcess(config)
    try:
        events = text_stream_events("slow " * 100, deltas=100)
        upstream.script(Stream(events, pace=0.1))  # ~10 s
        with httpx.stream("POST", process.url + "/v1/messages", content=orjson.dumps(GOOD), headers={"x-api-key": KEY}, timeout=30) as r:
            chunks: list[bytes] = []
            try:
                for chunk in r.iter_raw():
                    if not chunks:
                        process.proc.send_signal(signal.SIGTERM)
                    chunks.append(chunk)
            except httpx.RemoteProtocolError:
                pass  # the connection closes without a final chunk: the client knows it is cut
            body = b"".join(chunks)
        assert b"message_stop" not in body
        assert body.rstrip().endswith(b"}")
        last_event = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        assert last_event.startswith(b"event: error\n")
        assert b"overloaded_error" in last_event
        assert process.proc.wait(20) == 0
    finally:
        process.stop()


def test_serve_reads_config_from_the_environment(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = tmp_path / "env.yaml"
    config.write_text(f"upstream: {{base_url: '{upstream.url}/envprefix'}}\nstate_dir: '{tmp_path}'\n")
    process = ServeProcess(None, env={"CONTEXT_PROXY_CONFIG": str(config)})
    try:
        httpx.post(process.url + "/v1/messages", content=orjson.dumps({**GOOD, "stream": False}), headers={"x-api-key": KEY}, timeout=10)
        assert upstream.requests[-1].path == "/envprefix/v1/messages"
    finally:
        process.stop()


def test_serve_refuses_an_invalid_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: nine}\n")
    result = _run_cli("serve", "--config", str(bad))
    assert result.returncode == 2
    assert "key 'listen.port'" in result.stderr


def test_sighup_reloads_tenant_policies_in_a_running_server(tmp_path: Path, upstream: FakeUpstream) -> None:
    import hashlib

    policies = tmp_path / "policies"
    policies.mkdir()
    old_key, new_key = "cpk-old-key-1", "cpk-new-key-2"

    def policy(key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"name: acme\napi_keys_sha256: ['{digest}']\nprovider: {{mode: env, api_key_env: ACME_KEY}}\n"

    (policies / "acme.yaml").write_text(policy(old_key))
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\n"
        f"auth: {{mode: keys}}\npolicies_dir: '{policies}'\n"
    )
    process = ServeProcess(config, env={"ACME_KEY": "sk-ant-provider-acme"})
    try:
        def status(key: str) -> int:
            return httpx.get(process.url + "/v1/models", headers={"x-api-key": key}, timeout=10).status_code

        assert (status(old_key), status(new_key)) == (200, 401)
        (policies / "acme.yaml").write_text(policy(new_key))
        process.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status(new_key) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (status(old_key), status(new_key)) == (401, 200)
        assert upstream.requests[-1].headers["x-api-key"] == "sk-ant-provider-acme"
        # An invalid set is refused and logged; the server keeps serving the previous one.
        (policies / "acme.yaml").write_text("name: acme\nprovider: {mode: bogus}\n")
        process.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert status(new_key) == 200
        assert process.proc.poll() is None
        assert any("policies not reloaded" in line for line in process.lines)
    finally:
        process.stop()


def test_serve_refuses_invalid_policies(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "bad.yaml").write_text("name: acme\nprovider: {mode: env, api_key_env: NOT_SET_ANYWHERE_123}\n")
    config = tmp_path / "proxy.yaml"
    config.write_text(f"state_dir: '{tmp_path}'\nauth: {{mode: keys}}\npolicies_dir: '{policies}'\n")
    result = _run_cli("serve", "--config", str(config), "--port", "0")
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "NOT_SET_ANYWHERE_123" in result.stderr
