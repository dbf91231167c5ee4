"""The Bedrock InvokeModel, Vertex rawPredict and Microsoft Foundry routes: each request decoded
into the internal Messages request, served by the one Messages handler, its answer written in the
client's format.

The internal request is a clone of the client's (``web.Request.clone``: the same connection,
tenant and state) with the Messages path, the ``anthropic-version`` and ``anthropic-beta``
headers the body carried, and the platform's own headers (``x-amz-*``, ``amz-sdk-*``,
``x-goog-*``, a SigV4 ``Authorization``) left out; the client's credential (``x-api-key`` or
``Authorization: Bearer``) stays, so authentication, the tenant's upstream credentials and the
body memo's scope work as on ``/v1/messages``. ``serve_messages`` then validates, injects,
compacts, forwards and relays exactly as for an Anthropic client; a Bedrock answer is encoded by
``formats.answer.BedrockAnswer``, a Vertex answer is the Anthropic one.

Foundry (``/anthropic/v1/messages``, ``/anthropic/v1/messages/count_tokens``) is the Messages API
already: the clone only drops the prefix (the query, Claude Code's ``?beta=true``, kept) and
Foundry's ``api-key`` header (read as ``x-api-key`` when that one is absent), and the body keeps
its bytes unless its model is a deployment name the Claude API does not take
(:mod:`proxy.formats.foundry`). Its answers and errors are the Anthropic ones.
"""

from __future__ import annotations

import time

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.catalogue import Catalogue
from proxy.core.errors import NotFound
from proxy.formats import bedrock, foundry, vertex
from proxy.formats.request import Decoded, merge_betas
from proxy.server.appkeys import CONFIG
from proxy.server.formats.answer import BedrockAnswer, render_bedrock_error, render_vertex_error
from proxy.server.messages import decoded_for_inspection, read_body, serve_messages
from proxy.server.quota import QUOTA_TICKET
from proxy.server.relay.answer import ANSWER_FORMAT, ERROR_FORMATS

# the catalogue the formats name models by (every platform's spelling of each model)
MODEL_IDS = web.AppKey("model_ids", Catalogue)
# the paths of the client formats' API routes (admission and authentication apply to them)
FORMAT_PATHS = ("/model/", "/projects/", "/v1/projects/", foundry.PREFIX + "/v1/")
_VERTEX_PATH = "/projects/{project}/locations/{region}/publishers/anthropic/models/{target}"
BEDROCK_ROUTES = (
    "bedrock_invoke", "bedrock_stream", "bedrock_count", "bedrock_profiles", "bedrock_profile"
)
VERTEX_ROUTES = ("vertex", "vertex_v1")
FOUNDRY_ROUTES = {"foundry_messages": "messages", "foundry_count": "count_tokens"}
# the platforms' own request headers: meaningless to the Messages API
_PLATFORM_HEADERS = ("x-amz-", "x-amzn-", "amz-sdk-", "x-goog-")
_REPLACED = frozenset({"content-length", "content-encoding", "anthropic-version", "anthropic-beta"})
_BEDROCK = BedrockAnswer()
_BEDROCK_COUNT = BedrockAnswer(counting=True)


def add_format_routes(app: web.Application, ids: Catalogue) -> None:
    """Mount the routes (before the ``/v1/*`` passthrough: Vertex paths may start with it);
    ``ids``: the catalogue (the config's ``models:`` entries before the built-in rows)."""
    app[MODEL_IDS] = ids
    router = app.router
    router.add_post("/model/{model:.+}/invoke", handle_bedrock, name="bedrock_invoke")
    router.add_post(
        "/model/{model:.+}/invoke-with-response-stream", handle_bedrock, name="bedrock_stream"
    )
    router.add_post("/model/{model:.+}/count-tokens", handle_bedrock_count, name="bedrock_count")
    router.add_get("/inference-profiles", handle_inference_profiles, name="bedrock_profiles")
    router.add_get(
        "/inference-profiles/{profile:.+}", handle_inference_profile, name="bedrock_profile"
    )
    router.add_post(_VERTEX_PATH, handle_vertex, name="vertex")
    router.add_post("/v1" + _VERTEX_PATH, handle_vertex, name="vertex_v1")
    router.add_post(foundry.PREFIX + "/v1/messages", handle_foundry, name="foundry_messages")
    router.add_post(
        foundry.PREFIX + "/v1/messages/count_tokens", handle_foundry, name="foundry_count"
    )
    for name in BEDROCK_ROUTES:
        app[ERROR_FORMATS][name] = render_bedrock_error
    for name in VERTEX_ROUTES:
        app[ERROR_FORMATS][name] = render_vertex_error


async def _read(request: web.Request) -> bytes:
    """The body's JSON text (bounded; inflated when sent compressed)."""
    limit = request.app[CONFIG].limits.max_body_bytes
    raw = await read_body(request, limit)
    return decoded_for_inspection(request, raw, limit)


