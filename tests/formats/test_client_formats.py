"""Bedrock InvokeModel and Vertex rawPredict clients through the proxy, upstream in Anthropic form.

The official ``AnthropicBedrock`` and ``AnthropicVertex`` SDK clients (and raw httpx where the
bytes matter) against a real proxy and the fake upstream: each request is decoded into the one
internal Messages request (checked by what the upstream received), each answer encoded back in
the client's format: a Bedrock stream is read by botocore's own event-stream parser (prelude and
message CRCs checked) with the bedrock-runtime ``ResponseStream`` shape, as boto3 and the SDK
read it. Errors come in each platform's shape, the wording kept.

Bedrock's error shape (HTTP status, ``{"message": ...}``, ``x-amzn-ErrorType``) and stream
exceptions: docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html;
the paths and body fields: code.claude.com/docs/en/llm-gateway-protocol (reference §11.1).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest
from anthropic import AnthropicBedrock, AnthropicVertex
from botocore.eventstream import EventStreamBuffer
from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.parsers import EventStreamJSONParser

from tests.conftest import ProxyFactory
from tests.harness import LoopThread, ProxyServer
from tests.upstream import FakeUpstream, Reply, Stream, message_json, text_stream_events

KEY = "sk-ant-test-formats-0123456789"
PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{PROFILE}"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
INSIDE = "claude-sonnet-4-5-20250929"
SUMMARY = "claude-summary-test"
MESSAGES = [{"role": "user", "content": "Say hello."}]
VERTEX_PATH = "/projects/proj-x/locations/us-east5/publishers/anthropic/models"
EVENTSTREAM = "application/vnd.amazon.eventstream"


def _bedrock(proxy: ProxyServer, **kw: Any) -> AnthropicBedrock:
    return AnthropicBedrock(
        base_url=proxy.url, api_key=kw.pop("api_key", KEY), aws_region="us-east-1", max_retries=0,
        **kw,
    )


def _vertex(base_url: str, **kw: Any) -> AnthropicVertex:
    return AnthropicVertex(
        base_url=base_url, access_token=KEY, project_id="proj-x", region="us-east5",
        max_retries=0, **kw,
    )


def _bedrock_body(**extra: Any) -> bytes:
    """What Claude Code 2.1.197 sends on Bedrock (recorded): no model, no stream."""
    return orjson.dumps(
        {
            "messages": MESSAGES,
            "max_tokens": 50,
            "anthropic_beta": ["interleaved-thinking-2025-05-14"],
            "anthropic_version": "bedrock-2023-05-31",
            **extra,
        }
    )


def _response_stream_shape() -> Any:
    model = ServiceModel(Loader().load_service_model("bedrock-runtime", "service-2"))
    return model.shape_for("ResponseStream")


def _botocore_events(data: bytes) -> list[dict[str, Any]]:
    """The stream as boto3 parses it: each message's CRCs checked, then the shape applied."""
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    parser = EventStreamJSONParser()
    shape = _response_stream_shape()
    return [parser.parse(message.to_response_dict(), shape) for message in buffer]


def _sse_data(events: list[bytes]) -> list[bytes]:
    out = []
    for event in events:
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[6:])
    return out


# --- Bedrock -----------------------------------------------------------------------------------


