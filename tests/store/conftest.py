"""Store fixtures: every store test runs once per backend (``sqlite`` and ``postgres``).

The ``postgres`` param runs on the server ``.ci/pg start`` started (``CONTEXT_PROXY_TEST_PG``),
each test in a fresh schema; without that variable it is skipped (see ``tests/pg_server.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.store import Store, open_store
from tests.pg_server import fresh_schema

BACKENDS = ["sqlite", "postgres"]


def backend_url(backend: str, tmp_path: Path) -> str:
    """The URL of a new SQLite store (PostgreSQL ones come from ``fresh_schema``)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'store.db'}"
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield backend_url(request.param, tmp_path)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    opened = await open_store(store_url)
    yield opened
    await opened.close()