def internal_headers(headers: CIMultiDictProxy[str], decoded: Decoded) -> CIMultiDict[str]:
    """The internal Messages request's headers (see the module's docstring)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low in _REPLACED or low.startswith(_PLATFORM_HEADERS):
            continue
        if low == "authorization" and value.startswith("AWS4-"):
            continue  # a SigV4 signature of the client's request: nothing upstream can check
        if low == "accept" and "eventstream" in value:
            continue
        out.add(name, value)
    out["anthropic-version"] = decoded.version
    betas = merge_betas(",".join(headers.getall("anthropic-beta", [])), decoded.betas)
    if betas is not None:
        out["anthropic-beta"] = betas
    out["Content-Type"] = "application/json"
    return out


async def handle_bedrock(request: web.Request) -> web.StreamResponse:
    """``POST /model/{model}/invoke`` and ``/invoke-with-response-stream``."""
    started = time.perf_counter()
    stream = request.match_info.route.name == "bedrock_stream"
    text = await _read(request)
    decoded = bedrock.decode(
        request.match_info["model"], text, stream=stream, ids=request.app[MODEL_IDS]
    )
    internal = request.clone(
        rel_url="/v1/messages", headers=internal_headers(request.headers, decoded)
    )
    internal[ANSWER_FORMAT] = _BEDROCK
    return await _serve(request, internal, "messages", decoded.body, started)


async def handle_bedrock_count(request: web.Request) -> web.StreamResponse:
    """``POST /model/{model}/count-tokens`` (Claude Code counts a long context this way)."""
    started = time.perf_counter()
    text = await _read(request)
    decoded = bedrock.decode_count(request.match_info["model"], text, ids=request.app[MODEL_IDS])
    internal = request.clone(
        rel_url="/v1/messages/count_tokens", headers=internal_headers(request.headers, decoded)
    )
    internal[ANSWER_FORMAT] = _BEDROCK_COUNT
    return await _serve(request, internal, "count_tokens", decoded.body, started)


async def handle_vertex(request: web.Request) -> web.StreamResponse:
    """``POST …/publishers/anthropic/models/{model}:rawPredict`` / ``:streamRawPredict`` /
    ``count-tokens:rawPredict``."""
    started = time.perf_counter()
    model, method = vertex.split_target(request.match_info["target"])
    text = await _read(request)
    decoded, counting = vertex.decode(model, method, text, ids=request.app[MODEL_IDS])
    path, route = ("/v1/messages/count_tokens", "count_tokens") if counting else (
        "/v1/messages", "messages"
    )
    internal = request.clone(rel_url=path, headers=internal_headers(request.headers, decoded))
    return await _serve(request, internal, route, decoded.body, started)


async def handle_foundry(request: web.Request) -> web.StreamResponse:
    """``POST /anthropic/v1/messages`` and ``/anthropic/v1/messages/count_tokens``: a client in
    Foundry mode whose base URL is the proxy's ``/anthropic``."""
    started = time.perf_counter()
    route = FOUNDRY_ROUTES[request.match_info.route.name or ""]
    limit = request.app[CONFIG].limits.max_body_bytes
    raw = await read_body(request, limit)
    text = decoded_for_inspection(request, raw, limit)
    body, _model = foundry.decode(text, ids=request.app[MODEL_IDS])
    headers = foundry_headers(request.headers, rebodied=body is not text)
    path = "/v1/messages" if route == "messages" else "/v1/messages/count_tokens"
    query = request.raw_path.partition("?")[2]
    internal = request.clone(rel_url=f"{path}?{query}" if query else path, headers=headers)
    if body is text:  # the client's bytes, as /v1/messages takes them (compressed or not)
        return await _serve(request, internal, route, raw, started, text)
    return await _serve(request, internal, route, body, started)


def foundry_headers(headers: CIMultiDictProxy[str], *, rebodied: bool) -> CIMultiDict[str]:
    """The internal request's headers: the client's, Foundry's ``api-key`` taken as ``x-api-key``
    (when that one is absent) and never passed on; a rebuilt body's length and encoding are the
    proxy's own."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low == "api-key" or (rebodied and low in ("content-length", "content-encoding")):
            continue
        out.add(name, value)
    key = headers.get("api-key")
    if key and "x-api-key" not in out:
        out["x-api-key"] = key
    return out


async def _serve(
    request: web.Request,
    internal: web.Request,
    route: str,
    body: bytes,
    started: float,
    text: bytes | None = None,
) -> web.StreamResponse:
    """The internal request served (``body`` goes upstream when nothing changes, ``text`` its JSON
    when it came compressed); what it admitted against the tenant's limits handed back to the
    client's request (a clone's state is its own copy), where the error middleware settles a
    request that ends before the provider."""
    try:
        return await serve_messages(internal, route, body, body if text is None else text, started)
    finally:
        ticket = internal.get(QUOTA_TICKET)
        if ticket is not None:
            request[QUOTA_TICKET] = ticket


async def handle_inference_profiles(request: web.Request) -> web.StreamResponse:
    """Claude Code's Bedrock startup probe (``?type=SYSTEM_DEFINED``): an empty list."""
    return web.Response(body=bedrock.inference_profiles(), content_type="application/json")


async def handle_inference_profile(request: web.Request) -> web.StreamResponse:
    """``GET /inference-profiles/{id}``: the profile of a Claude model (404 otherwise)."""
    profile = request.match_info["profile"]
    body = bedrock.inference_profile(profile, request.app[MODEL_IDS])
    if body is None:
        raise NotFound(f"inference profile {profile[:120]!r} not found")
    return web.Response(body=body, content_type="application/json")