def test_bedrock_sdk_invoke_is_the_messages_request_inside(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    upstream.script(Reply(message_json("hi there"), headers={"request-id": "req_up_1"}))
    with _bedrock(proxy) as client:
        answer = client.messages.with_raw_response.create(
            model=PROFILE, max_tokens=50, messages=MESSAGES,
            extra_body={"anthropic_beta": ["beta-one-2026-01-01"]},
            extra_headers={"X-Claude-Code-Session-Id": "bedrock-session-1"},
        )
    seen = upstream.requests[-1]
    assert seen.path == "/v1/messages"
    # the model inside is the Anthropic id, first; the rest as sent; no platform fields
    assert seen.body == orjson.dumps(
        {"model": INSIDE, "max_tokens": 50, "messages": MESSAGES}
    )
    assert seen.headers["anthropic-version"] == anthropic._constants.ANTHROPIC_API_VERSION
    assert seen.headers["anthropic-beta"] == "beta-one-2026-01-01"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert not [name for name in seen.headers if name.lower().startswith(("x-amz", "amz-sdk"))]
    assert answer.status_code == 200
    assert answer.parse().content[0].text == "hi there"
    assert answer.headers["x-amzn-requestid"] == "req_up_1"
    assert answer.headers["content-type"].startswith("application/json")


def test_bedrock_arn_in_the_path_and_betas_from_header_and_body(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    """An inference-profile ARN comes URL-encoded (the SDK quotes its ``/``); the betas of the
    client's ``anthropic-beta`` header and of the body's ``anthropic_beta`` are all forwarded,
    each once (Claude Code sends both)."""
    upstream.script(Reply(message_json("arn ok")))
    with _bedrock(proxy) as client:
        answer = client.messages.create(
            model=ARN, max_tokens=50, messages=MESSAGES,
            extra_headers={"anthropic-beta": "claude-code-20250219,shared-beta"},
            extra_body={"anthropic_beta": ["shared-beta", "body-beta"]},
        )
    assert answer.content[0].text == "arn ok"
    seen = upstream.requests[-1]
    assert seen.json()["model"] == INSIDE
    assert seen.headers["anthropic-beta"] == "claude-code-20250219,shared-beta,body-beta"


def test_bedrock_stream_is_an_event_stream_botocore_reads(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    events = text_stream_events("The quick brown fox jumps over the lazy dog.", deltas=7)
    upstream.script(Stream(events))
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke-with-response-stream",
        content=_bedrock_body(),
        headers={"Content-Type": "application/json", "x-api-key": KEY},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == EVENTSTREAM
    parsed = _botocore_events(response.content)
    chunks = [event["chunk"]["bytes"] for event in parsed]
    assert chunks == _sse_data(list(events))  # every upstream event, in order, byte for byte
    seen = upstream.requests[-1]
    assert seen.body == orjson.dumps(
        {"model": INSIDE, "messages": MESSAGES, "max_tokens": 50, "stream": True}
    )
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_bedrock_sdk_stream(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    upstream.script(Stream(text_stream_events("streamed through bedrock", deltas=4)))
    with _bedrock(proxy) as client, client.messages.stream(
        model=PROFILE, max_tokens=50, messages=MESSAGES
    ) as stream:
        assert stream.get_final_text() == "streamed through bedrock"


def test_bedrock_answers_carry_the_compaction_headers(
    upstream: FakeUpstream, make_proxy: ProxyFactory, transcript: dict[str, Any]
) -> None:
    """Compaction applies unchanged: a long Claude Code conversation sent by a Bedrock client is
    compacted (the summary call made in Anthropic form) and reported in ``x-compaction-*``."""
    proxy = make_proxy(
        compaction={"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY}}
    )
    messages = transcript["messages"]
    k = next(k for k in range(90, len(messages) + 1) if messages[k - 1]["role"] == "user")
    def answer_for(req: Any) -> Reply:
        return Reply(message_json("SUMMARY: X" if req.json()["model"] == SUMMARY else "compacted"))

    upstream.script(answer_for, answer_for)  # the summary call, then the request
    with _bedrock(proxy) as client:
        answer = client.messages.with_raw_response.create(
            model=PROFILE, max_tokens=100, messages=messages[:k], tools=transcript["tools"],
        )
    assert answer.parse().content[0].text == "compacted"
    assert answer.headers["x-compaction-plan"] == "new"
    assert int(answer.headers["x-compaction-tokens-after"]) < int(
        answer.headers["x-compaction-tokens-before"]
    )
    forwarded = upstream.requests[-1].json()
    assert forwarded["model"] == INSIDE
    assert len(forwarded["messages"]) < k
    summary = [r for r in upstream.requests if r.json().get("model") == SUMMARY]
    assert summary and summary[0].path == "/v1/messages"


@pytest.mark.parametrize(
    ("body", "wording"),
    [
        (b"{not json", "request body is not valid JSON"),
        (b"[1, 2]", "request body must be a JSON object"),
        (orjson.dumps({"messages": MESSAGES, "max_tokens": 5}), "anthropic_version: Field required"),
        (_bedrock_body(anthropic_version="v9"), "anthropic_version: invalid value"),
        (_bedrock_body(anthropic_beta="one"), "anthropic_beta: Input should be a list"),
        (_bedrock_body(messages="hello"), "messages: Input should be a valid list"),
        (
            _bedrock_body(
                messages=[
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}
                    ]},
                    {"role": "user", "content": "no result"},
                ]
            ),
            "tool_use",
        ),
    ],
)
def test_a_malformed_bedrock_request_gets_a_bedrock_error(
    upstream: FakeUpstream, proxy: ProxyServer, body: bytes, wording: str
) -> None:
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke", content=body,
        headers={"Content-Type": "application/json"}, timeout=30,
    )
    assert response.status_code == 400
    assert response.headers["x-amzn-errortype"].startswith("ValidationException:")
    assert response.headers["x-amzn-requestid"]
    assert list(response.json()) == ["message"]
    assert wording in response.json()["message"]
    assert upstream.requests == []


def test_the_upstream_error_reaches_the_bedrock_client_with_its_wording(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    wording = "messages.0.content.0: thinking blocks cannot be modified"
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": wording}}
    upstream.script(Reply(error, status=400))
    with _bedrock(proxy) as client, pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)
    assert info.value.response.json() == {"message": wording}
    assert info.value.response.headers["x-amzn-errortype"].startswith("ValidationException:")
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.script(Reply(overloaded, status=529))
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke", content=_bedrock_body(), timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 503
    assert response.json() == {"message": "Overloaded"}
    assert response.headers["x-amzn-errortype"].startswith("ServiceUnavailableException:")


def test_errors_inside_a_bedrock_stream_are_exception_frames(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    events = list(text_stream_events("a long answer cut short", deltas=5))
    upstream.script(Stream(events, cut_after=3))
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke-with-response-stream", content=_bedrock_body(),
        headers={"Content-Type": "application/json"}, timeout=30,
    )
    parsed = _botocore_events(response.content)
    assert [event["chunk"]["bytes"] for event in parsed[:3]] == _sse_data(events[:3])
    last = parsed[-1]
    assert last["Error"]["Code"] == "internalServerException"
    assert "upstream connection lost mid-stream" in last["Error"]["Message"]
    # the provider's own error event: its wording, Bedrock's exception name
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    upstream.script(Stream([*events[:2], error]))
    with _bedrock(proxy) as client, pytest.raises(anthropic.APIStatusError) as info:
        with client.messages.stream(model=PROFILE, max_tokens=50, messages=MESSAGES) as stream:
            stream.get_final_text()
    assert "Overloaded" in str(info.value)
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke-with-response-stream", content=_bedrock_body(),
        headers={"Content-Type": "application/json"}, timeout=30,
    )
    assert response.status_code == 200  # the upstream script is spent: a default stream
    upstream.script(Stream([*events[:2], error]))
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/invoke-with-response-stream", content=_bedrock_body(),
        headers={"Content-Type": "application/json"}, timeout=30,
    )
    last = _botocore_events(response.content)[-1]
    assert last["Error"] == {"Code": "serviceUnavailableException", "Message": "Overloaded"}


