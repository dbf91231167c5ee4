"""Store fixtures: every store test runs once per backend (``sqlite`` now; PostgreSQL later)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.store import Store, open_store

BACKENDS = ["sqlite"]


def backend_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'store.db'}"
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    opened = await open_store(store_url)
    yield opened
    await opened.close()
