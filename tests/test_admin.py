"""The admin API and its CLI: a real SQLite store, real source files, real HTTP on 127.0.0.1.

The app under test is a plain ``web.Application`` holding the keys the admin routes read
(``STORE``, ``RESOLVER``, ``TENANCY``) with :func:`add_admin_routes`; the tenancy is loaded by
``load_tenancy`` from two real policy files (tenants ``acme`` and ``globex``, ``auth.mode: keys``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx2 as httpx
import orjson
import pytest
import yaml
from aiohttp import web

from proxy.config.settings import parse_config
from proxy.core.durable import DurableState, Item
from proxy.core.render import render_state
from proxy.server.admin.routes import add_admin_routes
from proxy.server.appkeys import RESOLVER, STORE, TENANCY, TenancyHolder
from proxy.sources.artifact_files import write_artifact
from proxy.sources.pointer_resolver import PointerResolver
from proxy.sources.resolver import SourceResolver
from proxy.store import Store, TranscriptEvent, open_store
from proxy.tenancy.policies import load_tenancy
from proxy.tenancy.tenants import Tenant
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream

T = TypeVar("T")

A_TOKEN = "cpa-acme-test-admin-token-0001"
B_TOKEN = "cpa-globex-test-admin-token-0001"
A_API_KEY = "cpk-acme-test-key-0001"
B_API_KEY = "cpk-globex-test-key-0001"
CANARY = "EXCERPT-CANARY-7d1f"  # in a transcript record: may appear in excerpts, never in a block
T0 = "2025-01-01T00:00:00Z"
T1 = "2025-01-02T00:00:00Z"
T2 = "2025-01-03T00:00:00Z"
SRC = "transcript:s1:1"


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Admin:
    url: str
    loop: LoopThread
    store: Store
    acme: Tenant
    globex: Tenant
    http: httpx.Client
    app: web.Application

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)

    def call(
        self, method: str, path: str, *, token: str | None = A_TOKEN, **kw: Any
    ) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.http.request(method, self.url + path, headers=headers, **kw)

    def history(self, tenant: Tenant, session: str) -> int:
        return len(self.run(self.store.history(tenant.name, session)))

    def state(self, tenant: Tenant, session: str) -> DurableState:
        return self.run(self.store.current_state(tenant.name, session))


def _write_policies(tmp: Path) -> Path:
    policies = tmp / "policies"
    policies.mkdir()
    for name, key, token in (("acme", A_API_KEY, A_TOKEN), ("globex", B_API_KEY, B_TOKEN)):
        roots = tmp / "roots" / name
        policy = {
            "name": name,
            "api_keys_sha256": [_sha(key)],
            "provider": {"mode": "passthrough"},
            "sources": {
                "kinds": ["transcript", "artifact"],
                "session_patterns": ["*"],
                "transcript_root": str(roots / "transcripts"),
                "artifact_root": str(roots / "artifacts"),
            },
            "admin_tokens_sha256": [_sha(token)],
        }
        (roots / "transcripts").mkdir(parents=True)
        (roots / "artifacts").mkdir(parents=True)
        (policies / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    return policies


@pytest.fixture
def admin(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Admin]:
    policies = _write_policies(tmp_path)
    config = parse_config(
        {"auth": {"mode": "keys"}, "policies_dir": str(policies), "state_dir": str(tmp_path)},
        "<test>",
    )
    tenancy = load_tenancy(config, environ={})
    acme, globex = tenancy.by_name("acme"), tenancy.by_name("globex")
    assert acme is not None and globex is not None
    runner: web.AppRunner | None = None

    app = web.Application()

    async def start() -> tuple[str, Store]:
        nonlocal runner
        store = await open_store(f"sqlite:///{tmp_path / 'state' / 'store.db'}")
        app[STORE] = store
        app[RESOLVER] = SourceResolver()
        app[TENANCY] = TenancyHolder(tenancy)
        add_admin_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}", store

    url, store = loop_thread.run(start())
    with httpx.Client(timeout=30, trust_env=False) as http:
        yield Admin(url, loop_thread, store, acme, globex, http, app)

    async def stop() -> None:
        assert runner is not None
        await runner.cleanup()
        await store.close()

    loop_thread.run(stop())


def fact(fid: str = "f1", **over: Any) -> dict[str, Any]:
    return {
        "id": fid,
        "content": "the build uses uv",
        "source": SRC,
        "last_confirmed_at": T0,
    } | over


def pending(pid: str = "p1", **over: Any) -> dict[str, Any]:
    return {
        "id": pid,
        "content": "fix the flaky test",
        "status": "open",
        "source": SRC,
        "last_confirmed_at": T0,
    } | over


def evidence(eid: str = "m1", **over: Any) -> dict[str, Any]:
    return {
        "id": eid,
        "title": "deploy notes",
        "source": SRC,
        "captured_at": T0,
        "score": 0.75,
        "rank": 1,
        "last_confirmed_at": T0,
    } | over


def error_of(r: httpx.Response, status: int, error_type: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert (
        r.headers["request-id"].startswith("req_") and body["request_id"] == r.headers["request-id"]
    )
    return dict(body["error"])


def details(r: httpx.Response) -> dict[str, str]:
    """The 422's ``{field: message}``; every field once."""
    error = error_of(r, 422, "invalid_request_error")
    pairs = [(d["field"], d["message"]) for d in error["details"]]
    assert len({f for f, _ in pairs}) == len(pairs), pairs
    for field, message in pairs:
        assert f"{field}: {message}" in error["message"]
    return dict(pairs)


def without_request_id(r: httpx.Response) -> tuple[int, Any]:
    body = r.json()
    body.pop("request_id", None)
    return r.status_code, body


# --- authentication --------------------------------------------------------------------------


# a value for each placeholder of the admin routes' paths
ROUTE_VALUES = {"session": "s1", "kind": "facts", "item_id": "f1", "compaction_id": "c1", "tail": "no-such-route"}
ANY_METHOD = ("GET", "POST", "PUT", "PATCH", "DELETE")