def test_bedrock_startup_probes(proxy: ProxyServer) -> None:
    assert httpx.head(f"{proxy.url}/").status_code == 200
    response = httpx.get(f"{proxy.url}/inference-profiles", params={"type": "SYSTEM_DEFINED"})
    assert response.status_code == 200
    assert response.json() == {"inferenceProfileSummaries": []}
    # after its first answer Claude Code asks for the model behind its profile
    profile = httpx.get(f"{proxy.url}/inference-profiles/{PROFILE.replace(':', '%3A')}").json()
    assert profile["inferenceProfileId"] == PROFILE
    assert profile["models"] == [
        {"modelArn": "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-sonnet-4-5-20250929-v1:0"}
    ]
    unknown = httpx.get(f"{proxy.url}/inference-profiles/us.amazon.nova-pro-v1%3A0")
    assert unknown.status_code == 404
    assert unknown.headers["x-amzn-errortype"].startswith("ResourceNotFoundException:")
    assert "us.amazon.nova-pro-v1:0" in unknown.json()["message"]


def test_keys_mode_authenticates_a_bedrock_client_by_its_bearer_token(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """``AWS_BEARER_TOKEN_BEDROCK`` (the SDK's ``api_key``) carries the proxy-issued key; an
    unknown one is 401 in Bedrock's shape; the key never goes upstream."""
    policies = tmp_path / "policies"
    policies.mkdir()
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    (policies / "acme.yaml").write_text(
        f"name: acme\napi_keys_sha256: [{digest}]\nprovider: {{mode: passthrough}}\n"
    )
    proxy = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))
    with _bedrock(proxy, api_key="cpk-not-a-key") as client, pytest.raises(
        anthropic.AuthenticationError
    ) as info:
        client.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)
    assert list(info.value.response.json()) == ["message"]
    assert info.value.response.headers["x-amzn-errortype"].startswith("AccessDeniedException:")
    assert upstream.requests == []
    upstream.script(Reply(message_json("tenant ok")))
    with _bedrock(proxy) as client:
        assert client.messages.create(
            model=PROFILE, max_tokens=50, messages=MESSAGES
        ).content[0].text == "tenant ok"
    assert "authorization" not in upstream.requests[-1].headers


