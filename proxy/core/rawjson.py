"""Where the elements of a JSON text's top-level ``messages`` array are, without building them.

``BodyMemo`` (``proxy.core.reparse``) compares a new body with a remembered one up to the end of
a message; for that it needs each element's end offset, for any layout a client writes (compact,
``json.dumps`` defaults with ``", "`` and ``": "``, ASCII escapes, indentation, any whitespace
between tokens, keys in any order).

``msgspec`` scans the text and hands back each element as raw bytes (``msgspec.Raw``, never
decoded into values): its lengths and the JSON whitespace and commas between them give the
offsets. msgspec is only ever used to *locate* bytes: every element found is compared byte for
byte with the text at the offset computed for it, so an offset is right whatever msgspec makes
of odd input (duplicate keys, lone surrogates, big numbers, invalid UTF-8, depth), and the values
are always ``orjson``'s. Whatever does not add up gives ``None``: the caller then parses in full.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from itertools import accumulate

import msgspec

__all__ = ["array_starts", "element_ends", "elements", "skip_space"]

# JSON whitespace is exactly these four bytes (RFC 8259)
_SPACE = re.compile(rb"[ \t\n\r]*")
_COLON = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")
_COMMA = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")
_CLOSE = re.compile(rb"[ \t\n\r]*\]")
_KEY = b'"messages"'


def _any_spelling(key: str) -> bytes:
    """A pattern for the JSON string ``key`` (ASCII letters) with any of its characters
    written as a ``\\u00XX`` escape, in either hex case."""
    out = ['"']
    for ch in key:
        digits = "".join(f"[{d}{d.upper()}]" for d in f"{ord(ch):02x}")
        out.append(f"(?:{ch}|\\\\u00{digits})")
    return "".join(out).encode() + b'"'


# the key spelled with escapes, as a JSON writer may
_ANY_KEY = re.compile(_any_spelling("messages") + rb"[ \t\n\r]*:[ \t\n\r]*\[")


class _Messages(msgspec.Struct):
    messages: list[msgspec.Raw]


_BODY = msgspec.json.Decoder(_Messages)


def skip_space(text: bytes, pos: int) -> int:
    """The offset of the first byte at or after ``pos`` that is not JSON whitespace."""
    match = _SPACE.match(text, pos)
    assert match is not None  # ``*``: always matches
    return match.end()


def array_starts(text: bytes) -> Iterator[int]:
    """Offsets just after the ``[`` of every ``"messages"`` key with an array value: those
    spelled plainly in order (a fast search), then those spelled with escapes (a slower one,
    made only when the caller asks for more). A string's quotes are escaped, so in valid JSON
    such bytes followed by ``:`` are always a key, possibly a nested one: the caller checks which
    is the top-level one."""
    plain = set()
    at = text.find(_KEY)
    while at >= 0:
        match = _COLON.match(text, at + len(_KEY))
        if match is not None:
            plain.add(match.end())
            yield match.end()
        at = text.find(_KEY, at + len(_KEY))
    # only a writer that escapes plain letters spells them so (``\\u0061``-``\\u007a``): real
    # ones never do, and the search is not made
    if b"\\u006" in text or b"\\u007" in text:
        for match in _ANY_KEY.finditer(text):
            if match.end() not in plain:
                yield match.end()


def elements(buffer: bytes) -> list[msgspec.Raw] | None:
    """The raw elements of the ``messages`` array of the object ``buffer`` (its last
    ``messages`` member, as ``orjson`` keeps it), or ``None`` when msgspec does not read it so."""
    try:
        return _BODY.decode(buffer).messages
    except (msgspec.DecodeError, RecursionError):
        return None


def element_ends(text: bytes, pos: int, raws: Sequence[msgspec.Raw]) -> list[int] | None:
    """The end offsets (just after each one's last byte) of ``raws`` laid out in ``text`` from
    ``pos`` on (whitespace first allowed) as array elements: separated by whitespace and one
    comma, the last one followed by whitespace and ``]``. ``None`` when the bytes there are not
    exactly that."""
    if not raws:
        return []
    pos = skip_space(text, pos)
    first = raws[0]
    if not text.startswith(first, pos):
        return None
    if len(raws) == 1:
        return _closed(text, [pos + len(first)])
    gap_match = _COMMA.match(text, pos + len(first))
    if gap_match is None:
        return None
    gap = gap_match.group()
    # most clients put the same bytes between all elements: one compare for the whole array
    if text.startswith(gap.join(raws), pos):
        step = len(gap)
        sizes = accumulate((len(raw) + step for raw in raws), initial=pos - step)
        next(sizes)
        return _closed(text, list(sizes))
    return _closed(text, _one_by_one(text, pos, raws))


def _one_by_one(text: bytes, pos: int, raws: Sequence[msgspec.Raw]) -> list[int] | None:
    ends: list[int] = []
    last = len(raws) - 1
    for i, raw in enumerate(raws):
        if not text.startswith(raw, pos):
            return None
        pos += len(raw)
        ends.append(pos)
        if i < last:
            gap = _COMMA.match(text, pos)
            if gap is None:
                return None
            pos = gap.end()
    return ends


def _closed(text: bytes, ends: list[int] | None) -> list[int] | None:
    """``ends`` when the array closes after the last one."""
    if ends is None or _CLOSE.match(text, ends[-1]) is None:
        return None
    return ends
