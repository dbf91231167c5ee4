"""Sending a Messages call to Bedrock Runtime, Vertex AI or Microsoft Foundry, answered in
Anthropic form.

:class:`Platforms` holds one :class:`BedrockUpstream` / :class:`VertexUpstream` /
:class:`FoundryUpstream` per distinct
tenant target (``upstream:`` in the config or a policy), made at first use and kept (their
credentials and tokens are reused). The auth middleware asks it once per request, for the
request's tenant, and sets :data:`CURRENT`, which ``Forwarder.open`` reads; the Anthropic
platform is ``None`` there and takes the usual path.

Each platform:

1. takes the Messages body the handler forwards as the value it parsed (never parsing the bytes
   again; a caller without one hands bytes, decoded when the client gzipped them),
2. bridges its betas (:mod:`proxy.formats.bridging`: unsupported betas dropped with their body
   fields, reported in ``x-upstream-betas-dropped`` / ``x-upstream-fields-dropped``),
3. encodes it for the platform (:mod:`proxy.formats.bedrock_upstream`,
   :mod:`proxy.formats.vertex_upstream`, :mod:`proxy.formats.foundry_upstream`), with the
   model's spelling there (:mod:`proxy.core.catalogue`: an ARN or an id that carries a
   geography as given, the target's ``profile_geo`` in front of a bare Bedrock id; Foundry's
   deployment name), signs it (SigV4, a bearer token, or Foundry's key),
4. sends it on the Forwarder's one session; a refused credential (Bedrock ``ExpiredTokenException``
   / ``UnrecognizedClientException``, Vertex or Foundry 401) is renewed once and the call sent
   again,
5. answers an :class:`~proxy.server.upstream.response.AdaptedResponse`: 200 streams as Anthropic
   SSE, errors as Anthropic error bodies with the upstream's wording (when the platform refuses
   an id the catalogue did not know and the published rule made, the error names the
   ``models:`` entry to add).

Other /v1 routes: ``GET /v1/models`` (and ``/v1/models/{id}``) are answered from the catalogue
(the models with a known id on the platform);
anything else is a 404 ``not_found_error`` naming the platform.
"""

from __future__ import annotations

import contextvars
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.config.upstream import UpstreamTarget
from proxy.core.catalogue import Catalogue, Resolved
from proxy.core.errors import InvalidRequest, NotFound, error_body, new_request_id
from proxy.formats import bedrock_upstream as bedrock
from proxy.formats import foundry_upstream as foundry
from proxy.formats import vertex_upstream as vertex
from proxy.formats.bridging import Bridged, Bridging, betas_of, bridge
from proxy.formats.eventstream import CONTENT_TYPE as EVENT_STREAM
from proxy.formats.upstream_errors import bedrock_error, foundry_error, vertex_error
from proxy.server.http.metrics import Metrics
from proxy.server.upstream.credentials import AwsCredentials, AzureToken, FoundryKey, GoogleToken
from proxy.server.upstream.response import AdaptedResponse, UpstreamResponse

log = logging.getLogger("context_proxy.upstream")

DROPPED_BETAS_HEADER = "x-upstream-betas-dropped"
DROPPED_FIELDS_HEADER = "x-upstream-fields-dropped"
# An error answer is read whole to translate it; more than this is not an error answer.
MAX_ERROR_BYTES = 1024 * 1024
_AWS_RENEW = ("expiredtoken", "unrecognizedclient")


