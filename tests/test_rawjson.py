"""Locating the ``messages`` elements in raw JSON text (``proxy.core.rawjson``): offsets right for
every layout, ``None`` whenever the bytes are not exactly what was asked."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest

from proxy.core.rawjson import array_starts, element_ends, elements

BODY = {
    "model": "m",
    "messages": [
        {"role": "user", "content": "héllo → 😀"},
        {"role": "assistant", "content": [{"type": "text", "text": "a\nb"}]},
        {"role": "user", "content": [1, 2.5, None, True, {"k": []}]},
    ],
    "tools": [],
}
LAYOUTS = {
    "compact": orjson.dumps(BODY),
    "spaced": json.dumps(BODY).encode(),
    "indented": json.dumps(BODY, indent=2, sort_keys=True).encode(),
    "tabs": json.dumps(BODY, indent="\t", separators=(" ,\r\n", " :\t")).encode(),
    # a different gap between each pair of elements, and before the ``]``
    "uneven": (
        b'{ "model" : "m" ,"messages"\n:\t[ '
        + orjson.dumps(BODY["messages"][0])
        + b" ,"
        + orjson.dumps(BODY["messages"][1])
        + b",\r\n\t"
        + orjson.dumps(BODY["messages"][2])
        + b'\n\n]\n, "tools":[]}'
    ),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_element_ends_where_its_bytes_end(layout: str) -> None:
    text = LAYOUTS[layout]
    (start,) = array_starts(text)
    raws = elements(text)
    assert raws is not None and len(raws) == 3
    ends = element_ends(text, start, raws)
    assert ends is not None
    begin = start
    for raw, end in zip(raws, ends, strict=True):
        element = text[begin:end].lstrip(b" \t\r\n,")
        assert element == bytes(raw)
        assert orjson.loads(element) in BODY["messages"]
        begin = end
    assert text[ends[-1] :].lstrip(b" \t\r\n").startswith(b"]")


def test_bytes_that_are_not_those_elements_are_refused() -> None:
    text = LAYOUTS["spaced"]
    (start,) = array_starts(text)
    raws = elements(text)
    assert raws is not None
    other = [msgspec.Raw(b'{"role": "user"}'), *raws[1:]]
    assert element_ends(text, start, other) is None  # another first element
    assert element_ends(text, start, raws[:2]) is None  # the array does not close after two
    assert element_ends(text, start + 1, raws) is None  # not where they start
    ends = element_ends(text, start, raws)
    assert ends is not None
    assert element_ends(text[: ends[-1]] + b" ,", start, raws) is None  # no "]" after the last
    assert element_ends(text[: ends[-1]], start, raws) is None
    comma = text.replace(b"}]}], ", b"}]},], ")  # a trailing comma: not one gap
    assert element_ends(comma, start, raws[:2]) is None
    assert element_ends(text, start, []) == []


def test_the_raw_elements_are_those_of_the_last_messages_member_as_orjson_keeps() -> None:
    assert [bytes(r) for r in elements(b'{"messages":[1],"x":{"messages":[7]},"messages" : [2, 3]}') or []] == [b"2", b"3"]
    assert [bytes(r) for r in elements(b'{"messag\\u0065s":[4]}') or []] == [b"4"]
    for text in (b'{"messages":{}}', b'{"messages":[1],"messages":2}', b"[1]", b'{"messages":[1,]}', b"{"):
        assert elements(text) is None, text
    deep = b'{"messages":[' + b"[" * 5000 + b"]" * 5000 + b"]}"
    assert elements(deep) is None  # too deep for msgspec: not located (parsed in full)


def test_messages_keys_are_found_plain_first_then_escaped() -> None:
    text = b'{"a":{"messages":[1]},"messag\\u0065s" :\n[2],"\\u006D\\u0065ssages":[3],"messages":{}}'
    starts = list(array_starts(text))
    assert [text[s : s + 1] for s in starts] == [b"1", b"2", b"3"]
    assert list(array_starts(b'{"m\\u0045ssages":[1],"x":"messages"}')) == []  # "mEssages"; a value
    # an escaped backslash before "u0065" is not an escape of "e"
    assert list(array_starts(b'{"messag\\\\u0065s":[1]}')) == []
