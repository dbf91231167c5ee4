"""Schemathesis against ``docs/admin-openapi.yaml`` (issue 11 #7).

Every route of the schema, with a valid admin token, with none, with an unknown one and with
another tenant's, against the real app (``build_app``: every middleware; a real SQLite store,
real HTTP on 127.0.0.1). Checks: never a 5xx, every status
is one the schema lists, every answer's content type and body match the schema. Bounded: a few
examples per route and token, so the whole file runs in seconds.

Random path parameters almost never name anything, so the answers that carry data are reached on
purpose: acme's session ``s1`` is seeded with an item of each kind, a retired one, its main and
an agent's transcript (real traffic through the proxy), a compaction manifest, usage rows, source
audit rows and quota counters; every generated read is sent again with its path naming those,
and one request per operation of the schema must answer 2xx with every list in it non-empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from proxy.core.durable import Create, Evidence, Fact, PendingItem, Retire
from proxy.server.appkeys import DURABLE, SOURCE_CHECKS, STORE
from proxy.server.ledger import LEDGER
from tests.fuzz.conftest import FuzzProxy, running_fuzz_proxy
from tests.harness import LoopThread
from tests.test_admin import A_API_KEY, A_TOKEN, B_TOKEN, T0, T1, fact, pending

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "admin-openapi.yaml"
schema = schemathesis.openapi.from_path(SCHEMA_PATH)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


SESSION = "s1"
AGENT = "agent-7"
MODEL = "claude-sonnet-4-5"  # priced: usage rows carry their costs
SOURCE = f"transcript:{SESSION}:1"
QUOTA = {"requests_per_minute": 10_000, "output_tokens_per_minute": 10**8, "budget_usd": 1000}


def _conversation() -> list[dict[str, Any]]:
    """Over the fuzz proxy's threshold, with a tool result over its cap (L1 cuts it: an
    artifact and a manifest)."""
    return [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cat log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "line of the log\n" * 200}]},
        {"role": "assistant", "content": "It is long."},
        {"role": "user", "content": "summarise it " + "please " * 100},
    ]


@pytest.fixture(scope="module")
def fuzz_proxy(loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzProxy]:
    """The fuzz proxy with acme's session ``s1`` holding something for every admin read."""
    with running_fuzz_proxy(loop_thread, tmp_path_factory.mktemp("fuzz"), acme_quota=QUOTA) as proxy:
        app = proxy.server.app
        changes = [
            Create(PendingItem("p1", "fix the flaky test", "open", SOURCE, T0)),
            Create(Evidence("m1", "deploy notes", SOURCE, T0, 0.75, 1, T0, "db-choice")),
            Create(Fact("gone", "the CI runs on Debian", SOURCE, T0)),
            Retire("fact", "gone", SOURCE, T1),
        ]
        loop_thread.run(app[STORE].write_changes("acme", SESSION, changes))
        compaction_id = ""
        for agent in ("", AGENT):  # the main conversation, then an agent's
            headers = {"x-api-key": A_API_KEY, "x-session-id": SESSION} | ({"x-agent-id": agent} if agent else {})
            body = {"model": MODEL, "max_tokens": 5, "messages": _conversation()}
            r = httpx.post(proxy.url + "/v1/messages", content=orjson.dumps(body), headers=headers, timeout=30, trust_env=False)
            assert r.status_code == 200, r.text
            compaction_id = compaction_id or r.headers.get("x-compaction-id", "")
        assert compaction_id
        loop_thread.run(app[DURABLE].drain())
        loop_thread.run(app[LEDGER].flush())
        loop_thread.run(app[SOURCE_CHECKS].audit.flush())
        proxy.seeded.update(session=SESSION, compaction_id=compaction_id, facts="build", pending="p1", evidence="m1")
        yield proxy


def _seeded_path(case: Any, seeded: dict[str, str]) -> dict[str, Any]:
    """The case's path parameters, each naming what is seeded (an item of the case's kind)."""
    params = dict(case.path_parameters)
    for name in (p.name for p in case.operation.path_parameters):
        if name == "kind":
            params[name] = params.get(name) if params.get(name) in ("facts", "pending", "evidence") else "facts"
        elif name == "id":
            params[name] = seeded[params.get("kind") if params.get("kind") in seeded else "facts"]
        else:
            params[name] = seeded[name]
    return params


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False
        yield session


def _call(case: Any, proxy: FuzzProxy, http: requests.Session, token: str | None) -> Any:
    headers: dict[str, str] = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if case.headers:
        case.headers.pop("Authorization", None)
    return case.call_and_validate(
        base_url=f"{proxy.url}/admin/v1", session=http, headers=headers, checks=CHECKS, timeout=10
    )


