"""Vertex rawPredict as a client format: the request decoded (the answer is the Messages one).

Requests: ``POST [<prefix>]/projects/{project}/locations/{region}/publishers/anthropic/models/
{model}:rawPredict`` (one JSON answer, or SSE when the body asks to stream),
``…:streamRawPredict`` (SSE), and ``…/models/count-tokens:rawPredict`` (the model in the body).
The body is the Messages body without ``model``, with ``anthropic_version``
(``vertex-2023-10-16``); betas come as the ``anthropic-beta`` header (a body ``anthropic_beta``
is taken too). Answers, streams and errors are the Anthropic ones as Vertex relays them: the
encoder is the identity.
"""

from __future__ import annotations

from proxy.core.catalogue import Catalogue
from proxy.core.errors import NotFound
from proxy.formats.request import (
    Decoded,
    betas_of,
    members,
    model_of,
    rebuild,
    stream_of,
    version_of,
)

COUNT_TOKENS = "count-tokens"
METHODS = ("rawPredict", "streamRawPredict")


def split_target(target: str) -> tuple[str, str]:
    """``{model}:{method}`` (the last path segment) → (model, method); 404 for another method."""
    model, _, method = target.rpartition(":")
    if not model or method not in METHODS:
        raise NotFound(f"publishers/anthropic/models/{target[:80]}: not found")
    return model, method


def decode(model: str, method: str, text: bytes, *, ids: Catalogue) -> tuple[Decoded, bool]:
    """A rawPredict request as the Messages request, and whether it counts tokens."""
    found = members(text)
    version = version_of(found.get("anthropic_version"))
    betas = betas_of(found.get("anthropic_beta"))
    counting = model == COUNT_TOKENS
    if counting:
        model = model_of(found.get("model"))
        stream = None
    elif method == "streamRawPredict":
        stream = True
    else:
        stream = stream_of(found.get("stream")) if "stream" in found else None
    inside = ids.anthropic(model)
    body = rebuild(found, inside, stream=stream)
    return Decoded(body, version, betas, inside, model, bool(stream)), counting
