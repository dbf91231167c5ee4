"""A Bedrock or Vertex request body, rewritten as the Messages body the proxy works on.

Both platforms send the Messages body with the model in the URL instead of the body,
``anthropic_version`` (and, on Bedrock, ``anthropic_beta``) as body fields instead of headers,
and (Bedrock) the stream choice in the path. ``members`` reads the top-level object without
building its values (``msgspec.Raw``: each member's bytes, as sent), ``rebuild`` writes the
Messages body: the model first, the client's other members in their order and byte for byte
(a re-sent history keeps its bytes, so the body memo still skips it), the platform fields left
out. The values themselves are parsed once, later, by the Messages path (``orjson``).

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec
import orjson

from proxy.core.errors import InvalidRequest

_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
# what the platforms carry in the body and the Messages API in headers
PLATFORM_FIELDS = frozenset({"anthropic_version", "anthropic_beta"})
# ``bedrock-2023-05-31``, ``vertex-2023-10-16``: the platforms' names of the Messages API version
_PLATFORM_VERSION = re.compile(r"^(?:bedrock|vertex)-\d{4}-\d{2}-\d{2}$")
_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# the Messages API version the platforms' versions stand for
PLATFORM_API_VERSION = "2023-06-01"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A client format's request as the internal Messages request."""

    body: bytes  # the Messages body (JSON)
    version: str  # the ``anthropic-version`` header
    betas: tuple[str, ...]  # from the body's ``anthropic_beta``
    model: str  # the Anthropic id inside
    client_model: str  # the model as the client named it (path or body)
    stream: bool


def members(text: bytes) -> dict[str, msgspec.Raw]:
    """The body's top-level members, values unparsed (``InvalidRequest`` if not an object)."""
    try:
        return _MEMBERS.decode(text)
    except msgspec.ValidationError:
        raise InvalidRequest("request body must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def version_of(raw: msgspec.Raw | None) -> str:
    """The ``anthropic-version`` header for the body's ``anthropic_version``."""
    if raw is None:
        raise InvalidRequest("anthropic_version: Field required")
    value = _string(raw, "anthropic_version")
    if _PLATFORM_VERSION.match(value):
        return PLATFORM_API_VERSION
    if _API_VERSION.match(value):
        return value
    raise InvalidRequest(f"anthropic_version: invalid value {value[:40]!r}")


def betas_of(raw: msgspec.Raw | None) -> tuple[str, ...]:
    """The body's ``anthropic_beta`` list (absent: none)."""
    if raw is None:
        return ()
    try:
        value = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:  # msgspec read it: cannot happen, but never a 500
        value = None
    if not isinstance(value, list) or not all(isinstance(b, str) and b for b in value):
        raise InvalidRequest("anthropic_beta: Input should be a list of beta names")
    return tuple(value)


def model_of(raw: msgspec.Raw | None) -> str:
    """The body's ``model`` (Vertex's count-tokens names it there)."""
    if raw is None:
        raise InvalidRequest("model: Field required")
    value = _string(raw, "model")
    if not value:
        raise InvalidRequest("model: String should have at least 1 character")
    return value


def stream_of(raw: msgspec.Raw | None) -> bool:
    if raw is None:
        return False
    text = bytes(raw)
    if text not in (b"true", b"false"):
        raise InvalidRequest("stream: Input should be a valid boolean")
    return text == b"true"


def rebuild(
    found: Mapping[str, msgspec.Raw],
    model: str,
    *,
    stream: bool | None,
    drop: Iterable[str] = (),
    platform: bool = True,
) -> bytes:
    """The Messages body: ``model`` first, the client's members as sent (minus the platform
    fields, ``model``, ``stream`` and ``drop``), ``stream`` last when given. ``platform=False``
    (a Messages body already, only its model renamed): every other member as sent, in place."""
    left_out = (PLATFORM_FIELDS | {"model", "stream", *drop}) if platform else {"model", *drop}
    parts = [b'{"model":' + orjson.dumps(model)]
    for name, value in found.items():
        if name not in left_out:
            parts.append(orjson.dumps(name) + b":" + bytes(value))
    if stream is not None:
        parts.append(b'"stream":true' if stream else b'"stream":false')
    return b",".join(parts) + b"}"


def merge_betas(header: str | None, body: Iterable[str]) -> str | None:
    """The internal ``anthropic-beta``: the header's betas, then the body's, each once."""
    seen: dict[str, None] = {}
    for beta in (header or "").split(","):
        if beta.strip():
            seen[beta.strip()] = None
    for beta in body:
        seen[beta] = None
    return ",".join(seen) or None


def _string(raw: msgspec.Raw, field: str) -> str:
    try:
        value = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: Input should be a valid string")
    return value