def admin_routes(app: web.Application) -> list[tuple[str, str, str]]:
    """Every (method, path, route name) the app's router serves, its placeholders filled
    (``*``: each method)."""
    calls = []
    for route in app.router.routes():
        path = route.resource.canonical.format_map(ROUTE_VALUES) if route.resource else ""
        for method in ANY_METHOD if route.method == "*" else (route.method,):
            calls.append((method, path, route.name or ""))
    return calls


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong-token",
        f"Basic {A_TOKEN}",
        f"Bearer {A_API_KEY}",  # a client API key is not an admin token
        f"Bearer {A_TOKEN}x",
        f"Bearer {_sha(A_TOKEN)}",  # nor is the stored hash
    ],
)
def test_without_a_valid_admin_token_every_route_is_401(
    admin: Admin, authorization: str | None
) -> None:
    # a session and an item that a route answering without a token would show
    assert admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact()).status_code == 201
    headers = {} if authorization is None else {"Authorization": authorization}
    routes = admin_routes(admin.app)
    names = {name for _, _, name in routes}
    assert len(names) >= 21 and {"admin_quota", "admin_usage_prices", "admin_other"} <= names
    assert all(path.startswith("/admin/v1/") and "{" not in path for _, path, _ in routes), routes
    for method, path in [
        *((method, path) for method, path, _ in routes),
        ("GET", "/admin/v1/sessions/..%2F..%2Fx/state"),  # auth before anything else
    ]:
        r = admin.call(method, path, token=None, headers=headers, json=fact())
        assert r.headers.get("www-authenticate", "").startswith("Bearer"), (method, path)
        if method == "HEAD":  # no body to read
            assert r.status_code == 401 and r.content == b"", (method, path)
            continue
        error = error_of(r, 401, "authentication_error")
        assert A_TOKEN not in error["message"]
    assert admin.history(admin.acme, "s1") == 1
    # each filled path reaches its own route (not the catch-all's 404, which is a 401 too)
    for method, path, name in routes:
        r = admin.call(method, path, json=fact())
        assert r.status_code != 401, (method, path)
        if name != "admin_other" and method != "HEAD":
            assert not r.text or r.json().get("error", {}).get("message") != f"{method} {path}: not found", (method, path)


def test_either_token_authenticates_its_own_tenant(admin: Admin) -> None:
    assert admin.call("POST", "/admin/v1/sessions/a1/facts", json=fact()).status_code == 201
    assert (
        admin.call("POST", "/admin/v1/sessions/b1/facts", token=B_TOKEN, json=fact()).status_code
        == 201
    )
    assert admin.call("GET", "/admin/v1/sessions").json() == {"sessions": ["a1"]}
    assert admin.call("GET", "/admin/v1/sessions", token=B_TOKEN).json() == {"sessions": ["b1"]}
    r = admin.call("GET", "/admin/v1/sessions")
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["request-id"].startswith("req_")


# --- facts, pending items, evidence ----------------------------------------------------------


def test_fact_lifecycle(admin: Admin) -> None:
    base = "/admin/v1/sessions/s1/facts"
    r = admin.call("POST", base, json=fact())
    assert r.status_code == 201, r.text
    assert r.headers["location"] == base + "/f1"
    assert r.json() == {"kind": "fact", "id": "f1", "version": 1, "retired": False, "item": fact()}
    assert admin.call("GET", base + "/f1").json()["item"] == fact()

    replaced = fact(content="the build uses uv 0.5", last_confirmed_at=T1)
    del replaced["id"]  # PUT: the path names the item
    r = admin.call("PUT", base + "/f1", json=replaced)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2 and r.json()["item"] == {**replaced, "id": "f1"}

    r = admin.call("PATCH", base + "/f1", json={"source": "transcript:s1:2"})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 3
    assert r.json()["item"] == fact(
        content="the build uses uv 0.5", last_confirmed_at=T1, source="transcript:s1:2"
    )

    r = admin.call(
        "POST", base + "/f1/retire", json={"source": "transcript:s1:3", "retired_at": T2}
    )
    assert r.status_code == 200, r.text
    assert r.json()["retired"] is True and r.json()["version"] == 4

    state = admin.call("GET", "/admin/v1/sessions/s1/state").json()
    assert state["session"] == "s1"
    assert state["facts"] == [] and state["pending"] == [] and state["evidence"] == []
    assert [(x["kind"], x["id"], x["version"]) for x in state["retired"]] == [("fact", "f1", 4)]
    assert admin.call("GET", base + "/f1").json()["retired"] is True

    history = admin.call("GET", "/admin/v1/sessions/s1/history").json()["history"]
    assert [(h["seq"], h["version"], h["change"]["op"]) for h in history] == [
        (1, 1, "create"),
        (2, 2, "update"),
        (3, 3, "update"),
        (4, 4, "retire"),
    ]
    assert history[3]["change"] == {
        "op": "retire",
        "kind": "fact",
        "id": "f1",
        "source": "transcript:s1:3",
        "retired_at": T2,
    }

    # A retired id is taken for good.
    assert details(admin.call("POST", base, json=fact(last_confirmed_at=T2))) == {
        "id": "a fact with this id was retired (ids are never reused)"
    }
    assert "id" in details(admin.call("PATCH", base + "/f1", json={"content": "again"}))
    assert admin.history(admin.acme, "s1") == 4


def test_item_ids_with_any_characters_round_trip_through_the_path(admin: Admin) -> None:
    odd = "notes/2025 é?#%"
    r = admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact(odd))
    assert r.status_code == 201, r.text
    location = r.headers["location"]
    assert admin.call("GET", location).json()["id"] == odd
    assert admin.call("PATCH", location, json={"content": "x"}).json()["item"]["id"] == odd
    r = admin.call("POST", location + "/retire", json={"source": SRC, "retired_at": T1})
    assert r.json()["retired"] is True


