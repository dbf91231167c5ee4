"""A minimal S3 client on aiohttp: GET, HEAD and PUT of one object, signed by botocore (SigV4).

Why not aiobotocore or obstore: the one property this backend must never lose is that **no
redirect is ever followed** and no request (or credential) goes anywhere but the pinned endpoint.
botocore's S3 *client* ships a region redirector (``S3RegionRedirectorv2``) that, on a 301/400
naming another region, re-signs and re-sends the request to another endpoint, and obstore (Rust
``object_store``) follows 3xx responses with a ``Location`` itself; both can be configured around,
but only by relying on internals that change between releases. So the requests are sent by the
proxy's own aiohttp, with ``allow_redirects=False``, and only the signature is botocore's: its
``S3SigV4Auth`` signer (the one the S3 client uses; botocore also signs the Bedrock upstream's
requests, ``proxy.server.upstream.credentials``), always over the real SHA-256 of the payload
(never ``UNSIGNED-PAYLOAD``), with ``host`` and every ``x-amz-*`` header signed, so a signature
cannot be replayed against another host or bucket. A payload larger than
:data:`SIGN_IN_THREAD_BYTES` is hashed and signed in a thread, off the event loop. Three verbs
are short enough to audit in full and are tested against a real S3 server (moto, checking
signatures) and against a server that redirects to a foreign host.

What a response means (:class:`Fetched.status`):

* 200 -> ``found`` (GET: the body, at most ``max_object_bytes``, else ``too_large``);
* 404 -> ``missing``;
* any 3xx, 400, 401, 403 -> ``denied`` (a redirect, a wrong region, refused or expired
  credentials: the request was not accepted as made; ``Location`` is never read);
* anything else (5xx, 429, a timeout, a refused connection, a reset) -> ``unavailable``.

Requests are bounded: ``connect_timeout`` to connect, ``read_timeout`` between reads, and both
added as the total; no proxy from the environment (``trust_env=False``), no cookies.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from yarl import URL

__all__ = [
    "SIGN_IN_THREAD_BYTES",
    "Addressing",
    "Credentials",
    "Fetched",
    "ObjectStoreError",
    "ObjectStoreSettings",
    "S3Client",
    "check_bucket",
    "check_endpoint",
    "check_prefix",
    "check_region",
    "dns_host",
]

Addressing = Literal["path", "virtual"]
FetchStatus = Literal["found", "missing", "denied", "unavailable", "too_large"]

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", re.ASCII)
_REGION_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}", re.ASCII)
_PREFIX_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", re.ASCII)
_HOST_RE = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", re.ASCII)
# keys are built from the pointer grammar's characters and ``/``: no percent-encoding is needed
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._~/-]*", re.ASCII)
SIGN_IN_THREAD_BYTES = 256 << 10  # a payload this large is hashed and signed off the event loop


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair (and session token); ``repr`` never shows the secret or the token."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


class _Signer(S3SigV4Auth):  # type: ignore[misc]
    """botocore's S3 signer, always over the payload's real SHA-256."""

    def _should_sha256_sign_payload(self, request: Any) -> bool:
        return True


def sign(
    method: str, url: str, host: str, data: bytes, credentials: Credentials, region: str
) -> dict[str, str]:
    """The headers of a request signed by botocore for ``host`` (sent as given): ``host``,
    ``X-Amz-Date``, ``X-Amz-Content-SHA256``, ``X-Amz-Security-Token`` (with a token) and
    ``Authorization``."""
    frozen = ReadOnlyCredentials(
        credentials.access_key_id, credentials.secret_access_key, credentials.session_token
    )
    request = AWSRequest(method=method, url=url, data=data, headers={"host": host})
    _Signer(frozen, "s3", region).add_auth(request)
    return {name: str(value) for name, value in request.headers.items()}


def check_bucket(value: str) -> str | None:
    ok = _BUCKET_RE.fullmatch(value) is not None and ".." not in value
    return None if ok else "an S3 bucket name (3-63 of [a-z0-9.-])"


def check_region(value: str) -> str | None:
    return None if _REGION_RE.fullmatch(value) else "a region name such as eu-west-1"


def check_prefix(value: str) -> str | None:
    """``seg/seg/``: segments of the pointer component grammar, ending in ``/``."""
    segments = value.split("/")
    ok = (
        value.endswith("/")
        and len(value) <= 512
        and all(_PREFIX_SEGMENT_RE.fullmatch(s) and not s.endswith(".") for s in segments[:-1])
    )
    return None if ok else "a key prefix of segments [A-Za-z0-9][A-Za-z0-9._-]* ending in '/'"


def check_endpoint(value: str) -> str | None:
    """``https://host[:port]`` (``http://`` for a store on loopback or a private network)."""
    expected = "an endpoint URL https://host[:port] (no path, query or credentials)"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return expected
    if (
        parts.scheme not in ("https", "http")
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or _HOST_RE.fullmatch(parts.netloc.rsplit(":", 1)[0] if port else parts.netloc) is None
    ):
        return expected
    return None


