"""The console's edge over plain HTTP (no browser): CSRF checks, the cookie, what the cookie may
do on the admin API, the assets, the source endpoint; and the session table with its clock."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.console.sessions import ConsoleSessions, token_hash
from proxy.server.appkeys import TENANCY
from tests.console.conftest import A_SESSION, A_TOKEN, B_SESSION, B_TOKEN, PAYLOAD, World


@pytest.fixture
def http(world: World) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=world.url, timeout=30, trust_env=False) as client:
        yield client


def _sign_in(http: httpx.Client, world: World, token: str = A_TOKEN, **headers: str) -> httpx.Response:
    return http.post(
        "/console/signin",
        data={"token": token},
        headers={"Origin": world.url, **headers},
    )


def _session_cookie(response: httpx.Response) -> str:
    match = re.match(r"([^=]+)=([^;]+);", response.headers["set-cookie"])
    assert match is not None
    return match.group(2)


def test_sign_in_needs_this_origin(http: httpx.Client, world: World) -> None:
    for headers in ({}, {"Origin": "https://evil.example"}, {"Origin": "null"}):
        r = http.post("/console/signin", data={"token": A_TOKEN}, headers=headers)
        assert r.status_code == 403 and "set-cookie" not in r.headers, headers
    r = _sign_in(http, world)
    assert r.status_code == 303 and r.headers["location"] == "/console/"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("cp_console=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Max-Age=28800" in cookie and "Secure" not in cookie
    assert A_TOKEN not in cookie
    # Sign-out is checked the same way: a cross-site form cannot sign anyone out.
    r = http.post("/console/signout", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    assert http.get("/console/api/me").json() == {"tenant": "acme", "ledger": True, "client_port": None}


def test_over_tls_the_cookie_is_secure_with_the_host_prefix(http: httpx.Client, world: World) -> None:
    # A TLS-terminating load balancer in front: the browser's Origin says https.
    host = world.url.removeprefix("http://")
    r = http.post("/console/signin", data={"token": A_TOKEN}, headers={"Origin": f"https://{host}"})
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("__Host-cp_console=") and "Secure" in cookie and "Domain" not in cookie


def test_a_wrong_token_gets_the_form_again_and_no_cookie(http: httpx.Client, world: World) -> None:
    for token in ("", "nope", B_TOKEN + "x", "t" * 5000):
        r = _sign_in(http, world, token)
        assert r.status_code == 200 and "set-cookie" not in r.headers
        assert '<p class="error" role="alert">Invalid admin token.</p>' in r.text
    assert http.get("/console/api/me").status_code == 401
    assert http.get("/console/", follow_redirects=False).headers["location"] == "/console/signin"


def test_the_cookie_reads_its_tenant_and_never_writes(http: httpx.Client, world: World) -> None:
    _sign_in(http, world)
    assert http.get("/admin/v1/sessions").json()["sessions"] == [
        "acme-build-42", "acme-errors-1", "acme-long-3"
    ]
    assert http.get(f"/admin/v1/sessions/{B_SESSION}/state").status_code == 404
    fact = {"id": "f2", "content": "x", "source": f"transcript:{A_SESSION}:1",
            "last_confirmed_at": "2026-12-01T10:00:00Z"}
    r = http.post(f"/admin/v1/sessions/{A_SESSION}/facts", json=fact)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = http.patch(f"/admin/v1/sessions/{A_SESSION}/facts/xss-fact", json={"content": "y"})
    assert r.status_code == 401
    # A bearer token, when sent, decides (a wrong one is 401 even with a valid cookie).
    r = http.get("/admin/v1/sessions", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = http.get("/admin/v1/sessions", headers={"Authorization": f"Bearer {B_TOKEN}"})
    assert r.json()["sessions"] == [B_SESSION]


def test_sign_out_ends_the_session_on_the_server(http: httpx.Client, world: World) -> None:
    value = _session_cookie(_sign_in(http, world))
    r = http.post("/console/signout", headers={"Origin": world.url})
    assert r.status_code == 303 and r.headers["location"] == "/console/signin"
    assert 'cp_console=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    with httpx.Client(base_url=world.url, trust_env=False, cookies={"cp_console": value}) as replay:
        assert replay.get("/admin/v1/sessions").status_code == 401
        assert replay.get("/console/api/me").status_code == 401


def test_removing_the_token_from_the_policy_ends_its_sessions(http: httpx.Client, world: World) -> None:
    _sign_in(http, world)
    assert http.get("/console/api/me").status_code == 200
    holder = world.proxy.app[TENANCY]
    before = holder.current
    acme = before.by_name("acme")
    assert acme is not None
    without = dataclasses.replace(acme, admin_token_hashes=())
    holder.current = dataclasses.replace(
        before, tenants=tuple(without if t.name == "acme" else t for t in before.tenants)
    )
    try:
        assert http.get("/console/api/me").status_code == 401
        assert http.get("/admin/v1/sessions").status_code == 401
    finally:
        holder.current = before
    assert http.get("/console/api/me").status_code == 401  # ended, not suspended


# a value for each placeholder of the console's routes
CONSOLE_VALUES = {"name": "app.js", "tail": "nope"}


def _console_routes(world: World) -> list[tuple[str, str]]:
    """Every (method, path) of the app's router under ``/console`` (``*``: GET and POST), the
    writes last (sign-out ends the session the reads use)."""
    calls = set()
    for route in world.proxy.app.router.routes():
        canonical = route.resource.canonical if route.resource else ""
        if canonical == "/console" or canonical.startswith("/console/"):
            path = canonical.format_map(CONSOLE_VALUES)
            calls |= {(m, path) for m in (("GET", "POST") if route.method == "*" else (route.method,))}
    return sorted(calls, key=lambda c: (c[0] == "POST", c))


def test_every_console_answer_has_the_security_headers(http: httpx.Client, world: World) -> None:
    _sign_in(http, world)
    routes = _console_routes(world)
    assert {("POST", "/console/signin"), ("POST", "/console/signout"), ("HEAD", "/console/api/me")} <= set(routes)
    assert len(routes) >= 15, routes
    for method, path in [
        *(("GET", p) for p in ("/console/signin", "/console/", "/console/sessions/x", "/console/static/app.js",
                               "/console/static/console.css", "/console/api/me", "/console/api/health",
                               "/console/static/..%2f..%2fconfig.py", "/console/api/nope")),
        *routes,
    ]:
        data = {"token": A_TOKEN} if path == "/console/signin" else None
        r = http.request(method, path, data=data, headers={"Origin": world.url}, follow_redirects=False)
        assert "content-security-policy" in r.headers, (method, path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, path
        assert "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
    assert http.get("/console/static/app.js").headers["content-type"].startswith("text/javascript")
    for bad in ("/console/static/..%2f..%2fconfig.py", "/console/static/routes.py",
                "/console/static/index.html", "/console/static/nope.js"):
        assert http.get(bad).status_code == 404, bad
    assert http.get("/console/api/nope").status_code == 404
    r = http.get("/console", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/console/"


def test_no_page_contains_inline_script_or_style() -> None:
    from importlib import resources

    static = resources.files("proxy.console").joinpath("static")
    for entry in static.iterdir():
        text = entry.read_text()
        if entry.name.endswith(".html"):
            assert re.findall(r"<script(?![^>]*\bsrc=)", text) == [], entry.name
            assert "style=" not in text and "<style" not in text, entry.name
            assert re.findall(r"\son[a-z]+\s*=", text) == [], entry.name
        if entry.name.endswith(".js"):
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
                assert sink not in text, (entry.name, sink)


def test_source_endpoint(world: World) -> None:
    base = f"/sessions/{A_SESSION}/source"
    r = world.admin("GET", base, params={"pointer": world.artifact_pointer})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "available"
    assert body["content"].startswith(f"line 0: {PAYLOAD}") and body["truncated"] is False
    assert body["evidence_sha256"] == world.artifact_pointer.rsplit(":", 1)[1]
    r = world.admin("GET", base, params={"pointer": world.fact_source})
    assert r.json()["status"] == "available"
    assert orjson.loads(r.json()["content"])["content"] == f"Build it. {PAYLOAD}"
    # The other tenant's view of the same pointers: its own roots hold nothing of acme's.
    r = world.admin("GET", f"/sessions/{B_SESSION}/source", token=B_TOKEN, params={"pointer": world.artifact_pointer})
    assert r.json() == {**r.json(), "status": "missing", "content": None, "evidence_sha256": None}
    # acme asking through globex's session: that session does not exist for acme.
    r = world.admin("GET", f"/sessions/{B_SESSION}/source", params={"pointer": world.fact_source})
    assert r.status_code == 404 and r.json()["error"]["message"] == "session not found"
    statuses = {
        f"transcript:{A_SESSION}:999": "missing",
        f"artifact:{A_SESSION}:nope.txt:{'0' * 64}": "missing",
        world.artifact_pointer[:-64] + "f" * 64: "corrupt",
        "transcript:../etc:1": "corrupt",
        "memory:abc": "unsupported",
    }
    for pointer, status in statuses.items():
        r = world.admin("GET", base, params={"pointer": pointer})
        assert r.status_code == 200 and r.json()["status"] == status, (pointer, r.text)
        assert r.json()["content"] is None
    for params in ({}, {"pointer": ""}, {"pointer": "x" * 600}):
        r = world.admin("GET", base, params=params)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert world.admin("GET", "/sessions/..bad/source", params={"pointer": "memory:a"}).status_code == 400
    assert world.admin("GET", base, token="wrong", params={"pointer": "memory:a"}).status_code == 401


def test_console_sessions_expire_and_are_bounded() -> None:
    sessions = ConsoleSessions(ttl_seconds=60, max_sessions=3)
    digest = token_hash("t")
    first = sessions.open("acme", digest, now=1000.0)
    assert sessions.get(first, 1059.9) is not None
    assert sessions.get(first, 1060.0) is None and len(sessions) == 0
    ids = [sessions.open("acme", digest, now=2000.0 + i) for i in range(4)]
    assert sessions.get(ids[0], 2004.0) is None  # the oldest went first
    assert all(sessions.get(i, 2004.0) is not None for i in ids[1:])
    assert len({*ids}) == 4 and all(len(i) >= 40 for i in ids)
    sessions.close(ids[1])
    assert sessions.get(ids[1], 2004.0) is None
    assert sessions.get("", 2004.0) is None and sessions.get("x" * 500, 2004.0) is None
    # Expired ones are dropped when a new one opens.
    sessions.open("acme", digest, now=5000.0)
    assert len(sessions) == 1


def test_the_console_can_be_turned_off(make_proxy: Any) -> None:
    proxy = make_proxy(console={"enabled": False})
    with httpx.Client(base_url=proxy.url, trust_env=False) as client:
        for path in ("/console/", "/console/signin", "/console/static/app.js"):
            r = client.get(path)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
