"""Bedrock's and Vertex's request forms, Bedrock's event stream as SSE, their errors as Anthropic's."""

from __future__ import annotations

import base64

import orjson
import pytest

from proxy.formats import bedrock_upstream as bedrock
from proxy.formats import vertex_upstream as vertex
from proxy.formats.eventstream import chunk_frame, encode_frame, exception_frame
from proxy.formats.upstream_errors import bedrock_error, vertex_error

EVENTS = [
    {"type": "message_start", "message": {"id": "msg_1", "content": []}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hé"}},
    {"type": "message_stop"},
]


def _sse(events: list[dict[str, object]]) -> bytes:
    return b"".join(
        b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def test_bedrock_paths_encode_the_model_id() -> None:
    assert bedrock.model_path("us.anthropic.claude-x-v1:0", stream=True) == (
        "/model/us.anthropic.claude-x-v1%3A0/invoke-with-response-stream"
    )
    arn = "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude-x-v1:0"
    assert bedrock.model_path(arn, stream=False) == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.anthropic.claude-x-v1%3A0/invoke"
    )


def test_bedrock_body_moves_version_and_betas_in_and_model_and_stream_out() -> None:
    body = {"model": "m", "stream": True, "max_tokens": 5, "messages": []}
    assert bedrock.invoke_body(body, ["b1"]) == {
        "anthropic_version": "bedrock-2023-05-31", "anthropic_beta": ["b1"], "max_tokens": 5, "messages": [],
    }
    assert "anthropic_beta" not in bedrock.invoke_body(body, [])
    counted = orjson.loads(bedrock.count_tokens_body(body, []))
    inner = orjson.loads(base64.b64decode(counted["input"]["invokeModel"]["body"]))
    assert inner == {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": []}
    assert bedrock.count_tokens_answer(b'{"inputTokens": 7}') == b'{"input_tokens":7}'
    assert bedrock.count_tokens_answer(b'{"inputTokens": "7"}') is None


def test_vertex_paths_and_body() -> None:
    assert vertex.model_path("p", "global", "claude-x@20250101", stream=True) == (
        "/v1/projects/p/locations/global/publishers/anthropic/models/claude-x@20250101:streamRawPredict"
    )
    assert vertex.count_tokens_path("p", "us-east5").endswith("/models/count-tokens:rawPredict")
    assert vertex.default_endpoint("global") == "https://aiplatform.googleapis.com"
    assert vertex.default_endpoint("europe-west1") == "https://europe-west1-aiplatform.googleapis.com"
    assert vertex.predict_body({"model": "m", "stream": True}) == {
        "anthropic_version": "vertex-2023-10-16", "stream": True
    }


def test_the_event_stream_becomes_the_same_sse_whatever_the_chunking() -> None:
    wire = b"".join(chunk_frame(orjson.dumps(e)) for e in EVENTS)
    for size in (1, 7, len(wire)):
        translate = bedrock.StreamToSse("req_1")
        out = b"".join(translate.feed(wire[i : i + size]) for i in range(0, len(wire), size))
        assert out + translate.close() == _sse(EVENTS)
        assert translate.failure is None


@pytest.mark.parametrize(
    ("tail", "kind", "message"),
    [
        (exception_frame("modelStreamErrorException", "The model stopped."), "api_error", "The model stopped."),
        (exception_frame("throttlingException", "Slow down."), "rate_limit_error", "Slow down."),
        (chunk_frame(b'{"type":"ping"}')[:-1] + b"\x00", "api_error",
         "upstream sent a corrupt event-stream frame (message CRC mismatch)"),
        (encode_frame({":message-type": "event", ":event-type": "chunk"}, b'{"bytes": "%%%"}'), "api_error",
         "upstream sent an unreadable chunk"),
    ],
)
def test_a_failing_stream_ends_in_one_error_event_after_the_good_ones(
    tail: bytes, kind: str, message: str
) -> None:
    translate = bedrock.StreamToSse("req_1")
    good = chunk_frame(orjson.dumps(EVENTS[0]))
    out = translate.feed(good + tail + chunk_frame(orjson.dumps(EVENTS[1])))
    out += translate.feed(chunk_frame(orjson.dumps(EVENTS[2])))  # ignored: the stream ended
    out += translate.close()
    first, error = out.split(b"\n\n")[0], out.split(b"\n\n")[1]
    assert first + b"\n\n" == _sse(EVENTS[:1])
    assert error.startswith(b"event: error\ndata: ")
    data = orjson.loads(error.split(b"data: ", 1)[1])
    assert data["error"]["type"] == kind and data["error"]["message"].startswith(message)
    assert data["request_id"] == "req_1"
    assert out.count(b"event: error") == 1


def test_a_stream_cut_inside_a_frame_is_an_error_at_its_end() -> None:
    translate = bedrock.StreamToSse("req_1")
    frame = chunk_frame(orjson.dumps(EVENTS[0]))
    assert translate.feed(frame[:10]) == b""
    tail = translate.close()
    assert tail.startswith(b"event: error") and b"stream ended inside a frame (10 bytes)" in tail


@pytest.mark.parametrize(
    ("status", "kind_header", "body", "kind", "message"),
    [
        (400, "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/",
         b'{"message":"invalid beta flag"}', "invalid_request_error", "invalid beta flag"),
        (429, "ThrottlingException", b'{"message":"Too many tokens"}', "rate_limit_error", "Too many tokens"),
        (403, "AccessDeniedException", b'{"Message":"no access"}', "permission_error", "no access"),
        (503, "", b"Service Unavailable", "api_error", "Service Unavailable"),
        (400, "", b'{"type":"error","error":{"type":"invalid_request_error","message":"as is"}}',
         "invalid_request_error", "as is"),
    ],
)
def test_bedrock_errors_keep_their_wording(
    status: int, kind_header: str, body: bytes, kind: str, message: str
) -> None:
    assert orjson.loads(bedrock_error(status, kind_header, body, "req_9")) == {
        "type": "error", "error": {"type": kind, "message": message}, "request_id": "req_9"
    }


@pytest.mark.parametrize(
    ("status", "body", "kind", "message"),
    [
        (429, b'{"error":{"code":429,"message":"Quota exceeded for aiplatform","status":"RESOURCE_EXHAUSTED"}}',
         "rate_limit_error", "Quota exceeded for aiplatform (RESOURCE_EXHAUSTED)"),
        (404, b'[{"error":{"code":404,"message":"Publisher model not found","status":"NOT_FOUND"}}]',
         "not_found_error", "Publisher model not found (NOT_FOUND)"),
        (529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
         "overloaded_error", "Overloaded"),
        (500, b"", "api_error", "upstream answered 500"),
    ],
)
def test_vertex_errors_keep_their_wording(status: int, body: bytes, kind: str, message: str) -> None:
    assert orjson.loads(vertex_error(status, body, "req_9"))["error"] == {"type": kind, "message": message}
