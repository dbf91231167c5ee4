"""Two ``context-proxy serve`` replicas with NO shared volume: each has its own ``state_dir``; they
share only PostgreSQL and an S3 bucket (moto's server, signatures checked). Each compacts a
session (its cut tool result goes to the bucket, its signed manifest entry to PostgreSQL) and the
other one verifies and shows that artifact (admin preview with excerpt, durable injection on
``/v1/messages``), and both record the checks in one audit trail.

Needs PostgreSQL: ``bash .ci/pg start && . .ci/pg.env`` (skipped without CONTEXT_PROXY_TEST_PG).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest
import yaml

from tests.pg_server import fresh_schema
from tests.s3_server import BUCKET, REGION, S3Server, start_s3_server
from tests.test_cli import ServeProcess
from tests.upstream import FakeUpstream

ADMIN_TOKEN = "adm-" + "7" * 40
HEADERS = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
BIG = "\n".join(f"line {i}: " + "data " * 12 for i in range(400))


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = start_s3_server()
    yield server
    server.stop()


def _write_config(tmp_path: Path, n: int, upstream: FakeUpstream, store_url: str, s3: S3Server) -> Path:
    policies = tmp_path / "policies"  # configuration, not state: the same on every machine
    policies.mkdir(exist_ok=True)
    policy = {
        "name": "acme",
        "provider": {"mode": "passthrough"},
        "sources": {
            "object_store": {
                "bucket": BUCKET,
                "prefix": "tenants/acme/",
                "endpoint": s3.endpoint,
                "region": REGION,
                "addressing": "path",
                "access_key_id_env": "ACME_S3_KEY_ID",
                "secret_access_key_env": "ACME_S3_SECRET",
            },
            "signing": {"key_id": "k1", "keys": [{"id": "k1", "env": "ACME_MANIFEST_KEY_1"}]},
        },
        "admin_tokens_sha256": [hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()],
    }
    (policies / "acme.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "listen": {"host": "127.0.0.1"},
        "upstream": {"base_url": upstream.url},
        "store": {"url": store_url},
        "state_dir": str(tmp_path / f"replica-{n}"),  # its own, nothing shared
        "policies_dir": str(policies),
        "compaction": {"threshold": 3000, "hard_limit": 100_000, "tool_result_cap": 200},
        "shutdown": {"grace_seconds": 5},
    }
    path = tmp_path / f"replica-{n}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _compact(replica: ServeProcess, upstream: FakeUpstream, session: str) -> str:
    tool_id = f"toolu_{secrets.token_hex(4)}"
    messages = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": "cat log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": BIG}]},
        {"role": "assistant", "content": "It is long."},
        {"role": "user", "content": "summarise it"},
    ]
    body = {"model": "m", "max_tokens": 5, "messages": messages}
    r = httpx.post(replica.url + "/v1/messages", content=orjson.dumps(body), headers={**HEADERS, "x-session-id": session}, timeout=30)
    assert r.status_code == 200, r.text
    assert "truncate" in r.headers["x-compaction-layers"]
    sent = upstream.requests[-1].json()["messages"][2]["content"][0]["content"]
    match = re.search(rf"full text: (artifact:{session}:[A-Za-z0-9._-]+:[0-9a-f]{{64}})\]", sent)
    assert match, sent[:300]
    return match.group(1)


def test_two_replicas_without_a_shared_volume(tmp_path: Path, upstream: FakeUpstream, s3: S3Server) -> None:
    if not os.environ.get("CONTEXT_PROXY_TEST_PG"):
        pytest.skip("needs PostgreSQL: `bash .ci/pg start && . .ci/pg.env`")
    env = {
        "ACME_S3_KEY_ID": s3.access_key_id,
        "ACME_S3_SECRET": s3.secret_access_key,
        "ACME_MANIFEST_KEY_1": secrets.token_hex(32),
    }
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with fresh_schema("replicas_s3") as store_url:
        replicas = [ServeProcess(_write_config(tmp_path, n, upstream, store_url, s3), env) for n in (1, 2)]
        try:
            for writer, reader in ((replicas[0], replicas[1]), (replicas[1], replicas[0])):
                session = f"s3-{secrets.token_hex(4)}"
                pointer = _compact(writer, upstream, session)
                key = "tenants/acme/" + pointer.split(":")[1] + "/tool-results/" + pointer.split(":")[2]
                stored = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
                assert stored == BIG.encode()
                fact = {"id": "f1", "content": "the log was read", "source": pointer, "last_confirmed_at": "2026-12-03T08:00:00Z"}
                r = httpx.post(f"{reader.url}/admin/v1/sessions/{session}/facts", json=fact, headers=admin, timeout=10)
                assert r.status_code == 201, r.text
                preview = httpx.get(f"{reader.url}/admin/v1/sessions/{session}/preview", headers=admin, timeout=10).json()
                [source] = preview["sources"]
                assert source["status"] == "available", source
                assert source["evidence_sha256"] == pointer.rsplit(":", 1)[1]
                assert BIG.startswith(source["excerpt"]) and len(source["excerpt"]) == 2000
                body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
                r = httpx.post(reader.url + "/v1/messages", content=orjson.dumps(body), headers={**HEADERS, "x-session-id": session}, timeout=30)
                assert r.status_code == 200
                assert r.headers["x-durable-sources"].startswith("available=1,")
                check_id = r.headers["x-durable-check-id"]
                # the writer's replica reads the reader's audit rows (one shared store)
                # (written in batches, off the answer path: wait for the reader's next flush)
                deadline = time.monotonic() + 10
                while True:
                    audit = httpx.get(f"{writer.url}/admin/v1/audit", params={"session": session}, headers=admin, timeout=10)
                    assert audit.status_code == 200, audit.text
                    rows = audit.json()["checks"]
                    if len(rows) >= 2 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                assert [(c["status"], c["backend"], c["pointer"]) for c in rows] == [("available", "s3", pointer)] * 2
                assert rows[0]["asked_by"].startswith("admin:") and rows[1]["asked_by"] == f"request:{check_id}"
            for n in (1, 2):  # nothing was written to either replica's disk for the artifacts
                state = tmp_path / f"replica-{n}"
                assert not [p for p in state.rglob("*") if "tool-results" in p.parts], n
        finally:
            for replica in replicas:
                replica.stop()
