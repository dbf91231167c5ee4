"""A Vertex AI upstream, end to end: the official SDK -> the proxy -> FakeVertex.

The proxy's Google credentials are a service-account key file whose ``token_uri`` is the fake's
own token endpoint (google-auth's JWT-bearer grant, signed with the key, checked by the fake, on
loopback: no internet); the fake accepts only the tokens it issued and has not expired.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conftest import ProxyFactory
from tests.harness import ProxyServer
from tests.platform_fakes import FakeVertex

MODEL = "claude-sonnet-4-5-20250929"
CLIENT_KEY = "sk-ant-client-key-never-sent-to-google"


def vertex_proxy(
    make_proxy: ProxyFactory, fake: FakeVertex, tmp_path: Path, **upstream: Any
) -> ProxyServer:
    credentials = tmp_path / "adc.json"
    credentials.write_text(json.dumps(fake.service_account()))
    section = {
        "format": "vertex", "project": fake.project, "location": fake.location,
        "endpoint_url": fake.url, "credentials_file": str(credentials), **upstream,
    }
    return make_proxy(upstream=section)


def client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)


def ask(proxy: ProxyServer, **extra: Any) -> Any:
    return client(proxy).messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}], **extra
    )


def test_a_message_goes_to_raw_predict_with_a_bearer_token(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    message = ask(proxy)
    assert message.content[0].text == "Hello from fake Vertex (claude-sonnet-4-5@20250929)."
    [seen] = vertex.seen
    assert seen.path == (
        "/v1/projects/test-project/locations/us-east5/publishers/anthropic/models/"
        "claude-sonnet-4-5@20250929:rawPredict"
    )
    assert seen.body["anthropic_version"] == "vertex-2023-10-16" and "model" not in seen.body
    assert seen.headers["Authorization"] == "Bearer ya29.test-1"
    assert CLIENT_KEY not in json.dumps(seen.headers)


def test_a_stream_passes_through_and_the_token_is_reused(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    for _ in range(3):
        with client(proxy).messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            text = "".join(stream.text_stream)
        assert text == "Hello from fake Vertex (claude-sonnet-4-5@20250929)."
    assert vertex.token_grants == 1
    assert all(s.path.endswith(":streamRawPredict") for s in vertex.seen)


def test_a_token_is_refreshed_before_it_expires(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    # 4 min 40 s: google-auth alone would still use it (its threshold is 3 min 45 s); the
    # proxy refreshes inside its 5-minute margin
    vertex.token_lifetime = 280
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    for _ in range(3):
        ask(proxy)
    assert vertex.token_grants == 3
    assert [s.headers["Authorization"] for s in vertex.seen] == [
        "Bearer ya29.test-1", "Bearer ya29.test-2", "Bearer ya29.test-3"
    ]


def test_a_refused_token_is_renewed_once_and_the_call_made_again(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    ask(proxy)
    vertex.expire_all()  # revoked before its expiry
    message = ask(proxy)
    assert message.content[0].text.startswith("Hello from fake Vertex")
    assert vertex.token_grants == 2
    assert [s.headers["Authorization"] for s in vertex.seen] == [
        "Bearer ya29.test-1", "Bearer ya29.test-1", "Bearer ya29.test-2"
    ]


def test_a_token_refused_after_one_renewal_is_a_clear_error_in_anthropic_form(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    monkeypatch.setattr(vertex, "tokens", _NeverValid())
    with pytest.raises(anthropic.AuthenticationError) as caught:
        ask(proxy)
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "authentication_error"
    assert error["message"] == (
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login"
        " cookie or other valid authentication credential. (UNAUTHENTICATED)"
        " (the proxy renewed its Google token once; still refused)"
    )
    assert len(vertex.seen) == 2 and vertex.token_grants == 2


class _NeverValid(dict[str, bool]):
    def get(self, key: str, default: Any = None) -> Any:
        return False


def test_unsupported_betas_are_dropped_and_supported_ones_sent_as_a_header(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """What Claude Code itself sends to Vertex (its own beta, effort with ``output_config.effort``)
    reaches Vertex; a first-party-only beta goes, with the field it enables."""
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    response = client(proxy).messages.with_raw_response.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"anthropic-beta": "claude-code-20250219,context-1m-2025-08-07,effort-2025-11-24,"
                       "task-budgets-2026-03-13"},
        extra_body={"output_config": {"effort": "high", "task_budget": {"type": "tokens", "total": 9}}},
    )
    assert response.status_code == 200
    seen = vertex.seen[0]
    assert seen.headers["anthropic-beta"] == "claude-code-20250219,context-1m-2025-08-07,effort-2025-11-24"
    assert seen.body["output_config"] == {"effort": "high"}  # the budget went with its beta
    assert response.headers["x-upstream-betas-dropped"] == "task-budgets-2026-03-13"
    assert response.headers["x-upstream-fields-dropped"] == "output_config.task_budget"


def test_vertexs_own_error_keeps_its_wording(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path, accepted_betas=["files-api-2025-04-14"])
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(proxy, extra_headers={"anthropic-beta": "files-api-2025-04-14"})
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error", "message": "Unsupported beta header: files-api-2025-04-14"
    }


def test_count_tokens_uses_the_count_tokens_model(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    counted = client(proxy).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}]
    )
    assert counted.input_tokens == 11
    [seen] = vertex.seen
    assert seen.path.endswith("/publishers/anthropic/models/count-tokens:rawPredict")
    assert seen.body["model"] == "claude-sonnet-4-5@20250929"


def test_unreadable_credentials_are_a_502_without_the_file_contents(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "service_account", "private_key": "SECRET-KEY-MATERIAL"}')
    proxy = vertex_proxy(make_proxy, vertex, tmp_path, credentials_file=str(bad))
    with pytest.raises(anthropic.APIStatusError) as caught:
        ask(proxy)
    assert caught.value.status_code == 502
    assert "Google credentials" in caught.value.message
    assert "SECRET-KEY" not in caught.value.message and vertex.seen == []


def test_a_model_vertex_does_not_serve_is_its_404_naming_the_entry_to_add(
    vertex: FakeVertex, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    vertex.models = frozenset({"claude-opus-4-8"})
    proxy = vertex_proxy(make_proxy, vertex, tmp_path)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client(proxy).messages.create(model="claude-opus-9", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert vertex.seen[-1].path.endswith("/models/claude-opus-9:rawPredict")
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert "was not found or your project does not have access to it" in message
    assert "add a models: entry {match: claude-opus-9, vertex: <its id>}" in message
    answer = client(proxy).messages.create(model="claude-opus-4-8", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert "claude-opus-4-8" in answer.content[0].text  # type: ignore[union-attr]
