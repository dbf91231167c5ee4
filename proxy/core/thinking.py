"""Thinking blocks bound to their prefix: which ones a forwarded request would replay stale. Pure.

On the models with *preserved thinking* (the catalogue's rows with ``binds_thinking``:
:meth:`proxy.core.catalogue.Catalogue.binds_thinking`, citing the provider's "Preserved thinking"
pages), a ``thinking`` or ``redacted_thinking`` block is honoured only while everything before
it -- ``system``, ``tools``, every earlier message and the earlier blocks of its own message --
is what it was in the request that produced it. ``cache_control`` markers are left out of that comparison (the
prompt cache ignores them too; Claude Code moves its marker every turn), and so are turn-scoped
system messages (``role: "system"`` with ``clear_at``). A stale block is a 400 (``Invalid
`signature` in `thinking` block. The block is bound to a different conversation.``) unless the
request carries the beta ``thinking-binding-controls-2026-08-01`` and
``thinking.block_binding.prefix_mismatch_behavior: "drop_block"`` (spelled ``mismatch_behavior``
in some published docs: both are read, the SDK's spelling is written), or is silently dropped
on the models that do not refuse.

The proxy rewrites exactly that prefix (compaction, the durable block in ``system``, the
retrieval tool in ``tools``), so it must know, for each block it forwards, whether the prefix it
forwards now is the one the block was made under. It remembers, for every block an answer
brought (by the hash of its signature), the *binding key* of the forwarded request at that
block; a later request forwards the block under its own key. Equal keys: the block is valid.
Different: stale. Unknown (a block this process never saw made: another replica's, or made
before the proxy): stale exactly when the proxy changed something before it, compared with the
client's own request (the client is answerable for its own prefix).

Binding key of a block at ``messages[i].content[j]``: the rolling hash of the marker-free
canonical JSON of ``system`` and ``tools`` (one hash), then of each earlier message (turn-scoped
system messages skipped), then of ``content[:j]``. It is this module's own hash, never compared
with the provider's signature: only equality between two requests matters.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import xxhash

from proxy.core.bounded import Bounded
from proxy.core.canonical import strip_markers

__all__ = [
    "BEHAVIOR_KEYS",
    "BINDING_BETA",
    "BindingRecords",
    "Block",
    "Decision",
    "PrefixKeys",
    "answer_bindings",
    "client_behavior",
    "decide",
    "thinking_blocks",
    "with_drop_block",
    "without_blocks",
]

BINDING_BETA = "thinking-binding-controls-2026-08-01"
# How the client may have spelled its choice: the SDK's (``BetaThinkingBlockBindingParam``)
# first, then the one some published docs use.
BEHAVIOR_KEYS = ("prefix_mismatch_behavior", "mismatch_behavior")
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
Behavior = Literal["error", "drop_block"]
_PAIR = struct.Struct(">QQ")
_START = 0x5A17_7E5D  # the key before anything (a fixed, arbitrary seed)


def client_behavior(body: Mapping[str, Any]) -> Behavior | None:
    """The client's own ``thinking.block_binding`` choice (either spelling), or ``None``."""
    thinking = body.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, Mapping) else None
    if not isinstance(binding, Mapping):
        return None
    for key in BEHAVIOR_KEYS:
        value = binding.get(key)
        if value in ("error", "drop_block"):
            return value  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True, slots=True)
class Block:
    """A thinking block of a request: where it is and who it is (the hash of its signature,
    or of a redacted block's data)."""

    message: int
    index: int
    ident: int


def _ident(block: Mapping[str, Any]) -> int | None:
    value = block.get("signature") if block.get("type") == "thinking" else block.get("data")
    if not isinstance(value, str):
        return None
    return xxhash.xxh3_64_intdigest(value.encode("utf-8", "surrogatepass"))


def thinking_blocks(messages: Sequence[Any]) -> list[Block]:
    """The thinking blocks of the assistant messages, in order."""
    found: list[Block] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") in THINKING_TYPES:
                ident = _ident(block)
                if ident is not None:
                    found.append(Block(i, j, ident))
    return found


