"""Fake Bedrock Runtime and Vertex AI upstreams: real aiohttp servers on 127.0.0.1, port 0.

``FakeBedrock`` checks each request's SigV4 signature by recomputing it with botocore from the
bytes it received and the secret of a known test key; refuses an unknown key
(``UnrecognizedClientException``) or one marked expired (``ExpiredTokenException``) as Bedrock does;
enforces the body rules it encodes (``anthropic_version``, no ``model`` / ``stream``, only the betas
in :data:`BEDROCK_BETAS` -- anything else is Bedrock's 400 ``invalid beta flag`` -- and no body field
without the beta that enables it: "Extra inputs are not permitted"); with ``models`` (the base
ids it serves, e.g. Claude Code's catalogue's), only their cross-region inference profiles (or an
ARN) are invoked -- a base id is AWS's on-demand refusal, anything else "The provided model
identifier is invalid." -- and count-tokens takes the base id; and answers a stream in real
event-stream frames (:mod:`proxy.formats.eventstream`), or a scripted broken one.

``FakeVertex`` accepts only the bearer tokens its token endpoint (``/token``, Google's JWT-bearer
grant, the assertion checked against the service-account key it made) issued and has not
expired; only the betas of :data:`VERTEX_BETAS` ("Unsupported beta header" otherwise) and no
body field without its beta; with ``models``, only those model names (Google's 404 otherwise);
and answers rawPredict / streamRawPredict / count-tokens in Anthropic form; Google's 401 body
for a bad token.

The tables here are the fakes' own copy of what the platforms document (see tests/formats/
test_bridging.py for the pages) and of what Claude Code itself sends in each platform's mode
(tests/test_catalogue_oracle.py checks these copies against the pinned Claude Code's bundle),
written independently of ``proxy.formats.bridging``.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt

from proxy.formats.eventstream import CONTENT_TYPE, chunk_frame, exception_frame
from tests.harness import serve_local
from tests.upstream import message_json, message_stream_events

# AWS's documented example key pair (IAM user guide), the fakes' known test credentials.
TEST_ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
TEST_SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

BEDROCK_BETAS = frozenset(
    {
        "computer-use-2025-01-24",
        "interleaved-thinking-2025-05-14",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "compact-2026-01-12",  # AWS "Compaction" (claude-messages-compaction)
        "effort-2025-11-24",
        "fine-grained-tool-streaming-2025-05-14",
        "thinking-binding-controls-2026-08-01",
        "token-efficient-tools-2025-02-19",
    }
)
# body field -> the beta it needs (a top-level key, or "a.b" one level down)
FIELD_BETAS = {
    "context_management": "context-management-2025-06-27",
    "compaction": "compact-2026-09-04",
    "thinking.block_binding": "thinking-binding-controls-2026-08-01",
    "output_config.effort": "effort-2025-11-24",
    "speed": "fast-mode-2026-02-01",
}
# a service account's JWT names Google's token endpoint as its audience, whatever token_uri says
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
VERTEX_BETAS = frozenset(
    {
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "interleaved-thinking-2025-05-14",
        # what Claude Code 2.1.197 sends to Vertex in its Vertex mode (its third-party list): a
        # beta Claude Code sends there is one Vertex accepts
        "claude-code-20250219",
        "effort-2025-11-24",
        "tool-search-tool-2025-10-19",
        "web-search-2025-03-05",
        "structured-outputs-2025-12-15",
        "afk-mode-2026-01-31",
        "fallback-credit-2026-06-01",
    }
)
# Claude Code 2.1.197 sends these in Bedrock's body anthropic_beta
BEDROCK_BETAS = BEDROCK_BETAS | {"tool-search-tool-2025-10-19"}
GEOGRAPHIES = ("us", "eu", "apac", "jp", "au", "ca", "us-gov", "global")


def _has(body: dict[str, Any], path: str) -> bool:
    head, _, rest = path.partition(".")
    value = body.get(head)
    if not rest:
        return head in body
    return isinstance(value, dict) and rest in value


def _events(message: dict[str, Any]) -> list[bytes]:
    """Each SSE event's JSON, from the Anthropic stream of ``message``."""
    out = []
    for event in message_stream_events(message, pings=False):
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[len(b"data: "):])
    return out


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Broken:
    """A stream answer that goes wrong after ``good`` chunk frames."""

    how: str  # "crc" (a frame with a bad message CRC), "cut" (half a frame, then the end),
    # "exception" (a throttlingException frame), "garbage" (bytes that are no frame)
    good: int = 2


