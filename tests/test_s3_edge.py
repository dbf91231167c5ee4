"""The object-store backend at the edge: policy loading (credentials only from named environment
variables, never echoed), a store outage on ``/v1/messages`` (never a 5xx), and the audit route's
input checks. Real proxy, real fake upstream, real SQLite store."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
import yaml

from proxy.config.settings import parse_config
from proxy.core.durable import Create, Fact
from proxy.server.appkeys import DURABLE, STORE
from proxy.store.source_records import AuditQuery, list_audit
from proxy.tenancy.policies import PolicyError, load_tenancy
from tests.harness import LoopThread

KEY = "sk-test"
ADMIN = "adm-" + "5" * 40
SECRET = "SeCrEt-" + "x" * 30
MANIFEST_KEY = "m" * 40


def _policy(tmp_path: Path, name: str = "acme", **store: Any) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    object_store = {
        "bucket": "cp-bucket",
        "prefix": f"tenants/{name}/",
        "endpoint": "http://127.0.0.1:9",
        "region": "eu-west-1",
        "access_key_id_env": "T_S3_KEY_ID",
        "secret_access_key_env": "T_S3_SECRET",
        **store,
    }
    body = {
        "name": name,
        "provider": {"mode": "passthrough"},
        "sources": {
            "object_store": object_store,
            "signing": {"key_id": "k1", "keys": [{"id": "k1", "env": "T_MANIFEST_KEY"}]},
        },
        "admin_tokens_sha256": [hashlib.sha256(ADMIN.encode()).hexdigest()] if name == "acme" else [],
    }
    (policies / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return policies


ENV = {"T_S3_KEY_ID": "AKIATEST", "T_S3_SECRET": SECRET, "T_MANIFEST_KEY": MANIFEST_KEY}


def _load(policies: Path, env: dict[str, str], mode: str = "passthrough") -> Any:
    config = parse_config({"policies_dir": str(policies), "auth": {"mode": mode}})
    return load_tenancy(config, environ=env)


def test_a_valid_policy_reads_credentials_from_the_named_variables(tmp_path: Path) -> None:
    tenancy = _load(_policy(tmp_path), ENV)
    sources = tenancy.default.sources
    assert sources.object_store.credentials.secret_access_key == SECRET
    assert sources.signing.keys == {"k1": MANIFEST_KEY.encode()}
    assert SECRET not in repr(sources) and MANIFEST_KEY not in repr(sources)


@pytest.mark.parametrize(
    ("store", "env", "expected"),
    [
        ({}, {**ENV, "T_S3_SECRET": ""}, "expected environment variable T_S3_SECRET to be non-empty"),
        ({}, {k: v for k, v in ENV.items() if k != "T_S3_KEY_ID"}, "expected environment variable T_S3_KEY_ID to be set"),
        ({}, {**ENV, "T_MANIFEST_KEY": "short"}, "to hold at least 32 bytes"),
        ({"endpoint": "https://user:pw@s3.example/path"}, ENV, "key 'sources.object_store.endpoint': expected an endpoint URL"),
        ({"prefix": "tenants/../x/"}, ENV, "key 'sources.object_store.prefix': expected a key prefix"),
        ({"prefix": "no-slash"}, ENV, "key 'sources.object_store.prefix'"),
        ({"bucket": "Bad_Bucket"}, ENV, "key 'sources.object_store.bucket'"),
        ({"addressing": "auto"}, ENV, "expected one of path, virtual"),
        ({"addressing": "virtual"}, ENV, "key 'sources.object_store.addressing': expected path with an endpoint that is an IP"),
        ({"secret_access_key": SECRET}, ENV, "key 'sources.object_store.secret_access_key': unknown key"),
    ],
)
def test_invalid_store_settings_name_the_key_and_never_the_secret(
    tmp_path: Path, store: dict[str, str], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        _load(_policy(tmp_path, **store), env)
    assert expected in str(caught.value)
    assert SECRET not in str(caught.value) and MANIFEST_KEY not in str(caught.value)


def test_an_object_store_needs_signing_keys_and_prefixes_never_overlap(tmp_path: Path) -> None:
    policies = _policy(tmp_path)
    data = yaml.safe_load((policies / "acme.yaml").read_text())
    del data["sources"]["signing"]
    (policies / "acme.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(PolicyError, match=r"expected signing keys with sources\.object_store"):
        _load(policies, ENV)
    policies = _policy(tmp_path)
    _policy(tmp_path, "globex", prefix="tenants/acme/globex/")
    with pytest.raises(PolicyError, match="overlaps"):
        _load(policies, ENV, "keys")


def test_a_store_outage_never_fails_a_request(
    tmp_path: Path, make_proxy: Any, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    proxy = make_proxy(
        policies_dir=str(_policy(tmp_path)),  # the endpoint is a closed port
        compaction={"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200},
    )
    pointer = "artifact:out-1:r.txt:" + "a" * 64
    loop_thread.run(proxy.app[STORE].write_changes("acme", "out-1", [Create(Fact("f1", "x", pointer, "2026-12-01T10:00:00Z"))]))
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers={"x-session-id": "out-1"})
    big = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))
    messages: Any = [
        {"role": "user", "content": "read"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]},
        {"role": "assistant", "content": "long"},
        {"role": "user", "content": "go on"},
    ]
    r = client.messages.with_raw_response.create(model="m", max_tokens=5, messages=messages)
    assert r.http_response.status_code == 200  # the write failed, the fact's check failed: no 5xx
    assert r.headers["x-durable-sources"] == "available=0,missing=1,denied=0,corrupt=0,unsupported=0"
    loop_thread.run(proxy.app[DURABLE].drain())
    rows = loop_thread.run(list_audit(proxy.app[STORE], AuditQuery("acme")))
    assert [(r.status, r.backend, r.detail) for r in rows] == [("missing", "s3", "unavailable:ClientConnectorError")]
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=proxy.url) as http:
        ok = http.get("/admin/v1/audit", params={"status": "missing", "since": "2026-01-01T00:00:00Z"}, headers=auth)
        assert ok.status_code == 200 and len(ok.json()["checks"]) == 1
        assert http.get("/admin/v1/audit", params={"until": "2026-01-01T00:00:00+00:00"}, headers=auth).json() == {"checks": [], "next_after": None}
        for params, problem in (
            ({"status": "fine"}, "status: expected one of"),
            ({"since": "yesterday"}, "since: expected an ISO 8601 timestamp"),
            ({"until": "2026-01-01T00:00:00"}, "until: expected an ISO 8601 timestamp with a UTC offset"),
            ({"limit": "0"}, "limit: expected an integer from 1 to 1000"),
            ({"after": "-1"}, "after: expected an integer"),
            ({"session": "../x"}, "session: expected a session id"),
        ):
            bad = http.get("/admin/v1/audit", params=params, headers=auth)
            assert bad.status_code == 400 and problem in bad.json()["error"]["message"], params
        assert http.get("/admin/v1/audit").status_code == 401
