"""Fold a relayed answer back into one assistant message, for the transcript.

Sans-I/O: it is fed the bytes the relay has already written (whole SSE events, or a JSON body) and
never delays the relay. Streams are folded the way the SDK's ``accumulate_event`` does: text,
thinking + signature, tool input JSON (parsed once at ``content_block_stop``), citations. A body
over ``limit`` bytes is not kept (the transcript then records that the answer was not captured).
"""

from __future__ import annotations

from typing import Any

import orjson


class AnswerAccumulator:
    __slots__ = ("_blocks", "_body", "_json", "_limit", "_message", "_size", "_sse", "stopped")

    def __init__(self, *, sse: bool, limit: int = 8 * 1024 * 1024) -> None:
        self._sse = sse
        self._limit = limit
        self._size = 0
        self._body: list[bytes] | None = []
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self.stopped = False  # saw message_stop (or a whole JSON message)

    def feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            self._body = None
            self._message = None
            return
        if not self._sse:
            if self._body is not None:
                self._body.append(data)
            return
        for line in data.split(b"\n"):
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def _event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._message = dict(event["message"])
            self._message["content"] = []
        elif self._message is None:
            return
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._blocks[int(event.get("index", len(self._blocks)))] = dict(event["content_block"])
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta"))
        elif kind == "content_block_stop":
            self._stop_block(int(event.get("index", 0)))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self._message.update({k: v for k, v in delta.items() if v is not None})
            if isinstance(event.get("usage"), dict):
                usage = dict(self._message.get("usage") or {})
                usage.update({k: v for k, v in event["usage"].items() if v is not None})
                self._message["usage"] = usage
        elif kind == "message_stop":
            self.stopped = True

    def _delta(self, index: int, delta: Any) -> None:
        block = self._blocks.get(index)
        if block is None or not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = str(delta.get("signature", ""))
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _stop_block(self, index: int) -> None:
        block = self._blocks.pop(index, None)
        if block is None or self._message is None:
            return
        parts = self._json.pop(index, None)
        if parts is not None:
            text = "".join(parts)
            try:
                block["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                block["input"] = {"_unparsed": text}
        self._message["content"].append(block)

    def message(self) -> dict[str, Any] | None:
        """The assistant message so far (``None`` when nothing could be captured)."""
        if not self._sse:
            if self._body is None:
                return None
            try:
                body = orjson.loads(b"".join(self._body))
            except orjson.JSONDecodeError:
                return None
            if isinstance(body, dict) and body.get("type") == "message":
                self.stopped = True
                return body
            return None
        if self._message is None:
            return None
        message = dict(self._message)
        # Blocks cut before their content_block_stop are kept as far as they got.
        message["content"] = [*message["content"], *self._blocks.values()]
        return message
