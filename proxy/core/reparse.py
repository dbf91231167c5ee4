"""Parse a re-sent request body without parsing its history again.

An agent sends its whole conversation on every turn: the body of turn N+1 is, byte for byte, the
body of turn N up to somewhere in its last messages (the client moves its ``cache_control``
breakpoint), then the new messages and the rest of the request. ``BodyMemo.parse`` parses only
what changed and hands back, for the messages it parsed before, the very same objects. The
result is always the value ``orjson.loads`` gives for the whole body (equal, with the same key
order), or ``orjson.loads`` is what ran. Any layout works alike: compact, ``json.dumps``
defaults (``", "``, ``": "``, ASCII escapes), indented, any whitespace between tokens, keys in
any order -- as long as a client writes its history the same way from turn to turn.

How, for a body ``text`` and a body ``prev`` remembered from an earlier request:

1. ``prev`` knows where its top-level ``messages`` array starts and where each element ends
   (just after its last byte): at learning time ``text[:start] + b"]}"`` parsed as an object
   whose last key is ``messages`` (so the array is the value of the top-level key ``messages``),
   and the elements were located by ``proxy.core.rawjson`` (each one's bytes found where it must
   be, the array's last ``messages`` member being the one ``orjson`` keeps).
2. ``j``: the most elements such that ``text`` and ``prev`` are equal up to the end of element
   ``j - 1``. A JSON parser that reads those bytes is then in the same state for both: inside
   the top-level object, inside the ``messages`` array, just after element ``j - 1``, with the
   same values read so far.
3. The rest, ``text[end_j:]`` (whitespace, ``,`` and more elements, or ``]``; then the other
   members and ``}``), is parsed alone as the continuation of that state: ``{"<key>":[`` + the
   rest after its comma, ``<key>`` a random per-process key that no client can know. It parses
   iff the whole text parses from that state (a trailing comma, ``,]``, is refused separately).
   When ``text`` ends with the very bytes that followed ``prev``'s last element (the ``]``, then
   ``system``, ``tools``, ...: Claude Code sends those after ``messages``), only the new elements
   between are parsed, as ``[[`` + them + ``]]`` (that parses iff they are values separated by
   commas, which leaves the parser after an element, the state those bytes followed in
   ``prev``; nested as deep as in the body, so orjson's depth limit holds), and the members
   after the array are ``prev``'s.
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
messages' values. ``Parsed.reused_members`` names the other members whose values are those of
the remembered body (the edge does not check their nesting again).

Cost: a continued body costs a compare of the remembered bytes (memcmp) plus parsing what is new;
learning where a never-seen body's elements end is one msgspec scan of the text (no values built)
and one compare, made only when a later body first looks like its next turn (a body whose
conversation goes on elsewhere, or nowhere, never pays it); learning a continued body's new
elements scans only those.

Memory: entries are kept in an LRU bounded by the total size of their texts (the parsed objects
take a few times that), 16 MiB by default: some 45 conversations of ~360 KiB; a conversation
keeps one entry (its latest body). The parsed containers stay alive, so the garbage collector's
full collections walk them: ~700 tracked objects per ~360 KiB body, ~1 us each on a slow core,
i.e. up to ~30 ms per full collection with the memo full -- rare (the proxy ``gc.freeze()``s at
start-up and a request leaves few survivors), but the reason for the bound. Bodies smaller than
``min_bytes`` are not remembered (they parse fast anyway). Not thread-safe: one event loop.
"""

from __future__ import annotations

import operator
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from proxy.core.bounded import Bounded
from proxy.core.canonical import strip_markers
from proxy.core.compaction.digest import Digests, Resent
from proxy.core.protocol import Checkpoint
from proxy.core.rawjson import array_starts, element_ends, elements

__all__ = ["BodyMemo", "Parsed"]

# bytes of the first message that go into the lookup key with the members before it: bodies
# whose first messages differ early are apart; the others (agents often start every session with
# the same long preamble) share a key, and are told apart by their first message, then more
_PROBE = 256
# A body that re-uses all but at most this many of a remembered body's messages is its next turn
# (an agent's client moves its cache breakpoint into the last few messages).
_SAME_CONVERSATION = 4
# "messages" keys tried for the top-level array (a nested one comes first only when a member
# before the array holds one)
_TRIED_STARTS = 4
# Memory an entry takes (measured: tests/test_bounded_caches.py, Claude Code's own bodies ~2-3x):
# its text, its parsed messages and bookkeeping, ~MEMORY_PER_TEXT_BYTE times the text (counted as
# its weight), plus a fixed part.
MEMORY_PER_TEXT_BYTE = 3.3
ENTRY_BYTES = 2000
_COMMA = re.compile(rb"[ \t\n\r]*,")
_NEXT = re.compile(rb"[ \t\n\r]*([,\]])")
_EMPTY: frozenset[str] = frozenset()


