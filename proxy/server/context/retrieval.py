"""The edge of the retrieval tool: answer the model's ``context_proxy_retrieve`` calls, call the
provider again with the extended view, and give the client one answer.

A request whose forwarded view offers the tool (``Prepared.view``) is relayed by
:class:`RetrievalLoop` (the ``retrieve`` stage installs it; an answer other than a 200 goes
through the plain relay, as it came). Per round:

1. the upstream's answer is relayed as it arrives (streaming: spliced, see ``splice``; JSON:
   read whole first, a JSON answer is one write anyway);
2. when it calls our tool and rounds remain (``compaction.retrieval.max_rounds``), each call is
   answered here: the pointer must name this conversation (or be one of the session's durable
   sources), the tenant's policy authorises it and
   the source is verified (``SourceChecks.fetch``, audited), and the result pages its text;
3. the view is extended by the round's assistant turn (the client's own calls of that round
   dropped: the model re-issues them after reading) and our results, and sent again, with the
   client's headers and ``stream`` as they were.

While a streamed answer waits for a hidden round, pings keep flowing to the client. A failed
continuation ends a stream with one ``event: error`` (the provider's error type when it sent one);
a JSON answer then gets the continuation's error as the provider sent it.

The count of hidden rounds is the ``x-compaction-retrievals`` header of a JSON answer; a stream's
headers leave before any round is known, so it carries the count as an SSE comment line
(``: x-compaction-retrievals: N``, ignored by SSE parsers) before its ``message_stop``, when
there was a hidden round. Each round is logged and kept with the recorded answer
(``context_proxy_retrievals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.config.settings import RetrievalConfig
from proxy.core.compaction.retrieval import (
    BadCall,
    artifact_text,
    error_result,
    event_text,
    is_ours,
    page_result,
    parse_call,
    sum_usage,
)
from proxy.core.conversation import Conversation
from proxy.core.errors import UpstreamTimeout, UpstreamUnavailable, new_request_id, sse_error_event
from proxy.core.pointers import ArtifactPointer, BadPointer, TranscriptPointer, parse_pointer
from proxy.server.http import spans
from proxy.server.relay.answer import client_response
from proxy.server.relay.call_span import start_call
from proxy.server.relay.forward import Forwarder, RelayOutcome, response_headers_for_client
from proxy.server.relay.rounds import Continuation, HiddenRounds
from proxy.server.relay.splice import PING, Splice, split_events
from proxy.server.relay.sse import EventSplitter
from proxy.server.upstream.response import UpstreamResponse
from proxy.sources.checks import SourceChecks
from proxy.sources.policy import SourcePolicy

log = logging.getLogger("context_proxy.retrieval")

RETRIEVALS_HEADER = "x-compaction-retrievals"
# Bytes a retrieved artifact may have (the whole file is read to verify it and page it).
MAX_SOURCE_BYTES = 64 << 20
_READ_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)

# --- reading a source ------------------------------------------------------------------------


async def read_source(
    checks: SourceChecks,
    tenant: str,
    policy: SourcePolicy,
    conversation: Conversation,
    pointer_text: str,
    asked_by: str,
    shared: Collection[str] = (),
) -> tuple[str, str | None]:
    """``(status, text)`` of a pointer the model asked for. A transcript pointer must name an
    event of this very conversation (a session's agents never read each other's turns), or be
    one of ``shared``: the source pointers of the session's durable context, which all its
    agents see in their ``system``; an artifact pointer must name this session. Then the
    tenant's policy and the source checks decide, as for durable context (a transcript event is
    the store's own, an artifact is verified where the tenant keeps them: local roots or the
    object store)."""
    parsed = parse_pointer(pointer_text)
    if isinstance(parsed, BadPointer):
        return parsed.status, None
    if parsed.session != conversation.session:
        return "denied", None
    if (
        isinstance(parsed, TranscriptPointer)
        and not conversation.owns(parsed)
        and pointer_text not in shared
    ):
        return "denied", None
    session = conversation.session
    kind = "transcript" if isinstance(parsed, TranscriptPointer) else "artifact"
    with spans.span("context_proxy.source.fetch", {"context_proxy.source.kind": kind}) as span:
        fetched = await checks.fetch(tenant, policy, pointer_text, session=session, asked_by=asked_by)
        span.set("context_proxy.source.status", fetched.resolution.status)
    data = fetched.data
    if data is None:
        return fetched.resolution.status, None
    if len(data) > MAX_SOURCE_BYTES:
        return "corrupt", None
    if len(data) <= INLINE_BYTES:
        return _source_text(parsed, data)
    return await asyncio.to_thread(_source_text, parsed, data)  # never a long decode on the loop


# A source up to this size is turned into text on the event loop (a thread hop costs more).
INLINE_BYTES = 256 << 10


def _source_text(parsed: TranscriptPointer | ArtifactPointer, data: bytes) -> tuple[str, str | None]:
    if isinstance(parsed, TranscriptPointer):
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError:
            return "corrupt", None
        return "available", event_text(record) if isinstance(record, dict) else ""
    return "available", artifact_text(parsed.name, data)


def _shown(pointer: str) -> str:
    """A pointer as logged and recorded: never the model's text when it is malformed (no log
    injection; the parser accepts printable ASCII only)."""
    parsed = parse_pointer(pointer)
    return "<malformed>" if isinstance(parsed, BadPointer) and parsed.status == "corrupt" else pointer


# --- the loop --------------------------------------------------------------------------------


class _Failed(Exception):
    """A continuation could not be had: ``status``/``body`` from the provider, if it answered."""

    def __init__(self, status: int, body: bytes, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.error_type = error_type
        self.message = message


def _error_of(body: bytes) -> tuple[str, str]:
    fallback = "api_error", "the provider failed while continuing after a retrieval"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return fallback  # not an Anthropic error body: the generic text says what happened
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("type", "api_error")), str(error.get("message", ""))
    return fallback


class RetrievalLoop:
    """One client request whose forwarded view offers the tool."""

    def __init__(
        self,
        forwarder: Forwarder,
        request: web.Request,
        headers: CIMultiDict[str],
        view: dict[str, Any],
        config: RetrievalConfig,
        checks: SourceChecks,
        tenant: str,
        policy: SourcePolicy,
        conversation: Conversation,
        route: str,
        settled: Callable[[], Awaitable[None]] | None = None,
        shared: Collection[str] = (),
    ) -> None:
        self.forwarder = forwarder
        self.request = request
        self.headers = headers
        self.view = view
        self.config = config
        self.checks = checks
        self.tenant = tenant
        self.request_id = new_request_id()  # the hidden rounds' source checks are audited under it
        self.policy = policy
        self.conversation = conversation
        self.shared = shared  # the durable context's source pointers (the session's agents')
        self.route = route
        self.settled = settled  # waits for the conversation's transcript to be written so far
        self.added: list[dict[str, Any]] = []  # the hidden turns, appended to the view
        # the hidden rounds' upstream calls, records and every round's own usage (round 0: the
        # client's call): the ledger's rows, the traces' spans, the transcript's records
        self.hidden = HiddenRounds()
        self._sent: dict[str, Any] = view  # the body of the latest call

    @property
    def rounds(self) -> int:
        return self.hidden.count

    # -- answering our calls ---------------------------------------------------------------

    async def _answer(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        last = self.rounds + 1 >= self.config.max_rounds
        results: list[dict[str, Any]] = []
        logged: list[dict[str, Any]] = []
        if self.settled is not None and any(
            str((b.get("input") or {}).get("pointer", "")).startswith("transcript:")
            for b in calls
            if isinstance(b.get("input"), dict)
        ):
            await self.settled()  # a transcript event of this request may still be queued
        for block in calls:
            call = parse_call(block, self.config.max_chars)
            if isinstance(call, BadCall):
                results.append(error_result(call.id, f"invalid input: {call.message}"))
                logged.append({"status": "invalid"})
                continue
            status, text = await read_source(
                self.checks,
                self.tenant,
                self.policy,
                self.conversation,
                call.pointer,
                f"retrieval:{self.request_id}",
                self.shared,
            )
            if text is None:
                results.append(error_result(call.id, status, call.pointer))
            else:
                results.append(page_result(call, text, last_round=last))
            chars = 0 if text is None else max(0, min(len(text), call.offset + call.max_chars) - call.offset)
            logged.append(
                {"pointer": _shown(call.pointer), "offset": call.offset, "status": status, "chars": chars}
            )
        self.hidden.records.append({"round": self.rounds + 1, "calls": logged})
        log.info(
            "[retrieval] round %d: %s",
            self.rounds,
            ", ".join(f"{c.get('pointer', '?')}={c['status']}" for c in logged),
        )
        return results

    def _extend(self, assistant: list[Any], results: list[dict[str, Any]]) -> bytes:
        self.added += [
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": results},
        ]
        body = {**self.view, "messages": [*self.view["messages"], *self.added]}
        self._sent = body
        return orjson.dumps(body)

    async def _continue(self, data: bytes) -> UpstreamResponse:
        headers = CIMultiDict(self.headers)
        headers.popall("Content-Encoding", None)
        now = time.perf_counter()
        continuations = self.hidden.continuations
        if continuations:
            continuations[-1].ended = now
        call = Continuation(time.time(), now, span=start_call(
            self._sent, self.route, "retrieval", self.forwarder.base_url
        ))
        continuations.append(call)
        try:
            upstream = await self.forwarder.open(
                self.request, route=self.route, data=data, decode=True, headers=headers,
                body=self._sent,
            )
        except UpstreamUnavailable as exc:
            call.status = 502
            raise _Failed(502, b"", "api_error", exc.message) from None
        except UpstreamTimeout as exc:
            call.status = 504
            raise _Failed(504, b"", "timeout_error", exc.message) from None
        call.status = upstream.status
        if upstream.status != 200:
            async with upstream:
                try:
                    body = await upstream.read()
                except _READ_ERRORS:
                    body = b""
            kind, message = _error_of(body)
            raise _Failed(upstream.status, body, kind, message)
        return upstream

    async def _next_round(
        self, assistant: list[Any], calls: list[dict[str, Any]]
    ) -> UpstreamResponse:
        """One hidden round: our calls answered from verified sources, the provider called
        again with the view extended by them."""
        self.hidden.starts.append(time.perf_counter())
        attributes = {"context_proxy.retrieval.round": self.rounds + 1, "context_proxy.retrieval.calls": len(calls)}
        with spans.span("context_proxy.retrieval.round", attributes):
            results = await self._answer(calls)
            return await self._continue(self._extend(assistant, results))

    # -- running ----------------------------------------------------------------------------

    async def run(
        self,
        upstream: UpstreamResponse,
        extra_headers: Mapping[str, str],
        on_prepared: float,
        tap: Callable[[bytes], None],
    ) -> tuple[web.StreamResponse, RelayOutcome]:
        """Relay ``upstream`` and any hidden rounds to the client as one answer. An answer
        other than a 200 carries no call of ours: it is relayed as it came (``Forwarder.relay``)."""
        if upstream.status != 200:
            return await self.forwarder.relay(
                self.request, upstream, decoded=True, extra_headers=extra_headers,
                on_prepared=on_prepared, route=self.route, tap=tap,
            )
        is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        headers = response_headers_for_client(upstream.headers, decoded=True)
        headers.update(extra_headers)
        headers.popall("Content-Length", None)
        metrics = self.forwarder.metrics
        metrics.active_streams.inc()
        task = asyncio.current_task()
        if task is not None:
            self.forwarder.active.add(task)
        try:
            if is_sse:
                return await self._run_sse(upstream, headers, on_prepared, tap)
            return await self._run_json(upstream, headers, on_prepared, tap)
        finally:
            if task is not None:
                self.forwarder.active.discard(task)
            metrics.active_streams.dec()

    def _observe(self, received_at: float, on_prepared: float) -> None:
        added = time.perf_counter() - received_at + on_prepared
        self.forwarder.metrics.added_latency.labels(self.route).observe(added)

    async def _run_json(
        self,
        upstream: UpstreamResponse,
        headers: CIMultiDict[str],
        on_prepared: float,
        tap: Callable[[bytes], None],
    ) -> tuple[web.StreamResponse, RelayOutcome]:
        received_at = time.perf_counter()
        try:
            first_raw = await upstream.read()
        except _READ_ERRORS as exc:
            raise UpstreamUnavailable(
                f"upstream connection failed while answering ({type(exc).__name__})"
            ) from None
        body = first_raw
        status = 200
        try:
            first = orjson.loads(first_raw)
        except orjson.JSONDecodeError:
            first = None
        if isinstance(first, dict) and any(is_ours(b) for b in first.get("content") or ()):
            try:
                body = await self._rounds_json(first)
            except _Failed as failed:
                status, body = failed.status, failed.body or orjson.dumps(
                    {
                        "type": "error",
                        "error": {"type": failed.error_type, "message": failed.message},
                        "request_id": new_request_id(),
                    }
                )
                headers["Content-Type"] = "application/json"
        headers[RETRIEVALS_HEADER] = str(self.rounds)
        response = client_response(
            self.request, web.StreamResponse, status=status, headers=headers
        )
        response.content_length = len(body)
        await response.prepare(self.request)
        self._observe(received_at, on_prepared)
        await response.write(body)
        tap(body)
        await response.write_eof()
        return response, RelayOutcome(status=status, completed=True, is_sse=False)

    async def _rounds_json(self, first: dict[str, Any]) -> bytes:
        current = first
        visible: list[Any] = []
        usages: list[dict[str, Any]] = []
        self.hidden.read_usages(lambda: usages)
        hid_ours = False
        while True:
            content = [b for b in current.get("content") or () if isinstance(b, dict)]
            usage = current.get("usage")
            usages.append(dict(usage) if isinstance(usage, dict) else {})
            ours = [b for b in content if is_ours(b)]
            if not ours or self.rounds >= self.config.max_rounds:
                hid_ours = hid_ours or bool(ours)
                visible += [b for b in content if not is_ours(b)]
                break
            hid_ours = True
            visible += [b for b in content if b.get("type") != "tool_use"]
            assistant = [b for b in content if b.get("type") != "tool_use" or is_ours(b)]
            upstream = await self._next_round(assistant, ours)
            async with upstream:
                try:
                    raw = await upstream.read()
                    nxt = orjson.loads(raw)
                except (*_READ_ERRORS, orjson.JSONDecodeError) as exc:
                    raise _Failed(
                        502, b"", "api_error", f"continuation unreadable ({type(exc).__name__})"
                    ) from None
            if not isinstance(nxt, dict):
                raise _Failed(502, b"", "api_error", "continuation is not a message")
            current = nxt
        stop_reason = current.get("stop_reason")
        client_call = any(b.get("type") == "tool_use" for b in visible)
        if hid_ours and stop_reason == "tool_use" and not client_call:
            stop_reason = "end_turn"
        merged = {
            **first,
            "content": visible,
            "stop_reason": stop_reason,
            "stop_sequence": current.get("stop_sequence"),
            "usage": sum_usage(usages),
        }
        return orjson.dumps(merged)

    async def _run_sse(
        self,
        upstream: UpstreamResponse,
        headers: CIMultiDict[str],
        on_prepared: float,
        tap: Callable[[bytes], None],
    ) -> tuple[web.StreamResponse, RelayOutcome]:
        received_at = time.perf_counter()
        response = client_response(
            self.request, web.StreamResponse, status=200, headers=headers
        )
        outcome = RelayOutcome(status=200, completed=False, is_sse=True)
        splice = Splice()
        self.hidden.read_usages(splice.round_usages)
        request_id = upstream.headers.get("request-id") or new_request_id()

        async def write(data: bytes) -> None:
            if not data:
                return
            if not response.prepared:
                # status and headers wait for the upstream's first event (its message_start)
                await response.prepare(self.request)
                self._observe(received_at, on_prepared)
            await response.write(data)
            tap(data)

        try:
            return await self._splice_rounds(upstream, response, outcome, splice, write, request_id)
        except asyncio.CancelledError:
            await self.forwarder.end_if_draining(response, request_id)
            raise

    async def _splice_rounds(
        self,
        upstream: UpstreamResponse,
        response: web.StreamResponse,
        outcome: RelayOutcome,
        splice: Splice,
        write: Callable[[bytes], Awaitable[None]],
        request_id: str,
    ) -> tuple[web.StreamResponse, RelayOutcome]:
        current = upstream
        async with contextlib.AsyncExitStack() as stack:
            while True:
                ended = await self._pump_round(current, splice, write)
                r = splice.round
                if r.failed:
                    await response.write_eof()
                    return response, outcome
                if not ended or not r.complete:
                    self.forwarder.metrics.upstream_errors.labels("midstream").inc()
                    await write(
                        sse_error_event(
                            "api_error",
                            "upstream connection lost mid-stream; the response is incomplete",
                            request_id,
                        )
                    )
                    await response.write_eof()
                    return response, outcome
                calls = splice.our_calls()
                if calls and self.rounds < self.config.max_rounds:
                    released, _ = splice.release(drop_client_calls=True)
                    await write(released)
                    assistant = splice.assistant_content(drop_client_calls=True)
                    try:
                        async with self._pinging(write):
                            current = await stack.enter_async_context(
                                await self._next_round(assistant, calls)
                            )  # closed with the stack even if cancelled right here
                    except _Failed as failed:
                        await write(sse_error_event(failed.error_type, failed.message, request_id))
                        await response.write_eof()
                        return response, outcome
                    splice.start_round()
                    continue
                released, client_call = splice.release(drop_client_calls=False)
                await write(released)
                await write(splice.finish(self.rounds, client_call))
                break
        outcome.completed = True
        await response.write_eof()
        return response, outcome

    async def _pump_round(
        self,
        upstream: UpstreamResponse,
        splice: Splice,
        write: Callable[[bytes], Any],
    ) -> bool:
        """Relay one round's events through the splice; ``False`` when the stream was cut."""
        splitter = EventSplitter()
        async for chunk in _chunks(upstream):
            if chunk is None:
                return False
            # one write per upstream chunk, as the plain relay does
            await write(b"".join([splice.feed(e) for e in split_events(splitter.feed(chunk))]))
        await write(b"".join([splice.feed(e) for e in split_events(splitter.flush())]))
        return True

    @contextlib.asynccontextmanager
    async def _pinging(self, write: Callable[[bytes], Any]) -> Any:
        """Pings to the client every ``ping_seconds`` until the block ends; a ping being
        written finishes first (never cut: the stream stays whole events)."""
        stop = asyncio.Event()

        async def ping() -> None:
            while True:
                try:
                    await asyncio.wait_for(stop.wait(), self.config.ping_seconds)
                    return
                except TimeoutError:
                    await write(PING)

        task = asyncio.get_running_loop().create_task(ping())
        try:
            yield
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await task


async def _chunks(upstream: UpstreamResponse) -> Any:
    """The body's chunks as they arrive; one ``None`` when the read fails."""
    iterator = upstream.content.iter_any().__aiter__()
    while True:
        try:
            chunk = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except _READ_ERRORS:
            yield None
            return
        yield chunk
