from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from tests.foundry_fake import FakeFoundry
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.platform_fakes import TEST_ACCESS_KEY, TEST_SECRET_KEY, FakeBedrock, FakeVertex
from tests.shared_data import CC_TRANSCRIPT
from tests.upstream import FakeUpstream


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run long soaks")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long soak: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def transcript() -> dict[str, Any]:
    """The real Claude Code conversation in Messages format (read-only: tests slice it)."""
    return orjson.loads(CC_TRANSCRIPT.read_bytes())  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _close_sdk_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every sync SDK client a test made, so that no pooled socket outlives its test
    (an unclosed socket found by the garbage collector later is an error under filterwarnings)."""
    created: list[anthropic.Anthropic] = []
    original = anthropic.Anthropic.__init__

    def init(self: anthropic.Anthropic, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(anthropic.Anthropic, "__init__", init)
    yield
    for client in created:
        client.close()


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def upstream(loop_thread: LoopThread) -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())


ProxyFactory = Callable[..., ProxyServer]


@pytest.fixture
def make_proxy(
    loop_thread: LoopThread, upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyFactory]:
    started: list[ProxyServer] = []

    def factory(upstream_url: str | None = None, **sections: Any) -> ProxyServer:
        state_dir = str(sections.pop("state_dir", None) or tmp_path_factory.mktemp("state"))
        server = ProxyServer(proxy_config(upstream_url or upstream.url, state_dir, **sections))
        loop_thread.run(server.start())
        started.append(server)
        return server

    yield factory
    for server in started:
        loop_thread.run(server.stop())


@pytest.fixture
def proxy(make_proxy: ProxyFactory) -> ProxyServer:
    return make_proxy()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """botocore's chain sees only the known test key (no real files, no instance metadata)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


@pytest.fixture
def bedrock(loop_thread: LoopThread) -> Iterator[FakeBedrock]:
    fake = FakeBedrock()
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())


@pytest.fixture
def foundry(loop_thread: LoopThread) -> Iterator[FakeFoundry]:
    fake = FakeFoundry()
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())


def no_azure_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable azure-identity's chain reads (service principal, workload or managed identity)."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "MSI_", "IDENTITY_", "IMDS_")):
            monkeypatch.delenv(name)


@pytest.fixture
def azure_env(monkeypatch: pytest.MonkeyPatch, foundry: FakeFoundry, tmp_path: Path) -> FakeFoundry:
    """azure-identity's DefaultAzureCredential chain finds only the fake's managed identity (App
    Service's IDENTITY_ENDPOINT / IDENTITY_HEADER): no service principal, workload identity, IMDS
    or Azure CLI login."""
    no_azure_identity(monkeypatch)
    monkeypatch.setenv("IDENTITY_ENDPOINT", foundry.identity_endpoint)
    monkeypatch.setenv("IDENTITY_HEADER", foundry.identity_header)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "no-azure-cli"))
    return foundry


@pytest.fixture
def vertex(loop_thread: LoopThread) -> Iterator[FakeVertex]:
    fake = FakeVertex()
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())