@dataclass(slots=True, eq=False)
class _Entry:
    """A remembered body: its text, the members before ``messages``, its elements, their ends."""

    scope: str
    probe: int
    text: bytes
    head: dict[str, Any]  # the members before the array; "messages" at its place, value []
    start: int  # offset just after the array's ``[``
    ends: list[int]  # ends[k]: offset just after element k's last byte
    messages: list[Any]  # the elements, parsed (len(messages) == len(ends))
    # when every element is known: the bytes from the end of the last element (whitespace, the
    # array's ``]``) to the end, and the members they hold (parsed when first needed; never
    # ``messages``; ``None`` when they cannot be parsed alone)
    trailer: bytes | None = None
    members: dict[str, Any] | None = None
    members_known: bool = False
    digests: Digests | None = None  # of ``messages`` (when compaction hashed them)
    checkpoints: tuple[Checkpoint, ...] = ()  # validator states after the first k messages
    # a never-seen body's elements are located when a later body first looks like its next
    # turn (``BodyMemo._located``): until then ``ends`` is empty and ``trailer`` unknown
    located: bool = True


@dataclass(slots=True, eq=False)
class Parsed:
    """A parsed body; ``reused``: how many leading messages are objects of an earlier body
    (``body["messages"]`` is then a ``Resent``); ``reused_members``: the other members whose
    values are those of that body. ``remember`` keeps it for the next turn."""

    body: Any
    text: bytes
    scope: str
    reused: int = 0
    checkpoint: Checkpoint | None = None  # the latest one at or before ``reused``
    reused_members: frozenset[str] = _EMPTY
    _prev: _Entry | None = None
    _memo: BodyMemo | None = None
    _entry: _Entry | None = field(default=None)
    _members: dict[str, Any] | None = None  # the members after the array (when continued)
    # where the new elements are in ``text`` (when continued with some): from ``_at`` (after
    # the comma) to ``_stop`` (where the remembered trailer starts; -1: the rest of the text)
    _at: int = -1
    _stop: int = -1

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
            map(operator.is_, entry.messages, digests.messages)
        ):
            entry.digests = digests.carried()


@dataclass(slots=True, frozen=True)
class _Tail:
    """What follows the remembered elements in a new text: the new elements, the members after
    the array, where the new elements are, and whether those members are the remembered ones."""

    elements: list[Any]
    members: dict[str, Any]
    at: int = -1
    stop: int = -1
    same_members: bool = False


