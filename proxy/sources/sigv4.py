"""AWS Signature Version 4 for S3 requests: pure (no I/O, no clock: the time is an argument).

Only what the object-store backend sends is supported: a method, a host, an already-safe path
(keys are built from the pointer grammar's characters and ``/``, so no percent-encoding beyond
the unreserved set is ever needed; anything else is refused), no query string, a payload SHA-256
(always the real one: ``UNSIGNED-PAYLOAD`` is never used) and an optional session token.

The result is the headers to add (``authorization``, ``x-amz-date``, ``x-amz-content-sha256`` and
``x-amz-security-token`` when a token is given). The signed headers are ``host`` and every
``x-amz-*`` header sent, so a signature cannot be replayed against another host or bucket.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["EMPTY_SHA256", "Credentials", "sign"]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._~/-]*", re.ASCII)
_SAFE_VALUE_RE = re.compile(r"[\x20-\x7e]*", re.ASCII)


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair (and session token); ``repr`` never shows the secret or the token."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).digest()


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode("utf-8"), day)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def sign(
    method: str,
    host: str,
    path: str,
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    now: datetime,
    *,
    extra_headers: dict[str, str] | None = None,
    service: str = "s3",
) -> dict[str, str]:
    """The headers that authenticate this request (add them, and send ``host`` as given)."""
    if _SAFE_PATH_RE.fullmatch(path) is None:
        raise ValueError("a path of unreserved characters only")
    amz_date = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    headers = {
        "x-amz-content-sha256": payload_sha256,
        "x-amz-date": amz_date,
    }
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    for name, value in (extra_headers or {}).items():
        headers[name.lower()] = value
    signed = {"host": host, **headers}
    for value in signed.values():
        if _SAFE_VALUE_RE.fullmatch(value) is None:
            raise ValueError("header values must be printable ASCII")
    names = sorted(signed)
    canonical_headers = "".join(f"{n}:{' '.join(signed[n].split())}\n" for n in names)
    signed_headers = ";".join(names)
    canonical_request = "\n".join(
        (method, path, "", canonical_headers, signed_headers, payload_sha256)
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        (
            "AWS4-HMAC-SHA256",
            amz_date,
            scope,
            hashlib.sha256(canonical_request.encode("ascii")).hexdigest(),
        )
    )
    key = signing_key(credentials.secret_access_key, day, region, service)
    signature = hmac.new(key, string_to_sign.encode("ascii"), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope},"
        f" SignedHeaders={signed_headers}, Signature={signature}"
    )
    return headers
