"""What compaction hashes and searches in each message, computed once per message object.

Per message of a request: its own hash (canonical JSON without ``cache_control`` markers: the
element of the plans' prefix hashes, see ``plan``), its message-memo key (``tokens``), whether it
may hold a marker, whether it may hold a provider ``compaction`` block; and the rolling prefix
hashes. That costs one canonical dump per message (``tokens.canonical_all``), two searches over
the dumps and a hash each.

An agent re-sends its whole history every turn. When the edge parses a re-sent body, the messages
it parsed before are the very objects of the earlier request (``proxy.core.reparse``) and the
messages list is a ``Resent`` that carries the earlier request's ``Digests``. Those are taken as
they are for the leading messages that are the same objects (checked by identity; the core never
mutates a message and the edge keeps parsed bodies as they were), and only the messages after
them are dumped and hashed. The result is the same as without: ``Digests`` is a function of the
messages' values.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from proxy.core.canonical import MARKER_JSON, Canonical, canonical_all, containing_each
from proxy.core.compaction.context import COMPACTION_JSON
from proxy.core.compaction.plan import message_hash, rolling_hashes
from proxy.core.compaction.view import Message
from proxy.core.tokens import message_keys

__all__ = ["Digests", "Resent", "digests"]

_ZERO = "0" * 16


@dataclass(frozen=True, slots=True)
class Digests:
    """Per message (same order): the facts compaction needs from its canonical JSON."""

    messages: tuple[object, ...]  # the message objects these are of (matched by identity)
    own: tuple[int, ...]  # ``plan.message_hash``; empty when not ``hashed``
    keys: tuple[int, ...]  # ``tokens.message_keys``
    marked: tuple[bool, ...]  # may hold a ``cache_control`` marker
    compaction: tuple[bool, ...]  # may hold a provider ``compaction`` block
    hashes: tuple[str, ...]  # ``plan.prefix_hashes`` (n + 1); empty when not ``hashed``
    # the canonical JSON made for these digests: of the messages from ``fresh_from`` on (the
    # ones not carried from an earlier request), for the request's own later use (its token
    # bound); ``carried`` drops it
    fresh: tuple[bytes | None, ...] = field(default=(), compare=False, repr=False)
    fresh_from: int = field(default=0, compare=False, repr=False)

    @property
    def hashed(self) -> bool:
        return len(self.hashes) == len(self.messages) + 1

    def canonical(self, i: int) -> bytes | None:
        """The canonical JSON of message ``i`` when these digests made it (else ``None``)."""
        j = i - self.fresh_from
        return self.fresh[j] if 0 <= j < len(self.fresh) else None

    def carried(self) -> Digests:
        """These digests without the canonical JSON: what an earlier request hands on."""
        return replace(self, fresh=(), fresh_from=0) if self.fresh else self


class Resent(list[Any]):
    """A ``messages`` list whose leading messages are the objects of an earlier request, with
    that request's ``Digests`` (``known``). It is a plain list in every other respect."""

    __slots__ = ("known",)

    def __init__(self, items: Iterable[Any] = (), known: Digests | None = None) -> None:
        super().__init__(items)
        self.known = known


def _reused(messages: Sequence[Message], known: Digests | None, hashed: bool) -> int:
    """How many leading ``messages`` are the objects ``known`` has digests of."""
    if known is None or (hashed and not known.hashed):
        return 0
    limit = min(len(known.messages), len(messages))
    same = list(map(operator.is_, messages[:limit], known.messages[:limit]))
    try:
        return same.index(False)
    except ValueError:
        return limit


def digests(
    messages: Sequence[Message], hashed: bool = True, made: Canonical | None = None
) -> Digests:
    """The ``Digests`` of ``messages``; ``hashed``: with own and prefix hashes too (they need
    every message to be JSON, else ``TypeError``, as ``prefix_hashes``). ``made``: canonical
    JSON of some of them already made (by the edge's nesting check)."""
    known = messages.known if isinstance(messages, Resent) else None
    k = _reused(messages, known, hashed)
    if known is not None and k == len(messages) == len(known.messages) and (known.hashed or not hashed):
        return known  # made for these very messages (``with_digests``): nothing to add
    tail = messages[k:]
    canonical = made.of(messages, k) if made is not None else canonical_all(tail)
    marked, found = containing_each(canonical, (MARKER_JSON, COMPACTION_JSON))
    keys = message_keys(tail, canonical, marked)
    own: list[int] = []
    if hashed:
        digest = xxhash.xxh3_64_intdigest
        own = [
            # an unmarked dict's key is the hash of its canonical JSON: the same number
            (key if type(m) is dict else digest(raw))
            if not may_have and raw is not None
            else message_hash(m, raw)
            for m, raw, may_have, key in zip(tail, canonical, marked, keys, strict=True)
        ]
    if known is None or k == 0:
        hashes = (_ZERO, *rolling_hashes(own)) if hashed else ()
        return Digests(
            tuple(messages),
            tuple(own),
            tuple(keys),
            tuple(marked),
            tuple(found),
            hashes,
            tuple(canonical),
        )
    hashes = (*known.hashes[: k + 1], *rolling_hashes(own, known.hashes[k])) if hashed else ()
    return Digests(
        tuple(messages),
        (*known.own[:k], *own) if hashed else (),
        (*known.keys[:k], *keys),
        (*known.marked[:k], *marked),
        (*known.compaction[:k], *found),
        hashes,
        tuple(canonical),
        k,
    )
