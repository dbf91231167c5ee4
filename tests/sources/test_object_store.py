"""Artifacts on an S3-compatible store, against real servers on loopback: moto's S3 server (with
signature checking on), aiohttp servers that redirect, stall or fail, and a second aiohttp server
standing for a foreign host that must never be reached.

The store behind the manifests and the audit trail is a real SQLite file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import posixpath
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.pointers import ArtifactPointer, BadPointer, parse_pointer
from proxy.sources import object_store
from proxy.sources.checks import SourceChecks
from proxy.sources.manifests import SigningKeys
from proxy.sources.object_store import Credentials, ObjectStoreError, ObjectStoreSettings, S3Client
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.sources.store_artifacts import object_key
from proxy.store import Store, open_store
from proxy.store.source_records import AuditQuery, delete_audit_before, list_audit
from tests.s3_server import BUCKET, REGION, S3Server, start_s3_server
from tests.shared_data import TRAVERSAL_PAYLOADS

KEY_1 = b"k1-" + b"1" * 40
KEY_2 = b"k2-" + b"2" * 40
TEXT = "the full text of a tool result that compaction cut\n" * 20
DATA = TEXT.encode()
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = start_s3_server()
    yield server
    server.stop()


def settings_for(
    endpoint: str, prefix: str, creds: Credentials, **overrides: Any
) -> ObjectStoreSettings:
    base = ObjectStoreSettings(
        BUCKET, prefix, endpoint, REGION, "path", creds, connect_timeout=1.0, read_timeout=1.0
    )
    return dataclasses.replace(base, **overrides)


def policy_for(settings: ObjectStoreSettings, signing: SigningKeys | None = None) -> SourcePolicy:
    return SourcePolicy(
        frozenset({"artifact", "transcript"}),
        ("*",),
        "/nonexistent/transcripts",
        "/nonexistent/artifacts",
        settings,
        signing or SigningKeys("k1", {"k1": KEY_1}),
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    await s.close()


@pytest.fixture
async def checks(store: Store) -> AsyncIterator[SourceChecks]:
    c = SourceChecks(SourceResolver(), store)
    yield c
    await c.close()


def creds(s3: S3Server) -> Credentials:
    return Credentials(s3.access_key_id, s3.secret_access_key)


class Recorder:
    """An aiohttp server on 127.0.0.1 that records every request and answers with ``handler``."""

    def __init__(self, handler: Any = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.handler = handler
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Recorder:
        async def any_request(request: web.Request) -> web.StreamResponse:
            self.requests.append(
                {"method": request.method, "path": request.path, "headers": dict(request.headers)}
            )
            if self.handler is None:
                return web.Response(status=500)
            response: web.StreamResponse = await self.handler(request)
            return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_request)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


# -- SigV4, by botocore's signer -----------------------------------------------------------------


def _verify_sigv4(method: str, path: str, headers: dict[str, str], body: bytes, secret: str) -> str:
    """What the signed request's ``Authorization`` must say, computed here from what the server
    received, by the published algorithm (header-based authentication, payload signed):
    https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html"""
    lower = {k.lower(): v for k, v in headers.items()}
    auth = lower["authorization"]
    scope = auth.split("Credential=", 1)[1].split(",", 1)[0].split("/", 1)[1]
    signed = auth.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    canonical = "\n".join([
        method, path, "", *(f"{n}:{lower[n].strip()}" for n in signed), "", ";".join(signed),
        hashlib.sha256(body).hexdigest(),
    ])  # fmt: skip
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", lower["x-amz-date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


async def test_requests_are_signed_over_the_payload_for_the_pinned_host() -> None:
    received: list[tuple[str, str, dict[str, str], bytes]] = []

    async def accept(request: web.Request) -> web.Response:
        received.append((request.method, request.path, dict(request.headers), await request.read()))
        return web.Response(status=200, body=b"", headers={"ETag": '"e1"'})

    c = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token/abc")
    client = S3Client()
    try:
        async with Recorder(accept) as endpoint:
            settings = settings_for(endpoint.url, "p/", c, region="eu-west-1")
            assert await client.put(settings, "p/s1/tool-results/a.txt", b"body") == '"e1"'
            assert (await client.get(settings, "p/s1/tool-results/a.txt", head=True)).status == "found"
    finally:
        await client.close()
    host = endpoint.url.removeprefix("http://")
    for (method, path, headers, body), sent in zip(received, (b"body", b""), strict=True):
        assert (method, path, body) == ("PUT" if sent else "HEAD", f"/{BUCKET}/p/s1/tool-results/a.txt", sent)
        assert headers["Host"] == host
        assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(sent).hexdigest()  # never UNSIGNED-PAYLOAD
        assert headers["X-Amz-Security-Token"] == "token/abc"
        auth = headers["Authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
        assert "/eu-west-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, " in auth
        assert auth.endswith("Signature=" + _verify_sigv4(method, path, headers, body, c.secret_access_key))
    assert "wJalr" not in repr(c) and "token" not in repr(c)


async def test_a_large_payload_is_hashed_and_signed_off_the_event_loop(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed_in: list[bool] = []  # True: in the event loop's thread
    real = object_store.sign

    def spy(*args: Any) -> dict[str, str]:
        signed_in.append(threading.get_ident() == loop_thread)
        return real(*args)

    loop_thread = threading.get_ident()
    monkeypatch.setattr(object_store, "sign", spy)
    settings = settings_for(s3.endpoint, "tenants/big/", creds(s3))
    client = S3Client()
    try:
        large = b"x" * (object_store.SIGN_IN_THREAD_BYTES + 1)
        await client.put(settings, "tenants/big/s1/tool-results/large.txt", large)
        await client.put(settings, "tenants/big/s1/tool-results/small.txt", b"small")
    finally:
        await client.close()
    assert signed_in == [False, True]
    body = s3.client().get_object(Bucket=BUCKET, Key="tenants/big/s1/tool-results/large.txt")["Body"]
    assert body.read() == large  # moto checked the signature made in the thread


# -- the happy path, the cache, the audit trail -----------------------------------------------


async def test_write_then_available_then_cached_and_audited(
    s3: S3Server, checks: SourceChecks, store: Store
) -> None:
    policy = policy_for(settings_for(s3.endpoint, "tenants/acme/", creds(s3)))
    await checks.write_artifacts("acme", policy, "s1", [("r1.txt", DATA)])
    obj = s3.client().get_object(Bucket=BUCKET, Key="tenants/acme/s1/tool-results/r1.txt")
    assert obj["Body"].read() == DATA  # the cut text is in the bucket, under the prefix
    pointer = f"artifact:s1:r1.txt:{SHA}"
    short = f"artifact:s1:r1.txt:{SHA[:12]}"
    got = await checks.resolve_many("acme", policy, [pointer, short], asked_by="request:t1")
    assert [(r.status, r.evidence_sha256) for r in got] == [("available", SHA)] * 2
    gets = checks.artifacts.gets
    again = await checks.resolve_many("acme", policy, [pointer], excerpt=True, asked_by="admin:x")
    assert again[0].status == "available" and checks.artifacts.gets == gets + 1  # excerpt: new key
    assert again[0].excerpt == TEXT[:2000]
    cached = await checks.resolve_many("acme", policy, [pointer], asked_by="request:t2")
    assert cached[0].status == "available" and checks.artifacts.gets == gets + 1  # HEAD only
    await checks.audit.flush()
    rows = await list_audit(store, AuditQuery("acme"))
    assert [(r.status, r.backend, r.digest, r.asked_by) for r in rows] == [
        ("available", "s3", SHA, "request:t1"),
        ("available", "s3", SHA, "request:t1"),
        ("available", "s3", SHA, "admin:x"),
        ("available", "s3", SHA, "request:t2"),
    ]
    assert rows[-1].detail == "cached" and all(r.session == "s1" for r in rows)
    assert await list_audit(store, AuditQuery("other")) == ()  # tenants never see each other's
    assert len(await list_audit(store, AuditQuery("acme", after=rows[1].id, limit=1))) == 1
    assert await delete_audit_before(store, "9999-01-01T00:00:00") == 4
    # the object deleted out of band: the cached result is not used
    s3.client().delete_object(Bucket=BUCKET, Key="tenants/acme/s1/tool-results/r1.txt")
    assert (await checks.resolve_many("acme", policy, [pointer]))[0].status == "missing"


async def test_missing_key_and_another_tenants_artifact_are_missing(
    s3: S3Server, checks: SourceChecks
) -> None:
    acme = policy_for(settings_for(s3.endpoint, "tenants/acme/", creds(s3)))
    globex = policy_for(
        settings_for(s3.endpoint, "tenants/globex/", creds(s3)),
        SigningKeys("g1", {"g1": KEY_2}),
    )
    await checks.write_artifacts("globex", globex, "s1", [("secret.txt", DATA)])
    theirs = f"artifact:s1:secret.txt:{SHA}"
    assert (await checks.resolve_many("globex", globex, [theirs]))[0].status == "available"
    # acme's key for the same pointer is under acme's prefix: nothing there, exactly as for a
    # pointer that names nothing at all (another tenant's thing answers like a missing one).
    nothing = f"artifact:s1:never-written.txt:{SHA}"
    got = await checks.resolve_many("acme", acme, [theirs, nothing])
    assert [(r.status, r.evidence_sha256, r.excerpt) for r in got] == [("missing", None, None)] * 2


# -- refused before any network call --------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["..", ".", "../x", "a/../../b", "/etc/passwd", "a//b", "x/./y"],
)
def test_object_keys_never_leave_the_prefix(name: str) -> None:
    settings = settings_for("http://127.0.0.1:9", "tenants/acme/", Credentials("a", "b"))
    assert object_key(settings, "s1", name) is None
    assert object_key(settings, name, "a.txt") is None
    assert object_key(settings, "s1", "ok.txt") == "tenants/acme/s1/tool-results/ok.txt"


def _payload_pointers() -> list[str]:
    entries = json.loads(TRAVERSAL_PAYLOADS.read_text(encoding="utf-8"))
    out = []
    for e in entries:
        p = e["payload"]
        if e["field"] == "pointer":
            out.append(p)
        else:
            out += [f"artifact:{p}:a.txt:{SHA}", f"artifact:s1:{p}:{SHA}"]
    return out


async def test_traversal_payloads_and_policy_refusals_never_reach_the_store(
    checks: SourceChecks,
) -> None:
    async with Recorder() as endpoint:
        settings = settings_for(endpoint.url, "tenants/acme/", Credentials("AKIA", "secret"))
        policy = policy_for(settings)
        pointers = _payload_pointers()
        assert len(pointers) > 100
        got = await checks.resolve_many("acme", policy, pointers)
        for pointer, r in zip(pointers, got, strict=True):
            parsed = parse_pointer(pointer)
            if isinstance(parsed, BadPointer):
                assert r.status == parsed.status, pointer
            elif isinstance(parsed, ArtifactPointer):  # valid components: the key stays under
                assert object_key(settings, parsed.session, parsed.name) is not None
            assert r.status != "available" and r.evidence_sha256 is None
        grammar_ok = [p for p in pointers if isinstance(parse_pointer(p), ArtifactPointer)]
        assert len(endpoint.requests) == len(grammar_ok)  # only well-formed pointers were asked
        assert all(r["path"].startswith(f"/{BUCKET}/tenants/acme/") for r in endpoint.requests)
        endpoint.requests.clear()
        narrow = dataclasses.replace(policy, session_patterns=("only-*",))
        no_artifacts = dataclasses.replace(policy, allowed_kinds=frozenset({"transcript"}))
        for p in (narrow, no_artifacts):
            got = await checks.resolve_many("acme", p, [f"artifact:s1:a.txt:{SHA}"])
            assert got[0].status == "denied"
        assert endpoint.requests == []  # authorised before any network call


# -- redirects, credentials, outages ----------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_denied_and_never_followed(status: int, checks: SourceChecks) -> None:
    async with Recorder() as foreign:

        async def redirect(request: web.Request) -> web.StreamResponse:
            return web.Response(
                status=status,
                headers={"Location": foreign.url + request.path, "x-amz-bucket-region": "eu-west-9"},
                body=b"<Error><Code>PermanentRedirect</Code></Error>",
            )

        async with Recorder(redirect) as endpoint:
            settings = settings_for(endpoint.url, "tenants/acme/", Credentials("AKIA", "secret"))
            policy = policy_for(settings)
            got = await checks.resolve_many("acme", policy, [f"artifact:s1:a.txt:{SHA}"])
            assert got[0].status == "denied"
            with pytest.raises(ObjectStoreError):
                await checks.write_artifacts("acme", policy, "s1", [("a.txt", DATA)])
            assert len(endpoint.requests) == 2  # the pinned endpoint got the signed requests
            assert "AWS4-HMAC-SHA256" in endpoint.requests[0]["headers"]["Authorization"]
        assert foreign.requests == []  # nothing, and so no credential, reached the other host
    await checks.audit.flush()
    [row] = await list_audit(checks.store, AuditQuery("acme"))
    assert (row.status, row.backend, row.detail) == ("denied", "s3", "redirect")


def test_path_and_virtual_addressing_pin_the_host() -> None:
    c = Credentials("a", "b")
    path = settings_for("https://s3.eu-west-1.amazonaws.com", "p/", c)
    url, host, signed = path.url_for("p/s1/tool-results/a.txt")
    assert (str(url), host, signed) == (
        f"https://s3.eu-west-1.amazonaws.com/{BUCKET}/p/s1/tool-results/a.txt",
        "s3.eu-west-1.amazonaws.com",
        f"/{BUCKET}/p/s1/tool-results/a.txt",
    )
    virtual = dataclasses.replace(path, addressing="virtual")
    url, host, signed = virtual.url_for("p/s1/tool-results/a.txt")
    assert (host, signed) == (f"{BUCKET}.s3.eu-west-1.amazonaws.com", "/p/s1/tool-results/a.txt")
    assert str(url) == f"https://{host}/p/s1/tool-results/a.txt"
    with pytest.raises(ValueError, match="DNS host name"):
        settings_for("http://127.0.0.1:9000", "p/", c, addressing="virtual")


async def test_wrong_or_expired_credentials_are_denied(
    s3: S3Server, checks: SourceChecks
) -> None:
    good = policy_for(settings_for(s3.endpoint, "tenants/acme/", creds(s3)))
    await checks.write_artifacts("acme", good, "s1", [("c.txt", DATA)])
    pointer = f"artifact:s1:c.txt:{SHA}"
    for bad in (
        Credentials(s3.access_key_id, "not-the-secret"),
        Credentials("AKIAUNKNOWNUNKNOWN00", s3.secret_access_key),
        Credentials(s3.access_key_id, s3.secret_access_key, "an-expired-session-token"),
    ):
        policy = policy_for(settings_for(s3.endpoint, "tenants/acme/", bad))
        got = await checks.resolve_many("acme", policy, [pointer])
        assert (got[0].status, got[0].evidence_sha256) == ("denied", None), bad.access_key_id
        with pytest.raises(ObjectStoreError):
            await checks.write_artifacts("acme", policy, "s1", [("d.txt", DATA)])
    assert (await checks.resolve_many("acme", good, [pointer]))[0].status == "available"


async def test_a_store_that_is_down_slow_or_failing_renders_missing(checks: SourceChecks) -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        await release.wait()  # answers only when the test is over
        return web.Response()

    async def fail(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503)

    pointer = f"artifact:s1:a.txt:{SHA}"
    async with Recorder() as closed:
        down = closed.url
    # `closed` has stopped listening: connection refused
    async with Recorder(stall) as slow, Recorder(fail) as failing:
        for url in (down, slow.url, failing.url):
            policy = policy_for(
                settings_for(url, "tenants/acme/", Credentials("AKIA", "s"), read_timeout=0.3)
            )
            got = await checks.resolve_many("acme", policy, [pointer], asked_by="request:o")
            assert (got[0].status, got[0].evidence_sha256) == ("missing", None)
            await checks.audit.flush()
        release.set()
        rows = await list_audit(checks.store, AuditQuery("acme", status="missing"))
        assert [r.detail.startswith(d) for r, d in zip(rows, ("unavailable:", "unavailable:timeout", "unavailable:http-503"), strict=True)] == [True] * 3


# -- signed manifests -------------------------------------------------------------------------


async def test_a_tampered_object_or_manifest_is_corrupt(
    s3: S3Server, checks: SourceChecks, tmp_path: Path
) -> None:
    policy = policy_for(settings_for(s3.endpoint, "tenants/acme/", creds(s3)))
    key = "tenants/acme/s2/tool-results/{}"
    await checks.write_artifacts("acme", policy, "s2", [(n, DATA) for n in ("o.txt", "m.txt", "n.txt", "z.txt")])
    # the bytes replaced out of band (the pointer's digest no longer matches)
    s3.client().put_object(Bucket=BUCKET, Key=key.format("o.txt"), Body=DATA + b"!")
    # the manifest entry edited in the store (its signature no longer verifies)
    db = sqlite3.connect(tmp_path / "store.db")
    db.execute("UPDATE artifact_manifests SET size = size + 1 WHERE name = 'm.txt'")
    db.execute("DELETE FROM artifact_manifests WHERE name = 'n.txt'")
    db.commit()
    db.close()
    # an object written by someone else straight into the bucket: no manifest entry at all
    s3.client().put_object(Bucket=BUCKET, Key=key.format("x.txt"), Body=DATA)
    names = ("o.txt", "m.txt", "n.txt", "x.txt", "z.txt")
    got = await checks.resolve_many("acme", policy, [f"artifact:s2:{n}:{SHA}" for n in names])
    assert [r.status for r in got] == ["corrupt"] * 4 + ["available"]
    await checks.audit.flush()
    rows = await list_audit(checks.store, AuditQuery("acme", status="corrupt"))
    assert sorted(r.detail for r in rows) == ["digest", "no-manifest", "no-manifest", "signature"]
    # key rotation: z.txt was signed with k1; k2 signs new entries and k1 still verifies
    rotated = dataclasses.replace(policy, signing=SigningKeys("k2", {"k1": KEY_1, "k2": KEY_2}))
    assert (await checks.resolve_many("acme", rotated, [f"artifact:s2:z.txt:{SHA}"]))[0].status == "available"
    retired = dataclasses.replace(policy, signing=SigningKeys("k2", {"k2": KEY_2}))
    assert (await checks.resolve_many("acme", retired, [f"artifact:s2:z.txt:{SHA}"]))[0].status == "corrupt"


async def test_local_artifacts_are_signed_too(checks: SourceChecks, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    policy = SourcePolicy(
        frozenset({"artifact"}), ("*",), None, str(root), None, SigningKeys("k1", {"k1": KEY_1})
    )
    await checks.write_artifacts("acme", policy, "s1", [("a.txt", DATA), ("b.txt", DATA)])
    db = sqlite3.connect(tmp_path / "store.db")
    db.execute("UPDATE artifact_manifests SET sha256 = ? WHERE name = 'b.txt'", ("0" * 64,))
    db.commit()
    db.close()
    got = await checks.resolve_many("acme", policy, [f"artifact:s1:{n}:{SHA}" for n in ("a.txt", "b.txt")])
    assert [r.status for r in got] == ["available", "corrupt"]
    unsigned = dataclasses.replace(policy, signing=None)
    got = await checks.resolve_many("acme", unsigned, [f"artifact:s1:b.txt:{SHA}"])
    assert got[0].status == "available"  # without keys, local artifacts are checked as before


async def test_the_audit_log_batches_waits_out_an_outage_and_bounds_memory() -> None:
    from proxy.sources.audit_log import AuditLog
    from proxy.store.base import StoreUnavailable
    from proxy.store.source_records import AuditRow

    written: list[list[AuditRow]] = []
    down = True

    async def write(rows: Any) -> None:
        if down:
            raise StoreUnavailable("down")
        written.append(list(rows))

    log = AuditLog(write, batch_size=3, flush_seconds=0.05, max_pending=5)
    rows = [AuditRow("t", "s", f"p{i}", "missing", None, "s3", "", 0.0, "x", "t") for i in range(7)]
    log.record(rows[:2])
    await log.flush()
    assert written == [] and log.dropped == 0  # kept while the store is down
    log.record(rows[2:])
    await log.flush()
    assert log.dropped == 2  # at most max_pending rows wait; the oldest go first
    down = False
    await log.close()
    assert [r.pointer for batch in written for r in batch] == ["p2", "p3", "p4", "p5", "p6"]
    assert [len(b) for b in written] == [3, 2]


_COMPONENT = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)


@given(session=st.one_of(_COMPONENT, st.text(max_size=30)), name=st.one_of(_COMPONENT, st.text(max_size=30)))
@settings(max_examples=300, deadline=None)
def test_a_key_is_always_under_the_prefix_or_refused(session: str, name: str) -> None:
    store = settings_for("http://127.0.0.1:9", "tenants/acme/", Credentials("a", "b"))
    key = object_key(store, session, name)
    if key is not None:
        assert key.startswith("tenants/acme/") and key == posixpath.normpath(key)
        assert ".." not in key.split("/") and not key.startswith("/")
    pointer = parse_pointer(f"artifact:{session}:{name}:{SHA}")
    if isinstance(pointer, ArtifactPointer):  # whatever the grammar accepts has a key
        assert object_key(store, pointer.session, pointer.name) is not None
