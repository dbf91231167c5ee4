"""The L4 summary call over aiohttp: the few things the ``anthropic`` SDK did for us, without it.

The SDK cost ~56 MB of RSS and ~1.8 s of start-up for one POST. This client sends
``POST {base}/v1/messages`` with the request's own credentials (``x-api-key`` and/or
``Authorization``, exactly as the client request goes upstream, and its
``anthropic-workspace-id``), ``anthropic-version`` and a JSON body; each attempt is bounded by
``summary.timeout_seconds``; ``summary.max_retries`` retries follow the SDK's rules
(:func:`should_retry`, :func:`retry_delay`): connection errors, timeouts, 408/409/429/5xx,
``x-should-retry: true|false`` obeyed, ``retry-after-ms`` / ``retry-after`` honoured when short,
otherwise 0.5 s doubling up to 8 s, less up to 25 % jitter.

Each attempt is a ledger row (``kind: summary``, route ``summary``) when the task runs in a
:data:`proxy.server.ledger.CALL_CONTEXT`: its status, usage and request-id, or 504 (timeout) /
502 (no answer) -- retries included, as with the SDK's recording HTTP client before.

No answer, a refused one, or an unreadable one is :class:`SummaryFailed` (its ``reason`` names
the cause, never the body: the caller logs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from proxy.core.errors import ProxyError
from proxy.server.ledger import CALL_CONTEXT, now_ms, record_upstream_call
from proxy.server.relay.call_span import end_call, start_call
from proxy.server.upstream.platforms import CURRENT, UpstreamPlatform

__all__ = [
    "ANTHROPIC_VERSION",
    "SummaryClient",
    "SummaryFailed",
    "retry_delay",
    "should_retry",
    "summary_auth_headers",
]

ANTHROPIC_VERSION = "2023-06-01"
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
# A provider's retry-after is obeyed up to this long (longer: the usual backoff).
MAX_RETRY_AFTER = 60.0
# A summary answer is a few KB; an upstream answering more than this is not answering a summary.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_POOL_SIZE = 16


class SummaryFailed(Exception):
    """No usable summary answer; ``reason`` is a short label (an exception class, a status)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an error answer is worth another attempt (the SDK's rule)."""
    hint = headers.get("x-should-retry")
    if hint == "true":
        return True
    if hint == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def summary_auth_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The credentials the request itself goes upstream with (the tenant's policy applied):
    its ``Authorization`` and/or ``X-Api-Key``, and the ``anthropic-workspace-id`` they are
    scoped to (Claude Platform on AWS requires it on every call); nothing else."""
    auth: dict[str, str] = {}
    if "authorization" in headers:
        auth["Authorization"] = headers["authorization"]
    if "x-api-key" in headers:
        auth["X-Api-Key"] = headers["x-api-key"]
    if "anthropic-workspace-id" in headers:
        auth["anthropic-workspace-id"] = headers["anthropic-workspace-id"]
    return auth


def _number(text: str) -> float | None:
    """``text`` as a number, ``None`` when it is not one (a header may hold a date)."""
    try:
        return float(text)
    except ValueError:
        return None


def _retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asks us to wait, if it says so (``retry-after-ms`` first)."""
    millis = _number(headers.get("retry-after-ms", ""))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    date = email.utils.parsedate_tz(value)
    return None if date is None else float(email.utils.mktime_tz(date) - now)


def retry_delay(
    retries_taken: int,
    headers: Mapping[str, str] | None = None,
    *,
    rand: Callable[[], float] = random.random,
    now: float | None = None,
) -> float:
    """Seconds to wait before retry number ``retries_taken + 1``: the provider's
    ``retry-after`` when between 0 and 60 s, else 0.5 s doubling (at most 8 s), less up to 25 %
    jitter."""
    if headers is not None:
        after = _retry_after(headers, time.time() if now is None else now)
        if after is not None and 0 < after <= MAX_RETRY_AFTER:
            return after
    backoff = min(INITIAL_RETRY_DELAY * 2.0 ** min(retries_taken, 1000), MAX_RETRY_DELAY)
    return backoff * (1 - 0.25 * rand())


class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _usage_of(answer: _Answer) -> dict[str, Any] | None:
    if answer.status != 200:
        return None
    try:
        message = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return None
    usage = message.get("usage") if isinstance(message, dict) else None
    return usage if isinstance(usage, dict) else None


class SummaryClient:
    """Makes summary calls to one upstream; its connection pool opens at the first call."""

    def __init__(self, base_url: str, *, max_retries: int, timeout_seconds: float) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.max_retries = max_retries
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_POOL_SIZE, keepalive_timeout=30),
                trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def create(self, body: Mapping[str, Any], auth: Mapping[str, str]) -> dict[str, Any]:
        """POST ``body`` (a Messages request) and return the answered message, retrying as the
        SDK did. Raises :class:`SummaryFailed`. Traced as one GenAI call span, retries
        included (``proxy.server.relay.call_span``)."""
        span = start_call(body, "summary", "summary", self.url)
        try:
            message = await self._create(body, auth)
        except BaseException as exc:
            span.fail(exc.reason if isinstance(exc, SummaryFailed) else type(exc).__name__)
            span.end()
            raise
        end_call(
            span, 200, message.get("usage") if isinstance(message.get("usage"), dict) else None,
            message_id=message.get("id"), model=message.get("model"),
            stop_reason=message.get("stop_reason"),
        )
        return message

    async def _create(self, body: Mapping[str, Any], auth: Mapping[str, str]) -> dict[str, Any]:
        payload = orjson.dumps(body)
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        headers = {
            **auth,
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
            "accept": "application/json",
        }
        platform = CURRENT.get()  # the tenant's Bedrock / Vertex / Foundry upstream, if it has one
        for retries_taken in range(self.max_retries + 1):
            last = retries_taken >= self.max_retries
            try:
                answer = await self._attempt(platform, body, payload, headers, model)
            except SummaryFailed:
                if last:
                    raise
                await asyncio.sleep(retry_delay(retries_taken))
                continue
            if 200 <= answer.status < 300:
                return _message(answer.body)
            if last or not should_retry(answer.status, answer.headers):
                raise SummaryFailed(f"status {answer.status}")
            await asyncio.sleep(retry_delay(retries_taken, answer.headers))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(
        self,
        platform: UpstreamPlatform | None,
        body: Mapping[str, Any],
        payload: bytes,
        headers: dict[str, str],
        model: str,
    ) -> _Answer:
        """One exchange, recorded in the ledger (when in a call context)."""
        at = now_ms()
        started = time.perf_counter()
        status = 0
        answer: _Answer | None = None
        try:
            async with self._exchange(platform, body, payload, headers) as response:
                status = response.status
                data = bytearray()
                async for chunk in response.content.iter_any():
                    data += chunk
                    if len(data) > MAX_ANSWER_BYTES:
                        raise SummaryFailed("answer too large")
                answer = _Answer(status, response.headers, bytes(data))
                return answer
        except TimeoutError as exc:
            status = 504
            raise SummaryFailed(type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            status = 502  # no answer: refused, reset, or cut before the body ended
            raise SummaryFailed(type(exc).__name__) from exc
        except ProxyError as exc:  # no credentials, or a body the platform path refused
            status = exc.status
            raise SummaryFailed(type(exc).__name__) from exc
        finally:
            _record(at, started, model, status, answer)

    @contextlib.asynccontextmanager
    async def _exchange(
        self,
        platform: UpstreamPlatform | None,
        body: Mapping[str, Any],
        payload: bytes,
        headers: dict[str, str],
    ) -> AsyncIterator[Any]:
        """The answer's response: from the Anthropic API, or from the tenant's platform
        upstream (its own credentials; the request's betas bridged as for the request itself)."""
        if platform is None:
            async with self._pool().post(
                self.url, data=payload, headers=headers, timeout=self.timeout,
                allow_redirects=False,
            ) as answered:
                yield answered
            return
        betas = [headers["anthropic-beta"]] if "anthropic-beta" in headers else []
        async with asyncio.timeout(self.timeout.total):
            response = await platform.call(body, betas)
            async with response:
                yield response


def _record(
    at: tuple[str, int], started: float, model: str, status: int, answer: _Answer | None
) -> None:
    context = CALL_CONTEXT.get()
    if context is None or (context.recorder is None and context.quota is None) or not status:
        return
    record_upstream_call(
        context.recorder,
        tenant=context.tenant,
        session=context.session,
        model=model,
        kind="summary",
        route="summary",
        status=status,
        latency_ms=(time.perf_counter() - started) * 1000,
        usage=_usage_of(answer) if answer is not None else None,
        request_id=answer.headers.get("request-id") if answer is not None else None,
        started=at,
        agent=context.agent,
        quota=context.quota,
    )


def _message(body: bytes) -> dict[str, Any]:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SummaryFailed("answer not JSON") from exc
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        raise SummaryFailed("answer not a message")
    return message
