"""Microsoft Foundry clients through the proxy: the official ``AnthropicFoundry`` SDK client (and
raw httpx where the bytes matter) with the proxy's ``/anthropic`` as its base URL.

Foundry serves the Messages API under ``https://<resource>.services.ai.azure.com/anthropic``
(platform.claude.com "Claude in Microsoft Foundry"); the SDK's Foundry client (anthropic
``lib/foundry.py``) posts to ``<base>/v1/messages`` and ``/v1/messages/count_tokens`` with its key
in ``x-api-key`` *and* ``api-key``, or an Entra ID token as ``Authorization: Bearer``; Claude Code
2.1.197 in Foundry mode sends ``?beta=true`` and ``x-api-key`` alone (recorded). The model is a
deployment name, by default the model's id (the catalogue's Foundry column).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
from anthropic import AnthropicFoundry

from tests.conftest import ProxyFactory
from tests.foundry_fake import FakeFoundry
from tests.harness import ProxyServer
from tests.test_upstream_foundry import KEY_VARIABLE, foundry_key  # noqa: F401 - a fixture
from tests.upstream import FakeUpstream, Reply, Stream, message_json, text_stream_events

KEY = "sk-ant-test-foundry-client-0123456789"
DEPLOYMENT = "claude-sonnet-4-5"  # Claude Code's Foundry name for the model (an alias on the API)
INSIDE = "claude-sonnet-4-5-20250929"
MESSAGES = [{"role": "user", "content": "Say hello."}]


def _foundry(proxy: ProxyServer, **kw: Any) -> AnthropicFoundry:
    return AnthropicFoundry(
        base_url=proxy.url + "/anthropic", api_key=kw.pop("api_key", KEY), max_retries=0, **kw
    )


def test_the_sdks_foundry_client_is_the_messages_request_inside(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    upstream.script(Reply(message_json("hi there"), headers={"request-id": "req_up_1"}))
    with _foundry(proxy) as client:
        answer = client.messages.with_raw_response.create(
            model=DEPLOYMENT, max_tokens=50, messages=MESSAGES,
            extra_headers={"anthropic-beta": "beta-one-2026-01-01"},
        )  # fmt: skip
    seen = upstream.requests[-1]
    assert seen.path == "/v1/messages"
    # a deployment name the Claude API takes (an alias): the client's bytes, as sent
    assert seen.body == orjson.dumps({"max_tokens": 50, "messages": MESSAGES, "model": DEPLOYMENT})
    assert seen.headers["x-api-key"] == KEY  # passthrough: the client's key is the provider's
    assert "api-key" not in seen.headers  # Foundry's second key header never goes on
    assert seen.headers["anthropic-beta"] == "beta-one-2026-01-01"
    assert answer.status_code == 200
    assert answer.parse().content[0].text == "hi there"
    assert answer.headers["request-id"] == "req_up_1"


def test_a_foundry_stream_and_count_tokens(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    events = text_stream_events("streamed through foundry", deltas=4)
    upstream.script(Stream(events), Reply({"input_tokens": 17}))
    with _foundry(proxy) as client:
        with client.messages.stream(model=DEPLOYMENT, max_tokens=50, messages=MESSAGES) as stream:
            assert stream.get_final_text() == "streamed through foundry"
        counted = client.messages.count_tokens(model=DEPLOYMENT, messages=MESSAGES)
    assert counted.input_tokens == 17
    streamed, count = upstream.requests[-2:]
    assert streamed.path == "/v1/messages" and streamed.json()["stream"] is True
    assert count.path == "/v1/messages/count_tokens"
    assert count.json() == {"messages": MESSAGES, "model": DEPLOYMENT}
    response = httpx.post(  # the stream's bytes are the upstream's, as they came
        f"{proxy.url}/anthropic/v1/messages?beta=true",
        content=orjson.dumps({"model": DEPLOYMENT, "max_tokens": 9, "messages": MESSAGES, "stream": True}),
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 200  # (the fake answered a stream by default)
    assert upstream.requests[-1].raw_path == "/v1/messages?beta=true"  # Claude Code's query kept


def test_a_deployment_name_the_api_does_not_take_becomes_the_anthropic_id(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """A team's own deployment name (``models:`` entry ``foundry: team-sonnet``) is read as the
    Anthropic id inside: the body rebuilt with it first, the client's other members byte for byte
    and in their order; a gzipped body likewise."""
    proxy = make_proxy(models=[{"match": "claude-sonnet-4-5", "foundry": "team-sonnet"}])
    upstream.script(Reply(message_json("one")), Reply(message_json("two")))
    raw = b'{"max_tokens":50,"messages":[{"role":"user","content":"Say hello."}],"model":"team-sonnet","stream":false,"metadata":{"user_id":"u"}}'
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    assert httpx.post(f"{proxy.url}/anthropic/v1/messages", content=raw, headers=headers).status_code == 200
    expected = b'{"model":"claude-sonnet-4-5-20250929","max_tokens":50,"messages":[{"role":"user","content":"Say hello."}],"stream":false,"metadata":{"user_id":"u"}}'
    assert upstream.requests[-1].body == expected
    zipped = httpx.post(
        f"{proxy.url}/anthropic/v1/messages", content=gzip.compress(raw),
        headers={**headers, "content-encoding": "gzip"},
    )  # fmt: skip
    assert zipped.status_code == 200
    assert upstream.requests[-1].body == expected
    assert "content-encoding" not in upstream.requests[-1].headers


def test_a_malformed_foundry_request_is_an_anthropic_400_and_nothing_is_forwarded(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    bad = httpx.post(f"{proxy.url}/anthropic/v1/messages", content=b"{oops", headers=headers)
    assert bad.status_code == 400
    assert bad.json()["type"] == "error" and bad.json()["error"]["type"] == "invalid_request_error"
    broken = orjson.dumps({"model": DEPLOYMENT, "max_tokens": 5, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
        {"role": "user", "content": "no result"}]})  # fmt: skip
    refused = httpx.post(f"{proxy.url}/anthropic/v1/messages", content=broken, headers=headers)
    assert refused.status_code == 400 and "tool_use" in refused.json()["error"]["message"]
    other = httpx.get(f"{proxy.url}/anthropic/v1/models", headers=headers)
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
    assert upstream.requests == []


def _keys_mode(make_proxy: ProxyFactory, tmp_path: Path, provider: str) -> ProxyServer:
    policies = tmp_path / "policies"
    policies.mkdir()
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    (policies / "acme.yaml").write_text(f"name: acme\napi_keys_sha256: [{digest}]\n{provider}")
    return make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))


def test_keys_mode_takes_the_proxy_key_from_foundrys_key_headers(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's key (``x-api-key`` and ``api-key``), Claude Code's (``x-api-key``) or a REST
    client's (``api-key`` alone, Microsoft's examples) is the proxy key; an unknown one is a 401;
    the tenant's provider key goes upstream, the proxy key never does."""
    monkeypatch.setenv("FOUNDRY_TENANT_PROVIDER_KEY", "sk-ant-provider-0123456789")
    proxy = _keys_mode(make_proxy, tmp_path, "provider: {mode: env, api_key_env: FOUNDRY_TENANT_PROVIDER_KEY}\n")
    with _foundry(proxy, api_key="cpk-not-a-key") as client, pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model=DEPLOYMENT, max_tokens=50, messages=MESSAGES)
    assert upstream.requests == []
    upstream.script(Reply(message_json("sdk")), Reply(message_json("rest")))
    with _foundry(proxy) as client:
        assert client.messages.create(model=DEPLOYMENT, max_tokens=50, messages=MESSAGES).content[0].text == "sdk"  # type: ignore[union-attr]
    rest = httpx.post(
        f"{proxy.url}/anthropic/v1/messages",
        content=orjson.dumps({"model": DEPLOYMENT, "max_tokens": 5, "messages": MESSAGES}),
        headers={"api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"},
    )  # fmt: skip
    assert rest.status_code == 200 and rest.json()["content"][0]["text"] == "rest"
    for sent in upstream.requests:
        assert sent.headers["x-api-key"] == "sk-ant-provider-0123456789"
        assert "api-key" not in sent.headers and KEY.encode() not in sent.body
        assert KEY not in repr(sent.headers)


def test_a_client_without_credentials_reaches_a_foundry_upstream_with_the_proxys_own(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory  # noqa: F811
) -> None:
    """Skip-auth mode (``CLAUDE_CODE_SKIP_FOUNDRY_AUTH``): the client sends no credential, the
    passthrough tenant's Foundry upstream signs with the proxy's key."""
    proxy = make_proxy(upstream={"format": "foundry", "endpoint_url": foundry.endpoint, "api_key_env": KEY_VARIABLE})
    response = httpx.post(
        f"{proxy.url}/anthropic/v1/messages?beta=true",
        content=orjson.dumps({"model": DEPLOYMENT, "max_tokens": 5, "messages": MESSAGES}),
        headers={"anthropic-version": "2023-06-01", "content-type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["content"][0]["text"] == f"Hello from fake Foundry ({DEPLOYMENT})."
    [seen] = foundry.seen
    assert seen.path == "/anthropic/v1/messages" and seen.body["model"] == DEPLOYMENT
