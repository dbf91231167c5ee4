"""The pure Bedrock and Vertex adapters: request bodies rebuilt byte for byte, the answer encoder
fed in any pieces (botocore reads the result), error bodies and their wording."""

from __future__ import annotations

import base64

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.catalogue import Catalogue
from proxy.core.errors import InvalidRequest, NotFound
from proxy.formats import bedrock, vertex
from proxy.formats.request import merge_betas

EVENTS = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1"}}\n\n',
    b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
    b'event: content_block_delta\r\ndata: {"type":"content_block_delta","delta":{"text":"\\u00e9"}}\r\n\r\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def _frames(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30))
def test_the_stream_encoder_gives_the_same_frames_for_any_pieces(cuts: list[int]) -> None:
    whole = b"".join(EVENTS)
    encoder = bedrock.AnswerEncoder()
    assert encoder.start(200, "text/event-stream; charset=utf-8") == {
        "Content-Type": "application/vnd.amazon.eventstream"
    }
    out = bytearray()
    at = 0
    for cut in cuts:
        out += encoder.feed(whole[at : at + cut])
        at += cut
    out += encoder.feed(whole[at:]) + encoder.end()
    frames = _frames(bytes(out))
    carried = [orjson.loads(base64.b64decode(orjson.loads(payload)["bytes"])) for _, payload in frames]
    assert carried == [orjson.loads(event.split(b"data: ", 1)[1]) for event in EVENTS]
    assert all(h[":event-type"] == "chunk" for h, _ in frames)


def test_a_json_answer_passes_and_an_error_becomes_bedrocks() -> None:
    encoder = bedrock.AnswerEncoder()
    assert encoder.start(200, "application/json") == {}
    assert encoder.feed(b'{"id":') + encoder.feed(b"1}") + encoder.end() == b'{"id":1}'
    assert not encoder.rewrites
    error = bedrock.AnswerEncoder()
    headers = error.start(529, "application/json")
    assert error.status == 503
    assert headers["x-amzn-ErrorType"].startswith("ServiceUnavailableException:")
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    assert error.feed(body[:10]) == b"" and error.feed(body[10:]) == b""
    assert error.end() == b'{"message":"Overloaded"}'
    plain = bedrock.AnswerEncoder()
    plain.start(502, "text/plain")
    plain.feed(b"Bad Gateway")
    assert plain.end() == b'{"message":"Bad Gateway"}'


def test_a_huge_error_body_is_bounded() -> None:
    encoder = bedrock.AnswerEncoder()
    encoder.start(400, "application/json")
    for _ in range(3):
        encoder.feed(b"x" * bedrock.MAX_ERROR_BODY)
    assert len(encoder.end()) < bedrock.MAX_ERROR_BODY + 100


def test_the_body_is_rebuilt_with_the_client_bytes_kept() -> None:
    text = (
        b'{ "messages" : [ {"role":"user","content":"hi"} ],"anthropic_version":"bedrock-2023-05-31",'
        b'"max_tokens":5, "anthropic_beta":["b1"],"stream":false,"model":"ignored"}'
    )
    decoded = bedrock.decode(
        "eu.anthropic.claude-haiku-4-5-20251001-v1:0", text, stream=True, ids=Catalogue()
    )
    assert decoded.body == (
        b'{"model":"claude-haiku-4-5-20251001","messages":[ {"role":"user","content":"hi"} ],'
        b'"max_tokens":5,"stream":true}'
    )
    assert (decoded.version, decoded.betas, decoded.stream) == ("2023-06-01", ("b1",), True)
    assert decoded.client_model == "eu.anthropic.claude-haiku-4-5-20251001-v1:0"


@pytest.mark.parametrize(
    ("text", "wording"),
    [
        (b"", "not valid JSON"),
        (b'"text"', "must be a JSON object"),
        (b'{"anthropic_version": 3}', "anthropic_version: Input should be a valid string"),
        (b'{"anthropic_version": "2023-06-01", "anthropic_beta": [""]}', "anthropic_beta"),
    ],
)
def test_bad_bodies_are_invalid_requests(text: bytes, wording: str) -> None:
    with pytest.raises(InvalidRequest, match=wording):
        bedrock.decode("anthropic.claude-x", text, stream=False, ids=Catalogue())


def test_vertex_targets_and_stream_values() -> None:
    assert vertex.split_target("claude-x@20250101:streamRawPredict") == (
        "claude-x@20250101", "streamRawPredict"
    )
    for target in ("claude-x:predict", ":rawPredict", "claude-x"):
        with pytest.raises(NotFound):
            vertex.split_target(target)
    body = b'{"anthropic_version":"vertex-2023-10-16","messages":[],"stream":"yes"}'
    with pytest.raises(InvalidRequest, match="stream: Input should be a valid boolean"):
        vertex.decode("claude-x", "rawPredict", body, ids=Catalogue())
    decoded, counting = vertex.decode(
        "claude-x@20250101", "rawPredict", body.replace(b'"yes"', b"true"), ids=Catalogue()
    )
    assert not counting and decoded.stream and decoded.model == "claude-x-20250101"


def test_betas_merge_in_order_once() -> None:
    assert merge_betas(" a, b ,,", ("b", "c")) == "a,b,c"
    assert merge_betas(None, ()) is None
