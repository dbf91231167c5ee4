"""A manifest row edited in the store after its artifact was verified: the next check says
``corrupt``, exactly as when the same edit comes before any check (docs/guides/durable-context.md, "Object storage,
signed manifests and the audit trail").

Real things only: moto's S3 server (signatures checked) behind a forwarder on loopback that
counts every request the proxy makes on its way to moto, and the manifest rows in a real store,
SQLite and PostgreSQL, edited out of band with that backend's own client. Local roots with
signing are checked the same way, with the resolver's cache warm.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from proxy.sources.checks import SourceChecks
from proxy.sources.manifests import SigningKeys, sign_entry
from proxy.sources.object_store import Credentials, ObjectStoreSettings
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.store import Store, open_store
from proxy.store.source_records import (
    AuditQuery,
    get_artifact_manifest,
    list_audit,
    put_artifact_manifest,
)
from tests.pg_server import fresh_schema
from tests.s3_server import BUCKET, REGION, S3Server, start_s3_server

KEYS = SigningKeys("k1", {"k1": b"k1-" + b"1" * 40, "k2": b"k2-" + b"2" * 40})
DATA = b"the full text of a tool result that compaction cut\n" * 20
OTHER = b"THE FULL TEXT OF A TOOL RESULT THAT COMPACTION CUT\n" * 20  # same size, other bytes
SHA = hashlib.sha256(DATA).hexdigest()
POINTER = f"artifact:s1:r1.txt:{SHA}"
KEY = "tenants/acme/s1/tool-results/r1.txt"


@dataclass(frozen=True)
class Edit:
    """One column of the ``artifact_manifests`` row changed, and what the next check says."""

    column: str
    value: Any
    detail: str  # the audit detail of the ``corrupt`` answer (an object-store check)


# Every column of the row. A changed tenant, session or name moves the row away from the
# (tenant, session, name) it is looked up by: no entry at all. Any other change breaks the HMAC.
EDITS = [
    Edit("tenant", "acme2", "no-manifest"),
    Edit("session", "s2", "no-manifest"),
    Edit("name", "r2.txt", "no-manifest"),
    Edit("size", len(DATA) + 1, "signature"),
    Edit("sha256", hashlib.sha256(OTHER).hexdigest(), "signature"),
    Edit("written_at", "2020-01-01T00:00:00.000000+00:00", "signature"),
    Edit("key_id", "k2", "signature"),  # a key the tenant holds: only the signature is wrong
    Edit("signature", "0" * 64, "signature"),
]
EDIT_IDS = [e.column for e in EDITS]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await open_store(store_url)
    yield s
    await s.close()


@pytest.fixture
async def checks(store: Store) -> AsyncIterator[SourceChecks]:
    c = SourceChecks(SourceResolver(), store)
    yield c
    await c.close()


class CountingS3:
    """A forwarder on 127.0.0.1 in front of moto: records (method, path) of every request, then
    passes it on unchanged (the Host header too, so moto checks the proxy's own signature)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> CountingS3:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        session = self._session

        async def forward(request: web.Request) -> web.Response:
            self.requests.append((request.method, request.path))
            headers = {
                k: v for k, v in request.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            body = await request.read()
            async with session.request(
                request.method, self.upstream + request.path_qs, headers=headers,
                data=body if body else None, allow_redirects=False,
            ) as answer:
                payload = await answer.read()
                names = ("ETag", "Content-Type")
                kept = {k: answer.headers[k] for k in names if k in answer.headers}
                return web.Response(status=answer.status, body=payload, headers=kept)

        app = web.Application(client_max_size=1 << 24)
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()

    def take(self) -> list[str]:
        """The methods asked since the last call (every one of them for the artifact's key)."""
        assert all(path == f"/{BUCKET}/{KEY}" for _, path in self.requests), self.requests
        methods = [m for m, _ in self.requests]
        self.requests.clear()
        return methods


@pytest.fixture
async def counting(s3: S3Server) -> AsyncIterator[CountingS3]:
    async with CountingS3(s3.endpoint) as server:
        yield server


def s3_policy(s3: S3Server, endpoint: str) -> SourcePolicy:
    settings = ObjectStoreSettings(
        BUCKET, "tenants/acme/", endpoint, REGION, "path",
        Credentials(s3.access_key_id, s3.secret_access_key),
        connect_timeout=2.0, read_timeout=5.0,
    )
    return SourcePolicy(
        frozenset({"artifact"}), ("*",), None, "/nonexistent/artifacts", settings, KEYS
    )


async def set_column(store_url: str, column: str, value: Any) -> None:
    """``UPDATE`` the one row out of band, with the backend's own client (not the proxy's)."""
    assert column in {e.column for e in EDITS}
    where = "tenant = 'acme' AND session = 's1' AND name = 'r1.txt'"
    if store_url.startswith("sqlite:///"):
        db = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            sql = f"UPDATE artifact_manifests SET {column} = ? WHERE {where}"
            assert db.execute(sql, (value,)).rowcount == 1
            db.commit()
        finally:
            db.close()
        return
    conn = await asyncpg.connect(store_url)
    try:
        sql = f"UPDATE artifact_manifests SET {column} = $1 WHERE {where}"
        assert await conn.execute(sql, value) == "UPDATE 1"
    finally:
        await conn.close()


async def details(checks: SourceChecks) -> list[tuple[str, str]]:
    await checks.audit.flush()
    return [(r.status, r.detail) for r in await list_audit(checks.store, AuditQuery("acme"))]


# -- the object store ---------------------------------------------------------------------------


@pytest.mark.parametrize("edit", EDITS, ids=EDIT_IDS)
async def test_an_edit_after_a_warm_check_is_corrupt(
    edit: Edit, s3: S3Server, counting: CountingS3, checks: SourceChecks, store_url: str
) -> None:
    policy = s3_policy(s3, counting.url)
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    assert counting.take() == ["PUT"]
    assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    assert counting.take() == ["GET"]  # cold: downloaded and hashed
    assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    assert counting.take() == ["HEAD"]  # warm: the cache is in use
    await set_column(store_url, edit.column, edit.value)
    got = await checks.resolve_many("acme", policy, [POINTER])
    assert (got[0].status, got[0].evidence_sha256) == ("corrupt", None)
    assert counting.take() == ["GET"]  # the edited row sent the check back to the object
    again = await checks.resolve_many("acme", policy, [POINTER])
    assert again[0].status == "corrupt"  # and a corrupt answer is never cached as available
    assert await details(checks) == [
        ("available", ""),
        ("available", "cached"),
        ("corrupt", edit.detail),
        ("corrupt", edit.detail),
    ]


@pytest.mark.parametrize("edit", EDITS, ids=EDIT_IDS)
async def test_an_edit_before_any_check_is_corrupt(
    edit: Edit, s3: S3Server, counting: CountingS3, checks: SourceChecks, store_url: str
) -> None:
    policy = s3_policy(s3, counting.url)
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    await set_column(store_url, edit.column, edit.value)
    got = await checks.resolve_many("acme", policy, [POINTER])
    assert (got[0].status, got[0].evidence_sha256) == ("corrupt", None)
    assert await details(checks) == [("corrupt", edit.detail)]


async def test_an_unchanged_row_stays_available_with_no_download(
    s3: S3Server, counting: CountingS3, checks: SourceChecks, store: Store
) -> None:
    policy = s3_policy(s3, counting.url)
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    counting.take()
    for _ in range(5):
        got = await checks.resolve_many("acme", policy, [POINTER])
        assert (got[0].status, got[0].evidence_sha256) == ("available", SHA)
    assert counting.take() == ["GET"] + ["HEAD"] * 4  # one download, then only HEADs
    # The same row written again (same values: an idempotent rewrite) is still the same row.
    entry = await get_artifact_manifest(store, "acme", "s1", "r1.txt")
    assert entry is not None
    await put_artifact_manifest(store, entry)
    assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    assert counting.take() == ["HEAD"]


async def test_an_older_validly_signed_row_put_back_is_corrupt(
    s3: S3Server, counting: CountingS3, checks: SourceChecks, store: Store
) -> None:
    """A replay: the row of an earlier write of the same name, signed with the tenant's own key,
    put back over the current one. Its HMAC verifies; it just describes other bytes."""
    policy = s3_policy(s3, counting.url)
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", OTHER)])
    older = await get_artifact_manifest(store, "acme", "s1", "r1.txt")
    assert older is not None
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    for _ in range(2):  # cold, then warm
        assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    counting.take()
    await put_artifact_manifest(store, older)
    assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "corrupt"
    assert counting.take() == ["GET"]
    assert (await details(checks))[-1] == ("corrupt", "manifest-mismatch")
    # the current row restored: verified again from the object, then warm again
    current = sign_entry(KEYS, "acme", "s1", "r1.txt", len(DATA), SHA, "2030-01-01T00:00:00+00:00")
    await put_artifact_manifest(store, current)
    for _ in range(2):
        assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    assert counting.take() == ["GET", "HEAD"]


# -- local roots with signing -------------------------------------------------------------------


@pytest.mark.parametrize("edit", EDITS, ids=EDIT_IDS)
async def test_a_local_artifact_with_a_warm_resolver_rechecks_its_row(
    edit: Edit, checks: SourceChecks, store_url: str, tmp_path: Path
) -> None:
    """The resolver's cache holds the file's digest (keyed on the file's identity, ctime
    included); the row is read and verified whole on every check. A row moved away (tenant,
    session, name changed) leaves the artifact without an entry: ``available``, audited
    ``unsigned``, as for an artifact written before signing was enabled (docs/guides/durable-context.md)."""
    root = str(tmp_path / "artifacts")
    policy = SourcePolicy(frozenset({"artifact"}), ("*",), None, root, None, KEYS)
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    for _ in range(2):
        assert (await checks.resolve_many("acme", policy, [POINTER]))[0].status == "available"
    assert (checks.local.hits, checks.local.misses) == (1, 1)
    await set_column(store_url, edit.column, edit.value)
    got = await checks.resolve_many("acme", policy, [POINTER])
    assert checks.local.hits == 2  # the file was not read again: only the row decided
    moved = edit.detail == "no-manifest"
    assert got[0].status == ("available" if moved else "corrupt")
    assert (await details(checks))[-1] == (
        ("available", "unsigned") if moved else ("corrupt", "signature")
    )
