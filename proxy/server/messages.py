"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the proxy's main handler.

Read the body (bounded, decoded for inspection, parsed through the body memo: a re-sent history
is not parsed again), validate it, inject the session's durable context, compact, guard thinking
blocks, forward, relay the answer (through the retrieval loop when the view offers its tool), and
record the answer and the call. The handler stays thin: it loads what the core needs, calls it,
then does the I/O. ``build_app`` (``proxy.server.app``) mounts it.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.conversation import Conversation
from proxy.core.errors import InvalidRequest, ProxyError, RequestTooLarge
from proxy.core.nesting import MAX_DEPTH, check_nesting
from proxy.core.protocol import scan_messages
from proxy.core.reparse import BodyMemo, Parsed
from proxy.core.thinking import BINDING_BETA
from proxy.server.appkeys import (
    COMPACTION,
    CONFIG,
    DURABLE,
    FORWARDER,
    METRICS,
    REQUEST_TENANT,
    TENANCY,
    THINKING,
)
from proxy.server.compaction.naming import transcript_naming
from proxy.server.compaction.service import (
    OPT_OUT_HEADER,
    CompactionService,
    Prepared,
    compaction_runs,
)
from proxy.server.compaction.thinking import THINKING_HEADER, ThinkingGuard, with_beta
from proxy.server.context.durable import conversation_from, with_system_block
from proxy.server.context.retrieval import RetrievalLoop
from proxy.server.http import spans
from proxy.server.ledger import LEDGER, ClientCall, calls_for
from proxy.server.quota import QUOTA_TICKET, admit
from proxy.server.relay.accumulate import AnswerAccumulator
from proxy.server.relay.call_span import answered, end_call, start_call
from proxy.server.relay.forward import (
    MESSAGES_ACCEPT_ENCODING,
    read_limited,
    request_headers_for_upstream,
)
from proxy.server.relay.usage import UsageTap

# The latest parsed body of each conversation: a re-sent history is not parsed (nor validated,
# nor hashed) again. See proxy.core.reparse.
BODIES = web.AppKey("bodies", BodyMemo)
# The validator's state is kept after each of the last messages of a request: the next turn
# re-sends the history up to about there (its client moves the cache breakpoint).
CHECKPOINTS_KEPT = 8


def route_of(request: web.Request) -> str:
    """The route's name (a metrics label): ``messages``, ``count_tokens``... or ``other``."""
    name = request.match_info.route.name
    return name or "other"


def upstream_headers(request: web.Request, *, messages_route: bool) -> CIMultiDict[str]:
    """The client's headers for the upstream: hop-by-hop ones dropped, the tenant's upstream
    credentials applied (set, or removed for ``None``). The messages routes are re-bodied by the
    proxy (its own length, an encoding it can read) and drop its control header."""
    headers = request_headers_for_upstream(
        request.headers,
        accept_encoding=MESSAGES_ACCEPT_ENCODING if messages_route else None,
        keep_content_length=not messages_route,
    )
    if messages_route:
        headers.popall(OPT_OUT_HEADER, None)
    tenancy = request.app[TENANCY].current
    for name, value in tenancy.upstream_auth_headers(request[REQUEST_TENANT], request.headers).items():
        headers.popall(name, None)
        if value is not None:
            headers[name] = value
    return headers


# --- body handling ---------------------------------------------------------------------------


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, bounded by ``limit`` before anything is forwarded (413 otherwise)."""
    too_large = RequestTooLarge(f"request body exceeds the maximum size of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    body = await read_limited(request.content, limit)
    if body is None:
        raise too_large
    return body


def decoded_for_inspection(request: web.Request, raw: bytes, limit: int) -> bytes:
    """The JSON text of a body sent with ``Content-Encoding: gzip|deflate`` (forwarded as sent)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise InvalidRequest(f"unsupported Content-Encoding: {encoding[:40]}")
    wbits = 31 if "gzip" in encoding else 15
    try:
        decoder = zlib.decompressobj(wbits)
        text = decoder.decompress(raw, limit + 1)
    except zlib.error:
        raise InvalidRequest(f"request body is not valid {encoding} data") from None
    if len(text) > limit or decoder.unconsumed_tail:
        raise RequestTooLarge(f"request body exceeds the maximum size of {limit} bytes after decoding")
    return text


def _memo_scope(request: web.Request, tenant: str, conversation: Conversation | None) -> str:
    """Whose remembered bodies a request may continue: its tenant's, and among those only the
    ones sent with the same credential (without tenant policies every client is the default
    tenant: one client's bodies, or how fast they parse, tell nothing to another), in the same
    conversation (a session's agents often open with the same words: each keeps its own body)."""
    credential = request.headers.get("x-api-key") or request.headers.get("authorization") or ""
    digest = hashlib.blake2b(credential.encode(), digest_size=8).hexdigest()
    where = conversation.scope if conversation is not None else ""
    return f"{tenant}\0{digest}\0{where}"