class UpstreamPlatform:
    """One Bedrock, Vertex or Foundry target."""

    format = ""

    def __init__(
        self,
        target: UpstreamTarget,
        session: aiohttp.ClientSession,
        timeout: aiohttp.ClientTimeout,
        catalogue: Catalogue,
        metrics: Metrics,
    ) -> None:
        self.target = target
        self.session = session
        self.timeout = timeout
        self.catalogue = catalogue
        self.metrics = metrics
        self.bridging = Bridging.for_platform(
            target.format,
            target.accepted_betas,
            {entry.beta: entry.fields for entry in target.beta_fields},
        )

    async def open(
        self,
        request: web.Request,
        *,
        route: str,
        data: bytes | AsyncIterator[bytes] | None,
        headers: CIMultiDict[str],
        body: Mapping[str, Any] | None = None,
    ) -> UpstreamResponse:
        """A call the forwarder hands over: a Messages call is encoded from ``body`` (what
        ``data`` holds, parsed: the handler parsed it already), read from ``data`` only without
        it; ``/v1/models`` is answered here (``other_route``)."""
        if route not in ("messages", "count_tokens"):
            return self.other_route(request)
        if body is None:
            raw = data if isinstance(data, bytes) else b"".join([c async for c in data or _empty()])
            body = _json_of(raw, headers.get("Content-Encoding"))
        return await self.call(
            body, headers.getall("anthropic-beta", []), count_tokens=route == "count_tokens",
            version=headers.get("anthropic-version"),
        )

    async def call(
        self,
        body: Mapping[str, Any],
        beta_values: list[str],
        *,
        count_tokens: bool = False,
        version: str | None = None,
    ) -> AdaptedResponse:
        """A Messages call (``body`` as the Anthropic API takes it, ``version`` its
        ``anthropic-version``), answered in Anthropic form."""
        bridged = bridge(body, betas_of(beta_values), self.bridging)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: Field required")
        answer = await self._send(bridged, model, count_tokens, version)
        if (
            answer.status in (400, 404)
            and isinstance(answer.body, bytes)
            and self.catalogue.derived(model, self.format)
        ):
            answer.body = _with_note(answer.body, self._unknown_note(model))
        if bridged.dropped_betas:
            answer.headers_extra[DROPPED_BETAS_HEADER] = ",".join(bridged.dropped_betas)
        if bridged.dropped_fields:
            answer.headers_extra[DROPPED_FIELDS_HEADER] = ",".join(bridged.dropped_fields)
        return answer.response()

    async def _send(
        self, bridged: Bridged, model: str, count_tokens: bool, version: str | None
    ) -> _Answer:
        raise NotImplementedError

    def _sent_id(self, model: str) -> str:
        """The id the platform gets for ``model``."""
        return self.catalogue.vertex(model)

    def _unknown_note(self, model: str) -> str:
        sent = self._sent_id(model)
        return (
            f"the proxy's model catalogue does not know {model[:100]!r}; it sent {sent[:120]!r}"
            f" by the published id rule. If {self.format} names the model otherwise, add a"
            f" models: entry {{match: {model[:100]}, {self.format}: <its id>}}"
        )

    def accepts(self, beta: str) -> bool:
        """Whether ``beta`` reaches the platform (the bridging keeps it)."""
        return beta in self.bridging.accepted

    async def close(self) -> None:
        """Release what the credentials hold (a token transport's connections)."""

    async def _auth(self, renew: bool) -> dict[str, str]:
        """The credential's headers (``renew``: after the platform refused the one held)."""
        raise NotImplementedError

    async def _anthropic_exchange(
        self,
        url: str,
        headers: Mapping[str, str],
        payload: bytes,
        translate: Callable[[int, bytes, str], bytes],
        refused_note: str,
    ) -> _Answer:
        """A call whose 200 answer is the Messages API's own (JSON or SSE, relayed as it comes):
        Vertex and Foundry. A 401 renews the credential once and sends the call again; an error
        answer is ``translate``d (``refused_note`` added when still refused after the renewal)."""
        upstream = await self._post(url, {**headers, **await self._auth(renew=False)}, payload)
        renewed = False
        if upstream.status == 401:
            upstream.release()
            renewed = True
            upstream = await self._post(url, {**headers, **await self._auth(renew=True)}, payload)
        request_id = (
            upstream.headers.get("request-id") or upstream.headers.get("apim-request-id")
            or new_request_id()
        )
        out = {"request-id": request_id}
        if upstream.status != 200:
            async with upstream:
                raw = await _read_bounded(upstream)
            error = translate(upstream.status, raw, request_id)
            if renewed and upstream.status == 401:
                error = _with_note(error, refused_note)
            if "retry-after" in upstream.headers:
                out["retry-after"] = upstream.headers["retry-after"]
            return _Answer(upstream.status, {**out, "Content-Type": "application/json"}, error)
        content_type = upstream.headers.get("Content-Type", "application/json")
        return _Answer(
            200, {**out, "Content-Type": content_type}, upstream.content.iter_any(), upstream.release
        )

    def other_route(self, request: web.Request) -> AdaptedResponse:
        """``GET /v1/models[/{id}]`` from the catalogue; any other route is not served."""
        path = request.path
        if request.method in ("GET", "HEAD") and path in ("/v1/models", "/v1/models/"):
            models = [_model_info(r) for r in self.catalogue.listed(self.format)]
            body = {
                "data": models,
                "has_more": False,
                "first_id": models[0]["id"] if models else None,
                "last_id": models[-1]["id"] if models else None,
            }
            return _json_answer(200, body)
        if request.method in ("GET", "HEAD") and path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            resolved = self.catalogue.resolve(name)
            if resolved.known:
                return _json_answer(200, _model_info(resolved))
            raise NotFound(f"model: {name[:100]} is not in the proxy's model catalogue")
        raise NotFound(
            f"{path[:100]} is not available through the proxy's {self.format} upstream"
            " (it serves /v1/messages, /v1/messages/count_tokens and /v1/models)"
        )

    async def _post(
        self, url: str, headers: Mapping[str, str], body: bytes
    ) -> aiohttp.ClientResponse:
        return await self.session.post(
            URL(url, encoded=True), headers=headers, data=body, timeout=self.timeout,
            allow_redirects=False, auto_decompress=True,
        )


