"""Microsoft Foundry as a client format: the Messages API under ``/anthropic``, its model a
deployment name.

Foundry serves the Messages API at ``https://<resource>.services.ai.azure.com/anthropic/v1/*``
(platform.claude.com "Claude in Microsoft Foundry"): a client in Foundry mode (Claude Code's
``CLAUDE_CODE_USE_FOUNDRY``, the SDK's ``AnthropicFoundry``) whose base URL is the proxy's
``/anthropic`` sends ``POST /anthropic/v1/messages`` (Claude Code: ``?beta=true``) and
``/anthropic/v1/messages/count_tokens``: the Messages body, the ``anthropic-version`` and
``anthropic-beta`` headers, and its key in ``x-api-key`` (Claude Code 2.1.197; the SDK sends
``api-key`` too) or an Entra ID token as ``Authorization: Bearer``. Answers and errors are the
Messages API's own: the encoder is the identity.

The one difference is the model: a Foundry *deployment name*, the model's id unless its owner
chose another (``models:`` entries name those as ``foundry:``). A name the Claude API takes (the
catalogue's id or one of its aliases, or a name the catalogue does not know) keeps the client's
bytes; any other spelling the catalogue knows (``claude-opus-4``, a configured deployment name)
becomes the Anthropic id, the body rebuilt with it first and the client's other members byte for
byte (:func:`proxy.formats.request.rebuild`).

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import msgspec

from proxy.core.catalogue import Catalogue
from proxy.formats.request import members, rebuild

PREFIX = "/anthropic"


class _Model(msgspec.Struct):
    model: object = None


_MODEL = msgspec.json.Decoder(_Model)


def decode(text: bytes, *, ids: Catalogue) -> tuple[bytes, str]:
    """The Messages body for ``text`` and its model inside. A body that is not a JSON object,
    or has no string model, is passed on as sent: the Messages path refuses it in its words."""
    try:
        model = _MODEL.decode(text).model
    except (msgspec.DecodeError, msgspec.ValidationError):
        return text, ""
    if not isinstance(model, str) or not model:
        return text, ""
    resolved = ids.resolve(model)
    if not resolved.known or model == resolved.id or model in resolved.aliases.value:
        return text, model
    return rebuild(members(text), resolved.id, stream=None, platform=False), resolved.id
