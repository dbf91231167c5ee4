"""Span attributes of an upstream model call, by the OpenTelemetry GenAI conventions (pure).

Names as published in the semantic conventions for GenAI client spans and their Anthropic page
(https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans,
https://opentelemetry.io/docs/specs/semconv/gen-ai/anthropic): the span is named
``{gen_ai.operation.name} {gen_ai.request.model}``, ``gen_ai.provider.name`` is ``anthropic``,
and ``gen_ai.usage.input_tokens`` includes the cache reads and writes, which are also given on
their own (``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens``;
the provider reports them apart from its ``input_tokens``). The GenAI client span also carries
``gen_ai.conversation.id`` (the session, when known) and ``server.address`` / ``server.port``
(the server the call goes to; the port is required whenever the address is given:
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/#inference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

PROVIDER = "anthropic"
# ``gen_ai.provider.name``'s well-known value for each upstream platform the proxy calls (Microsoft
# Foundry's models are the conventions' ``azure.ai.inference``)
PROVIDERS = {
    "anthropic": PROVIDER,
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "foundry": "azure.ai.inference",
}

OPERATION = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
INPUT_MESSAGES = "gen_ai.input.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

Attributes = dict[str, str | int | float | tuple[str, ...]]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def span_name(operation: str, model: Any) -> str:
    return f"{operation} {model}" if isinstance(model, str) and model else operation


def request_attributes(
    operation: str, body: Mapping[str, Any], platform: str = "anthropic"
) -> Attributes:
    """What the request asks for (never its content); ``platform``: the upstream's format."""
    attributes: Attributes = {OPERATION: operation, PROVIDER_NAME: PROVIDERS.get(platform, PROVIDER)}
    model = body.get("model")
    if isinstance(model, str) and model:
        attributes[REQUEST_MODEL] = model
    max_tokens = _count(body.get("max_tokens"))
    if max_tokens is not None:
        attributes[REQUEST_MAX_TOKENS] = max_tokens
    for key, name in (("temperature", REQUEST_TEMPERATURE), ("top_p", REQUEST_TOP_P)):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = float(value)
    top_k = _count(body.get("top_k"))
    if top_k is not None:
        attributes[REQUEST_TOP_K] = top_k
    return attributes


def server_attributes(url: str | None) -> Attributes:
    """Where the call goes: ``server.address`` and ``server.port`` (the scheme's default port
    when the URL names none: the conventions require the port whenever the address is given)."""
    if not url:
        return {}
    parts = urlsplit(url)
    if not parts.hostname:
        return {}
    try:
        port = parts.port
    except ValueError:
        return {}
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port}


def usage_attributes(usage: Mapping[str, Any] | None) -> Attributes:
    """The provider's ``usage`` as token attributes (input includes the cache's)."""
    if not usage:
        return {}
    attributes: Attributes = {}
    fresh = _count(usage.get("input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    if fresh is not None or read is not None or written is not None:
        attributes[INPUT_TOKENS] = (fresh or 0) + (read or 0) + (written or 0)
    if read is not None:
        attributes[CACHE_READ_TOKENS] = read
    if written is not None:
        attributes[CACHE_CREATION_TOKENS] = written
    output = _count(usage.get("output_tokens"))
    if output is not None:
        attributes[OUTPUT_TOKENS] = output
    return attributes


def response_attributes(
    usage: Mapping[str, Any] | None,
    *,
    message_id: Any = None,
    model: Any = None,
    stop_reason: Any = None,
) -> Attributes:
    """What the answer says about itself: its id, model, why it stopped, the tokens (values
    that are not strings are left out)."""
    attributes = usage_attributes(usage)
    if isinstance(message_id, str) and message_id:
        attributes[RESPONSE_ID] = message_id
    if isinstance(model, str) and model:
        attributes[RESPONSE_MODEL] = model
    if isinstance(stop_reason, str) and stop_reason:
        attributes[FINISH_REASONS] = (stop_reason,)
    return attributes