class BodyMemo:
    """The latest body of each conversation, parsed, keyed by ``scope`` (the tenant) and the
    start of the text; bounded by ``max_bytes`` of text."""

    def __init__(self, max_bytes: int = 16 << 20, min_bytes: int = 64 << 10) -> None:
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        # id(entry) -> entry, oldest learnt first (``body_memo`` in the metrics): bounded by the
        # bytes of text (each entry's weight); their parsed objects take ~``MEMORY_PER_TEXT_BYTE``
        # times that. An entry pushed out leaves ``_by_probe`` too.
        self.entries: Bounded[int, _Entry] = Bounded(
            "body_memo",
            max_bytes // max(1, min_bytes) + 1 if max_bytes else 0,
            entry_bytes=ENTRY_BYTES,
            max_weight=max_bytes,
            weight_factor=MEMORY_PER_TEXT_BYTE,
            on_evict=self._unindex,
            idle_forget=True,
        )
        self._by_probe: dict[tuple[str, int], list[_Entry]] = {}
        self._key = secrets.token_hex(16).encode()  # the continuation's key; see the module doc
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def size(self) -> int:
        """Bytes of text remembered."""
        return self.entries.weight

    def forget_idle(self, now: float, idle: float) -> int:
        """Forget the bodies of conversations with no turn for ``idle`` seconds (their next
        turn, if any, is parsed whole); the count forgotten."""
        return self.entries.forget_idle(now, idle)

    # --- parsing ---------------------------------------------------------------------------

    def parse(self, scope: str, text: bytes) -> Parsed:
        """``orjson.loads(text)``, re-using a remembered body of ``scope`` when ``text`` starts
        like it. Raises what ``orjson.loads`` raises."""
        if len(text) >= self.min_bytes and self._by_probe:
            for tried, start in enumerate(array_starts(text)):
                if tried == _TRIED_STARTS:
                    break
                group = self._by_probe.get((scope, _probe(text, start)))
                if group is None:
                    if _top_level(text, start):
                        break  # the body's own array, never seen: no later start can be it
                    continue  # a nested "messages" key: the array is further on
                best: tuple[int, _Entry] | None = None
                for entry in list(group):
                    if entry.start != start or not self._located(entry):
                        continue
                    if not _same_first(text, entry):
                        continue  # another conversation (one compare, to its first difference)
                    j = _common(text, entry)
                    if j and (best is None or j > best[0]):
                        best = (j, entry)
                if best is not None:
                    parsed = self._continue(scope, text, *best)
                    if parsed is not None:
                        self.hits += 1
                        return parsed
                break
        self.misses += 1
        return Parsed(orjson.loads(text), text, scope, _memo=self)

    def _continue(self, scope: str, text: bytes, j: int, entry: _Entry) -> Parsed | None:
        """The body of ``text`` from ``entry``'s first ``j`` elements and the rest parsed alone;
        ``None`` when the rest is not a plain continuation (parse it all instead)."""
        end = entry.ends[j - 1]
        tail = self._between(text, end, entry) or self._rest(text, end)
        if tail is None:
            return None
        members = tail.members
        body = dict(entry.head)
        body["messages"] = Resent([*entry.messages[:j], *tail.elements], entry.digests)
        for name, value in members.items():
            body[name] = value
        if tail.same_members:  # the remembered body's values, all of them
            reused = frozenset(body)
        elif entry.members_known and entry.members is not None:
            # the members before the array that nothing after it overrides, then or now
            old = entry.members
            reused = frozenset(n for n in entry.head if n not in members and n not in old)
        else:
            reused = _EMPTY
        checkpoint = None
        for cp in entry.checkpoints:
            if cp.index <= j and (checkpoint is None or cp.index > checkpoint.index):
                checkpoint = cp
        return Parsed(
            body,
            text,
            scope,
            j,
            checkpoint,
            reused - {"messages"},
            entry,
            self,
            _members=members,
            _at=tail.at,
            _stop=tail.stop,
        )

    def _between(self, text: bytes, end: int, entry: _Entry) -> _Tail | None:
        """The new elements when ``text`` ends with ``entry``'s trailer, and its members."""
        trailer = entry.trailer
        if trailer is None:
            return None
        stop = len(text) - len(trailer)
        if stop < end or not text.endswith(trailer):
            return None
        members = self._trailer_members(entry)
        if members is None:
            return None
        if stop == end:
            return _Tail([], members, same_members=True)
        comma = _COMMA.match(text, end)
        if comma is None or comma.end() > stop:
            return None
        at = comma.end()
        try:
            # nested as deep as in the body (``{"messages":[``), so orjson's depth limit holds
            elements = orjson.loads(b"[[" + text[at:stop] + b"]]")[0]
        except orjson.JSONDecodeError:
            return None
        if not elements:  # "," alone: a trailing comma
            return None
        return _Tail(elements, members, at, stop, same_members=True)

    def _rest(self, text: bytes, end: int) -> _Tail | None:
        """The new elements and the members after the array, parsed from ``text[end:]``."""
        found = _NEXT.match(text, end)
        if found is None:
            return None
        more = found.group(1) == b","
        at = found.end() if more else found.end() - 1
        members = self._members(text[at:])
        if members is None:
            return None
        elements = members.pop(self._key.decode())
        if more and not elements:  # ",]": a trailing comma, which the whole text does not allow
            return None
        return _Tail(elements, members, at if more else -1)

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

    def _trailer_members(self, entry: _Entry) -> dict[str, Any] | None:
        """The members in ``entry``'s trailer, parsed the first time they are needed."""
        if not entry.members_known and entry.trailer is not None:
            members = self._members(entry.trailer)
            if members is not None:
                del members[self._key.decode()]
            entry.members, entry.members_known = members, True
        return entry.members

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
        if prev is None:
            self._drop_superseded(parsed.scope, messages)
        located = prev is not None
        if prev is not None:
            start, head = prev.start, prev.head
            ends = prev.ends[: parsed.reused]
            ends += _new_ends(parsed, len(messages) - parsed.reused) or []
            count = len(ends)
        else:
            # Where a never-seen body's elements end is found only if a next turn comes: one
            # msgspec scan of the whole text, wasted on a body whose conversation goes on
            # elsewhere (another replica) or not at all. Here: where its array starts.
            found = _array_of(text)
            if found is None:
                return None
            start, head = found
            ends, count = [], len(messages)
        entry = _Entry(
            parsed.scope,
            _probe(text, start),
            text,
            head,
            start,
            ends,
            list(messages[:count]),
            checkpoints=tuple(cp for cp in checkpoints if cp.index <= count),
            located=located,
        )
        if located and count == len(messages):
            entry.trailer = text[ends[-1] :]
            if parsed._members is not None:  # continued: the members after the array, parsed
                entry.members, entry.members_known = parsed._members, True
        self._add(entry)
        return entry

    def _drop_superseded(self, scope: str, messages: list[Any]) -> None:
        """A body that continued no remembered one may still be the next turn of one: the same
        conversation (scope) whose first message differs only in ``cache_control`` markers
        (Claude Code moves its breakpoint off the first message on the second turn). That body is
        superseded: dropped, not kept beside its successor until the LRU evicts it."""
        first = strip_markers(messages[0])
        for entry in [e for e in self.entries.values() if e.scope == scope]:
            if len(entry.messages) < len(messages) and strip_markers(entry.messages[0]) == first:
                self._drop(entry)

    def _located(self, entry: _Entry) -> bool:
        """Whether ``entry``'s elements are located (locating them now if not yet); an entry
        whose elements cannot be located is dropped."""
        if entry.located:
            return True
        ends = _element_ends_of(entry.text, entry.start, len(entry.messages))
        if ends is None:
            self._drop(entry)
            return False
        entry.ends, entry.located = ends, True
        entry.trailer = entry.text[ends[-1] :]
        return True

    def _add(self, entry: _Entry) -> None:
        self._by_probe.setdefault((entry.scope, entry.probe), []).insert(0, entry)
        self.entries.put(id(entry), entry, len(entry.text))  # the oldest go beyond the bounds

    def _drop(self, entry: _Entry) -> None:
        if self.entries.pop(id(entry)) is not None:
            self._unindex(id(entry), entry)

    def _unindex(self, _key: int, entry: _Entry) -> None:
        group = self._by_probe.get((entry.scope, entry.probe), [])
        group[:] = [e for e in group if e is not entry]
        if not group:
            self._by_probe.pop((entry.scope, entry.probe), None)


