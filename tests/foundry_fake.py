"""A fake Microsoft Foundry resource: a real aiohttp server on 127.0.0.1, port 0.

``FakeFoundry`` serves the Messages API under ``/anthropic`` as a Foundry resource does
(platform.claude.com "Claude in Microsoft Foundry"): a request carries the resource's key in
``x-api-key`` or ``api-key`` ("Use the api-key or x-api-key header"), or a Microsoft Entra ID
token as ``Authorization: Bearer`` that its own managed-identity endpoint (``/msi/token``: Azure
App Service's form, ``IDENTITY_ENDPOINT`` + ``IDENTITY_HEADER``, a member of azure-identity's
``DefaultAzureCredential`` chain) issued for the Cognitive Services or AI audience and that has
not expired; anything else is Azure's 401 (``{"error": {"code": "401", "message": "Access denied
due to invalid subscription key or wrong API endpoint..."}}`` for a key, anthropics/claude-code
#91842; ``{"statusCode": 401, "message": "Unauthorized. Access token is missing, invalid,
audience is incorrect ..."}`` for a token). The ``model`` names a deployment (by default the
model's id): with ``deployments``, any other is Azure's 404 ``DeploymentNotFound``
(posit-dev/positron#12858). The body is the Messages body (``anthropic-version`` header
required, no ``anthropic_version`` / ``anthropic_beta`` members), only the betas of
:data:`FOUNDRY_BETAS` ("Unsupported beta header", the Claude API's wording), no body field
without its beta.

Its beta list is the fake's own copy (tests/test_claude_code_foundry.py checks that Claude Code in
Foundry mode loses no beta on the way), written independently of ``proxy.formats.bridging``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.harness import serve_local
from tests.platform_fakes import FIELD_BETAS, Seen, _has, messages_answer
from tests.upstream import message_json

# what Claude Code 2.1.197 sends to Foundry in its Foundry mode (recorded with opus-4-6..4-8,
# sonnet-4-5[1m], sonnet-4-6, sonnet-5, haiku-4-5, fable-5) and what LiteLLM's azure_ai table
# lets through (litellm/anthropic_beta_headers_config.json)
FOUNDRY_BETAS = frozenset(
    {
        "claude-code-20250219",
        "interleaved-thinking-2025-05-14",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "effort-2025-11-24",
        "web-search-2025-03-05",
        "prompt-caching-scope-2026-01-05",
        "mid-conversation-system-2026-04-07",
        "advanced-tool-use-2025-11-20",
        "fallback-credit-2026-06-01",
        "code-execution-2025-08-25",
        "computer-use-2025-01-24",
        "computer-use-2025-11-24",
        "files-api-2025-04-14",
        "mcp-client-2025-04-04",
        "mcp-client-2025-11-20",
        "skills-2025-10-02",
        "structured-outputs-2025-11-13",
        "thinking-display-updates-2026-08-18",
        "web-fetch-2025-09-10",
    }
)
FOUNDRY_KEY = "foundry-resource-key-0123456789abcdef"
# the audiences an Entra ID token for Foundry may name: Claude Code asks for the first
# (.../.default), the SDK's README and anthropics/claude-code#91842 use the second
ENTRA_AUDIENCES = ("https://cognitiveservices.azure.com", "https://ai.azure.com")
AZURE_KEY_REFUSED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a"
    " valid key for an active subscription and use a correct regional API endpoint for your resource."
)
AZURE_TOKEN_REFUSED = (
    "Unauthorized. Access token is missing, invalid, audience is incorrect"
    " (https://cognitiveservices.azure.com), or have expired."
)
DEPLOYMENT_NOT_FOUND = (
    "The API deployment for this resource does not exist. If you created the deployment within the"
    " last 5 minutes, please wait a moment and try again."
)


@dataclass
class FakeFoundry:
    keys: set[str] = field(default_factory=lambda: {FOUNDRY_KEY})
    identity_header: str = "fake-identity-header-secret"  # App Service's X-IDENTITY-HEADER
    tokens: dict[str, float] = field(default_factory=dict)  # token -> expiry (epoch seconds)
    token_lifetime: int = 3600
    token_grants: int = 0
    deployments: frozenset[str] | None = None  # the deployment names (None: any)
    # the answer to (path, body): a message, or a response of its own (default: a short text
    # naming the deployment)
    responder: Callable[[str, dict[str, Any]], Any] | None = None
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _serial: Any = field(default_factory=lambda: itertools.count(1))

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/msi/token", self._identity)
        app.router.add_post("/anthropic/v1/messages", self._handle)
        app.router.add_post("/anthropic/v1/messages/count_tokens", self._handle)
        self._runner, self.url = await serve_local(app)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def endpoint(self) -> str:
        """What ``upstream.endpoint_url`` names: the resource's ``/anthropic``."""
        return f"{self.url}/anthropic"

    @property
    def identity_endpoint(self) -> str:
        return f"{self.url}/msi/token"

    def expire_all(self) -> None:
        """Every token issued so far refused from now on (revoked before its expiry)."""
        self.tokens.clear()

    async def _identity(self, request: web.Request) -> web.Response:
        """App Service's managed-identity endpoint (api-version 2019-08-01)."""
        if request.headers.get("X-IDENTITY-HEADER") != self.identity_header:
            return web.json_response({"error": "unauthorized"}, status=401)
        resource = request.query.get("resource", "")
        if request.query.get("api-version") != "2019-08-01" or resource not in ENTRA_AUDIENCES:
            return web.json_response(
                {"error": "invalid_resource", "error_description": f"not a resource: {resource}"},
                status=400,
            )
        self.token_grants += 1
        token = f"eyJ0eXAiOiJKV1QifQ.fake-entra-{next(self._serial)}"
        expires_on = int(time.time()) + self.token_lifetime
        self.tokens[token] = expires_on
        return web.json_response({"access_token": token, "expires_on": str(expires_on),
                                  "resource": resource, "token_type": "Bearer"})  # fmt: skip

    def _auth_problem(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("x-api-key") or request.headers.get("api-key")
        if key is not None:
            if key in self.keys:
                return None
            return web.json_response({"error": {"code": "401", "message": AZURE_KEY_REFUSED}}, status=401)
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if token and self.tokens.get(token, 0) > time.time():
            return None
        if not token:
            return web.json_response({"error": {"code": "401", "message": AZURE_KEY_REFUSED}}, status=401)
        return web.json_response({"statusCode": 401, "message": AZURE_TOKEN_REFUSED}, status=401)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        refused = self._auth_problem(request)
        body = orjson.loads(raw) if raw else None
        self.seen.append(Seen(request.raw_path, dict(request.headers), body))
        if refused is not None:
            return refused
        problem = self._body_problem(request, body)
        if problem is not None:
            return problem
        deployment = body["model"]
        if self.deployments is not None and deployment not in self.deployments:
            return web.json_response(
                {"error": {"type": "invalid_request_error", "code": "DeploymentNotFound",
                           "message": DEPLOYMENT_NOT_FOUND}},
                status=404, headers={"apim-request-id": "apim-req-404"},
            )  # fmt: skip
        if request.path.endswith("/count_tokens"):
            return web.json_response({"input_tokens": 10 + len(body["messages"])})
        if self.responder is not None:
            message = self.responder(request.raw_path, body)
            if isinstance(message, web.StreamResponse):  # an answer of its own (an error)
                return message
        else:
            message = message_json(f"Hello from fake Foundry ({deployment}).", model=deployment)
        return await messages_answer(request, message, bool(body.get("stream")), "req_foundry")

    @staticmethod
    def _body_problem(request: web.Request, body: Any) -> web.Response | None:
        def refuse(message: str) -> web.Response:
            return web.json_response(
                {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
                status=400,
            )

        if not request.headers.get("anthropic-version"):
            return refuse("anthropic-version: header is required")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return refuse("model: Field required")
        for key in ("anthropic_version", "anthropic_beta"):
            if key in body:
                return refuse(f"{key}: Extra inputs are not permitted")
        betas = [b for b in request.headers.get("anthropic-beta", "").split(",") if b]
        unsupported = [b for b in betas if b not in FOUNDRY_BETAS]
        if unsupported:
            return refuse(f"Unsupported beta header: {unsupported[0]}")
        for path, beta in FIELD_BETAS.items():
            if _has(body, path) and beta not in betas:
                return refuse(f"{path}: Extra inputs are not permitted")
        return None
