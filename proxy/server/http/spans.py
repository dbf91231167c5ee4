"""Spans on the request path: the small API the edge's modules call, free when tracing is off.

Nothing here imports OpenTelemetry. ``proxy.server.http.tracing`` (imported only when
``tracing.enabled``) puts a :class:`Tracer` in the request's context; without one every call
returns the shared no-op span, one context-variable read, so the request path does not pay for
tracing it does not use (bench/bench_tracing.py). Spans opened with :func:`span` become the
current span (their children's parent); :func:`start` opens one that is not (a GenAI call span
ending later, when its answer has been read), ended with an explicit time.

Attributes under ``context_proxy.*`` are ours; ``gen_ai.*`` follow the OpenTelemetry GenAI
conventions (:mod:`proxy.core.genai`). Never an API key, an admin token or (unless
``tracing.capture_content``) message content.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextvars import ContextVar, Token
from typing import Literal, Protocol

from proxy.core.conversation import Conversation

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int]
Attributes = Mapping[str, AttributeValue]
Kind = Literal["internal", "client", "server"]

# the request's conversation, copied onto every span the request opens
TENANT = "context_proxy.tenant"
SESSION = "context_proxy.session"
AGENT = "context_proxy.agent"
# coarse spans of the store's work a request waits for (attribute context_proxy.store.kind)
STORE_READ = "context_proxy.store.read"
STORE_WRITE = "context_proxy.store.write"


class Span(Protocol):
    recording: bool

    def set(self, key: str, value: AttributeValue | None) -> None: ...

    def set_many(self, attributes: Attributes) -> None: ...

    def fail(self, error_type: str) -> None:
        """The span's operation failed: ``error.type`` and an error status (no message text)."""

    def end(self, at: float | None = None) -> None:
        """End the span now, or at ``at`` (a ``time.perf_counter()`` reading)."""


class Tracer(Protocol):
    capture_content: bool

    def current(self, name: str, kind: Kind, attributes: Attributes | None) -> ContextManager[Span]: ...

    def start(self, name: str, kind: Kind, attributes: Attributes | None) -> Span: ...

    def identify(self, tenant: str, session: str | None, agent: str | None) -> None: ...

    def session(self) -> str | None:
        """The session :meth:`identify` named for the current request, if any."""


class _NoSpan:
    __slots__ = ()
    recording = False

    def set(self, key: str, value: AttributeValue | None) -> None:
        return None

    def set_many(self, attributes: Attributes) -> None:
        return None

    def fail(self, error_type: str) -> None:
        return None

    def end(self, at: float | None = None) -> None:
        return None


NO_SPAN: Span = _NoSpan()
_NO_SPAN_CONTEXT: ContextManager[Span] = contextlib.nullcontext(NO_SPAN)
_TRACER: ContextVar[Tracer | None] = ContextVar("context_proxy_tracer", default=None)


def activate(tracer: Tracer) -> Token[Tracer | None]:
    """The request's tracer, for every span opened in its context (tasks it starts included)."""
    return _TRACER.set(tracer)


def deactivate(token: Token[Tracer | None]) -> None:
    _TRACER.reset(token)


def enabled() -> bool:
    return _TRACER.get() is not None


def capture_content() -> bool:
    """Whether message content may be put on spans (``tracing.capture_content``)."""
    tracer = _TRACER.get()
    return tracer is not None and tracer.capture_content


def span(name: str, attributes: Attributes | None = None) -> ContextManager[Span]:
    """A span around a block, current within it; an exception ending the block marks it failed
    (its type only)."""
    tracer = _TRACER.get()
    if tracer is None:
        return _NO_SPAN_CONTEXT
    return tracer.current(name, "internal", attributes)


def start(name: str, kind: Kind = "internal", attributes: Attributes | None = None) -> Span:
    """A span started now, a child of the current one, not current itself; :meth:`Span.end`."""
    tracer = _TRACER.get()
    if tracer is None:
        return NO_SPAN
    return tracer.start(name, kind, attributes)


def session() -> str | None:
    """The current request's session (tracing on, once identified), for ``gen_ai.conversation.id``."""
    tracer = _TRACER.get()
    return tracer.session() if tracer is not None else None


def identify(tenant: str, conversation: Conversation | None) -> None:
    """The request's tenant, session and agent: on its server span and every span it opens from
    now on."""
    tracer = _TRACER.get()
    if tracer is not None:
        session = conversation.session if conversation is not None else None
        tracer.identify(tenant, session, conversation.agent or None if conversation else None)


