"""The client formats and the upstream platforms together, and with the tenant's limits.

Any client format to any upstream: a Bedrock client (the official ``AnthropicBedrock`` SDK, and
botocore's event-stream parser where the bytes matter), a Vertex client (``AnthropicVertex``) and
a Foundry client (``AnthropicFoundry``) through the proxy to a Bedrock Runtime upstream (tests/platform_fakes.py: SigV4 checked,
event-stream answers) -- the answer decoded from Bedrock's frames into the internal SSE and
encoded back into the client's frames, a broken upstream frame ending as an exception frame, never
a hang. And a Bedrock client over its tenant's request limit gets Bedrock's ``ThrottlingException``
with ``retry-after``; a request the proxy itself refuses after admission gives its output
reservation back (the ticket the internal request admitted reaches the client's request). And
every client format (Anthropic, Bedrock, Vertex, Foundry) to a Microsoft Foundry upstream
(tests/foundry_fake.py: its key checked, its deployments), the same Messages body arriving each
time, the answer in each client's format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
from anthropic import AnthropicBedrock, AnthropicFoundry, AnthropicVertex

from proxy.server.app import API_PATHS
from proxy.server.appkeys import STORE
from proxy.server.http.tracing import TRACED_PATHS
from proxy.server.quota import QUOTA
from tests.conftest import ProxyFactory
from tests.formats.test_client_formats import _botocore_events
from tests.foundry_fake import FOUNDRY_KEY, FakeFoundry
from tests.harness import LoopThread, ProxyServer
from tests.otlp_receiver import OtlpReceiver
from tests.platform_fakes import TEST_ACCESS_KEY, Broken, FakeBedrock
from tests.test_quota_edge import ACME_KEY, Clock, limited, quota_json, used
from tests.test_tracing import _wait
from tests.upstream import FakeUpstream

PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
MESSAGES = [{"role": "user", "content": "Say hello."}]
KEY = "sk-ant-test-across-0123456789"


@pytest.fixture
def on_bedrock(aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory) -> ProxyServer:
    return make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url,
                  "profile_geo": "us"},
    )  # fmt: skip


def _bedrock_client(proxy: ProxyServer, **kw: Any) -> AnthropicBedrock:
    return AnthropicBedrock(
        base_url=proxy.url, api_key=kw.pop("api_key", KEY), aws_region="us-east-1",
        max_retries=0, **kw,
    )  # fmt: skip


def test_a_bedrock_client_reaches_a_bedrock_upstream_signed_and_streamed_back(
    on_bedrock: ProxyServer, bedrock: FakeBedrock
) -> None:
    with _bedrock_client(on_bedrock) as client:
        message = client.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)  # type: ignore[arg-type]
        assert message.content[0].text == "Hello from fake Bedrock."  # type: ignore[union-attr]
        with client.messages.stream(model=PROFILE, max_tokens=50, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            assert stream.get_final_text() == "Hello from fake Bedrock."
    first, second = bedrock.seen
    # the client's profile, as the upstream's own spelling: the inside form never shows
    assert first.path == f"/model/{PROFILE.replace(':', '%3A')}/invoke"
    assert second.path == f"/model/{PROFILE.replace(':', '%3A')}/invoke-with-response-stream"
    for seen in (first, second):
        assert seen.headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={TEST_ACCESS_KEY}/")
        assert seen.body["anthropic_version"] == "bedrock-2023-05-31"
        assert seen.body["messages"] == MESSAGES
        assert KEY not in repr(seen.headers)  # the client's key stays here


def test_a_vertex_client_reaches_a_bedrock_upstream(
    on_bedrock: ProxyServer, bedrock: FakeBedrock
) -> None:
    with AnthropicVertex(
        base_url=on_bedrock.url, access_token=KEY, project_id="p", region="us-east5", max_retries=0
    ) as client:
        message = client.messages.create(
            model="claude-sonnet-4-5@20250929", max_tokens=50, messages=MESSAGES  # type: ignore[arg-type]
        )
    assert message.content[0].text == "Hello from fake Bedrock."  # type: ignore[union-attr]
    [seen] = bedrock.seen
    assert seen.path == f"/model/{PROFILE.replace(':', '%3A')}/invoke"


@pytest.mark.parametrize("how", ["crc", "cut", "garbage"])
def test_a_broken_upstream_frame_reaches_a_bedrock_client_as_an_exception_frame(
    on_bedrock: ProxyServer, bedrock: FakeBedrock, how: str
) -> None:
    bedrock.script.append(Broken(how, good=2))
    response = httpx.post(
        f"{on_bedrock.url}/model/{PROFILE}/invoke-with-response-stream",
        content=orjson.dumps(
            {"anthropic_version": "bedrock-2023-05-31", "messages": MESSAGES, "max_tokens": 50}
        ),
        headers={"Content-Type": "application/json", "x-api-key": KEY},
        timeout=30,
    )
    assert response.status_code == 200
    events = _botocore_events(response.content)  # botocore checks every frame's CRCs
    assert [next(iter(e)) for e in events[:2]] == ["chunk", "chunk"]  # the good frames, relayed
    last = events[-1]
    assert next(iter(last)) == "Error", last
    assert last["Error"]["Code"] == "internalServerException"


def test_a_bedrock_client_over_its_limit_gets_bedrocks_throttling_error(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, loop_thread: LoopThread
) -> None:
    proxy = limited(make_proxy, tmp_path, {"requests_per_minute": 1}, Clock("2026-12-04T10:21:15"))
    with _bedrock_client(proxy, api_key=ACME_KEY) as client:
        first = client.messages.with_raw_response.create(model=PROFILE, max_tokens=50, messages=MESSAGES)  # type: ignore[arg-type]
        assert first.headers["x-context-proxy-ratelimit-requests-remaining"] == "0"
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)  # type: ignore[arg-type]
    refused = info.value.response
    assert refused.headers["x-amzn-errortype"].startswith("ThrottlingException")
    assert refused.headers["retry-after"] == "45"
    assert "requests per minute (1)" in refused.json()["message"]
    assert len(upstream.requests) == 1
    assert used(quota_json(proxy, loop_thread), "requests") == 1


def test_a_bedrock_request_refused_after_admission_gives_its_reservation_back(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, loop_thread: LoopThread
) -> None:
    proxy = limited(
        make_proxy, tmp_path, {"output_tokens_per_minute": 100, "requests_per_minute": 5},
        Clock("2026-12-04T10:21:00"), compaction={"threshold": 50, "hard_limit": 100},
    )  # fmt: skip
    long = [{"role": "user", "content": "word " * 2000}]
    with _bedrock_client(proxy, api_key=ACME_KEY) as client, pytest.raises(
        anthropic.BadRequestError
    ) as info:
        client.messages.create(model=PROFILE, max_tokens=80, messages=long)  # type: ignore[arg-type]
    assert "prompt is too long" in info.value.response.json()["message"]
    body = quota_json(proxy, loop_thread)
    assert (used(body, "output_tokens"), used(body, "requests")) == (0, 1)
    assert upstream.requests == []
    # the tenant the key names is the one counted, and no other
    now = proxy.app[QUOTA].now_ms()
    rows = loop_thread.run(proxy.app[STORE].quota_current("acme", now))
    assert sorted((scope, metric, value) for scope, metric, _, _, value in rows) == [
        ("tenant", "output_tokens", 0), ("tenant", "requests", 1)
    ]
    assert loop_thread.run(proxy.app[STORE].quota_current("globex", now)) == ()


def test_a_traced_bedrock_call_is_a_genai_span_of_aws_bedrock(
    aws_env: Path,
    bedrock: FakeBedrock,
    make_proxy: ProxyFactory,
    loop_thread: LoopThread,
) -> None:
    """``gen_ai.provider.name`` is the platform actually called (the conventions' well-known
    values: ``aws.bedrock``, ``gcp.vertex_ai``, ``anthropic``), under the Bedrock route's server
    span."""
    receiver = OtlpReceiver()
    loop_thread.run(receiver.start())
    try:
        proxy = make_proxy(
            upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url},
            tracing={"enabled": True, "endpoint": receiver.endpoint, "flush_seconds": 0.05},
        )
        with _bedrock_client(proxy) as client:
            client.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)  # type: ignore[arg-type]
        call = _wait(lambda: receiver.named("chat claude-sonnet-4-5-20250929"), "the call span")[0]
        assert call.attributes["gen_ai.provider.name"] == "aws.bedrock"
        assert call.attributes["gen_ai.request.model"] == "claude-sonnet-4-5-20250929"
        # the server called is the platform's endpoint, not upstream.base_url
        assert (call.attributes["server.address"], call.attributes["server.port"]) == (
            "127.0.0.1", int(bedrock.url.rsplit(":", 1)[1])
        )
        server = next(s for s in receiver.spans if s.kind == "server")
        assert server.attributes["http.route"] == "/model/{model}/invoke"
        assert call.trace_id == server.trace_id and call.parent_id
    finally:
        loop_thread.run(receiver.stop())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_every_client_format_reaches_a_foundry_upstream(
    foundry: FakeFoundry, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setenv("ACROSS_FOUNDRY_KEY", FOUNDRY_KEY)
    foundry.deployments = frozenset({"claude-sonnet-4-5"})
    proxy = make_proxy(upstream={"format": "foundry", "endpoint_url": foundry.endpoint,
                                 "api_key_env": "ACROSS_FOUNDRY_KEY"})  # fmt: skip
    expected = "Hello from fake Foundry (claude-sonnet-4-5)."
    clients: list[tuple[Any, str]] = [
        (anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0), "claude-sonnet-4-5-20250929"),
        (_bedrock_client(proxy), PROFILE),
        (AnthropicVertex(base_url=proxy.url, access_token=KEY, project_id="p", region="us-east5",
                         max_retries=0), "claude-sonnet-4-5@20250929"),
        (AnthropicFoundry(base_url=proxy.url + "/anthropic", api_key=KEY, max_retries=0), "claude-sonnet-4-5"),
    ]  # fmt: skip
    for client, model in clients:
        with client:
            if stream:
                with client.messages.stream(model=model, max_tokens=50, messages=MESSAGES) as s:
                    assert s.get_final_text() == expected
            else:
                answer = client.messages.create(model=model, max_tokens=50, messages=MESSAGES)
                assert answer.content[0].text == expected
    assert len(foundry.seen) == 4
    for seen in foundry.seen:  # one Messages body, whoever sent it; Foundry's key, never the client's
        assert seen.path == "/anthropic/v1/messages"
        assert {k: v for k, v in seen.body.items() if k != "stream"} == {
            "model": "claude-sonnet-4-5", "max_tokens": 50, "messages": MESSAGES
        }
        assert seen.body.get("stream", False) is stream
        assert seen.headers["x-api-key"] == FOUNDRY_KEY and KEY not in repr(seen.headers)


def test_every_api_path_is_traced() -> None:
    assert all(path.startswith(TRACED_PATHS) for path in API_PATHS)
