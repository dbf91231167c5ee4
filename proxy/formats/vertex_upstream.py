"""Vertex AI's rawPredict form of a Messages call.

``POST /v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict``
(``:streamRawPredict`` when ``stream`` is true) with the Messages body less ``model`` plus
``"anthropic_version": "vertex-2023-10-16"``; betas go in the ``anthropic-beta`` header, as the
provider's Vertex SDK sends them. Count tokens: ``.../models/count-tokens:rawPredict`` with the
body *and* its ``model`` (docs.anthropic.com "Claude on Vertex AI"; Claude Code's gateway
protocol). Answers are the Messages API's own (JSON, or SSE for a stream); errors are Google's
(:func:`proxy.formats.upstream_errors.vertex_error`).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

ANTHROPIC_VERSION = "vertex-2023-10-16"


def default_endpoint(location: str) -> str:
    """Google's endpoint for ``location`` (``global`` has no region prefix)."""
    if location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def _models(project: str, location: str) -> str:
    return (
        f"/v1/projects/{quote(project, safe='')}/locations/{quote(location, safe='')}"
        "/publishers/anthropic/models"
    )


def model_path(project: str, location: str, model: str, *, stream: bool) -> str:
    method = "streamRawPredict" if stream else "rawPredict"
    return f"{_models(project, location)}/{quote(model, safe='@')}:{method}"


def count_tokens_path(project: str, location: str) -> str:
    return f"{_models(project, location)}/count-tokens:rawPredict"


def predict_body(body: Mapping[str, Any], *, keep_model: str | None = None) -> dict[str, Any]:
    """The rawPredict body (a new mapping); ``keep_model``: count-tokens wants the model."""
    out: dict[str, Any] = {"anthropic_version": ANTHROPIC_VERSION}
    out.update((k, v) for k, v in body.items() if k != "model")
    if keep_model is not None:
        out["model"] = keep_model
    return out