def test_pending_transitions(admin: Admin) -> None:
    base = "/admin/v1/sessions/s1/pending"
    assert details(admin.call("POST", base, json=pending(status="done"))) == {
        "status": "a new pending item is open or blocked"
    }
    assert details(admin.call("POST", base, json=pending(status="later"))) == {
        "status": "expected one of open, blocked, done"
    }
    assert admin.call("POST", base, json=pending()).status_code == 201
    assert (
        admin.call("PATCH", base + "/p1", json={"status": "blocked"}).json()["item"]["status"]
        == "blocked"
    )
    assert (
        admin.call("PATCH", base + "/p1", json={"status": "open"}).json()["item"]["status"]
        == "open"
    )
    assert admin.history(admin.acme, "s1") == 3

    # done needs the confirming pointer and a later confirmation, given explicitly
    assert details(admin.call("PATCH", base + "/p1", json={"status": "done"})) == {
        "source": "required when marking a pending item done (the confirmation)",
        "last_confirmed_at": "required when marking a pending item done (the confirmation)",
    }
    assert set(
        details(admin.call("PATCH", base + "/p1", json={"status": "done", "last_confirmed_at": T1}))
    ) == {"source"}
    r = admin.call(
        "PATCH", base + "/p1", json={"status": "done", "source": "", "last_confirmed_at": T1}
    )
    assert details(r) == {"source": "a source pointer must not be empty"}
    r = admin.call(
        "PATCH",
        base + "/p1",
        json={"status": "done", "source": "transcript:s1:9", "last_confirmed_at": T0},
    )
    assert set(details(r)) == {"last_confirmed_at"}
    # the same rules through the change list
    r = admin.call(
        "POST",
        "/admin/v1/sessions/s1/changes",
        json={
            "changes": [
                {
                    "op": "update",
                    "kind": "pending",
                    "item": pending(status="done", source="", last_confirmed_at=T1),
                },
            ]
        },
    )
    assert details(r) == {"changes[0].item.source": "a source pointer must not be empty"}
    assert admin.history(admin.acme, "s1") == 3  # nothing written by any of the above

    r = admin.call(
        "PATCH",
        base + "/p1",
        json={"status": "done", "source": "transcript:s1:9", "last_confirmed_at": T1},
    )
    assert r.status_code == 200, r.text
    assert r.json()["item"]["status"] == "done" and r.json()["version"] == 4

    for status in ("open", "blocked"):  # done is final
        assert details(
            admin.call("PATCH", base + "/p1", json={"status": status, "last_confirmed_at": T2})
        ) == {"status": "a done item is final; record new work as a new pending item"}
    assert admin.history(admin.acme, "s1") == 4


def test_evidence_lifecycle(admin: Admin) -> None:
    base = "/admin/v1/sessions/s1/evidence"
    r = admin.call("POST", base, json=evidence(conflict_key="deploy-target"))
    assert r.status_code == 201, r.text
    assert r.json()["item"]["conflict_key"] == "deploy-target"
    r = admin.call("PUT", base + "/m1", json=evidence(score=0.5, rank=2))
    assert r.json()["item"]["conflict_key"] is None and r.json()["version"] == 2
    assert details(
        admin.call("PATCH", base + "/m1", json={"score": 1.5, "rank": 0, "title": " "})
    ) == {
        "score": "the score must be between 0 and 1",
        "rank": "the rank must be >= 1",
        "title": "a title must not be empty",
    }
    r = admin.call("POST", base + "/m1/retire", json={"source": SRC, "retired_at": T1})
    assert r.json()["retired"] is True
    assert admin.history(admin.acme, "s1") == 3


