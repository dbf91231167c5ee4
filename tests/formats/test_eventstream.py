"""The event-stream codec against botocore's own parser (the one boto3's Bedrock client uses),
and against frames botocore's parser is known to read: a wrong CRC, a cut-off frame and an
impossible length are errors, never a hang."""

from __future__ import annotations

import base64
import struct
import zlib

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from proxy.formats.eventstream import (
    EventStreamError,
    FrameDecoder,
    chunk_event,
    chunk_frame,
    encode_frame,
    exception_frame,
)

EVENT = b'{"type":"message_start","message":{"id":"msg_1"}}'


def _botocore(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(message.headers), message.payload) for message in buffer]


def test_botocore_reads_a_chunk_frame_as_bedrock_sends_it() -> None:
    [(headers, payload)] = _botocore(chunk_frame(EVENT))
    assert headers == {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    assert base64.b64decode(orjson.loads(payload)["bytes"]) == EVENT


def test_botocore_reads_an_exception_frame() -> None:
    [(headers, payload)] = _botocore(exception_frame("throttlingException", "Too many requests"))
    assert headers[":message-type"] == "exception"
    assert headers[":exception-type"] == "throttlingException"
    assert orjson.loads(payload) == {"message": "Too many requests"}


@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=50), max_size=4),
            st.binary(max_size=300),
        ),
        max_size=5,
    ),
    st.integers(min_value=1, max_value=64),
)
def test_any_frames_round_trip_through_both_parsers_in_any_pieces(
    frames: list[tuple[dict[str, str], bytes]], piece: int
) -> None:
    wire = b"".join(encode_frame(headers, payload) for headers, payload in frames)
    assert _botocore(wire) == [(headers, payload) for headers, payload in frames]
    decoder = FrameDecoder()
    got = []
    for at in range(0, len(wire), piece):
        got += decoder.feed(wire[at : at + piece])
    decoder.close()
    assert [(dict(f.headers), f.payload) for f in got] == frames


def test_chunk_event_gives_back_the_anthropic_event() -> None:
    [frame] = FrameDecoder().feed(chunk_frame(EVENT))
    assert (frame.message_type, frame.event_type) == ("event", "chunk")
    assert chunk_event(frame) == EVENT


def test_a_chunk_without_base64_bytes_is_an_error() -> None:
    [frame] = FrameDecoder().feed(encode_frame({":event-type": "chunk"}, b'{"bytes": "%%%"}'))
    with pytest.raises(EventStreamError):
        chunk_event(frame)


def test_a_flipped_payload_bit_fails_the_message_crc() -> None:
    wire = bytearray(chunk_frame(EVENT))
    wire[-10] ^= 1
    with pytest.raises(EventStreamError, match="message CRC"):
        FrameDecoder().feed(bytes(wire))


def test_a_flipped_length_bit_fails_the_prelude_crc_before_waiting_for_bytes() -> None:
    wire = bytearray(chunk_frame(EVENT))
    wire[1] ^= 0x10  # a total length a megabyte longer: a naive reader would wait for it
    with pytest.raises(EventStreamError, match="prelude CRC"):
        FrameDecoder().feed(bytes(wire[:12]))


def test_an_impossible_length_with_a_valid_prelude_crc_is_an_error() -> None:
    prelude = struct.pack(">II", 8, 0)  # shorter than a frame's own prelude and trailer
    with pytest.raises(EventStreamError, match="impossible"):
        FrameDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_a_stream_cut_inside_a_frame_is_an_error_at_close() -> None:
    decoder = FrameDecoder()
    wire = chunk_frame(EVENT)
    assert decoder.feed(wire + wire[:20]) != []
    assert decoder.pending == 20
    with pytest.raises(EventStreamError, match="inside a frame"):
        decoder.close()


def test_typed_headers_decode() -> None:
    # a frame with every non-string header type, assembled by hand as AWS documents them
    headers = (
        b"\x01a\x00"  # bool true
        + b"\x01b\x01"  # bool false
        + b"\x01c\x02\x05"  # byte
        + b"\x01d\x03\x00\x07"  # short
        + b"\x01e\x04\x00\x00\x00\x09"  # int
        + b"\x01f\x05" + (11).to_bytes(8, "big")  # long
        + b"\x01g\x06\x00\x02hi"  # bytes
        + b"\x01h\x08" + (13).to_bytes(8, "big")  # timestamp
        + b"\x01i\x09" + bytes(range(16))  # uuid
    )
    total = 16 + len(headers)
    prelude = struct.pack(">II", total, len(headers))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers
    wire = head + struct.pack(">I", zlib.crc32(head))
    [(expected, _)] = _botocore(wire)
    [frame] = FrameDecoder().feed(wire)
    assert dict(frame.headers) == expected
