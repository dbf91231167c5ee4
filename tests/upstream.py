"""The fake upstream: a real aiohttp server on 127.0.0.1, port 0, scriptable and recording.

Every request it receives is recorded (method, path, query, headers, raw body). Answers come from
a script queue (``FakeUpstream.script(...)``); with an empty queue it answers like the provider:
a message (JSON or SSE, per the request's ``stream``), ``{"input_tokens": N}`` for count_tokens,
a model list for ``/v1/models``.

Script entries: :class:`Reply` (JSON or any bytes, status, headers, optional delay and gzip),
:class:`Stream` (SSE events with pacing, optionally cut after N events or mid-event, or held
before an event until the test releases it),
:class:`Reset` (connection closed before any header), :class:`Hang` (never answers).

Opt-in provider rules (``FakeUpstream(rules=ProviderRules())`` or ``use_rules``, see
``tests/provider_rules``): every ``POST /v1/messages`` and ``/v1/messages/count_tokens`` is
checked first; a violation is answered with the provider's error (never reaching the script), an
on-demand compaction request is answered by the rules (without taking a script entry), and a
script entry may then be a :class:`Turn`, built for the request it answers (signed thinking,
``input_transformations``). Each check's :class:`Verdict` is kept in ``verdicts``. Without rules
nothing of this runs.
"""

from __future__ import annotations

import asyncio
import gzip as gzip_module
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from tests.provider_rules import ProviderRules, Turn, Verdict, betas_of

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):024d}"


RATE_LIMIT_HEADERS = {
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-requests-reset": "2026-12-02T12:00:00Z",
    "anthropic-organization-id": "org-fake",
}