# --- Vertex ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_vertex_sdk_create_stream_and_count_tokens(
    upstream: FakeUpstream, proxy: ProxyServer, prefix: str
) -> None:
    """``ANTHROPIC_VERTEX_BASE_URL`` with or without ``/v1`` (Claude Code appends
    ``/projects/...`` to what it is given)."""
    upstream.script(
        Reply(message_json("vertex hi")),
        Stream(text_stream_events("vertex streamed", deltas=3)),
        Reply({"input_tokens": 17}),
    )
    with _vertex(proxy.url + prefix) as client:
        answer = client.messages.create(
            model=VERTEX_MODEL, max_tokens=50, messages=MESSAGES,
            extra_headers={"anthropic-beta": "beta-v-2026-01-01"},
        )
        assert answer.content[0].text == "vertex hi"
        first = upstream.requests[-1]
        with client.messages.stream(
            model=VERTEX_MODEL, max_tokens=50, messages=MESSAGES
        ) as stream:
            assert stream.get_final_text() == "vertex streamed"
        streamed = upstream.requests[-1]
        counted = client.messages.count_tokens(model=VERTEX_MODEL, messages=MESSAGES)
    assert counted.input_tokens == 17
    assert first.path == "/v1/messages"
    assert first.body == orjson.dumps({"model": INSIDE, "max_tokens": 50, "messages": MESSAGES})
    assert first.headers["anthropic-beta"] == "beta-v-2026-01-01"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert streamed.json() == {
        "model": INSIDE, "max_tokens": 50, "messages": MESSAGES, "stream": True
    }
    count = upstream.requests[-1]
    assert count.path == "/v1/messages/count_tokens"
    assert count.json() == {"model": INSIDE, "messages": MESSAGES}