class _Answer:
    """An answer being built: its parts, then :meth:`response`."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes | AsyncIterator[bytes],
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.status = status
        self.headers_extra = headers
        self.body = body
        self.release = release

    def response(self) -> AdaptedResponse:
        return AdaptedResponse(self.status, self.headers_extra, self.body, self.release)


class BedrockUpstream(UpstreamPlatform):
    format = "bedrock"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        target = self.target
        self.endpoint = (
            target.endpoint_url or f"https://bedrock-runtime.{target.region}.amazonaws.com"
        ).rstrip("/")
        self.credentials = AwsCredentials(target.aws_profile, target.region)

    def _sent_id(self, model: str) -> str:
        return self.catalogue.bedrock(model, self.target.geography())

    async def _send(
        self, bridged: Bridged, model: str, count_tokens: bool, version: str | None
    ) -> _Answer:
        stream = bridged.body.get("stream") is True and not count_tokens
        if count_tokens:  # a foundation model id: count-tokens takes no inference profile
            path = bedrock.count_tokens_path(self.catalogue.bedrock_foundation(model))
            payload = bedrock.count_tokens_body(bridged.body, bridged.betas)
        else:
            model_id = self._sent_id(model)
            path = bedrock.model_path(model_id, stream=stream)
            payload = orjson.dumps(bedrock.invoke_body(bridged.body, bridged.betas))
        url = self.endpoint + path
        headers = {
            "Content-Type": "application/json",
            "Accept": EVENT_STREAM if stream else "application/json",
        }
        upstream = await self._post(url, await self.credentials.sign("POST", url, headers, payload), payload)
        renewed = False
        if upstream.status in (400, 401, 403) and _aws_kind(upstream) in _AWS_RENEW:
            upstream.release()
            await self.credentials.renew()
            renewed = True
            upstream = await self._post(
                url, await self.credentials.sign("POST", url, headers, payload), payload
            )
        request_id = upstream.headers.get("x-amzn-RequestId") or new_request_id()
        out = {"request-id": request_id}
        if upstream.status != 200:
            async with upstream:
                body = await _read_bounded(upstream)
            error = bedrock_error(
                upstream.status, upstream.headers.get("x-amzn-ErrorType", ""), body, request_id
            )
            if renewed and _aws_kind(upstream) in _AWS_RENEW:
                error = _with_note(error, "the proxy renewed its AWS credentials once; still refused")
            for name in ("retry-after",):
                if name in upstream.headers:
                    out[name] = upstream.headers[name]
            return _Answer(upstream.status, {**out, "Content-Type": "application/json"}, error)
        if count_tokens:
            async with upstream:
                body = await _read_bounded(upstream)
            answer = bedrock.count_tokens_answer(body)
            if answer is None:
                return _Answer(502, {**out, "Content-Type": "application/json"}, _bad_answer(request_id))
            return _Answer(200, {**out, "Content-Type": "application/json"}, answer)
        if not stream:
            return _Answer(
                200, {**out, "Content-Type": "application/json"}, upstream.content.iter_any(),
                upstream.release,
            )
        return _Answer(
            200,
            {**out, "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
            self._sse(upstream, request_id),
            upstream.release,
        )

    async def _sse(self, upstream: aiohttp.ClientResponse, request_id: str) -> AsyncIterator[bytes]:
        translate = bedrock.StreamToSse(request_id)
        async for chunk in upstream.content.iter_any():
            out = translate.feed(chunk)
            if out:
                yield out
            if translate.done:
                break
        tail = translate.close()
        if tail:
            yield tail
        if translate.failure is not None:
            self.metrics.upstream_errors.labels("midstream").inc()
            log.warning("[upstream] bedrock stream failed: %s", translate.failure)


class VertexUpstream(UpstreamPlatform):
    format = "vertex"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        target = self.target
        self.endpoint = (target.endpoint_url or vertex.default_endpoint(target.location)).rstrip("/")
        self.tokens = GoogleToken(target.credentials_file)

    async def close(self) -> None:
        await self.tokens.close()

    async def _send(
        self, bridged: Bridged, model: str, count_tokens: bool, version: str | None
    ) -> _Answer:
        target = self.target
        model_name = self._sent_id(model)
        if count_tokens:
            path = vertex.count_tokens_path(target.project, target.location)
            body = vertex.predict_body(bridged.body, keep_model=model_name)
            body.pop("stream", None)
        else:
            path = vertex.model_path(
                target.project, target.location, model_name,
                stream=bridged.body.get("stream") is True,
            )
            body = vertex.predict_body(bridged.body)
        headers = {"Content-Type": "application/json"}
        if bridged.betas:
            headers["anthropic-beta"] = ",".join(bridged.betas)
        return await self._anthropic_exchange(
            self.endpoint + path, headers, orjson.dumps(body), vertex_error,
            "the proxy renewed its Google token once; still refused",
        )

    async def _auth(self, renew: bool) -> dict[str, str]:
        token = await (self.tokens.renew() if renew else self.tokens.token())
        return {"Authorization": f"Bearer {token}"}


class FoundryUpstream(UpstreamPlatform):
    """Microsoft Foundry: the Messages API under the resource, the model its deployment name;
    the resource's key, or a Microsoft Entra ID token."""

    format = "foundry"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        target = self.target
        self.endpoint = (target.endpoint_url or foundry.default_endpoint(target.resource)).rstrip("/")
        self.credential: FoundryKey | AzureToken = (
            FoundryKey(target.api_key_env) if target.api_key_env else AzureToken(target.entra_scope)
        )

    def _sent_id(self, model: str) -> str:
        return self.catalogue.foundry(model)

    async def close(self) -> None:
        await self.credential.close()

    async def _auth(self, renew: bool) -> dict[str, str]:
        credential = self.credential
        if isinstance(credential, FoundryKey):
            return foundry.key_headers(await (credential.renew() if renew else credential.key()))
        return foundry.bearer_headers(await (credential.renew() if renew else credential.token()))

    async def _send(
        self, bridged: Bridged, model: str, count_tokens: bool, version: str | None
    ) -> _Answer:
        path = foundry.COUNT_TOKENS_PATH if count_tokens else foundry.MESSAGES_PATH
        payload = orjson.dumps(foundry.messages_body(bridged.body, self._sent_id(model)))
        url = self.endpoint + path
        headers = {
            "Content-Type": "application/json",
            "anthropic-version": version or foundry.ANTHROPIC_VERSION,
        }
        if bridged.betas:
            headers["anthropic-beta"] = ",".join(bridged.betas)
        what = "read its Foundry key again" if isinstance(self.credential, FoundryKey) else (
            "renewed its Microsoft Entra ID token"
        )
        return await self._anthropic_exchange(
            url, headers, payload, foundry_error, f"the proxy {what} once; still refused"
        )


