"""Where an answer to the client is made: the seam between the relay and the client's format.

The relay and the retrieval loop write Anthropic Messages answers (JSON, SSE, Anthropic error
bodies). A request that arrived in another client format (``proxy.server.formats``: Bedrock
InvokeModel, Vertex rawPredict) carries an ``AnswerFormat`` in its state; the response object it
makes encodes what is written into the client's own format as it goes. Without one (the
Anthropic routes) the answer is the plain aiohttp response it always was: one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict


class AnswerFormat(Protocol):
    def response(
        self, status: int, reason: str | None, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        """The response that writes an Anthropic answer (status, headers, then the body as it
        is written) to the client in its own format."""
        ...


# a client format's ``AnswerFormat``, in the (internal) request's state
ANSWER_FORMAT = web.RequestKey("answer_format", AnswerFormat)


def client_response(
    request: web.Request,
    response_class: type[web.StreamResponse],
    *,
    status: int,
    headers: CIMultiDict[str],
    reason: str | None = None,
) -> web.StreamResponse:
    """The response an Anthropic answer is written to: ``response_class`` for the Anthropic
    routes, the client format's own otherwise."""
    answer_format: AnswerFormat | None = request.get(ANSWER_FORMAT)
    if answer_format is None:
        return response_class(status=status, reason=reason, headers=headers)
    response: web.StreamResponse = answer_format.response(status, reason, headers)
    return response


# A ProxyError rendered in a client format (status, error type, message, request id, headers).
ErrorRenderer = Callable[[int, str, str, str, dict[str, str]], web.Response]
# route name → its client format's error renderer (the error middleware asks; Anthropic routes
# have none and get the Anthropic envelope)
ERROR_FORMATS = web.AppKey("error_formats", dict[str, ErrorRenderer])