def parse_messages_body(text: bytes, memo: BodyMemo | None = None, scope: str = "") -> Parsed:
    """The parsed body (through ``memo``: a re-sent history is not parsed again), checked."""
    try:
        parsed = memo.parse(scope, text) if memo is not None else Parsed(orjson.loads(text), text, scope)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise InvalidRequest(
                f"request body is not valid JSON: nested deeper than {MAX_DEPTH} levels (the"
                f" proxy's limit for a request body; {exc})"
            ) from None
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    body = parsed.body
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if "messages" not in body:
        raise InvalidRequest("messages: Field required")
    if not isinstance(body["messages"], list):
        raise InvalidRequest("messages: Input should be a valid list")
    return parsed


# --- handlers --------------------------------------------------------------------------------


async def handle_messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages and /v1/messages/count_tokens."""
    started = time.perf_counter()
    limit = request.app[CONFIG].limits.max_body_bytes
    raw = await read_body(request, limit)
    text = decoded_for_inspection(request, raw, limit)
    return await serve_messages(request, route_of(request), raw, text, started)


async def serve_messages(
    request: web.Request, route: str, raw: bytes, text: bytes, started: float
) -> web.StreamResponse:
    """A Messages request, read: ``raw`` is what goes upstream when nothing changes, ``text`` its
    JSON (``raw`` decoded when it came compressed). ``request`` is the one the answer is written
    to; its path, method and headers are the internal Messages request's: the client's own on
    ``/v1/messages``, or the clone a client format decoded its request into
    (``proxy.server.formats``), whose answer a format encoder writes (``relay.answer``)."""
    app = request.app
    app[METRICS].request_bytes.labels(route).observe(len(raw))
    tenant_policy = request[REQUEST_TENANT]
    tenant = tenant_policy.name
    conversation = conversation_from(request.headers)
    spans.identify(tenant, conversation)
    with spans.span("context_proxy.validate"):
        parsed = parse_messages_body(
            text,
            app[BODIES],
            _memo_scope(request, tenant, conversation),
        )
        body = parsed.body
        n = len(body["messages"])
        keep = range(max(0, n - CHECKPOINTS_KEPT), n + 1) if parsed.rememberable else ()
        # the new messages' canonical JSON, made in the same step, serves compaction (when it runs)
        too_deep, canonical = check_nesting(
            body,
            parsed.reused,
            parsed.reused_members,
            make_canonical=compaction_runs(request.headers, tenant_policy.compaction),
        )
        if too_deep is not None:
            raise InvalidRequest(too_deep)
        violation, checkpoints = scan_messages(body["messages"], parsed.checkpoint, keep)
        if violation is not None:
            raise InvalidRequest(violation.message)
    sources = tenant_policy.sources
    session = conversation.session if conversation is not None else None
    durable = app[DURABLE]
    extra_headers: dict[str, str] = {}
    extra_headers.update(await admit(request, route, body))  # 429 before any upstream call
    faithful: bytes | None = raw
    shared: tuple[str, ...] = ()  # the durable context's pointers, which every agent sees
    if conversation is not None:
        injection = await durable.injection(tenant, sources, conversation.session)
        extra_headers.update(injection.headers(conversation))
        shared = injection.sources
        if injection.block is not None:
            body = with_system_block(body, injection.block)
            faithful = None
    service = app[COMPACTION]
    headers = upstream_headers(request, messages_route=True)
    artifact_session = session if session is not None and sources.artifact_root else None
    naming = transcript_naming(sources, conversation) if conversation is not None else None
    recorder = app.get(LEDGER)
    # queued before compaction runs: naming what it removes reads these events back (settled)
    recording = conversation is not None and route == "messages"
    if recording:
        assert conversation is not None
        turn = durable.record_request(tenant, sources, conversation, body["messages"])
    # the calls the proxy makes for this request (summaries) are recorded as the tenant's
    agent = conversation.agent or None if conversation is not None else None
    with calls_for(tenant, session, recorder, agent=agent, quota=request.get(QUOTA_TICKET)):
        prepared = await service.prepare(
            request.headers,
            body,
            faithful,
            tenant,
            tenant_policy.compaction,
            artifact_session=artifact_session,
            upstream_headers=headers,
            transcript=naming,
            offer_retrieval=conversation is not None,
            canonical=canonical,
            conversation=conversation,
            settled=(
                None if conversation is None else lambda: durable.settled(tenant, conversation)
            ),
        )
    extra_headers.update(prepared.headers)
    result = prepared.result
    if conversation is not None and result is not None and result.plan_status == "new":
        await durable.keep_compaction(tenant, sources, conversation, body["messages"], result)
    guard = app[THINKING]
    learn_from: int | None = None  # a binding model's answer: where its blocks stand
    if guard.binds(body.get("model")):
        prepared, learn_from = _guard_thinking(
            guard, service, prepared, parsed.body, body, raw, headers, extra_headers
        )
    for beta in prepared.betas:  # what the view itself needs (the provider's compaction block)
        with_beta(headers, beta)
    if prepared.changed:
        headers.popall("Content-Encoding", None)  # a re-serialised body is sent as identity
    forwarder = app[FORWARDER]
    retrieval = None
    if prepared.view is not None and conversation is not None and route == "messages":
        retrieval = RetrievalLoop(
            forwarder, request, headers, prepared.view, tenant_policy.compaction.retrieval,
            durable.checks, tenant, sources, conversation, route,
            settled=lambda: durable.settled(tenant, conversation),
            shared=shared,
        )
    before_upstream = time.perf_counter() - started
    call = ClientCall(
        recorder if route == "messages" else None, tenant, session, body, prepared.headers,
        agent=agent, quota=request.get(QUOTA_TICKET),
    )
    call_span = start_call(prepared.forwarded or body, route)
    try:
        upstream = await forwarder.open(
            request, route=route, data=prepared.body, decode=True, headers=headers
        )
    except ProxyError as exc:  # 502/504: the compaction outcome is known, and reported
        end_call(call_span, exc.status, None)
        prepared = await service.settle(prepared)
        exc.headers = {**extra_headers, **prepared.headers, **exc.headers}
        call.record(exc.status, None, None)  # never reached the provider's answer: no usage
        raise
    except BaseException as exc:  # cancelled (the client went away): the call's span still ends
        call_span.fail(type(exc).__name__)
        call_span.end()
        raise
    async with upstream:
        if prepared.counting is not None:  # counted while the provider worked: now reported
            prepared = await service.settle(prepared)
            extra_headers.update(prepared.headers)
            result = prepared.result
        sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        tap = UsageTap(sse=sse)
        accumulate = recording or learn_from is not None
        answer = AnswerAccumulator(sse=sse) if accumulate and upstream.status == 200 else None

        def feed(data: bytes) -> None:
            tap.feed(data)
            if answer is not None:
                answer.feed(data)

        try:
            if retrieval is not None and upstream.status == 200:
                try:
                    response, outcome = await retrieval.run(
                        upstream, extra_headers, before_upstream, feed
                    )
                except ProxyError as exc:  # a 502 before the answer: still reported in full
                    exc.headers = {**extra_headers, **exc.headers}
                    raise
            else:
                response, outcome = await forwarder.relay(
                    request,
                    upstream,
                    decoded=True,
                    extra_headers=extra_headers,
                    on_prepared=before_upstream,
                    route=route,
                    tap=feed,
                )
        finally:
            if answer is not None:
                message = answer.message()
                if learn_from is not None and answer.stopped and (
                    retrieval is None or not retrieval.rounds
                ):
                    guard.learn(learn_from, message)
                if retrieval is not None:
                    message = retrieval.hidden.annotate(message)
                if recording:
                    durable.record_answer(turn, message, answer.stopped)
            if upstream.status == 200:
                tap.close()
            # recorded even when the client went away mid-stream: the call was made (and billed)
            request_id = upstream.headers.get("request-id")
            if retrieval is not None and retrieval.hidden.continuations:
                call.record_rounds(
                    upstream.status, retrieval.hidden.usages(), retrieval.hidden.continuations,
                    request_id,
                    notes=tap.notes,
                )
            else:
                call.record(upstream.status, tap.usage, request_id, notes=tap.notes)
            answered(call_span, upstream.status, tap, retrieval.hidden if retrieval else None)
    if outcome.completed and outcome.status == 200 and (retrieval is None or not retrieval.rounds):
        service.observe(prepared.calibration_key, prepared.estimate, tap.input_tokens)
    # Learnt once the answer is out: where this body's messages end, and their digests, serve
    # only the conversation's next turn, which the client sends after reading this answer.
    parsed.remember(checkpoints)
    if result is not None:
        parsed.keep_digests(result.digests)
    return response


def _guard_thinking(
    guard: ThinkingGuard,
    service: CompactionService,
    prepared: Prepared,
    client: dict[str, Any],
    decided: dict[str, Any],
    raw: bytes,
    headers: CIMultiDict[str],
    extra_headers: dict[str, str],
) -> tuple[Prepared, int]:
    """A binding model's request: what ``ThinkingGuard`` says to forward (see
    ``proxy.server.compaction.thinking``), and where the answer's blocks will stand."""
    forwarded = prepared.forwarded if prepared.forwarded is not None else decided
    digests = prepared.result.digests if prepared.result is not None else None
    own = digests.own if digests is not None and digests.hashed else ()
    guarded = guard.check(client, forwarded, decided, own)
    extra_headers[THINKING_HEADER] = guarded.header
    if guarded.body is None:
        return prepared, guarded.end
    if guarded.deferred:
        if guarded.as_sent:  # the client's request, byte for byte: no durable block either
            extra_headers["x-durable-context"] = "deferred"
            deferred = service.deferred(prepared, raw, False)
        else:
            deferred = service.deferred(prepared, orjson.dumps(guarded.body), True)
        for name in prepared.headers:  # the compaction report is now the deferral's
            extra_headers.pop(name, None)
        extra_headers.update(deferred.headers)
        return deferred, guarded.end
    if guarded.decision.action == "asked-to-drop":
        with_beta(headers, BINDING_BETA)
    view = guarded.body if prepared.view is not None else None
    body = orjson.dumps(guarded.body)
    return replace(prepared, body=body, changed=True, view=view, forwarded=guarded.body), guarded.end
