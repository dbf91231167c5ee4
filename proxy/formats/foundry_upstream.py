"""Microsoft Foundry's form of a Messages call: the Messages API itself, under the resource.

``POST https://<resource>.services.ai.azure.com/anthropic/v1/messages`` (and
``/v1/messages/count_tokens``) with the Messages body, its ``model`` the Foundry *deployment
name* (the catalogue's Foundry id: a deployment is named after the model id unless its owner
chose otherwise), the ``anthropic-version`` and ``anthropic-beta`` headers as the Claude API takes
them, and the resource's key in ``x-api-key`` and ``api-key`` (both: the page names either, and
the SDK's ``AnthropicFoundry`` sends both since a release that sent ``api-key`` alone was refused:
anthropics/anthropic-sdk-python#1661) or a Microsoft Entra ID token as ``Authorization: Bearer``
(platform.claude.com "Claude in Microsoft Foundry"; learn.microsoft.com "Deploy and use Claude
models in Microsoft Foundry"). Answers are the Messages API's own (JSON, or SSE for a stream);
errors are Foundry's (:func:`proxy.formats.upstream_errors.foundry_error`).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ANTHROPIC_VERSION = "2023-06-01"  # what the SDKs send (the Foundry page's REST example too)
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


def default_endpoint(resource: str) -> str:
    """The resource's Messages API (``<this>/v1/messages``)."""
    return f"https://{resource}.services.ai.azure.com/anthropic"


def messages_body(body: Mapping[str, Any], deployment: str) -> dict[str, Any]:
    """The body with ``model`` the deployment's name (in its place; a new mapping)."""
    return {**body, "model": deployment}


def key_headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "api-key": key}


def bearer_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