@dataclass
class FakeBedrock:
    secrets: dict[str, str] = field(default_factory=lambda: {TEST_ACCESS_KEY: TEST_SECRET_KEY})
    expired: set[str] = field(default_factory=set)
    region: str = "us-east-1"
    seen: list[Seen] = field(default_factory=list)
    script: list[Any] = field(default_factory=list)  # Broken or a message dict, in order
    # after the script: the answer to (path, body) (default: a short text message)
    responder: Callable[[str, dict[str, Any]], Any] | None = None
    count_tokens_reply: bytes | None = None  # instead of {"inputTokens": n}
    models: frozenset[str] | None = None  # the base model ids served (None: any id)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/model/{model}/{operation}", self._handle)
        self._runner, self.url = await serve_local(app)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _refuse(self, status: int, kind: str, message: str) -> web.Response:
        return web.Response(
            status=status,
            body=orjson.dumps({"message": message}),
            headers={
                "Content-Type": "application/json",
                "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
                "x-amzn-RequestId": "bedrock-req-refused",
            },
        )

    def _signature_problem(self, request: web.Request, body: bytes) -> web.Response | None:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return self._refuse(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
        parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        key_id, _date, region, service, _term = parts["Credential"].split("/")
        if key_id not in self.secrets:
            return self._refuse(
                403, "UnrecognizedClientException", "The security token included in the request is invalid."
            )
        if key_id in self.expired:
            return self._refuse(
                403, "ExpiredTokenException", "The security token included in the request is expired"
            )
        signed = parts["SignedHeaders"].split(";")
        headers = {name: request.headers[name] for name in signed if name in request.headers}
        raw = AWSRequest(
            method=request.method, url=f"http://{request.host}{request.raw_path}", data=body,
            headers=headers,
        )
        raw.context["timestamp"] = request.headers["X-Amz-Date"]
        signer = SigV4Auth(
            Credentials(key_id, self.secrets[key_id], request.headers.get("X-Amz-Security-Token")),
            service, region,
        )
        expected = signer.signature(signer.string_to_sign(raw, signer.canonical_request(raw)), raw)
        if service != "bedrock" or region != self.region or expected != parts["Signature"]:
            return self._refuse(
                403, "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided."
                " Check your AWS Secret Access Key and signing method.",
            )
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        refused = self._signature_problem(request, raw)
        if refused is not None:
            self.seen.append(Seen(request.raw_path, dict(request.headers), None))
            return refused
        body = orjson.loads(raw)
        self.seen.append(Seen(request.raw_path, dict(request.headers), body))
        operation = request.match_info["operation"]
        refused = self._model_problem(request.match_info["model"], operation)
        if refused is not None:
            return refused
        if operation == "count-tokens":
            invoke = orjson.loads(base64.b64decode(body["input"]["invokeModel"]["body"]))
            problem = self._body_problem(invoke)
            if problem is not None:
                return problem
            if self.count_tokens_reply is not None:
                return web.Response(body=self.count_tokens_reply, content_type="application/json")
            return web.json_response({"inputTokens": 42 + len(invoke["messages"])})
        problem = self._body_problem(body)
        if problem is not None:
            return problem
        if self.script:
            entry = self.script.pop(0)
        elif self.responder is not None:
            entry = self.responder(request.raw_path, body)
        else:
            entry = message_json("Hello from fake Bedrock.")
        headers = {"x-amzn-RequestId": "bedrock-req-1"}
        if operation == "invoke":
            return web.json_response(entry, headers=headers)
        response = web.StreamResponse(
            headers={**headers, "Content-Type": CONTENT_TYPE, "X-Amzn-Bedrock-Content-Type": "application/json"}
        )
        await response.prepare(request)
        broken = entry if isinstance(entry, Broken) else None
        message = message_json("Streamed from fake Bedrock.") if broken else entry
        for i, event in enumerate(_events(message)):
            if broken is not None and i == broken.good:
                await response.write(self._broken(broken.how))
                return response
            await response.write(chunk_frame(event))
        await response.write_eof()
        return response

    def _model_problem(self, model: str, operation: str) -> web.Response | None:
        """Bedrock's answers for an id it does not serve (``models`` set): the newer models run
        on inference profiles only (AWS "Supported Regions and models for inference profiles";
        list-foundation-models says inferenceTypesSupported: INFERENCE_PROFILE)."""
        if self.models is None or model.startswith("arn:"):
            return None
        geo, _, base = model.partition(".")
        if operation == "count-tokens":
            if model in self.models:
                return None
        elif geo in GEOGRAPHIES and base in self.models:
            return None
        elif model in self.models:
            return self._refuse(
                400, "ValidationException",
                f"Invocation of model ID {model} with on-demand throughput isn't supported. Retry"
                " your request with the ID or ARN of an inference profile that contains this model.",
            )
        return self._refuse(400, "ValidationException", "The provided model identifier is invalid.")

    def _broken(self, how: str) -> bytes:
        good = chunk_frame(orjson.dumps({"type": "ping"}))
        if how == "crc":
            return good[:-1] + bytes([good[-1] ^ 0xFF])
        if how == "cut":
            return good[: len(good) // 2]
        if how == "exception":
            return exception_frame("throttlingException", "Too many requests, please wait before trying again.")
        return b"\x00\x00\x00\x20not an event stream frame at all!!"

    def _body_problem(self, body: dict[str, Any]) -> web.Response | None:
        if body.get("anthropic_version") != "bedrock-2023-05-31":
            return self._refuse(400, "ValidationException", "anthropic_version: invalid value")
        for key in ("model", "stream"):
            if key in body:
                return self._refuse(400, "ValidationException", f"#: extraneous key [{key}] is not permitted")
        betas = body.get("anthropic_beta", [])
        if any(beta not in BEDROCK_BETAS for beta in betas):
            return self._refuse(400, "ValidationException", "invalid beta flag")
        for path, beta in FIELD_BETAS.items():
            if _has(body, path) and beta not in betas:
                return self._refuse(400, "ValidationException", f"{path}: Extra inputs are not permitted")
        for message in body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "compaction" for b in content
            ):
                return self._refuse(
                    400, "ValidationException", "messages: compaction blocks are not supported"
                )
        return None


@dataclass
class FakeVertex:
    project: str = "test-project"
    location: str = "us-east5"
    tokens: dict[str, bool] = field(default_factory=dict)  # token -> still valid
    seen: list[Seen] = field(default_factory=list)
    token_grants: int = 0
    token_lifetime: int = 3600
    models: frozenset[str] | None = None  # the model names served (None: any)
    _public_pem: bytes = b""
    url: str = ""
    _runner: web.AppRunner | None = None
    _serial: Any = field(default_factory=lambda: itertools.count(1))

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/token", self._token)
        app.router.add_post("/v1/{tail:.*}", self._handle)
        self._runner, self.url = await serve_local(app)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def service_account(self) -> dict[str, str]:
        """A service-account key file's fields: a fresh RSA key, this fake as its token endpoint."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "type": "service_account",
            "project_id": self.project,
            "private_key_id": "test-key-1",
            "private_key": private.decode(),
            "client_email": "proxy@test-project.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "token_uri": f"{self.url}/token",
        }

    async def _token(self, request: web.Request) -> web.Response:
        """Google's JWT-bearer grant: the assertion must be signed by the service account's key."""
        form = await request.post()
        assertion = form.get("assertion")
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" or not isinstance(assertion, str):
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        try:
            claims = jwt.decode(assertion, certs=self._public_pem, audience=GOOGLE_TOKEN_AUDIENCE)
        except ValueError:
            return web.json_response({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, status=400)
        if "cloud-platform" not in claims.get("scope", ""):
            return web.json_response({"error": "invalid_scope"}, status=400)
        self.token_grants += 1
        token = f"ya29.test-{next(self._serial)}"
        self.tokens[token] = True
        return web.json_response(
            {"access_token": token, "expires_in": self.token_lifetime, "token_type": "Bearer"}
        )

    def expire_all(self) -> None:
        for token in self.tokens:
            self.tokens[token] = False

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        body = orjson.loads(raw) if raw else None
        self.seen.append(Seen(request.raw_path, dict(request.headers), body))
        if not self.tokens.get(token):
            return web.json_response(
                {
                    "error": {
                        "code": 401,
                        "message": "Request had invalid authentication credentials. Expected OAuth 2"
                        " access token, login cookie or other valid authentication credential.",
                        "status": "UNAUTHENTICATED",
                    }
                },
                status=401,
            )
        prefix = f"/v1/projects/{self.project}/locations/{self.location}/publishers/anthropic/models/"
        if not request.path.startswith(prefix):
            return web.json_response(
                {"error": {"code": 404, "message": "Not found", "status": "NOT_FOUND"}}, status=404
            )
        model, _, method = request.path[len(prefix):].partition(":")
        betas = [b for b in request.headers.get("anthropic-beta", "").split(",") if b]
        unsupported = [b for b in betas if b not in VERTEX_BETAS]
        if unsupported:
            return web.json_response(
                {"type": "error", "error": {"type": "invalid_request_error",
                                            "message": f"Unsupported beta header: {unsupported[0]}"}},
                status=400,
            )
        if body.get("anthropic_version") != "vertex-2023-10-16":
            return web.json_response(
                {"error": {"code": 400, "message": "anthropic_version is required", "status": "INVALID_ARGUMENT"}},
                status=400,
            )
        for path, beta in FIELD_BETAS.items():
            if _has(body, path) and beta not in betas:
                return web.json_response(
                    {"type": "error", "error": {"type": "invalid_request_error",
                                                "message": f"{path}: Extra inputs are not permitted"}},
                    status=400,
                )
        served = body.get("model") if model == "count-tokens" else model
        if self.models is not None and served not in self.models:
            return web.json_response(
                {"error": {"code": 404, "status": "NOT_FOUND", "message": (
                    f"Publisher Model `projects/{self.project}/locations/{self.location}/publishers"
                    f"/anthropic/models/{served}` was not found or your project does not have"
                    " access to it.")}},
                status=404,
            )
        if model == "count-tokens":
            return web.json_response({"input_tokens": 10 + len(body["messages"])})
        if "model" in body:
            return web.json_response(
                {"type": "error", "error": {"type": "invalid_request_error", "message": "model: Extra inputs are not permitted"}},
                status=400,
            )
        message = message_json(f"Hello from fake Vertex ({model}).", model=model)
        return await messages_answer(request, message, method != "rawPredict", "req_vertex")


async def messages_answer(
    request: web.Request, message: dict[str, Any], stream: bool, request_id: str
) -> web.StreamResponse:
    """``message`` as the Messages API answers it: JSON, or its SSE events."""
    if not stream:
        return web.json_response(message, headers={"request-id": f"{request_id}_1"})
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "request-id": f"{request_id}_2"}
    )
    await response.prepare(request)
    for event in message_stream_events(message):
        await response.write(event)
    await response.write_eof()
    return response
