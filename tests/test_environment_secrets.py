"""Secrets from the environment (proxy/config/environment.py): the admin token and the store's
password as a variable or as a file named by ``<VARIABLE>_FILE`` (Docker and Kubernetes secrets),
never printed; the password reaches a real PostgreSQL server that requires it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from proxy.config.environment import (
    admin_tokens_from_env,
    secret_from_env,
    store_password_from_env,
    url_with_password,
)
from proxy.config.schema import ConfigError
from proxy.config.settings import parse_config
from proxy.store import open_store
from tests.pg_server import PrivateServer
from tests.test_cli import ServeProcess
from tests.upstream import FakeUpstream

TOKEN = "an-admin-token-0123456789abcdef"
# every character a URL gives a meaning to, and one that is not ASCII
PASSWORD = "p@ss:w/rd%20 x?#&é"


def test_a_secret_comes_from_the_variable_or_from_the_file_it_names(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(TOKEN + "\n")  # `echo` and editors add a newline: dropped
    assert secret_from_env("X", {"X": TOKEN}) == TOKEN
    assert secret_from_env("X", {"X_FILE": str(secret)}) == TOKEN
    assert secret_from_env("X", {}) == ""
    assert secret_from_env("X", {"X": ""}) == ""
    secret.write_bytes(b"crlf\r\n")
    assert secret_from_env("X", {"X_FILE": str(secret)}) == "crlf"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"x" * (64 * 1024 + 1), "is larger than 65536 bytes"),
    ],
)
def test_a_secret_file_that_cannot_serve_stops_the_start_naming_it(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        secret_from_env("X", {"X_FILE": str(path)})
    shown = repr(str(path))
    expected = (
        f"variable X_FILE: cannot read {shown} (No such file or directory)"
        if content is None
        else f"variable X_FILE: {shown} {problem}"
    )
    assert caught.value.errors == [expected]


def test_both_the_variable_and_its_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(TOKEN)
    with pytest.raises(ConfigError) as caught:
        secret_from_env("X", {"X": "other-value", "X_FILE": str(path)})
    assert caught.value.errors == ["variables X and X_FILE: expected one of them, got both"]
    assert "other-value" not in str(caught.value) and TOKEN not in str(caught.value)


def test_the_admin_token_from_a_file_is_the_same_token(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    digest = hashlib.sha256(TOKEN.encode()).digest()
    assert admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN_FILE": str(path)}) == (digest,)
    assert admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN": TOKEN}) == (digest,)
    path.write_text("short\n")  # checked like the variable, never shown
    with pytest.raises(ConfigError) as caught:
        admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN_FILE": str(path)})
    assert "at least 16 printable" in str(caught.value) and "short" not in str(caught.value)


def test_the_password_is_put_into_the_url_percent_encoded() -> None:
    url = url_with_password("postgresql://proxy@db:5432/cp?search_path=x", PASSWORD)
    assert url == (
        "postgresql://proxy:p%40ss%3Aw%2Frd%2520%20x%3F%23%26%C3%A9@db:5432/cp?search_path=x"
    )
    config = parse_config({"store": {"url": "postgresql://proxy@db:5432/cp"}})
    assert config.with_store_password("").store_url == "postgresql://proxy@db:5432/cp"
    with_password = config.with_store_password(PASSWORD)
    assert with_password.store_url == url_with_password("postgresql://proxy@db:5432/cp", PASSWORD)
    assert PASSWORD not in repr(with_password) and "p%40ss" not in repr(with_password)


@pytest.mark.parametrize(
    ("store", "problem"),
    [
        ({}, "got a SQLite store"),
        ({"url": "sqlite:///tmp/x.db"}, "got a SQLite store"),
        ({"url": "postgresql://proxy:inline@db/cp"}, "got a URL that holds one"),
    ],
)
def test_a_password_the_store_cannot_take_stops_the_start(store: dict[str, str], problem: str) -> None:
    config = parse_config({"store": store})
    with pytest.raises(ConfigError) as caught:
        config.with_store_password(PASSWORD)
    (line,) = caught.value.errors
    assert line.startswith("variable CONTEXT_PROXY_STORE_PASSWORD: expected ") and line.endswith(problem)
    assert PASSWORD not in str(caught.value) and "inline" not in str(caught.value)


def test_store_password_from_env_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(PASSWORD + "\n")
    assert store_password_from_env({"CONTEXT_PROXY_STORE_PASSWORD_FILE": str(path)}) == PASSWORD
    assert store_password_from_env({"CONTEXT_PROXY_STORE_PASSWORD": PASSWORD}) == PASSWORD


@pytest.fixture
def pg_with_password() -> PrivateServer:
    server = PrivateServer(password=PASSWORD)  # skipped without PostgreSQL
    server.start()
    yield server  # type: ignore[misc]
    server.remove()


def _config(tmp_path: Path, upstream: FakeUpstream, store_url: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstore: {{url: '{store_url}'}}\n"
        f"state_dir: '{tmp_path}'\nshutdown: {{grace_seconds: 2}}\n"
    )
    return path


def test_serve_opens_a_password_protected_postgres_with_the_secret_file(
    tmp_path: Path, upstream: FakeUpstream, pg_with_password: PrivateServer
) -> None:
    """The URL holds no password; ``CONTEXT_PROXY_STORE_PASSWORD_FILE`` gives it: the store opens
    and a request's transcript is recorded there. A wrong one stops the start, unprinted."""
    secret = tmp_path / "store-password"
    secret.write_text(PASSWORD + "\n")
    config = _config(tmp_path, upstream, pg_with_password.url)
    process = ServeProcess(config, env={"CONTEXT_PROXY_STORE_PASSWORD_FILE": str(secret)})
    try:
        assert httpx.get(process.url + "/readyz", timeout=10).status_code == 200
        body = {"model": "claude-sonnet-4-5", "max_tokens": 16,
                "messages": [{"role": "user", "content": "recorded through the secret"}]}
        answer = httpx.post(process.url + "/v1/messages", content=orjson.dumps(body),
                            headers={"x-api-key": "sk-test", "x-session-id": "s1"}, timeout=10)
        assert answer.status_code == 200
    finally:
        assert process.stop(graceful=True) == 0
    assert PASSWORD not in "".join(process.lines)

    async def recorded() -> list[object]:
        store = await open_store(url_with_password(pg_with_password.url, PASSWORD))
        try:
            return [e.event.content for e in await store.transcript_events("default", "s1")]
        finally:
            await store.close()

    assert "recorded through the secret" in orjson.dumps(asyncio.run(recorded())).decode()

    secret.write_text("not-the-password\n")
    refused = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(config)],
        env={**os.environ, "CONTEXT_PROXY_STORE_PASSWORD_FILE": str(secret)},
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode != 0
    assert "InvalidPasswordError" in refused.stderr
    assert "not-the-password" not in refused.stderr + refused.stdout
