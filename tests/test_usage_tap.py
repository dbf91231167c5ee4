"""The usage tap reads the provider's real input size from what the relay writes."""

from __future__ import annotations

import orjson

from proxy.server.relay.usage import UsageTap
from tests.upstream import message_json, text_stream_events


def test_sse_message_start_usage_is_read_from_the_first_event() -> None:
    events = text_stream_events("hello", input_tokens=321)
    start = orjson.loads(events[0].split(b"data: ", 1)[1])
    start["message"]["usage"]["cache_read_input_tokens"] = 1000
    events[0] = b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n"
    tap = UsageTap(sse=True)
    for event in events:
        tap.feed(event)
    assert tap.input_tokens == 1321


def test_sse_events_arriving_together_are_parsed() -> None:
    tap = UsageTap(sse=True)
    tap.feed(b"".join(text_stream_events("x", input_tokens=77)))
    assert tap.input_tokens == 77


def test_json_message_and_count_tokens_bodies() -> None:
    body = orjson.dumps(message_json(input_tokens=40))
    tap = UsageTap(sse=False)
    tap.feed(body[:10])
    tap.feed(body[10:])
    tap.close()
    assert tap.input_tokens == 40
    counted = UsageTap(sse=False)
    counted.feed(b'{"input_tokens": 999}')
    counted.close()
    assert counted.input_tokens == 999


def test_oversized_or_broken_bodies_give_nothing() -> None:
    tap = UsageTap(sse=False, limit=10)
    tap.feed(orjson.dumps(message_json(input_tokens=40)))
    tap.close()
    assert tap.input_tokens is None
    broken = UsageTap(sse=False)
    broken.feed(b'{"type": "message", "usage": ')
    broken.close()
    assert broken.input_tokens is None
    error = UsageTap(sse=False)
    error.feed(b'{"type":"error","error":{"type":"api_error","message":"x"}}')
    error.close()
    assert error.input_tokens is None