def dns_host(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return bool(host) and ":" not in host and not host.replace(".", "").isdigit()


@dataclass(frozen=True, slots=True)
class ObjectStoreSettings:
    """Where a tenant's artifacts live; built once from its policy (credentials from the
    environment variables it names). ``repr`` never shows the credentials."""

    bucket: str
    prefix: str
    endpoint: str
    region: str
    addressing: Addressing
    credentials: Credentials = field(repr=False)
    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    max_concurrency: int = 8
    max_object_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for problem in (
            check_bucket(self.bucket),
            check_prefix(self.prefix),
            check_endpoint(self.endpoint),
            check_region(self.region),
        ):
            if problem is not None:
                raise ValueError(f"expected {problem}")
        if self.addressing not in ("path", "virtual"):
            raise ValueError("addressing must be path or virtual")
        if self.addressing == "virtual" and not dns_host(self.endpoint):
            raise ValueError("virtual addressing needs an endpoint with a DNS host name")
        if min(self.connect_timeout, self.read_timeout) <= 0 or self.max_concurrency < 1:
            raise ValueError("timeouts and concurrency must be positive")

    def url_for(self, key: str) -> tuple[URL, str, str]:
        """(the URL, the Host header, the signed path) of ``key`` (already validated)."""
        parts = urlsplit(self.endpoint)
        netloc = parts.netloc
        if self.addressing == "virtual":
            netloc = f"{self.bucket}.{netloc}"
            path = f"/{key}"
        else:
            path = f"/{self.bucket}/{key}"
        url = URL.build(scheme=parts.scheme, authority=netloc, path=path, encoded=True)
        return url, netloc, path


@dataclass(frozen=True, slots=True)
class Fetched:
    status: FetchStatus
    data: bytes = b""
    etag: str | None = None
    detail: str = ""  # why, for the audit trail: "http-403", "redirect", "timeout", ...


class ObjectStoreError(Exception):
    """A write was not accepted; the message never holds a key, a URL or a credential."""


def _refusal(status: int) -> Fetched | None:
    if 300 <= status < 400:
        return Fetched("denied", detail="redirect")
    if status in (400, 401, 403):
        return Fetched("denied", detail=f"http-{status}")
    if status == 404:
        return Fetched("missing", detail="http-404")
    if status != 200:
        return Fetched("unavailable", detail=f"http-{status}")
    return None


class S3Client:
    """One aiohttp session for every tenant's store (connections are pooled per host)."""

    def __init__(self, *, pool_size: int = 64) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._pool_size = pool_size

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, enable_cleanup_closed=True),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                trust_env=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    async def _headers(
        settings: ObjectStoreSettings, method: str, key: str, data: bytes = b""
    ) -> tuple[URL, dict[str, str]]:
        url, host, path = settings.url_for(key)
        if _SAFE_PATH_RE.fullmatch(path) is None:
            raise ValueError("a path of unreserved characters only")
        args = (method, str(url), host, data, settings.credentials, settings.region)
        if len(data) > SIGN_IN_THREAD_BYTES:
            return url, await asyncio.to_thread(sign, *args)
        return url, sign(*args)

    @staticmethod
    def _timeout(settings: ObjectStoreSettings) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=settings.connect_timeout + settings.read_timeout,
            sock_connect=settings.connect_timeout,
            sock_read=settings.read_timeout,
        )

    async def get(self, settings: ObjectStoreSettings, key: str, *, head: bool = False) -> Fetched:
        method = "HEAD" if head else "GET"
        url, headers = await self._headers(settings, method, key)
        try:
            async with self._client().request(
                method,
                url,
                headers=headers,
                allow_redirects=False,
                max_redirects=0,
                timeout=self._timeout(settings),
            ) as response:
                refused = _refusal(response.status)
                if refused is not None:
                    return refused
                etag = response.headers.get("ETag")
                if head:
                    return Fetched("found", etag=etag)
                length = response.content_length
                if length is not None and length > settings.max_object_bytes:
                    return Fetched("too_large", etag=etag, detail="size")
                chunks: list[bytes] = []
                total = 0
                async for chunk in response.content.iter_chunked(1 << 16):
                    total += len(chunk)
                    if total > settings.max_object_bytes:
                        return Fetched("too_large", etag=etag, detail="size")
                    chunks.append(chunk)
                return Fetched("found", b"".join(chunks), etag)
        except TimeoutError:
            return Fetched("unavailable", detail="timeout")
        except (aiohttp.ClientError, OSError) as exc:
            return Fetched("unavailable", detail=type(exc).__name__)

    async def put(self, settings: ObjectStoreSettings, key: str, data: bytes) -> str | None:
        """Store ``data`` at ``key``; return its ETag. :class:`ObjectStoreError` if refused."""
        url, headers = await self._headers(settings, "PUT", key, data)
        headers["content-type"] = "application/octet-stream"
        try:
            async with self._client().put(
                url,
                data=data,
                headers=headers,
                allow_redirects=False,
                max_redirects=0,
                timeout=self._timeout(settings),
            ) as response:
                await response.read()
                if response.status != 200:
                    refused = _refusal(response.status)
                    detail = refused.detail if refused is not None else f"http-{response.status}"
                    raise ObjectStoreError(f"the object store refused the write ({detail})")
                return response.headers.get("ETag")
        except TimeoutError:
            raise ObjectStoreError("the object store timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ObjectStoreError(f"the object store is unreachable ({type(exc).__name__})") from None
