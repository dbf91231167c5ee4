"""The GenAI client span of each upstream model call a client request makes.

:func:`start_call` opens it (``chat {model}``, request attributes) just before the call is sent;
:meth:`CallSpan.answered` ends it once the relay is done, with what the answer said (id, model,
finish reason, tokens: ``proxy.core.genai``). A request whose answer took hidden retrieval rounds
made one call per round: the first call's span ends where the first hidden round began, each
round's call has its own span (opened by the retrieval loop, a child of its round's span), and all
get their round's own usage here, where the rounds' figures are known. Every call's span names
the server it goes to (``server.address``, ``server.port``) and, when the request has one, its
session as ``gen_ai.conversation.id``. Without tracing every step is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core import genai
from proxy.server.http import spans
from proxy.server.relay.rounds import HiddenRounds
from proxy.server.relay.usage import UsageTap
from proxy.server.upstream.platforms import CURRENT

# the operation each route's call performs (count_tokens is not one of the conventions' own)
_OPERATIONS = {"messages": "chat", "count_tokens": "count_tokens", "summary": "chat"}


def start_call(
    body: Mapping[str, Any], route: str, call: str = "client", server_url: str | None = None
) -> spans.Span:
    """The span of one upstream call of ``body`` (``call``: whose call: ``client`` (the client's
    own request), ``retrieval`` (a hidden round's), ``summary``; ``server_url``: where an
    Anthropic API call goes; a tenant's platform call goes to its platform's endpoint)."""
    if not spans.enabled():
        return spans.NO_SPAN
    operation = _OPERATIONS.get(route, route)
    platform = CURRENT.get()  # the tenant's platform, or None: the Anthropic API
    attributes: dict[str, Any] = dict(
        genai.request_attributes(operation, body, platform.format if platform else "anthropic")
    )
    endpoint = getattr(platform, "endpoint", None) if platform is not None else server_url
    attributes.update(genai.server_attributes(endpoint))
    session = spans.session()
    if session:
        attributes[genai.CONVERSATION_ID] = session
    attributes["context_proxy.call"] = call
    if spans.capture_content():
        messages = body.get("messages")
        if isinstance(messages, list):
            attributes[genai.INPUT_MESSAGES] = orjson.dumps(messages).decode()
        if body.get("system") is not None:
            attributes[genai.SYSTEM_INSTRUCTIONS] = orjson.dumps(body.get("system")).decode()
    return spans.start(genai.span_name(operation, body.get("model")), "client", attributes)


def end_call(
    span: spans.Span,
    status: int,
    usage: Mapping[str, Any] | None,
    *,
    message_id: str | None = None,
    model: str | None = None,
    stop_reason: str | None = None,
    at: float | None = None,
) -> None:
    """End one call's span with what its answer said (``status`` other than 200: failed)."""
    if not span.recording:
        span.end(at)
        return
    span.set("http.response.status_code", status)
    if status != 200:
        span.fail(str(status))
    else:
        span.set_many(
            genai.response_attributes(
                usage, message_id=message_id, model=model, stop_reason=stop_reason
            )
        )
    span.end(at)


def answered(
    span: spans.Span, status: int, tap: UsageTap, hidden: HiddenRounds | None
) -> None:
    """End the client call's span, and those of the hidden rounds' calls when there were any."""
    rounds = hidden.continuations if hidden is not None else ()
    if not rounds:
        usage = tap.usage
        if usage is None and tap.input_tokens is not None:  # a count_tokens answer
            usage = {"input_tokens": tap.input_tokens}
        end_call(
            span, status, usage, message_id=tap.message_id, model=tap.model,
            stop_reason=tap.stop_reason,
        )
        return
    assert hidden is not None
    usages = hidden.usages()
    starts = hidden.starts  # a call's answer was read when the next round began
    # every round but the last stopped to call the proxy's tool
    end_call(
        span, status, _usage(usages, 0), message_id=tap.message_id, model=tap.model,
        stop_reason="tool_use", at=starts[0] if starts else None,
    )
    for i, continuation in enumerate(rounds):
        last = i == len(rounds) - 1
        end_call(
            continuation.span,
            continuation.status,
            _usage(usages, i + 1),
            model=tap.model,
            stop_reason=tap.stop_reason if last else "tool_use",
            at=starts[i + 1] if i + 1 < len(starts) else continuation.ended,
        )


def _usage(usages: Sequence[Mapping[str, Any]], i: int) -> Mapping[str, Any] | None:
    return usages[i] if i < len(usages) else None