# Set by the auth middleware for each /v1 request: its tenant's platform (None: the Anthropic
# API). The summary client reads it, so a tenant's summaries go where its requests go.
CURRENT: contextvars.ContextVar[UpstreamPlatform | None] = contextvars.ContextVar(
    "upstream_platform", default=None
)


class Platforms:
    """One platform object per distinct target, made at first use."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout: aiohttp.ClientTimeout,
        catalogue: Catalogue,
        metrics: Metrics,
    ) -> None:
        self._args = (session, timeout, catalogue, metrics)
        self._made: dict[UpstreamTarget, UpstreamPlatform] = {}

    async def close(self) -> None:
        for made in self._made.values():
            await made.close()
        self._made.clear()

    def get(self, target: UpstreamTarget) -> UpstreamPlatform | None:
        if target.format == "anthropic":
            return None
        made = self._made.get(target)
        if made is None:
            made = self._made[target] = _KINDS[target.format](target, *self._args)
        return made


_KINDS: dict[str, type[UpstreamPlatform]] = {
    kind.format: kind for kind in (BedrockUpstream, VertexUpstream, FoundryUpstream)
}


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""


def _json_of(raw: bytes, encoding: str | None) -> Mapping[str, Any]:
    """The forwarded body as JSON (a gzip/deflate body the handler forwarded as sent: decoded)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        try:
            raw = zlib.decompress(raw, 31 if "gzip" in encoding else 15)
        except zlib.error:
            raise InvalidRequest(f"request body is not valid {encoding} data") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