def _top_level(text: bytes, start: int) -> dict[str, Any] | None:
    """The members before the array when the ``[`` just before ``start`` opens the top-level
    object's ``messages`` member (its text up to there, plus ``]}``, is such an object)."""
    try:
        head = orjson.loads(text[:start] + b"]}")
    except orjson.JSONDecodeError:
        return None  # a nested "messages" key
    if type(head) is dict and next(reversed(head), None) == "messages":
        return head
    return None


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


def _array_of(text: bytes) -> tuple[int, dict[str, Any]] | None:
    """Where the top-level ``messages`` array of a never-seen ``text`` (valid JSON) starts,
    and the members before it."""
    for tried, start in enumerate(array_starts(text)):
        if tried == _TRIED_STARTS:
            return None
        head = _top_level(text, start)
        if head is not None:
            return start, head
    return None


def _element_ends_of(text: bytes, start: int, count: int) -> list[int] | None:
    """Where the ``count`` elements of the array starting at ``start`` in ``text`` end."""
    raws = elements(text)
    if raws is None or len(raws) != count:
        return None
    return element_ends(text, start, raws)


def _new_ends(parsed: Parsed, count: int) -> list[int] | None:
    """The ends of the ``count`` elements a continued body added after the reused ones."""
    if count == 0:
        return []
    text, at, stop = parsed.text, parsed._at, parsed._stop
    if at < 0:
        return None
    region = text[at:stop] + b"]}" if stop >= 0 else text[at:]
    raws = elements(b'{"messages":[' + region)
    if raws is None or len(raws) != count:
        return None
    return element_ends(text, at, raws)