def test_change_list_is_all_or_nothing(admin: Admin) -> None:
    url = "/admin/v1/sessions/s1/changes"
    r = admin.call(
        "POST",
        url,
        json={
            "changes": [
                {"op": "create", "kind": "fact", "item": fact()},
                {
                    "op": "update",
                    "kind": "fact",
                    "item": fact(content="updated", last_confirmed_at=T1),
                },
                {"op": "create", "kind": "pending", "item": pending()},
                {"op": "create", "kind": "evidence", "item": evidence()},
                {"op": "retire", "kind": "pending", "id": "p1", "source": SRC, "retired_at": T1},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "session": "s1",
        "applied": [
            {"op": "create", "kind": "fact", "id": "f1", "version": 1},
            {"op": "update", "kind": "fact", "id": "f1", "version": 2},
            {"op": "create", "kind": "pending", "id": "p1", "version": 1},
            {"op": "create", "kind": "evidence", "id": "m1", "version": 1},
            {"op": "retire", "kind": "pending", "id": "p1", "version": 2},
        ],
    }
    before = admin.state(admin.acme, "s1")

    # one bad change among good ones: nothing of the list is written
    r = admin.call(
        "POST",
        url,
        json={
            "changes": [
                {"op": "create", "kind": "fact", "item": fact("f2")},
                {"op": "update", "kind": "fact", "item": fact("nope")},
            ]
        },
    )
    assert details(r) == {"changes[1].item.id": "no fact with this id"}
    assert admin.history(admin.acme, "s1") == 5 and admin.state(admin.acme, "s1") == before


def test_422_names_every_bad_field_and_writes_nothing(admin: Admin) -> None:
    r = admin.call(
        "POST",
        "/admin/v1/sessions/s9/facts",
        json={
            "id": "f1",
            "content": "",
            "source": "file:///etc/passwd",
            "last_confirmed_at": "yesterday",
            "colour": "blue",
        },
    )
    assert details(admin.call("POST", "/admin/v1/sessions/s9/facts", json={})) == dict.fromkeys(
        ("id", "content", "source", "last_confirmed_at"), "required"
    )
    assert set(details(r)) == {"colour", "content", "source", "last_confirmed_at"}
    assert details(r)["colour"] == "unknown field"
    assert "/etc/passwd" not in r.text
    r = admin.call(
        "POST",
        "/admin/v1/sessions/s9/pending",
        json={"id": "p9", "content": "x", "status": "done", "source": 7, "last_confirmed_at": None},
    )
    assert details(r) == {
        "last_confirmed_at": "expected an ISO 8601 timestamp string",
        "status": "a new pending item is open or blocked",
        "source": "expected a source pointer (a string)",
    }

    r = admin.call(
        "POST",
        "/admin/v1/sessions/s9/changes",
        json={
            "changes": [
                {"op": "create", "kind": "fact", "item": fact(content="")},
                {"op": "create", "kind": "fact", "item": fact("f2") | {"colour": "blue"}},
                {"op": "delete", "kind": "fact", "id": "f1"},
                {"op": "create", "kind": "memo", "item": {}},
                {"op": "retire", "kind": "fact", "id": "f1"},
                "not an object",
                {"op": "create", "kind": "evidence", "item": evidence(score=2, rank=0)},
                {"op": "update", "kind": "pending", "item": {"id": "p9", "content": ""}},
            ]
        },
    )
    assert details(r) == {
        "changes[0].item.content": "content must not be empty",
        "changes[1].item.colour": "unknown field",
        "changes[2].op": "expected one of create, update, retire",
        "changes[3].kind": "expected one of fact, pending, evidence",
        "changes[4].source": "required",
        "changes[4].retired_at": "required",
        "changes[5]": "expected an object",
        "changes[6].item.score": "the score must be between 0 and 1",
        "changes[6].item.rank": "the rank must be >= 1",
        "changes[7].item.status": "required",
        "changes[7].item.source": "required",
        "changes[7].item.last_confirmed_at": "required",
        "changes[7].item.content": "content must not be empty",
    }
    assert details(admin.call("POST", "/admin/v1/sessions/s9/changes", json={"change": []})) == {
        "change": "unknown field",
        "changes": "required",
    }
    assert details(admin.call("POST", "/admin/v1/sessions/s9/changes", json={"changes": {}})) == {
        "changes": "expected a list of changes",
    }
    assert details(admin.call("POST", "/admin/v1/sessions/s9/changes", json={"changes": []})) == {
        "changes": "expected at least one change",
    }
    r = admin.call("POST", "/admin/v1/sessions/s9/changes", json={"changes": [fact()] * 1001})
    assert details(r) == {"changes": "at most 1000 changes per write"}
    # nothing written: no history, and the session does not even exist
    assert admin.history(admin.acme, "s9") == 0
    assert admin.call("GET", "/admin/v1/sessions").json() == {"sessions": []}
    error_of(admin.call("GET", "/admin/v1/sessions/s9/state"), 404, "not_found_error")


def test_convenience_routes_check_path_and_body_agree(admin: Admin) -> None:
    base = "/admin/v1/sessions/s1/facts"
    admin.call("POST", base, json=fact())
    assert details(admin.call("PUT", base + "/f1", json=fact("f2"))) == {
        "id": "must match the id in the path"
    }
    assert details(admin.call("PATCH", base + "/f1", json={"id": "f2", "content": ""})) == {
        "id": "must match the id in the path",
        "content": "content must not be empty",
    }
    assert details(
        admin.call("POST", base + "/f1/retire", json={"source": "a b", "retired_at": "x", "why": 1})
    ) == {
        "why": "unknown field",
        "source": "not a valid source pointer (whitespace or control character)",
        "retired_at": "not an ISO 8601 timestamp",
    }
    assert details(
        admin.call(
            "PUT", base + "/f1", json=fact(content="", last_confirmed_at="2024-01-01T00:00Z")
        )
    ) == {
        "content": "content must not be empty",
        "last_confirmed_at": f"must not be earlier than the current one ({T0})",
    }
    assert details(admin.call("POST", base + "/f1/retire", json={"source": SRC})) == {
        "retired_at": "required"
    }
    assert admin.history(admin.acme, "s1") == 1


@pytest.mark.parametrize(
    ("method", "path", "body", "contains"),
    [
        ("POST", "/admin/v1/sessions/s1/facts", b"{not json", "not valid JSON"),
        ("POST", "/admin/v1/sessions/s1/facts", b"[1, 2]", "must be a JSON object"),
        ("POST", "/admin/v1/sessions/s1/facts", b"", "empty"),
        ("POST", "/admin/v1/sessions/s1/changes", b'"changes"', "must be a JSON object"),
        ("GET", "/admin/v1/sessions/-s1/state", None, "session:"),
        ("GET", "/admin/v1/sessions/CON/history", None, "session:"),
        ("GET", "/admin/v1/sessions/a%20b/preview", None, "session:"),
        ("GET", "/admin/v1/sessions/..%2F..%2Fetc/state", None, "session:"),
        ("POST", "/admin/v1/sessions/s1./facts", b"{}", "session:"),
        (
            "GET",
            "/admin/v1/sessions/s1/transcript?limit=0",
            None,
            "limit: expected an integer from 1 to 1000",
        ),
        ("GET", "/admin/v1/sessions/s1/transcript?limit=1001", None, "limit:"),
        (
            "GET",
            "/admin/v1/sessions/s1/transcript?after=-1&limit=x",
            None,
            "after: expected an integer",
        ),
        ("GET", f"/admin/v1/manifests/{'c' * 257}", None, "compaction_id:"),
    ],
)
def test_malformed_requests_are_400(
    admin: Admin, method: str, path: str, body: bytes | None, contains: str
) -> None:
    admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact())
    r = admin.call(method, path, content=body)
    assert contains in error_of(r, 400, "invalid_request_error")["message"]
    if "after=-1" in path:
        assert "limit:" in r.json()["error"]["message"]  # each bad parameter named
    assert admin.history(admin.acme, "s1") == 1


def test_an_oversized_body_is_413(admin: Admin) -> None:
    r = admin.call("POST", "/admin/v1/sessions/s1/changes", content=b" " * (4 << 20 | 1))
    error_of(r, 413, "request_too_large")


def test_unknown_admin_routes_and_methods_are_404(admin: Admin) -> None:
    admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact())
    error_of(admin.call("GET", "/admin/v1/nothing"), 404, "not_found_error")
    error_of(admin.call("DELETE", "/admin/v1/sessions/s1/facts/f1"), 404, "not_found_error")
    error_of(admin.call("POST", "/admin/v1/sessions/s1/memos", json={}), 404, "not_found_error")
    assert (
        error_of(admin.call("GET", "/admin/v1/sessions/s1/facts/f9"), 404, "not_found_error")[
            "message"
        ]
        == "fact not found"
    )