async def _read_bounded(upstream: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    try:
        async for chunk in upstream.content.iter_any():
            body += chunk
            if len(body) > MAX_ERROR_BYTES:
                break
    except (aiohttp.ClientError, TimeoutError):
        pass  # what arrived is what we translate
    return bytes(body[:MAX_ERROR_BYTES])


def _aws_kind(upstream: aiohttp.ClientResponse) -> str:
    name = upstream.headers.get("x-amzn-ErrorType", "").split(":", 1)[0].strip().lower()
    return name[: -len("exception")] if name.endswith("exception") else name


def _with_note(error: bytes, note: str) -> bytes:
    data = orjson.loads(error)
    data["error"]["message"] = f"{data['error']['message']} ({note})"
    return orjson.dumps(data)


def _bad_answer(request_id: str) -> bytes:
    return error_body("api_error", "the upstream's count-tokens answer was unreadable", request_id)


def _json_answer(status: int, body: Any) -> AdaptedResponse:
    return AdaptedResponse(
        status, {"Content-Type": "application/json", "request-id": new_request_id()}, orjson.dumps(body)
    )


def _model_info(model: Resolved) -> dict[str, Any]:
    return {
        "type": "model", "id": model.id, "display_name": model.display.value,
        "created_at": "1970-01-01T00:00:00Z",
    }
