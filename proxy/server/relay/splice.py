"""Splice the streamed rounds of one answer into one SSE stream for the client (sans-I/O).

The proxy may answer the model's ``context_proxy_retrieve`` calls itself and call the provider
again (a hidden round); the client must still receive one well-formed message stream:

* the first round's ``message_start`` goes out; a continuation's is dropped (its usage kept);
* content blocks keep streaming as they arrive, their ``index`` shifted by the blocks already
  sent; an event whose index does not change leaves byte for byte as it came;
* from the first ``tool_use`` block of a round on, blocks are held back until the round ends:
  only then is it known whether the model called our tool. Our calls are never shown; when they
  are answered, the client's calls of the same round are dropped too (the model re-issues them
  after reading), else they are released in order;
* ``message_delta`` and ``message_stop`` are held until the last round: one ``message_delta``
  goes out, with usage summed over every round, then one ``message_stop``. A stream with no
  hidden round ends with the provider's own bytes.

Input is whole events (see :class:`proxy.server.relay.sse.EventSplitter`); output is bytes to write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.compaction.retrieval import is_ours, sum_usage
from proxy.server.relay.accumulate import AnswerAccumulator

__all__ = ["PING", "Round", "Splice", "split_events"]

PING = b'event: ping\ndata: {"type": "ping"}\n\n'
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def split_events(chunk: bytes) -> list[bytes]:
    """Whole events (each with its blank line) from bytes that end on an event boundary."""
    out: list[bytes] = []
    start = 0
    for m in _BOUNDARY.finditer(chunk):
        out.append(chunk[start : m.end()])
        start = m.end()
    if start < len(chunk):
        out.append(chunk[start:])
    return out


def _parse(raw: bytes) -> tuple[bytes, dict[str, Any] | None]:
    name = b""
    data: list[bytes] = []
    for line in raw.splitlines():
        if line.startswith(b"event:"):
            name = line[6:].strip()
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    if not data:
        return name, None
    try:
        value = orjson.loads(b"\n".join(data))
    except orjson.JSONDecodeError:
        return name, None
    return name, value if isinstance(value, dict) else None


def _event(name: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@dataclass(slots=True)
class Round:
    """One upstream answer as it streams."""

    number: int
    usage: dict[str, Any] = field(default_factory=dict)
    held: list[tuple[bytes, bytes, dict[str, Any]]] = field(default_factory=list)
    held_index: set[int] = field(default_factory=set)
    index_map: dict[int, int] = field(default_factory=dict)
    delta: dict[str, Any] | None = None
    delta_raw: bytes = b""
    stop_raw: bytes = b""
    complete: bool = False  # message_stop seen
    failed: bool = False  # an error event came through
    started: bool = False  # message_start seen
    accumulator: AnswerAccumulator = field(default_factory=lambda: AnswerAccumulator(sse=True))

    def content(self) -> list[Any]:
        message = self.accumulator.message()
        content = message.get("content") if message is not None else None
        return list(content) if isinstance(content, list) else []


class Splice:
    """The state of one client stream across its rounds."""

    __slots__ = ("_next", "hid_ours", "round", "usages")

    def __init__(self) -> None:
        self._next = 0  # the next client block index
        self.usages: list[dict[str, Any]] = []
        self.round = Round(1)
        self.hid_ours = False  # the last released round hid a call of ours

    def start_round(self) -> Round:
        self.usages.append(self._round_usage(self.round))
        self.round = Round(self.round.number + 1)
        return self.round

    def round_usages(self) -> list[dict[str, Any]]:
        """Each round's own usage so far (the current round's included)."""
        return [*self.usages, self._round_usage(self.round)]

    @staticmethod
    def _round_usage(r: Round) -> dict[str, Any]:
        usage = dict(r.usage)
        if r.delta is not None and isinstance(r.delta.get("usage"), dict):
            usage.update({k: v for k, v in r.delta["usage"].items() if v is not None})
        return usage

    def _reindexed(self, raw: bytes, name: bytes, data: dict[str, Any], index: int) -> bytes:
        if data.get("index") == index:
            return raw
        return _event(name, {**data, "index": index})

    def feed(self, raw: bytes) -> bytes:
        """One whole upstream event in; what the client gets now out (maybe ``b""``)."""
        r = self.round
        r.accumulator.feed(raw)
        name, data = _parse(raw)
        kind = data.get("type") if data is not None else None
        if data is None or not isinstance(kind, str):
            return raw  # a comment, or an event we do not read: as it came
        if kind == "message_start":
            r.started = True
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            r.usage = dict(usage) if isinstance(usage, dict) else {}
            return raw if r.number == 1 else b""
        if kind == "content_block_start":
            index = data.get("index")
            block = data.get("content_block")
            if not isinstance(index, int):
                return raw
            if r.held or (isinstance(block, dict) and block.get("type") == "tool_use"):
                r.held.append((raw, name, data))
                r.held_index.add(index)
                return b""
            r.index_map[index] = self._next
            self._next += 1
            return self._reindexed(raw, name, data, r.index_map[index])
        if kind in ("content_block_delta", "content_block_stop"):
            index = data.get("index")
            if isinstance(index, int) and index in r.held_index:
                r.held.append((raw, name, data))
                return b""
            mapped = r.index_map.get(index) if isinstance(index, int) else None
            return raw if mapped is None else self._reindexed(raw, name, data, mapped)
        if kind == "message_delta":
            r.delta = data
            r.delta_raw = raw
            return b""
        if kind == "message_stop":
            r.complete = True
            r.stop_raw = raw
            return b""
        if kind == "error":
            r.failed = True
        return raw  # ping, error, anything newer

    def our_calls(self) -> list[dict[str, Any]]:
        """The round's calls of our tool (whole blocks, inputs parsed)."""
        return [b for b in self.round.content() if is_ours(b)]

    def assistant_content(self, *, drop_client_calls: bool) -> list[Any]:
        """The round's blocks as the model wrote them (for the continuation), minus the
        client's calls when they are dropped."""
        return [
            b
            for b in self.round.content()
            if not (
                drop_client_calls
                and isinstance(b, dict)
                and b.get("type") == "tool_use"
                and not is_ours(b)
            )
        ]

    def release(self, *, drop_client_calls: bool) -> tuple[bytes, bool]:
        """The held blocks the client may see, re-indexed; and whether a client call was in."""
        r = self.round
        out: list[bytes] = []
        hidden: set[int] = set()
        client_call = False
        for raw, name, data in r.held:
            index = data["index"]
            if data.get("type") == "content_block_start":
                block = data.get("content_block")
                tool_use = isinstance(block, dict) and block.get("type") == "tool_use"
                if is_ours(block):
                    self.hid_ours = True
                    hidden.add(index)
                    continue
                if tool_use and drop_client_calls:
                    hidden.add(index)
                    continue
                client_call = client_call or tool_use
                r.index_map[index] = self._next
                self._next += 1
            if index in hidden or index not in r.index_map:
                continue
            out.append(self._reindexed(raw, name, data, r.index_map[index]))
        r.held.clear()
        r.held_index.clear()
        return b"".join(out), client_call

    def finish(self, retrievals: int, client_call: bool) -> bytes:
        """The one ``message_delta`` (usage summed over every round) and ``message_stop``."""
        r = self.round
        if retrievals == 0 and not self.hid_ours:
            return r.delta_raw + r.stop_raw  # nothing was spliced: the provider's own bytes
        delta = dict(r.delta or {"type": "message_delta", "delta": {}})
        usage = sum_usage([*self.usages, self._round_usage(r)])
        delta["usage"] = usage
        inner = dict(delta.get("delta") or {})
        if self.hid_ours and inner.get("stop_reason") == "tool_use" and not client_call:
            inner["stop_reason"] = "end_turn"  # the round limit hid our call: nothing to run
        delta["delta"] = inner
        comment = b": x-compaction-retrievals: " + str(retrievals).encode() + b"\n\n"
        stop = r.stop_raw or b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        return _event(b"message_delta", delta) + comment + stop
