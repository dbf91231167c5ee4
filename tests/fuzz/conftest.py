"""One proxy for the fuzz tests of a module: the real app (``build_app``: every middleware),
tenant policies with admin tokens (``auth.mode: keys``), a real SQLite store, the fake upstream.

Module-scoped so that each generated example costs one HTTP call, not a server start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.core.durable import Create, Fact
from proxy.server.appkeys import STORE
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.test_admin import T0, _write_policies
from tests.upstream import FakeUpstream


@dataclass
class FuzzProxy:
    url: str
    server: ProxyServer
    upstream: FakeUpstream
    # path parameter -> a value naming something seeded (filled by a module that seeds more)
    seeded: dict[str, str] = field(default_factory=dict)


@contextmanager
def running_fuzz_proxy(
    loop_thread: LoopThread, tmp: Path, acme_quota: dict[str, Any] | None = None
) -> Iterator[FuzzProxy]:
    """The proxy, acme's session ``s1`` holding one fact; ``acme_quota``: a ``quota`` section
    for acme's policy."""
    policies = _write_policies(tmp)
    if acme_quota is not None:
        acme = policies / "acme.yaml"
        acme.write_text(yaml.safe_dump({**yaml.safe_load(acme.read_text()), "quota": acme_quota}))
    upstream = FakeUpstream()
    loop_thread.run(upstream.start())
    config = proxy_config(
        upstream.url,
        str(tmp / "state"),
        auth={"mode": "keys"},
        policies_dir=str(policies),
        # Low, so that generated conversations go through the compaction layers too.
        compaction={"threshold": 300, "hard_limit": 100_000, "keep_recent": 2, "tool_result_cap": 100},
    )
    server = ProxyServer(config)
    try:
        loop_thread.run(server.start())
        store = server.app[STORE]
        fact = Fact("build", "the build uses uv", "transcript:s1:1", T0)
        loop_thread.run(store.write_changes("acme", "s1", [Create(fact)]))
        yield FuzzProxy(server.url, server, upstream)
    finally:
        loop_thread.run(server.stop())
        loop_thread.run(upstream.stop())


@pytest.fixture(scope="module")
def fuzz_proxy(
    loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzProxy]:
    with running_fuzz_proxy(loop_thread, tmp_path_factory.mktemp("fuzz")) as proxy:
        yield proxy
