"""Parse a re-sent request body without parsing its history again.

An agent sends its whole conversation on every turn: the body of turn N+1 is, byte for byte, the
body of turn N up to somewhere in its last messages (the client moves its ``cache_control``
breakpoint), then the new messages and the rest of the request. ``BodyMemo.parse`` parses only
what changed and hands back, for the messages it parsed before, the very same objects. The
result is always the value ``orjson.loads`` gives for the whole body (equal, with the same key
order), or ``orjson.loads`` is what ran.

How, for a body ``text`` and a body ``prev`` remembered from an earlier request:

1. ``prev`` knows where its top-level ``messages`` array starts and where each element ends: at
   learning time each element's compact JSON (``orjson.dumps``) was found there byte for byte,
   and ``text[:start] + b"]}"`` parsed as an object whose last key is ``messages`` (so the array
   is the value of the top-level key ``messages``).
2. ``j``: the most elements such that ``text`` and ``prev`` are equal up to the end of element
   ``j - 1``. A JSON parser that reads those bytes is then in the same state for both: inside
   the top-level object, inside the ``messages`` array, just after element ``j - 1``, with the
   same values read so far.
3. The rest, ``text[end_j:]`` (``,`` and more elements, or ``]``; then the other members and
   ``}``), is parsed alone as the continuation of that state: ``{"<key>":[`` + the rest after its
   comma, ``<key>`` a random per-process key that no client can know. It parses iff the whole
   text parses from that state (a trailing comma, ``,]``, is refused separately).
   When ``text`` ends with the very bytes that followed ``prev``'s last element (the ``]``, then
   ``system``, ``tools``, ...: Claude Code sends those after ``messages``), only the new elements
   between are parsed, as ``[`` + them + ``]`` (that parses iff they are values separated by
   commas, which leaves the parser after an element, the state those bytes followed in
   ``prev``), and the members after the array are ``prev``'s.
4. The body is the remembered members before ``messages`` (a new dict with their keys in order),
   ``messages`` = the ``j`` remembered elements + the new ones, then the continuation's members
   assigned in order: ``orjson`` keeps a duplicated key at its first position with its last value,
   and so does assigning. A continuation that holds ``messages`` again (a duplicate that would
   replace the array) is parsed in full instead.

Anything unexpected falls back to ``orjson.loads(text)``, which also raises the errors as before.

Objects are shared between the requests of a conversation: the proxy never mutates a parsed body
(the compaction core never mutates its input, the edge builds new dicts and lists). Each entry
also carries what was learnt about its messages: the validator's checkpoints
(``protocol.scan_messages``) and the compaction digests (``Resent``), both functions of the
messages' values.

Memory: entries are kept in an LRU bounded by the total size of their texts (the parsed objects
take a few times that), 16 MiB by default: some 45 conversations of ~360 KiB; a conversation
keeps one entry (its latest body). The parsed containers stay alive, so the garbage collector's
full collections walk them: ~700 tracked objects per ~360 KiB body, ~1 us each on a slow core,
i.e. up to ~30 ms per full collection with the memo full -- rare (the proxy ``gc.freeze()``s at
start-up and a request leaves few survivors), but the reason for the bound. Bodies smaller than
``min_bytes`` are not remembered (they parse fast anyway). Not thread-safe: one event loop.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from proxy.core.compaction.digest import Digests, Resent
from proxy.core.protocol import Checkpoint

__all__ = ["BodyMemo", "Parsed"]

_OPEN = b'"messages":['
# bytes of the first message that go into the lookup key with the members before it: bodies
# whose first messages differ early are apart; the others (agents often start every session with
# the same long preamble) share a key, and are told apart by their first message, then more
_PROBE = 256
# A body that re-uses all but at most this many of a remembered body's messages is its next turn
# (an agent's client moves its cache breakpoint into the last few messages).
_SAME_CONVERSATION = 4


@dataclass(slots=True, eq=False)
class _Entry:
    """A remembered body: its text, the members before ``messages``, its elements, their ends."""

    scope: str
    probe: int
    text: bytes
    head: dict[str, Any]  # the members before the array; "messages" at its place, value []
    start: int  # offset of the first element (just after ``[``)
    ends: list[int]  # ends[k]: offset just after element k (its ``,`` or the ``]``)
    messages: list[Any]  # the elements, parsed (len(messages) == len(ends))
    # when every element is known: the bytes from the array's ``]`` to the end, and the members
    # they hold (parsed; never ``messages``)
    trailer: bytes | None = None
    members: dict[str, Any] | None = None
    digests: Digests | None = None  # of ``messages`` (when compaction hashed them)
    checkpoints: tuple[Checkpoint, ...] = ()  # validator states after the first k messages


@dataclass(slots=True, eq=False)
class Parsed:
    """A parsed body; ``reused``: how many leading messages are objects of an earlier body
    (``body["messages"]`` is then a ``Resent``). ``remember`` keeps it for the next turn."""

    body: Any
    text: bytes
    scope: str
    reused: int = 0
    checkpoint: Checkpoint | None = None  # the latest one at or before ``reused``
    _prev: _Entry | None = None
    _memo: BodyMemo | None = None
    _entry: _Entry | None = field(default=None)
    _members: dict[str, Any] | None = None  # the members after the array (when continued)

    @property
    def rememberable(self) -> bool:
        """Whether ``remember`` would keep this body (its size is in the memo's range): the
        checkpoints for it are worth making."""
        memo = self._memo
        return memo is not None and memo.min_bytes <= len(self.text) <= memo.max_bytes

    def remember(self, checkpoints: Sequence[Checkpoint] = ()) -> None:
        """Keep this body (a valid request) for the next turn, with the validator's
        ``checkpoints`` of its messages."""
        if self._memo is not None:
            self._entry = self._memo._learn(self, tuple(checkpoints))

    def keep_digests(self, digests: Digests | None) -> None:
        """The compaction digests of this body's messages, for the next turn."""
        entry = self._entry
        if entry is None or digests is None:
            return
        if len(digests.messages) >= len(entry.messages) and all(
            a is b for a, b in zip(entry.messages, digests.messages, strict=False)
        ):
            entry.digests = digests


class BodyMemo:
    """The latest body of each conversation, parsed, keyed by ``scope`` (the tenant) and the
    start of the text; bounded by ``max_bytes`` of text."""

    def __init__(self, max_bytes: int = 16 << 20, min_bytes: int = 64 << 10) -> None:
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._size = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry, LRU
        self._by_probe: dict[tuple[str, int], list[_Entry]] = {}
        self._key = secrets.token_hex(16).encode()  # the continuation's key; see the module doc
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes of text remembered."""
        return self._size

    # --- parsing ---------------------------------------------------------------------------

    def parse(self, scope: str, text: bytes) -> Parsed:
        """``orjson.loads(text)``, re-using a remembered body of ``scope`` when ``text`` starts
        like it. Raises what ``orjson.loads`` raises."""
        if len(text) >= self.min_bytes:
            start = text.find(_OPEN) + len(_OPEN)
            if start >= len(_OPEN):
                probe = _probe(text, start)
                best: tuple[int, _Entry] | None = None
                for entry in self._by_probe.get((scope, probe), ()):
                    if entry.start != start or not _same_first(text, entry):
                        continue  # another conversation (one compare, to its first difference)
                    j = _common(text, entry)
                    if j and (best is None or j > best[0]):
                        best = (j, entry)
                if best is not None:
                    parsed = self._continue(scope, text, *best)
                    if parsed is not None:
                        self.hits += 1
                        return parsed
        self.misses += 1
        return Parsed(orjson.loads(text), text, scope, _memo=self)

    def _continue(self, scope: str, text: bytes, j: int, entry: _Entry) -> Parsed | None:
        """The body of ``text`` from ``entry``'s first ``j`` elements and the rest parsed alone;
        ``None`` when the rest is not a plain continuation (parse it all instead)."""
        end = entry.ends[j - 1]
        found = self._between(text, end, entry)
        if found is None:
            found = self._rest(text, end)
        if found is None:
            return None
        tail, members = found
        body = dict(entry.head)
        body["messages"] = Resent([*entry.messages[:j], *tail], entry.digests)
        for name, value in members.items():
            body[name] = value
        checkpoint = None
        for cp in entry.checkpoints:
            if cp.index <= j and (checkpoint is None or cp.index > checkpoint.index):
                checkpoint = cp
        return Parsed(body, text, scope, j, checkpoint, entry, self, _members=members)

    def _between(
        self, text: bytes, end: int, entry: _Entry
    ) -> tuple[list[Any], dict[str, Any]] | None:
        """The new elements when ``text`` ends with ``entry``'s trailer, and its members."""
        trailer, members = entry.trailer, entry.members
        if trailer is None or members is None:
            return None
        stop = len(text) - len(trailer)
        if stop < end or not text.endswith(trailer):
            return None
        if stop == end:
            return [], members
        if text[end : end + 1] != b",":
            return None
        try:
            # nested as deep as in the body (``{"messages":[``), so orjson's depth limit holds
            tail = orjson.loads(b"[[" + text[end + 1 : stop] + b"]]")[0]
        except orjson.JSONDecodeError:
            return None
        if not tail:  # "," alone: a trailing comma
            return None
        return tail, members

    def _rest(self, text: bytes, end: int) -> tuple[list[Any], dict[str, Any]] | None:
        """The new elements and the members after the array, parsed from ``text[end:]``."""
        rest = text[end:]
        more = rest[:1] == b","
        if not more and rest[:1] != b"]":
            return None
        members = self._members(rest[1:] if more else rest)
        if members is None:
            return None
        tail = members.pop(self._key.decode())
        if more and not tail:  # ",]": a trailing comma, which the whole text does not allow
            return None
        return tail, members

    def _members(self, rest: bytes) -> dict[str, Any] | None:
        """``rest`` (elements, ``]``, members, ``}``) parsed after ``{"<key>":[``; ``None``
        unless it parses and holds no ``messages`` member."""
        try:
            parsed = orjson.loads(b'{"' + self._key + b'":[' + rest)
        except orjson.JSONDecodeError:
            return None
        if type(parsed) is not dict or "messages" in parsed:
            return None
        return parsed

    # --- learning --------------------------------------------------------------------------

    def _learn(self, parsed: Parsed, checkpoints: tuple[Checkpoint, ...]) -> _Entry | None:
        """Remember ``parsed`` (replacing the body it was continued from)."""
        text = parsed.text
        body = parsed.body
        prev = parsed._prev
        if (
            prev is not None
            and parsed.reused > 1
            and parsed.reused + _SAME_CONVERSATION >= len(prev.ends)
        ):
            # the next turn of that body: it replaces it (two conversations that only share
            # their first messages keep an entry each, rather than evicting each other)
            self._drop(prev)
        if len(text) < self.min_bytes or len(text) > self.max_bytes or type(body) is not dict:
            return None
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        if prev is not None:
            start, head = prev.start, prev.head
            ends = prev.ends[: parsed.reused]
        else:
            start = text.find(_OPEN) + len(_OPEN)
            if start < len(_OPEN) or text[start - len(_OPEN) - 1 : start - len(_OPEN)] not in (
                b"{",
                b",",
            ):
                return None
            try:
                head = orjson.loads(text[:start] + b"]}")
            except orjson.JSONDecodeError:
                return None
            if type(head) is not dict or next(reversed(head), None) != "messages":
                return None
            ends = []
        ends += _element_ends(text, messages, start, ends)
        if not ends:
            return None
        count = len(ends)
        entry = _Entry(
            parsed.scope,
            _probe(text, start),
            text,
            head,
            start,
            ends,
            list(messages[:count]),
            checkpoints=tuple(cp for cp in checkpoints if cp.index <= count),
        )
        if count == len(messages) and text[ends[-1] : ends[-1] + 1] == b"]":
            trailer = text[ends[-1] :]
            if prev is not None and prev.trailer == trailer:
                entry.trailer, entry.members = prev.trailer, prev.members
            else:
                members = parsed._members
                if members is None:  # parsed in full: the members after the array, alone
                    members = self._members(trailer)
                    if members is not None:
                        del members[self._key.decode()]
                entry.trailer, entry.members = trailer, members
        self._add(entry)
        return entry

    def _add(self, entry: _Entry) -> None:
        self._entries[id(entry)] = entry
        self._by_probe.setdefault((entry.scope, entry.probe), []).insert(0, entry)
        self._size += len(entry.text)
        while self._size > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries.values())))

    def _drop(self, entry: _Entry) -> None:
        if self._entries.pop(id(entry), None) is None:
            return
        self._size -= len(entry.text)
        group = self._by_probe.get((entry.scope, entry.probe), [])
        group[:] = [e for e in group if e is not entry]
        if not group:
            self._by_probe.pop((entry.scope, entry.probe), None)