def _hash(value: Any) -> int:
    try:
        data = orjson.dumps(strip_markers(value), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        data = repr(value).encode("utf-8", "surrogatepass")
    return xxhash.xxh3_64_intdigest(data)


def _roll(key: int, part: int) -> int:
    return xxhash.xxh3_64_intdigest(_PAIR.pack(key, part))


def _counts(message: Any) -> bool:
    """Whether a message is part of the prefix a thinking block is bound to (a turn-scoped
    system message is not: it clears itself)."""
    return not (
        isinstance(message, Mapping) and message.get("role") == "system" and "clear_at" in message
    )


class PrefixKeys:
    """Binding keys of a request's positions. ``own(i)``: the marker-free hash of message ``i``
    (the compaction digests have them for a client's messages; ``None``: hash it here)."""

    def __init__(
        self,
        system: Any,
        tools: Any,
        messages: Sequence[Any],
        own: Callable[[int], int | None] | None = None,
    ) -> None:
        self.messages = messages
        key = _roll(_START, _hash([system, tools]))
        self._before = [key]  # _before[i]: the key before message i
        for i, message in enumerate(messages):
            if _counts(message):
                h = own(i) if own is not None else None
                key = _roll(key, h if h is not None else _hash(message))
            self._before.append(key)

    def at(self, message: int, index: int) -> int:
        """The key of a block at ``messages[message].content[index]``."""
        content = self.messages[message].get("content")
        head = content[:index] if isinstance(content, list) else []
        return _roll(self._before[message], _hash(head))

    @property
    def end(self) -> int:
        """The key after every message: where an answer to this request starts."""
        return self._before[-1]


def answer_bindings(end: int, answer: Mapping[str, Any]) -> dict[int, int]:
    """Ident -> binding key of each thinking block an answer brought, made after a request
    whose ``PrefixKeys.end`` is ``end``."""
    content = answer.get("content")
    if not isinstance(content, list):
        return {}
    out: dict[int, int] = {}
    for j, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") in THINKING_TYPES:
            ident = _ident(block)
            if ident is not None:
                out[ident] = _roll(end, _hash(content[:j]))
    return out


# Memory one record takes (measured: tests/test_bounded_caches.py): two 64-bit ints in an LRU.
RECORD_BYTES = 240


class BindingRecords:
    """Bounded LRU (``thinking_records`` in the metrics): ident -> the binding key its block was
    made under. One event loop.

    A miss (a block made before the bound pushed its record out, or on another replica) is judged
    as an unknown block: stale exactly when the proxy changed something before it. So a block
    whose prefix the proxy rewrote is then asked to be dropped (``drop_block``, or dropped here
    with thinking off) though it may have been valid: the model loses that block's reasoning,
    never gets a stale one."""

    def __init__(self, max_entries: int = 20_000) -> None:
        self.cache: Bounded[int, int] = Bounded(
            "thinking_records", max_entries, entry_bytes=RECORD_BYTES
        )

    def __len__(self) -> int:
        return len(self.cache)

    def learn(self, bindings: Mapping[int, int]) -> None:
        for ident, key in bindings.items():
            self.cache.put(ident, key)

    def get(self, ident: int) -> int | None:
        return self.cache.get(ident)


def stale_blocks(
    forwarded: PrefixKeys,
    blocks: Sequence[Block],
    records: BindingRecords,
    client: Mapping[int, int],
) -> list[Block]:
    """The blocks of ``forwarded`` whose prefix differs from the one they were made under:
    known ones by their record, unknown ones when the forwarded key differs from the client's
    own request's key at that block (``client``: ident -> key)."""
    stale: list[Block] = []
    for block in blocks:
        key = forwarded.at(block.message, block.index)
        made = records.get(block.ident)
        if made is None:
            made = client.get(block.ident, key)
        if made != key:
            stale.append(block)
    return stale


Action = Literal["none", "asked-to-drop", "dropped", "deferred", "forwarded"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request's thinking blocks on a binding model. ``action``: ``none``
    (nothing stale), ``asked-to-drop`` (the beta and ``drop_block`` added: the provider drops
    ``count`` stale blocks), ``dropped`` (thinking is off, or the platform does not take the
    beta: the proxy removed ``count`` stale blocks itself), ``deferred`` (the client chose ``error``: forward its own prefix),
    ``forwarded`` (the client already chose ``drop_block``: as sent)."""

    action: Action
    count: int
    stale: tuple[Block, ...] = ()


def decide(
    body: Mapping[str, Any],
    forwarded: PrefixKeys,
    blocks: Sequence[Block],
    records: BindingRecords,
    client: Mapping[int, int],
    can_ask: bool = True,
) -> Decision:
    """The decision for a forwarded request (``forwarded``'s messages) of a binding model;
    ``can_ask``: the upstream platform takes the binding beta (a platform that does not, such
    as Foundry, loses it and its ``block_binding`` on the way: the proxy drops the stale blocks
    itself, whether it or the client would have asked the provider to)."""
    stale = stale_blocks(forwarded, blocks, records, client)
    if not stale:
        return Decision("none", 0)
    behavior = client_behavior(body)
    if not can_ask and behavior != "error":
        return Decision("dropped", len(stale), tuple(stale))
    if behavior == "drop_block":
        return Decision("forwarded", len(stale), tuple(stale))
    if behavior == "error":
        return Decision("deferred", len(stale), tuple(stale))
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "disabled":
        return Decision("dropped", len(stale), tuple(stale))
    return Decision("asked-to-drop", len(stale), tuple(stale))


def with_drop_block(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` asking the provider to drop stale blocks: ``thinking.block_binding
    .prefix_mismatch_behavior = "drop_block"`` in the request's own thinking type (a request
    without ``thinking`` gets ``adaptive``, what models with preserved thinking do by default).
    The client's other ``block_binding`` fields are kept."""
    thinking = body.get("thinking")
    current = dict(thinking) if isinstance(thinking, Mapping) else {"type": "adaptive"}
    binding = current.get("block_binding")
    binding = dict(binding) if isinstance(binding, Mapping) else {}
    binding["prefix_mismatch_behavior"] = "drop_block"
    current["block_binding"] = binding
    return {**body, "thinking": current}


def without_blocks(messages: Sequence[Any], blocks: Iterable[Block]) -> list[Any]:
    """``messages`` without the given thinking blocks (new lists and dicts; the rest by
    reference). A message left empty keeps a placeholder-free shape: it is dropped only if it
    held nothing else, which an assistant message never does (its last block is never
    thinking)."""
    drop: dict[int, set[int]] = {}
    for block in blocks:
        drop.setdefault(block.message, set()).add(block.index)
    out: list[Any] = []
    for i, message in enumerate(messages):
        gone = drop.get(i)
        if not gone:
            out.append(message)
            continue
        content = [b for j, b in enumerate(message["content"]) if j not in gone]
        if content:
            out.append({**message, "content": content})
    return out