def test_vertex_stream_bytes_are_the_upstream_sse(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    events = text_stream_events("byte for byte", deltas=3)
    upstream.script(Stream(events))
    response = httpx.post(
        f"{proxy.url}{VERTEX_PATH}/{VERTEX_MODEL}:streamRawPredict",
        content=orjson.dumps(
            {"messages": MESSAGES, "max_tokens": 9, "stream": True,
             "anthropic_version": "vertex-2023-10-16"}
        ),
        headers={"Content-Type": "application/json"}, timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == b"".join(events)
    assert upstream.requests[-1].headers["anthropic-version"] == "2023-06-01"


def test_vertex_errors_are_the_anthropic_ones(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    url = f"{proxy.url}{VERTEX_PATH}/{VERTEX_MODEL}:rawPredict"
    bad = httpx.post(url, content=b"{oops", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in bad.json()["error"]["message"]
    missing = httpx.post(url, content=orjson.dumps({"messages": MESSAGES, "max_tokens": 5}))
    assert missing.json()["error"]["message"] == "anthropic_version: Field required"
    count = httpx.post(
        f"{proxy.url}{VERTEX_PATH}/count-tokens:rawPredict",
        content=orjson.dumps({"messages": MESSAGES, "anthropic_version": "vertex-2023-10-16"}),
    )
    assert count.json()["error"]["message"] == "model: Field required"
    other = httpx.post(f"{proxy.url}{VERTEX_PATH}/{VERTEX_MODEL}:predict", content=b"{}")
    assert other.status_code == 404
    assert other.json()["error"]["type"] == "not_found_error"
    assert upstream.requests == []
    error = orjson.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: 0"},
         "request_id": "req_up_2"}
    )
    upstream.script(Reply(error, status=400))
    with _vertex(proxy.url + "/v1") as client, pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=VERTEX_MODEL, max_tokens=50, messages=MESSAGES)
    assert info.value.response.content == error  # unmodified


def test_the_three_formats_forward_the_same_view(
    upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread
) -> None:
    """One conversation sent as Anthropic, Bedrock and Vertex clients: the upstream receives the
    same Messages body each time."""
    upstream.script(*(Reply(message_json("same")) for _ in range(3)))
    with anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as direct:
        direct.messages.create(model=INSIDE, max_tokens=50, messages=MESSAGES)
    with _bedrock(proxy) as bedrock:
        bedrock.messages.create(model=PROFILE, max_tokens=50, messages=MESSAGES)
    with _vertex(proxy.url + "/v1") as vertex:
        vertex.messages.create(model=VERTEX_MODEL, max_tokens=50, messages=MESSAGES)
    bodies = [request.json() for request in upstream.requests[-3:]]
    assert bodies[0] == bodies[1] == bodies[2]


# --- boto3's own bedrock-runtime client ---------------------------------------------------------


def _boto3(proxy: ProxyServer) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    return boto3.client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url=proxy.url,
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="not-a-secret",
        config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_boto3_invoke_stream_and_count_tokens(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    """boto3 signs with SigV4: the signature is left out of the internal request (nothing
    upstream could check it); the answers are read by botocore's own parsers."""
    events = text_stream_events("boto3 reads this", deltas=3)
    upstream.script(Reply(message_json("boto3 hi")), Stream(events), Reply({"input_tokens": 23}))
    client = _boto3(proxy)
    try:
        plain = client.invoke_model(modelId=PROFILE, body=_bedrock_body())
        assert orjson.loads(plain["body"].read())["content"][0]["text"] == "boto3 hi"
        streamed = client.invoke_model_with_response_stream(modelId=PROFILE, body=_bedrock_body())
        chunks = [event["chunk"]["bytes"] for event in streamed["body"]]
        assert chunks == _sse_data(list(events))
        counted = client.count_tokens(
            modelId=PROFILE, input={"invokeModel": {"body": _bedrock_body(metadata={"user_id": "u"})}}
        )
    finally:
        client.close()
    assert counted["inputTokens"] == 23
    for request in upstream.requests:
        assert "authorization" not in request.headers
        assert not [n for n in request.headers if n.lower().startswith("x-amz")]
    count = upstream.requests[-1]
    assert count.path == "/v1/messages/count_tokens"
    assert count.body == orjson.dumps({"model": INSIDE, "messages": MESSAGES})
    assert count.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_a_converse_count_is_a_bedrock_validation_error(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    response = httpx.post(
        f"{proxy.url}/model/{PROFILE}/count-tokens",
        content=orjson.dumps({"input": {"converse": {"messages": []}}}),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.headers["x-amzn-errortype"].startswith("ValidationException:")
    assert "only InvokeModel bodies are counted" in response.json()["message"]
    assert upstream.requests == []