def _probe(text: bytes, start: int) -> int:
    return xxhash.xxh3_64_intdigest(memoryview(text)[: start + _PROBE])


def _same_first(text: bytes, entry: _Entry) -> bool:
    """Whether ``text`` starts like ``entry`` up to the end of its first element."""
    return text.startswith(memoryview(entry.text)[: entry.ends[0]])


def _common(text: bytes, entry: _Entry) -> int:
    """The most elements ``j`` of ``entry`` with ``text`` equal to its text up to element
    ``j - 1``'s end (0: none). Agents change the last few: those are tried first."""
    ends = entry.ends
    old = memoryview(entry.text)

    def same(j: int) -> bool:
        return text.startswith(old[: ends[j - 1]])

    n = len(ends)
    for j in range(n, max(0, n - 4), -1):
        if same(j):
            return j
    lo, hi = 0, max(0, n - 4)  # same(lo) holds (lo 0: trivially); find the largest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if same(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _element_ends(text: bytes, messages: Sequence[Any], start: int, ends: list[int]) -> list[int]:
    """The ends of the elements after the first ``len(ends)`` (whose ends are ``ends``), as far
    as each one's compact JSON is in ``text`` where the element must be."""
    pos = ends[-1] + 1 if ends else start  # the first byte of the next element
    out: list[int] = []
    for i in range(len(ends), len(messages)):
        try:
            element = orjson.dumps(messages[i])
        except TypeError:
            break
        end = pos + len(element)
        if not text.startswith(element, pos):
            break
        sep = text[end : end + 1]
        if sep == b",":
            out.append(end)
            pos = end + 1
        elif sep == b"]" and i == len(messages) - 1:
            out.append(end)
        else:
            break
    return out