def _fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@schema.parametrize()
@_fuzz(10)
def test_admin_api_matches_its_schema_with_a_valid_token(
    case: Any, fuzz_proxy: FuzzProxy, http: requests.Session
) -> None:
    _call(case, fuzz_proxy, http, A_TOKEN)
    if case.method == "GET" and case.path_parameters:  # again, on the seeded session
        case.path_parameters = _seeded_path(case, fuzz_proxy.seeded)
        _call(case, fuzz_proxy, http, A_TOKEN)


# one request per operation of the schema, in an order where each finds what it needs:
# (method, path, path parameters, query, body)
POPULATED: list[tuple[str, str, dict[str, str], dict[str, str], Any]] = [
    ("GET", "/sessions", {}, {}, None),
    ("GET", "/sessions/{session}/state", {}, {}, None),
    ("GET", "/sessions/{session}/history", {}, {}, None),
    ("POST", "/sessions/{session}/changes", {}, {}, {"changes": [{"op": "create", "kind": "fact", "item": fact("w1")}]}),
    ("POST", "/sessions/{session}/{kind}", {"kind": "pending"}, {}, pending("w2")),
    ("GET", "/sessions/{session}/{kind}/{id}", {"kind": "evidence", "id": "m1"}, {}, None),
    ("PUT", "/sessions/{session}/{kind}/{id}", {"kind": "facts", "id": "w1"}, {}, fact("w1", content="the build uses uv 0.5")),
    ("PATCH", "/sessions/{session}/{kind}/{id}", {"kind": "pending", "id": "w2"}, {}, {"status": "blocked"}),
    ("POST", "/sessions/{session}/{kind}/{id}/retire", {"kind": "facts", "id": "w1"}, {}, {"source": SOURCE, "retired_at": T1}),
    ("GET", "/sessions/{session}/preview", {}, {}, None),
    ("GET", "/sessions/{session}/agents", {}, {}, None),
    ("GET", "/sessions/{session}/transcript", {}, {"agent": AGENT}, None),
    ("GET", "/manifests/{compaction_id}", {}, {}, None),
    ("GET", "/audit", {}, {}, None),
    ("GET", "/usage", {}, {}, None),
    ("GET", "/usage/summary", {}, {}, None),
    ("GET", "/usage/sessions", {}, {}, None),
    ("GET", "/usage/prices", {}, {}, None),
    ("GET", "/quota", {}, {}, None),
    ("GET", "/sessions/{session}/source", {}, {"pointer": SOURCE}, None),
]


def _lists(value: Any, where: str = "") -> Iterator[tuple[str, list[Any]]]:
    if isinstance(value, list):
        yield where, value
        for k, v in enumerate(value):
            yield from _lists(v, f"{where}[{k}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _lists(v, f"{where}.{k}")


def test_admin_api_matches_its_schema_on_a_populated_session(
    fuzz_proxy: FuzzProxy, http: requests.Session
) -> None:
    """Each operation once, naming what is seeded: a 2xx answer that matches the schema, with no
    top-level member null and every list in it non-empty."""
    operations = {(r.ok().method.upper(), r.ok().path) for r in schema.get_all_operations()}
    assert {(method, path) for method, path, *_ in POPULATED} == operations
    for method, path, params, query, body in POPULATED:
        operation = schema[path][method]
        names = {p.name for p in operation.path_parameters}
        values = {n: fuzz_proxy.seeded[n] for n in names if n not in params} | params
        case = operation.Case(path_parameters=values, query=query, **({} if body is None else {"body": body}))
        response = _call(case, fuzz_proxy, http, A_TOKEN)
        assert 200 <= response.status_code < 300, (method, path, response.text)
        answer = response.json()
        # (the last page has no next one)
        assert [k for k, v in answer.items() if v is None and k != "next_after"] == [], (method, path, answer)
        empty = [where for where, items in _lists(answer) if not items]
        # lists that are empty by design: an item's details, the ledger's unpriced models
        empty = [w for w in empty if not w.endswith((".details", ".unpriced_models", ".applied_edits", ".input_transformations"))]
        assert empty == [], (method, path, empty, answer)


@pytest.mark.parametrize("token", [None, "cpa-not-a-token-of-anyone", B_TOKEN])
@schema.parametrize()
@_fuzz(2)
def test_admin_api_without_a_valid_token_matches_its_schema(
    case: Any, token: str | None, fuzz_proxy: FuzzProxy, http: requests.Session
) -> None:
    response = _call(case, fuzz_proxy, http, token)
    if token != B_TOKEN:
        assert response.status_code == 401, response.text
    else:  # another tenant's token: acme's session s1 answers like a missing one
        assert response.status_code != 200 or "the build uses uv" not in response.text
