"""A sound upper bound on a request's token estimate, without tokenising what is new.

Below the threshold nothing is compacted, yet the exact estimate (``TokenCounter.count_request``)
still has to tokenise every message the counter has not seen: the request's new bytes. When a
bound shows that the estimate cannot reach the threshold, the edge forwards the request at once
and counts it exactly while the provider works (the count then only fills in the report).

The bound: system and tools counted exactly (they are memoised: the same every turn), messages
the message memo knows at their exact count, and each other message at ``MESSAGE_OVERHEAD`` +
``BLOCK_OVERHEAD`` per block it may hold + the bytes of its canonical JSON. That holds because
every token the counter gives a message comes from a string inside it (text, tool input JSON,
names; a BPE token spans at least one UTF-8 byte, and a string's JSON is at least as long as its
UTF-8 bytes) plus the overheads; every block has a ``"type"`` key, so counting ``"type"`` in the
JSON over-counts the blocks. Images and documents are counted from their dimensions and pages,
not their bytes: a message that may hold one (its JSON shows ``"image"`` or ``"document"``) has
no bound (``None``), nor has one the memo cannot key. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

from proxy.core.compaction.digest import Digests
from proxy.core.tokens import BLOCK_OVERHEAD, MESSAGE_OVERHEAD, NO_KEY, TokenCounter

__all__ = ["Bound", "tokens_at_most"]

_MEDIA = (b'"image"', b'"document"')
_TYPE = b'"type"'


class Bound(NamedTuple):
    tokens: int  # at least the exact estimate
    new_bytes: int  # canonical JSON bytes of the messages the memo does not know: what is left to count


def tokens_at_most(
    system: object,
    tools: object,
    messages: Sequence[object],
    digests: Digests,
    counter: TokenCounter,
) -> Bound | None:
    """At least ``counter.count_request(system, tools, messages).total``; ``None`` when no bound
    is known (a message that may hold media, or that the memo cannot key)."""
    known = counter.known_messages(digests.keys)
    if len(known) != len(messages):
        raise ValueError("digests of other messages")
    # the known ones summed at C speed (a count is never 0: MESSAGE_OVERHEAD), then only the
    # others visited: an agent's next turn has a few, at the end
    bound = sum(filter(None, known))
    new_bytes = 0
    for i in _unknown(known):
        message, key = messages[i], digests.keys[i]
        if key == NO_KEY or type(message) is not dict:
            return None
        canonical = digests.canonical(i)  # made by the digests (the same canonical JSON)
        if canonical is None:
            try:
                canonical = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            except TypeError:
                return None
        if any(media in canonical for media in _MEDIA):
            return None
        blocks = canonical.count(_TYPE) + 1  # + 1: a string content is one block
        bound += MESSAGE_OVERHEAD + BLOCK_OVERHEAD * blocks + len(canonical)
        new_bytes += len(canonical)
    return Bound(bound + sum(counter.count_fixed(system, tools)), new_bytes)


def _unknown(known: list[int | None]) -> list[int]:
    """The indices of the ``None`` entries, found from the end."""
    left = known.count(None)
    out: list[int] = []
    i = len(known)
    while left:
        i -= 1
        if known[i] is None:
            out.append(i)
            left -= 1
    return out
