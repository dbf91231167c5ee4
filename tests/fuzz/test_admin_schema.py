"""Schemathesis against ``docs/admin-openapi.yaml`` (issue 11 #7).

Every route of the schema, with a valid admin token, with none, with an unknown one and with
another tenant's, against the real app (``build_app``: every middleware; a real SQLite store,
real HTTP on 127.0.0.1). Checks: never a 5xx, every status
is one the schema lists, every answer's content type and body match the schema. Bounded: a few
examples per route and token, so the whole file runs in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from tests.fuzz.conftest import FuzzProxy
from tests.test_admin import A_TOKEN, B_TOKEN

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "admin-openapi.yaml"
schema = schemathesis.openapi.from_path(SCHEMA_PATH)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


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