def test_store_unavailable_is_503(admin: Admin) -> None:
    admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact())
    admin.run(admin.store.close())
    for method, path, body in [
        ("GET", "/admin/v1/sessions", None),
        ("GET", "/admin/v1/sessions/s1/state", None),
        ("POST", "/admin/v1/sessions/s1/facts", fact("f2")),
    ]:
        r = admin.call(method, path, json=body)
        error = error_of(r, 503, "api_error")
        assert error["message"] == "the session store is unavailable; retry later"
        assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"


# --- tenants ---------------------------------------------------------------------------------


def test_another_tenants_data_is_indistinguishable_from_missing(admin: Admin) -> None:
    # acme's session s1: a fact, a pending item, evidence, transcript events and a manifest
    for kind, item in (("facts", fact()), ("pending", pending()), ("evidence", evidence())):
        assert admin.call("POST", f"/admin/v1/sessions/s1/{kind}", json=item).status_code == 201
    _record_events(admin, admin.acme, "s1", 3)
    admin.run(admin.store.put_manifest("acme", "cmp_acme_1", "s1", '{"layers": ["L1"]}'))
    acme_history = admin.history(admin.acme, "s1")

    def same(path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        """globex asking for acme's thing answers exactly as for something that never existed."""
        theirs = admin.call(method, path, token=B_TOKEN, json=body)
        missing = admin.call(
            method,
            path.replace("/s1/", "/s-never/").replace("cmp_acme_1", "cmp_never"),
            token=B_TOKEN,
            json=body,
        )
        own_missing = admin.call(
            method, path.replace("/s1/", "/s-never/").replace("cmp_acme_1", "cmp_never"), json=body
        )
        assert theirs.status_code == 404, theirs.text
        assert (
            without_request_id(theirs)
            == without_request_id(missing)
            == without_request_id(own_missing)
        )
        assert theirs.headers.keys() == missing.headers.keys()
        return without_request_id(theirs)

    for view in ("state", "history", "preview", "transcript", "transcript?after=1&limit=1"):
        assert same(f"/admin/v1/sessions/s1/{view}")[1]["error"]["message"] == "session not found"
    for kind, noun in (
        ("facts/f1", "fact"),
        ("pending/p1", "pending item"),
        ("evidence/m1", "evidence"),
    ):
        path = f"/admin/v1/sessions/s1/{kind}"
        assert same(path)[1]["error"]["message"] == f"{noun} not found"
        same(path, "PUT", fact())
        same(path, "PATCH", {"content": "hijacked"})
        same(path + "/retire", "POST", {"source": SRC, "retired_at": T2})
    assert same("/admin/v1/manifests/cmp_acme_1")[1]["error"]["message"] == "manifest not found"
    assert admin.call("GET", "/admin/v1/sessions", token=B_TOKEN).json() == {"sessions": []}

    # globex writing "s1" creates globex's own s1; acme's is untouched
    r = admin.call(
        "POST", "/admin/v1/sessions/s1/facts", token=B_TOKEN, json=fact(content="globex's")
    )
    assert r.status_code == 201 and r.json()["version"] == 1
    r = admin.call(
        "POST",
        "/admin/v1/sessions/s1/changes",
        token=B_TOKEN,
        json={
            "changes": [
                {"op": "update", "kind": "pending", "item": pending(content="hijacked")},
            ]
        },
    )
    assert details(r) == {"changes[0].item.id": "no pending item with this id"}
    assert admin.history(admin.acme, "s1") == acme_history
    assert [f.content for f in admin.state(admin.acme, "s1").facts] == ["the build uses uv"]
    assert (
        admin.call("GET", "/admin/v1/sessions/s1/state", token=B_TOKEN).json()["facts"][0]["item"][
            "content"
        ]
        == "globex's"
    )
    assert (
        admin.call("GET", "/admin/v1/sessions/s1/transcript", token=B_TOKEN).json()["events"] == []
    )
    assert admin.call("GET", "/admin/v1/sessions", token=B_TOKEN).json() == {"sessions": ["s1"]}
    assert admin.call("GET", "/admin/v1/manifests/cmp_acme_1").json()["session"] == "s1"


# --- preview ---------------------------------------------------------------------------------


def _resolutions_without_excerpts(admin: Admin, tenant: Tenant, session: str) -> dict[str, Any]:
    state = admin.state(tenant, session)
    items: tuple[Item, ...] = (*state.facts, *state.pending, *state.evidence)
    pointers = sorted({i.source for i in items})
    resolver = PointerResolver(admin.store, SourceResolver())
    found = admin.run(resolver.resolve_many(tenant.name, tenant.sources, pointers))
    return dict(zip(pointers, found, strict=True))


def test_preview_is_the_injected_block_with_excerpts_only_beside_it(admin: Admin) -> None:
    acme = admin.acme
    assert acme.sources.transcript_root is not None and acme.sources.artifact_root is not None
    # Transcript pointers are verified against the store (the record of truth), not a file.
    event = TranscriptEvent(
        "evt-1", T0, "message", "user", [{"type": "text", "text": f"deploy with {CANARY}"}], True
    )
    first = admin.run(admin.store.append_transcript(acme.name, "s1", [event], 1, "h1"))
    transcript = f"transcript:s1:{first}"
    artifact = write_artifact(
        acme.sources.artifact_root, "s1", "out.txt", f"tool said {CANARY}\n".encode()
    )
    assert transcript == "transcript:s1:1"
    changes = [
        {"op": "create", "kind": "fact", "item": fact("f1", source=transcript)},
        {
            "op": "create",
            "kind": "fact",
            "item": fact("f2", source=artifact, content="artifact fact"),
        },
        {"op": "create", "kind": "fact", "item": fact("f3", source="transcript:s1:99")},
        {"op": "create", "kind": "pending", "item": pending(source="store:s1:42")},
        {"op": "create", "kind": "evidence", "item": evidence(source=transcript)},
        {"op": "create", "kind": "fact", "item": fact("gone", source="transcript:s1:7")},
        {"op": "retire", "kind": "fact", "id": "gone", "source": SRC, "retired_at": T1},
    ]
    assert (
        admin.call("POST", "/admin/v1/sessions/s1/changes", json={"changes": changes}).status_code
        == 200
    )

    r = admin.call("GET", "/admin/v1/sessions/s1/preview")
    assert r.status_code == 200, r.text
    preview = r.json()
    expected = render_state(
        admin.state(acme, "s1"), _resolutions_without_excerpts(admin, acme, "s1")
    )
    assert preview["block"] == expected
    assert CANARY not in preview["block"] and "evidence_sha256=" in preview["block"]

    # ...and it is what the edge injects for this session
    from proxy.server.context.durable import DurableContext

    durable = DurableContext(admin.store, SourceResolver())
    try:
        injection = admin.run(durable.injection("acme", acme.sources, "s1"))
    finally:  # its audit trail writes in the background: closed while the store is open
        admin.run(durable.checks.close())
    assert injection.block == preview["block"]

    sources = {s["pointer"]: s for s in preview["sources"]}
    assert list(sources) == sorted(sources)  # one entry per pointer, in order
    assert set(sources) == {
        transcript,
        artifact,
        "transcript:s1:99",
        "store:s1:42",
    }  # not the retired one's
    assert sources[transcript]["status"] == "available" and CANARY in sources[transcript]["excerpt"]
    assert sources[transcript]["used_by"] == [
        {"kind": "fact", "id": "f1"},
        {"kind": "evidence", "id": "m1"},
    ]
    assert sources[transcript]["evidence_sha256"] in preview["block"]
    assert sources[artifact]["excerpt"] == f"tool said {CANARY}\n"
    assert sources[artifact]["evidence_sha256"] == artifact.rsplit(":", 1)[1]
    assert sources["transcript:s1:99"] == {
        "pointer": "transcript:s1:99",
        "status": "missing",
        "evidence_sha256": None,
        "excerpt": None,
        "used_by": [{"kind": "fact", "id": "f3"}],
    }
    assert sources["store:s1:42"]["status"] == "unsupported"
    assert preview["counts"] == {
        "available": 2,
        "missing": 1,
        "denied": 0,
        "corrupt": 0,
        "unsupported": 1,
    }
    # the excerpt appears nowhere but in the preview's resolutions
    assert CANARY not in admin.call("GET", "/admin/v1/sessions/s1/state").text
    assert CANARY not in admin.call("GET", "/admin/v1/sessions/s1/history").text

    # globex pointing at acme's transcript resolves under globex's own roots: missing
    admin.call("POST", "/admin/v1/sessions/s1/facts", token=B_TOKEN, json=fact(source=transcript))
    theirs = admin.call("GET", "/admin/v1/sessions/s1/preview", token=B_TOKEN).json()
    assert theirs["sources"] == [
        {
            "pointer": transcript,
            "status": "missing",
            "evidence_sha256": None,
            "excerpt": None,
            "used_by": [{"kind": "fact", "id": "f1"}],
        }
    ]
    assert CANARY not in json.dumps(theirs)


def test_preview_of_a_session_with_nothing_live_has_no_block(admin: Admin) -> None:
    admin.call("POST", "/admin/v1/sessions/s1/facts", json=fact())
    admin.call(
        "POST", "/admin/v1/sessions/s1/facts/f1/retire", json={"source": SRC, "retired_at": T1}
    )
    assert admin.call("GET", "/admin/v1/sessions/s1/preview").json() == {
        "session": "s1",
        "block": None,
        "sources": [],
        "counts": {"available": 0, "missing": 0, "denied": 0, "corrupt": 0, "unsupported": 0},
    }


# --- transcripts and manifests ---------------------------------------------------------------


def _record_events(admin: Admin, tenant: Tenant, session: str, n: int) -> None:
    events = [
        TranscriptEvent(
            f"evt-{i}",
            T0,
            "message" if i % 2 else "answer",
            "user" if i % 2 else "assistant",
            [{"type": "text", "text": f"turn {i}"}],
            i != n,
        )
        for i in range(1, n + 1)
    ]
    admin.run(admin.store.append_transcript(tenant.name, session, events, n, f"hash-{n}"))


def test_transcript_pages_by_seq(admin: Admin) -> None:
    _record_events(admin, admin.acme, "s1", 5)
    url = "/admin/v1/sessions/s1/transcript"
    page = admin.call("GET", url, params={"limit": 2}).json()
    assert [e["seq"] for e in page["events"]] == [1, 2] and page["next_after"] == 2
    assert page["events"][0] == {
        "seq": 1,
        "pointer": "transcript:s1:1",
        "event_id": "evt-1",
        "recorded_at": T0,
        "type": "message",
        "role": "user",
        "content": [{"type": "text", "text": "turn 1"}],
        "complete": True,
        "prefix_count": 5,
        "prefix_hash": "hash-5",
        "evidence_sha256": page["events"][0]["evidence_sha256"],
    }
    # The page's digest is the one the pointer resolves to (both from the store's event).
    preview_resolver = PointerResolver(admin.store, SourceResolver())
    resolved = admin.run(
        preview_resolver.resolve(admin.acme.name, admin.acme.sources, "transcript:s1:1")
    )
    assert resolved.status == "available"
    assert resolved.evidence_sha256 == page["events"][0]["evidence_sha256"]
    page = admin.call("GET", url, params={"after": 2, "limit": 2}).json()
    assert [e["seq"] for e in page["events"]] == [3, 4] and page["next_after"] == 4
    page = admin.call("GET", url, params={"after": 4, "limit": 2}).json()
    assert [e["seq"] for e in page["events"]] == [5] and page["next_after"] is None
    assert page["events"][0]["complete"] is False
    page = admin.call("GET", url, params={"after": 5}).json()
    assert page == {"session": "s1", "agent": None, "events": [], "next_after": None}
    page = admin.call("GET", url, params={"after": 3, "limit": 2}).json()
    assert [e["seq"] for e in page["events"]] == [4, 5] and page["next_after"] is None
    assert len(admin.call("GET", url).json()["events"]) == 5  # default limit 100


def test_manifest_by_compaction_id(admin: Admin) -> None:
    manifest = '{"layers":["L1","L2"],"before":120000,"after":40000,"note":"\\u00e9"}'
    admin.run(admin.store.put_manifest("acme", "cmp_01HZX", "s7", manifest))
    r = admin.call("GET", "/admin/v1/manifests/cmp_01HZX")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["compaction_id"] == "cmp_01HZX" and body["session"] == "s7"
    assert body["manifest"] == orjson.loads(manifest) and body["stored_at"]
    assert admin.call("GET", "/admin/v1/sessions").json() == {"sessions": ["s7"]}
    assert admin.call("GET", "/admin/v1/sessions/s7/state").json()["facts"] == []


# --- the CLI ---------------------------------------------------------------------------------


def _cli(
    admin: Admin, *args: str, token: str | None = A_TOKEN, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_PROXY_")}
    if token is not None:
        env["CP_TEST_ADMIN"] = token
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "admin",
        "--url",
        admin.url,
        "--token-env",
        "CP_TEST_ADMIN",
        *args,
    ]
    assert all(A_TOKEN not in a and B_TOKEN not in a for a in argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, input=stdin)


def _ok(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cli_end_to_end(admin: Admin, tmp_path: Path) -> None:
    made = _ok(
        _cli(
            admin,
            "add-fact",
            "s1",
            "--id",
            "f1",
            "--content",
            "uses uv",
            "--source",
            SRC,
            "--confirmed-at",
            T0,
        )
    )
    assert made["version"] == 1 and made["item"]["content"] == "uses uv"
    assert _ok(_cli(admin, "update-fact", "s1", "f1", "--content", "uses uv 0.5"))["version"] == 2
    _ok(
        _cli(
            admin,
            "add-pending",
            "s1",
            "--id",
            "p1",
            "--content",
            "ship it",
            "--source",
            SRC,
            "--confirmed-at",
            T0,
        )
    )
    assert (
        _ok(_cli(admin, "set-pending-status", "s1", "p1", "blocked", "--confirmed-at", T0))["item"][
            "status"
        ]
        == "blocked"
    )
    done = _ok(_cli(admin, "set-pending-status", "s1", "p1", "done", "--source", "transcript:s1:2"))
    assert done["item"]["status"] == "done" and done["item"]["source"] == "transcript:s1:2"
    ev = _ok(
        _cli(
            admin,
            "add-evidence",
            "s1",
            "--id",
            "m1",
            "--title",
            "notes",
            "--source",
            SRC,
            "--captured-at",
            T0,
            "--score",
            "0.5",
            "--rank",
            "1",
            "--conflict-key",
            "k1",
        )
    )
    assert ev["item"]["score"] == 0.5 and ev["item"]["conflict_key"] == "k1"
    changes = tmp_path / "changes.json"
    changes.write_text(json.dumps([{"op": "create", "kind": "fact", "item": fact("f2")}]))
    assert _ok(_cli(admin, "changes", "s1", str(changes)))["applied"][0]["id"] == "f2"
    stdin_changes = json.dumps({"changes": [{"op": "create", "kind": "fact", "item": fact("f3")}]})
    assert _ok(_cli(admin, "changes", "s1", "-", stdin=stdin_changes))["applied"][0]["id"] == "f3"
    assert _ok(_cli(admin, "retire", "s1", "fact", "f2", "--source", SRC))["retired"] is True

    assert _ok(_cli(admin, "sessions")) == {"sessions": ["s1"]}
    state = _ok(_cli(admin, "state", "s1"))
    assert [f["id"] for f in state["facts"]] == ["f1", "f3"] and state["pending"][0]["item"][
        "status"
    ] == "done"
    assert _ok(_cli(admin, "item", "s1", "fact", "f2"))["retired"] is True
    assert len(_ok(_cli(admin, "history", "s1"))["history"]) == admin.history(admin.acme, "s1") == 9
    block = _cli(admin, "preview", "s1", "--block")
    assert (
        block.returncode == 0 and block.stdout == _ok(_cli(admin, "preview", "s1"))["block"] + "\n"
    )
    assert block.stdout.startswith('<durable_state version="1">')

    _record_events(admin, admin.acme, "s1", 3)
    page = _ok(_cli(admin, "transcript", "s1", "--after", "1", "--limit", "1"))
    assert [e["seq"] for e in page["events"]] == [2] and page["next_after"] == 2
    admin.run(admin.store.put_manifest("acme", "cmp_cli", "s1", "{}"))
    assert _ok(_cli(admin, "manifest", "cmp_cli"))["manifest"] == {}

    # API errors: exit 1, the error JSON on stderr, nothing on stdout
    bad = _cli(
        admin,
        "add-fact",
        "s1",
        "--id",
        "f9",
        "--content",
        " ",
        "--source",
        "nope nope",
        "--confirmed-at",
        "soon",
    )
    assert bad.returncode == 1 and bad.stdout == ""
    error = json.loads(bad.stderr)["error"]
    assert {d["field"] for d in error["details"]} == {"content", "source", "last_confirmed_at"}
    assert _cli(admin, "manifest", "cmp_acme_other").returncode == 1
    other = _cli(admin, "state", "s1", token=B_TOKEN)
    assert other.returncode == 1 and json.loads(other.stderr)["error"]["type"] == "not_found_error"
    wrong = _cli(admin, "sessions", token="not-a-token")
    assert (
        wrong.returncode == 1
        and json.loads(wrong.stderr)["error"]["type"] == "authentication_error"
    )
    assert "not-a-token" not in wrong.stderr
    assert admin.history(admin.acme, "s1") == 9


def test_cli_into_a_closed_pipe_exits_quietly(admin: Admin) -> None:
    """``context-proxy admin transcript ... | head``: the reader leaves early; no traceback, the
    shell's status for it (141), whatever was still to print."""
    events = [
        TranscriptEvent(f"big-{i}", T0, "message", "user", [{"type": "text", "text": "x" * 4000}], True)
        for i in range(1, 101)
    ]
    admin.run(admin.store.append_transcript("acme", "s-big", events, 100, "hash-big"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_PROXY_")}
    env["CP_TEST_ADMIN"] = A_TOKEN
    argv = [sys.executable, "-m", "proxy", "admin", "--url", admin.url, "--token-env",
            "CP_TEST_ADMIN", "transcript", "s-big", "--limit", "100"]
    # well beyond a pipe's buffer (64 KiB): the CLI is still writing when the reader goes
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stderr is not None
    try:
        assert child.stdout.read(3) == b'{\n '  # it has started printing
        child.stdout.close()
        errors = child.stderr.read()
        assert child.wait(60) == 141
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stderr.close()
    assert errors == b""


def test_cli_usage_errors_exit_2(admin: Admin) -> None:
    missing = _cli(admin, "sessions", token=None)
    assert missing.returncode == 2 and "$CP_TEST_ADMIN" in missing.stderr
    assert _cli(admin, "set-pending-status", "s1", "p1", "done").returncode == 2
    assert _cli(admin, "update-fact", "s1", "f1").returncode == 2
    env = {**os.environ, "CP_TEST_ADMIN": A_TOKEN}
    unreachable = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "admin",
            "--url",
            "http://127.0.0.1:9",
            "--token-env",
            "CP_TEST_ADMIN",
            "sessions",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert unreachable.returncode == 2 and "cannot reach" in unreachable.stderr
    assert A_TOKEN not in unreachable.stderr


# --- mounted on the real proxy ---------------------------------------------------------------


def test_on_the_real_proxy_the_preview_is_what_the_upstream_receives(
    loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path
) -> None:
    policies = _write_policies(tmp_path)
    config = proxy_config(
        upstream.url, str(tmp_path / "state"), auth={"mode": "keys"}, policies_dir=str(policies)
    )
    server = ProxyServer(config)
    if "admin_sessions" not in server.app.router.named_resources():  # until build_app mounts it
        add_admin_routes(server.app)
    loop_thread.run(server.start())
    try:
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http:
            admin_auth = {"Authorization": f"Bearer {A_TOKEN}"}
            r = http.post("/admin/v1/sessions/s1/facts", json=fact(), headers=admin_auth)
            assert r.status_code == 201, r.text
            preview = http.get("/admin/v1/sessions/s1/preview", headers=admin_auth).json()
            assert preview["block"].startswith('<durable_state version="1">')
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            r = http.post(
                "/v1/messages",
                json=body,
                headers={
                    "x-api-key": A_API_KEY,
                    "x-session-id": "s1",
                    "anthropic-version": "2023-06-01",
                },
            )
            assert r.status_code == 200, r.text
            system = upstream.requests[-1].json()["system"]
            assert system[-1] == {"type": "text", "text": preview["block"]}
            # the proxy's error middleware leaves the admin answers as they are
            r = http.get(
                "/admin/v1/sessions/s1/state", headers={"Authorization": f"Bearer {B_TOKEN}"}
            )
            assert error_of(r, 404, "not_found_error")["message"] == "session not found"
            error_of(http.get("/admin/v1/sessions"), 401, "authentication_error")
            # an admin token is not an API key, and an API key is not an admin token
            r = http.post("/v1/messages", json=body, headers={"x-api-key": A_TOKEN})
            error_of(r, 401, "authentication_error")
            r = http.get("/admin/v1/sessions", headers={"Authorization": f"Bearer {A_API_KEY}"})
            error_of(r, 401, "authentication_error")
    finally:
        loop_thread.run(server.stop())


def test_the_openapi_file_lists_exactly_the_mounted_routes() -> None:
    spec = yaml.safe_load(
        (Path(__file__).parent.parent / "docs" / "admin-openapi.yaml").read_text()
    )
    documented = {
        (method.upper(), "/admin/v1" + path)
        for path, ops in spec["paths"].items()
        for method in ops
        if method != "parameters"
    }
    app = web.Application()
    add_admin_routes(app)
    mounted = set()
    for route in app.router.routes():
        if route.method in ("HEAD", "*"):
            continue
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter", "")
        path = path.replace("{kind:facts|pending|evidence}", "{kind}").replace("{item_id}", "{id}")
        mounted.add((route.method, path))
    assert documented == mounted and len(mounted) == 20


def test_a_resource_error_while_checking_sources_is_never_a_500(admin: Admin) -> None:
    """EMFILE from the file side (not a property of any source): the injection renders the
    store-unavailable block, and a retrieval/admin fetch answers ``missing``, audited as such."""
    import errno

    from proxy.core.render import render_unavailable
    from proxy.server.context.durable import DurableContext
    from proxy.sources.checks import SourceChecks

    acme = admin.acme
    assert acme.sources.artifact_root is not None
    artifact = write_artifact(acme.sources.artifact_root, "s1", "out.txt", b"tool output\n")
    change = {"op": "create", "kind": "fact", "item": fact("f1", source=artifact)}
    r = admin.call("POST", "/admin/v1/sessions/s1/changes", json={"changes": [change]})
    assert r.status_code == 200, r.text

    def no_fds(path: str, flags: int, dir_fd: int | None = None) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    starved = SourceResolver(opener=no_fds)
    durable = DurableContext(admin.store, starved)
    try:
        injection = admin.run(durable.injection("acme", acme.sources, "s1"))
    finally:  # its audit trail writes in the background: closed while the store is open
        admin.run(durable.checks.close())
    assert injection.block == render_unavailable() and not injection.available
    checks = SourceChecks(starved, admin.store)
    try:
        fetched = admin.run(checks.fetch("acme", acme.sources, artifact, session="s1"))
        assert fetched.resolution.status == "missing" and fetched.data is None
    finally:
        admin.run(checks.close())
    healthy = SourceChecks(SourceResolver(), admin.store)
    try:
        ok = admin.run(healthy.fetch("acme", acme.sources, artifact))
    finally:
        admin.run(healthy.close())
    assert ok.resolution.status == "available" and ok.data == b"tool output\n"