def frame(event: str, data: Any) -> bytes:
    """One SSE frame: ``event: <name>\\ndata: <json>\\n\\n``."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def message_json(
    text: str = "Hello from the fake upstream.",
    *,
    model: str = "claude-fake-1",
    input_tokens: int = 0,  # 0: the proxy does not calibrate on it (scripts set real figures)
    output_tokens: int = 7,
    content: list[dict[str, Any]] | None = None,
    stop_reason: str = "end_turn",
) -> dict[str, Any]:
    return {
        "id": _next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content if content is not None else [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def text_stream_events(
    text: str = "Hello from the fake upstream, streaming.",
    *,
    deltas: int = 5,
    model: str = "claude-fake-1",
    input_tokens: int = 0,  # 0: the proxy does not calibrate on it (scripts set real figures)
) -> list[bytes]:
    """A complete, well-formed SSE answer with ``deltas`` text deltas (plus pings)."""
    msg = message_json("", model=model, input_tokens=input_tokens, output_tokens=1, content=[])
    msg["stop_reason"] = None
    events = [frame("message_start", {"type": "message_start", "message": msg})]
    events.append(
        frame(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
    )
    events.append(frame("ping", {"type": "ping"}))
    step = max(1, len(text) // max(1, deltas))
    pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    for piece in pieces:
        events.append(
            frame(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            )
        )
    events.append(frame("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(pieces)},
            },
        )
    )
    events.append(frame("message_stop", {"type": "message_stop"}))
    return events


def tool_use_stream_events(
    name: str, tool_input: dict[str, Any], *, tool_id: str | None = None, model: str = "claude-fake-1"
) -> list[bytes]:
    """A streamed assistant turn that calls one tool (stop_reason tool_use)."""
    msg = message_json("", model=model, content=[])
    msg["stop_reason"] = None
    tool_id = tool_id or _next_id("toolu")
    raw = orjson.dumps(tool_input).decode()
    half = len(raw) // 2
    return [
        frame("message_start", {"type": "message_start", "message": msg}),
        frame(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
            },
        ),
        frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
        ),
        frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": raw[:half]}},
        ),
        frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": raw[half:]}},
        ),
        frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
        frame(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 20}},
        ),
        frame("message_stop", {"type": "message_stop"}),
    ]


@dataclass
class Reply:
    body: Any = None  # dict/list → JSON; bytes → as is; None → a default message
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    gzip: bool = False
    content_type: str = "application/json"


@dataclass
class Stream:
    events: Sequence[bytes] = field(default_factory=text_stream_events)
    pace: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None  # abort the connection after this many events
    cut_mid_event: bool = False  # ... and first write half of the next event
    delay: float = 0.0  # before the response headers
    # event index -> an Event awaited before that event is written: the stream stops there
    # until the test sets it (on the servers' loop: ``loop.call_soon_threadsafe(event.set)``)
    hold: Mapping[int, asyncio.Event] = field(default_factory=dict)


@dataclass
class Reset:
    """Close the connection before sending any header."""

    delay: float = 0.0


@dataclass
class Hang:
    """Never answer (until the client gives up)."""


Script = Reply | Stream | Reset | Hang | Turn | Callable[["RecordedRequest"], "Reply | Stream | Reset | Hang | Turn"]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query_string: str
    headers: CIMultiDict[str]
    body: bytes
    raw_path: str = ""  # path and query exactly as they arrived, still percent-encoded

    def json(self) -> Any:
        body = self.body
        if self.headers.get("content-encoding", "").lower() == "gzip":
            body = gzip_module.decompress(body)
        return orjson.loads(body)


class FakeUpstream:
    def __init__(self, rules: ProviderRules | None = None) -> None:
        self.rules = rules
        self.verdicts: list[Verdict] = []  # one per request the rules checked
        self.requests: list[RecordedRequest] = []
        self._script: list[Script] = []
        self.active = 0
        self.cancelled = 0  # handlers that ended because the client (the proxy) went away
        self.completed = 0
        self.stream_bytes_written = 0  # SSE bytes handed to the transport (for backpressure tests)
        self.url = ""
        self._runner: web.AppRunner | None = None

    # -- scripting --------------------------------------------------------------------------
    def script(self, *entries: Script) -> None:
        self._script.extend(entries)

    def use_rules(self, rules: ProviderRules | None) -> None:
        """Check every Messages request against ``rules`` from now on (``None``: stop)."""
        self.rules = rules

    def _take(self, recorded: RecordedRequest) -> Script | None:
        return self._pop(recorded, None)

    def _pop(self, recorded: RecordedRequest, verdict: Verdict | None) -> Reply | Stream | Reset | Hang | None:
        if not self._script:
            return None
        entry = self._script.pop(0)
        if callable(entry) and not isinstance(entry, Reply | Stream | Reset | Hang | Turn):
            entry = entry(recorded)
        if isinstance(entry, Turn):
            return self._turn(recorded, entry, verdict)
        return entry

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def open_connections(self) -> int:
        server = self._runner.server if self._runner else None
        return len(server.connections) if server else 0

    # -- handling ---------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        recorded = RecordedRequest(
            request.method, request.path, request.query_string, CIMultiDict(request.headers), body,
            request.raw_path,
        )
        self.requests.append(recorded)
        self.active += 1
        try:
            if self.rules is None:
                entry = self._take(recorded) or self._default(recorded)
            else:
                verdict = self._check(recorded)
                entry = self._ruled(recorded, verdict) or self._pop(recorded, verdict) or self._ruled_default(recorded, verdict)
            response = await self._answer(request, entry)
            self.completed += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    # -- provider rules (opt-in) ------------------------------------------------------------
    def _check(self, recorded: RecordedRequest) -> Verdict | None:
        assert self.rules is not None
        if recorded.method != "POST":
            return None
        if recorded.path.endswith("/messages/count_tokens"):
            endpoint = "count_tokens"
        elif recorded.path.endswith("/messages"):
            endpoint = "messages"
        else:
            return None
        try:
            body = recorded.json()
        except (ValueError, OSError):
            return None
        if not isinstance(body, dict):
            return None
        verdict = self.rules.check(endpoint, body, betas_of(recorded.headers.getall("anthropic-beta", [])))
        self.verdicts.append(verdict)
        return verdict

    def _ruled(self, recorded: RecordedRequest, verdict: Verdict | None) -> Reply | Stream | None:
        """The rules' own answer: the error of a rejected request, or a compaction's block."""
        if verdict is None or self.rules is None:
            return None
        if verdict.rejection is not None:
            request_id = _next_id("req")
            return Reply(
                verdict.rejection.body(request_id),
                status=verdict.rejection.status,
                headers={"request-id": request_id, "x-should-retry": "true" if verdict.rejection.status >= 500 else "false"},
            )
        if verdict.compaction:
            body = recorded.json()
            message = self.rules.compaction_answer(body, betas_of(recorded.headers.getall("anthropic-beta", [])), verdict)
            return self._as_answer(body, message)
        return None

    def _turn(self, recorded: RecordedRequest, turn: Turn, verdict: Verdict | None) -> Reply | Stream:
        if self.rules is None:
            raise AssertionError("a Turn script entry needs FakeUpstream(rules=ProviderRules(...))")
        body = recorded.json()
        message = self.rules.answer(body, betas_of(recorded.headers.getall("anthropic-beta", [])), turn, verdict)
        return self._as_answer(body, message)

    def _as_answer(self, body: Any, message: dict[str, Any]) -> Reply | Stream:
        assert self.rules is not None
        if isinstance(body, dict) and body.get("stream"):
            return Stream(events=[frame(name, data) for name, data in self.rules.stream_events(message)])
        return Reply(message)

    def _ruled_default(self, recorded: RecordedRequest, verdict: Verdict | None) -> Reply | Stream:
        if verdict is not None and verdict.endpoint == "messages":
            return self._turn(recorded, Turn(text="Hello from the fake upstream."), verdict)
        return self._default(recorded)

    def _default(self, recorded: RecordedRequest) -> Reply | Stream:
        if recorded.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": len(recorded.body) // 4})
        if recorded.path.endswith("/messages"):
            data = recorded.json()
            if data.get("stream"):
                return Stream()
            return Reply(message_json())
        if recorded.path.endswith("/models"):
            return Reply(
                {
                    "data": [
                        {"type": "model", "id": "claude-fake-1", "display_name": "Fake", "created_at": "2026-01-01T00:00:00Z"}
                    ],
                    "has_more": False,
                    "first_id": "claude-fake-1",
                    "last_id": "claude-fake-1",
                }
            )
        return Reply({"type": "error", "error": {"type": "not_found_error", "message": "fake: no such path"}}, status=404)

    async def _answer(self, request: web.Request, entry: Script) -> web.StreamResponse:
        base_headers = {"request-id": _next_id("req"), **RATE_LIMIT_HEADERS}
        if isinstance(entry, Hang):
            await asyncio.sleep(3600)
        if isinstance(entry, Reset):
            await asyncio.sleep(entry.delay)
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("fake upstream reset")
        if isinstance(entry, Reply):
            await asyncio.sleep(entry.delay)
            if entry.body is None:
                payload = orjson.dumps(message_json())
            elif isinstance(entry.body, bytes):
                payload = entry.body
            else:
                payload = orjson.dumps(entry.body)
            headers = {**base_headers, "Content-Type": entry.content_type, **entry.headers}
            if entry.gzip:
                payload = gzip_module.compress(payload)
                headers["Content-Encoding"] = "gzip"
            return web.Response(status=entry.status, body=payload, headers=headers)
        assert isinstance(entry, Stream)
        await asyncio.sleep(entry.delay)
        response = web.StreamResponse(
            status=200,
            headers={**base_headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **entry.headers},
        )
        await response.prepare(request)
        for i, event in enumerate(entry.events):
            if i in entry.hold:
                await entry.hold[i].wait()
            if entry.cut_after is not None and i >= entry.cut_after:
                if entry.cut_mid_event:
                    await response.write(event[: len(event) // 2])
                    await asyncio.sleep(0.01)
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write(event)
            self.stream_bytes_written += len(event)
            if entry.pace:
                await asyncio.sleep(entry.pace)
        await response.write_eof()
        return response


def message_stream_events(message: dict[str, Any], *, pings: bool = True) -> list[bytes]:
    """The SSE events that stream ``message`` (a whole message as :func:`message_json` makes):
    text in two deltas, tool input JSON in two pieces, thinking + signature; usage as the
    provider splits it (input figures in ``message_start``, output in ``message_delta``)."""
    usage = dict(message.get("usage") or {})
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 1}}
    events = [frame("message_start", {"type": "message_start", "message": start})]
    if pings:
        events.append(frame("ping", {"type": "ping"}))
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            text = block["text"]
            deltas = [{"type": "text_delta", "text": text[: len(text) // 2]},
                      {"type": "text_delta", "text": text[len(text) // 2 :]}]
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            raw = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": raw[: len(raw) // 2]},
                      {"type": "input_json_delta", "partial_json": raw[len(raw) // 2 :]}]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        else:
            opening, deltas = block, []
        events.append(frame("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}))
        for delta in deltas:
            events.append(frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(frame("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(frame("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")},
        "usage": {"output_tokens": usage.get("output_tokens", 0)},
    }))
    events.append(frame("message_stop", {"type": "message_stop"}))
    return events
