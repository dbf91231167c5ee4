"""Tenants on the wire: proxy-issued keys, the tenant's own provider key, SIGHUP reload, and a
cross-tenant matrix (state, pointers, transcripts, plans, manifests)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from proxy.core.durable import Create, Fact
from proxy.server.appkeys import DURABLE, RESOLVER, STORE, TENANCY
from proxy.server.http.runner import reload_policies
from proxy.sources.artifact_files import write_artifact
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream

ACME_KEY, GLOBEX_KEY = "cpk-acme-test-1", "cpk-globex-test-1"
ACME_PROVIDER, GLOBEX_PROVIDER = "sk-ant-acme-provider-key", "sk-ant-globex-provider-key"
T0 = "2026-12-01T10:00:00+00:00"


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _policy(root: Path, name: str, key: str, env: str) -> str:
    return (
        f"name: {name}\n"
        f"api_keys_sha256: ['{_sha(key)}']\n"
        f"provider: {{mode: env, api_key_env: {env}}}\n"
        f"sources: {{kinds: [transcript, artifact], session_patterns: ['*'],"
        f" transcript_root: '{root / name / 'transcripts'}', artifact_root: '{root / name / 'artifacts'}'}}\n"
        f"compaction: {{threshold: 3000, hard_limit: 100000, summary: {{model: summ}}}}\n"
    )


@pytest.fixture
def tenants_proxy(tmp_path: Path, make_proxy: Any, monkeypatch: pytest.MonkeyPatch) -> ProxyServer:
    monkeypatch.setenv("ACME_PROVIDER_KEY", ACME_PROVIDER)
    monkeypatch.setenv("GLOBEX_PROVIDER_KEY", GLOBEX_PROVIDER)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(_policy(tmp_path / "data", "acme", ACME_KEY, "ACME_PROVIDER_KEY"))
    (policies / "globex.yaml").write_text(_policy(tmp_path / "data", "globex", GLOBEX_KEY, "GLOBEX_PROVIDER_KEY"))
    proxy: ProxyServer = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))
    return proxy


def _client(proxy: ProxyServer, key: str, session: str | None = None) -> anthropic.Anthropic:
    headers = {"x-session-id": session} if session else {}
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, default_headers=headers)


def _tenant(proxy: ProxyServer, name: str) -> Any:
    return proxy.app[TENANCY].current.by_name(name)


MESSAGES = [{"role": "user", "content": "hello"}]


def test_unknown_or_missing_keys_are_401_and_never_forwarded(upstream: FakeUpstream, tenants_proxy: ProxyServer) -> None:
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(tenants_proxy, "cpk-nobody").messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert httpx.get(tenants_proxy.url + "/v1/models").status_code == 401
    assert httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": ACME_PROVIDER}).status_code == 401
    assert upstream.requests == []


def test_each_tenant_reaches_the_provider_with_its_own_key(upstream: FakeUpstream, tenants_proxy: ProxyServer) -> None:
    _client(tenants_proxy, ACME_KEY).messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    sent = upstream.requests[-1]
    assert sent.headers["x-api-key"] == ACME_PROVIDER
    assert "authorization" not in sent.headers  # the SDK sent the proxy key as a Bearer token
    httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": GLOBEX_KEY})
    sent = upstream.requests[-1]
    assert sent.headers["x-api-key"] == GLOBEX_PROVIDER
    for request in upstream.requests:
        text = repr(list(request.headers.items()))
        assert ACME_KEY not in text and GLOBEX_KEY not in text


def test_cross_tenant_matrix(upstream: FakeUpstream, tenants_proxy: ProxyServer, loop_thread: LoopThread) -> None:
    store = tenants_proxy.app[STORE]
    resolver = tenants_proxy.app[RESOLVER]
    acme, globex = _tenant(tenants_proxy, "acme"), _tenant(tenants_proxy, "globex")
    session = "shared-session-1"

    # Acme has state, an artifact and a recorded transcript in a session whose id globex reuses.
    pointer = write_artifact(acme.sources.artifact_root, session, "notes.txt", b"acme secret\n")
    loop_thread.run(store.write_changes("acme", session, [Create(Fact("f1", "acme fact", pointer, T0))]))
    r = _client(tenants_proxy, ACME_KEY, session).messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    assert r.headers["x-durable-sources"].startswith("available=1,")
    assert "acme fact" in upstream.requests[-1].json()["system"][-1]["text"]
    loop_thread.run(tenants_proxy.app[DURABLE].drain())
    acme_events = loop_thread.run(store.transcript_events("acme", session))
    assert acme_events

    # Acme's existing sources, asked for by globex, look exactly like missing ones.
    truly_missing = f"artifact:{session}:absent.txt:{'0' * 64}"
    for theirs in (pointer, acme_events[0].pointer):
        got = resolver.resolve(theirs, globex.sources)
        assert got.status == "missing"
        assert got == resolver.resolve(truly_missing if theirs.startswith("artifact") else f"transcript:{session}:999", globex.sources)

    # Globex, same session id: no state, no block.
    r = _client(tenants_proxy, GLOBEX_KEY, session).messages.with_raw_response.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    assert "system" not in upstream.requests[-1].json()
    assert r.headers["x-durable-sources"] == "available=0,missing=0,denied=0,corrupt=0,unsupported=0"
    assert (loop_thread.run(store.current_state("globex", session))).facts == ()
    # Transcripts and sessions are the tenant's own.
    loop_thread.run(tenants_proxy.app[DURABLE].drain())
    globex_events = loop_thread.run(store.transcript_events("globex", session))
    assert [e.event.event_id for e in globex_events] != [e.event.event_id for e in acme_events]
    assert all(e.event.content != "acme fact" for e in globex_events)
    # each tenant's transcript holds its own turn (its question, the answer), and globex's
    # turn left acme's untouched
    assert [(e.seq, e.event.role) for e in acme_events] == [(1, "user"), (2, "assistant")]
    assert [(e.seq, e.event.role) for e in globex_events] == [(1, "user"), (2, "assistant")]
    assert loop_thread.run(store.transcript_events("acme", session)) == acme_events

    # Plans and summaries: the same long conversation compacts separately for each tenant.
    long: list[dict[str, Any]] = [MESSAGES[0]]
    for i in range(40):
        long += [{"role": "assistant", "content": f"step {i} " + "words " * 120}, {"role": "user", "content": f"next {i}"}]
    first = _client(tenants_proxy, ACME_KEY).messages.with_raw_response.create(model="m", max_tokens=5, messages=long)  # type: ignore[arg-type]
    second = _client(tenants_proxy, GLOBEX_KEY).messages.with_raw_response.create(model="m", max_tokens=5, messages=long)  # type: ignore[arg-type]
    assert first.headers["x-compaction-plan"] == "new"
    assert second.headers["x-compaction-plan"] == "new"  # never acme's plan
    summary_calls = [r for r in upstream.requests if r.json().get("model") == "summ"]
    assert [r.headers["x-api-key"] for r in summary_calls] == [ACME_PROVIDER, GLOBEX_PROVIDER]
    # Manifests are the tenant's own.
    other = [{"role": "user", "content": "another task"}, *long[1:]]
    acme_with_session = _client(tenants_proxy, ACME_KEY, "m-1").messages.with_raw_response.create(model="m", max_tokens=5, messages=other)  # type: ignore[arg-type]
    assert acme_with_session.headers["x-compaction-plan"] == "new"
    loop_thread.run(tenants_proxy.app[DURABLE].drain())
    compaction_id = acme_with_session.headers["x-compaction-id"]
    assert loop_thread.run(store.get_manifest("acme", compaction_id)) is not None
    assert loop_thread.run(store.get_manifest("globex", compaction_id)) is None


def test_sighup_reload_swaps_policies_and_keeps_the_old_ones_when_invalid(upstream: FakeUpstream, tenants_proxy: ProxyServer, tmp_path: Path) -> None:
    config = tenants_proxy.config
    new_key = "cpk-acme-rotated-2"
    assert httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": new_key}).status_code == 401
    acme_file = Path(config.policies_dir) / "acme.yaml"
    acme_file.write_text(acme_file.read_text().replace(_sha(ACME_KEY), _sha(new_key)))
    reload_policies(tenants_proxy.app, config)
    assert httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": new_key}).status_code == 200
    assert httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": ACME_KEY}).status_code == 401
    # An invalid set is refused; the previous one stays in force.
    acme_file.write_text("name: acme\nprovider: {mode: nonsense}\n")
    reload_policies(tenants_proxy.app, config)
    assert httpx.get(tenants_proxy.url + "/v1/models", headers={"x-api-key": new_key}).status_code == 200


def test_calibration_never_crosses_tenants(upstream: FakeUpstream, tenants_proxy: ProxyServer) -> None:
    from proxy.core.tokens import TokenCounter
    from tests.upstream import Reply, message_json

    messages = [{"role": "user", "content": "calibrate " * 300}]
    estimate = TokenCounter().count_request(None, None, messages).total
    upstream.script(Reply(message_json("ok", input_tokens=2 * estimate)))
    _client(tenants_proxy, ACME_KEY).messages.create(model="m", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    acme = _client(tenants_proxy, ACME_KEY).messages.with_raw_response.create(model="m", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    globex = _client(tenants_proxy, GLOBEX_KEY).messages.with_raw_response.create(model="m", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    assert int(acme.headers["x-compaction-tokens-before"]) == 2 * estimate
    assert int(globex.headers["x-compaction-tokens-before"]) == estimate
