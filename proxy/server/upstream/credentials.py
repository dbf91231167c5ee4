"""The proxy's own cloud credentials: AWS for Bedrock (SigV4), Google for Vertex (a bearer token),
a key or a Microsoft Entra ID token for Foundry.

* AWS: botocore's credential chain (environment, shared files and ``aws_profile``, SSO, web
  identity, container and instance roles, ``credential_process``), resolved once. Refreshable
  credentials are refreshed by botocore before they expire (15 min ahead, advisory; 10 min,
  mandatory); that refresh does I/O, so it runs in a thread, as does the first resolution.
  :meth:`AwsCredentials.renew` runs the chain again (after Bedrock said the token expired).
* Google: application-default credentials (``google.auth.default``) or the JSON file the config
  names; the token is refreshed in a thread when it is missing or within
  :data:`REFRESH_MARGIN` of its expiry, and by :meth:`GoogleToken.renew` after a 401.

* Foundry, a key: the environment variable ``api_key_env`` names (or the file its ``_FILE``
  variable names: a mounted secret), read in a thread at first use and again by
  :meth:`FoundryKey.renew` after Foundry refused it (a rotated secret file is picked up).
* Foundry, Entra ID: azure-identity's ``DefaultAzureCredential`` chain (environment service
  principal, workload identity, managed identity, Azure CLI...), imported only then; the token is
  asked for in a thread when it is missing or within :data:`REFRESH_MARGIN` of its expiry, and by
  :meth:`AzureToken.renew` after a 401 (a new chain: nothing cached is reused).

None logs nor returns a secret in an error message.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from collections.abc import Mapping
from typing import Any

from proxy.config.environment import FILE_SUFFIX, secret_from_env
from proxy.config.schema import ConfigError
from proxy.core.errors import UpstreamUnavailable

REFRESH_MARGIN = datetime.timedelta(minutes=5)
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class AwsCredentials:
    """botocore's credentials for one profile, and SigV4 signing with them."""

    def __init__(self, profile: str, region: str) -> None:
        self._profile = profile
        self._region = region
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    def _resolve(self) -> Any:
        import botocore.session
        from botocore.exceptions import BotoCoreError

        try:
            session = botocore.session.Session(profile=self._profile or None)
            credentials = session.get_credentials()
        except BotoCoreError as exc:
            raise UpstreamUnavailable(
                f"the proxy's AWS credentials could not be loaded ({type(exc).__name__})"
            ) from None
        if credentials is None:
            raise UpstreamUnavailable(
                "the proxy has no AWS credentials for the bedrock upstream (botocore's chain:"
                " environment, shared files, SSO, container or instance role)"
            )
        return credentials

    async def _frozen(self) -> Any:
        from botocore.credentials import RefreshableCredentials
        from botocore.exceptions import BotoCoreError

        if self._credentials is None:
            async with self._lock:
                if self._credentials is None:
                    self._credentials = await asyncio.to_thread(self._resolve)
        credentials = self._credentials
        try:
            if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
                return await asyncio.to_thread(credentials.get_frozen_credentials)
            return credentials.get_frozen_credentials()
        except BotoCoreError as exc:
            raise UpstreamUnavailable(
                f"the proxy's AWS credentials could not be refreshed ({type(exc).__name__})"
            ) from None

    async def renew(self) -> None:
        """Run the chain again: the next request signs with whatever it finds now."""
        fresh = await asyncio.to_thread(self._resolve)
        self._credentials = fresh

    async def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        """``headers`` plus SigV4's (``Authorization``, ``X-Amz-Date``, the session token)."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        frozen = await self._frozen()
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        SigV4Auth(frozen, "bedrock", self._region).add_auth(request)
        return dict(request.headers.items())


class GoogleToken:
    """An OAuth access token from Google credentials, refreshed before it expires."""

    def __init__(self, credentials_file: str) -> None:
        self._file = credentials_file
        self._credentials: Any = None
        self._lock = asyncio.Lock()
        self._transport: Any = None

    def _load(self) -> Any:
        import google.auth
        from google.auth.exceptions import GoogleAuthError

        try:
            if self._file:
                return _from_file(self._file)
            credentials, _project = google.auth.default(scopes=list(GOOGLE_SCOPES))
        except (GoogleAuthError, ValueError, KeyError, OSError) as exc:
            raise UpstreamUnavailable(
                "the proxy has no usable Google credentials for the vertex upstream"
                f" ({type(exc).__name__})"
            ) from None
        return credentials

    def _refresh(self, credentials: Any) -> None:
        from google.auth.exceptions import GoogleAuthError
        from google.auth.transport.requests import Request

        if self._transport is None:
            self._transport = Request()
        try:
            credentials.refresh(self._transport)
        except GoogleAuthError as exc:
            raise UpstreamUnavailable(
                f"the proxy's Google token could not be refreshed ({type(exc).__name__})"
            ) from None

    def _fresh_enough(self, credentials: Any) -> bool:
        if not credentials.token or not credentials.valid:
            return False
        expiry = credentials.expiry
        if expiry is None:
            return True
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)  # google-auth: naive UTC
        return bool(expiry - now > REFRESH_MARGIN)

    async def token(self) -> str:
        credentials = self._credentials
        if credentials is not None and self._fresh_enough(credentials):
            return str(credentials.token)
        async with self._lock:
            if self._credentials is None:
                self._credentials = await asyncio.to_thread(self._load)
            credentials = self._credentials
            if not self._fresh_enough(credentials):
                await asyncio.to_thread(self._refresh, credentials)
            return str(credentials.token)

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        session = getattr(transport, "session", None)
        if session is not None:
            await asyncio.to_thread(session.close)

    async def renew(self) -> str:
        """Refresh now (the upstream refused the token), whatever its expiry says."""
        async with self._lock:
            if self._credentials is None:
                self._credentials = await asyncio.to_thread(self._load)
            await asyncio.to_thread(self._refresh, self._credentials)
            return str(self._credentials.token)


def _from_file(path: str) -> Any:
    """A service-account key or an ``authorized_user`` file, by its declared type (the two a
    config names; other kinds go through application-default credentials)."""
    import json

    from google.oauth2 import credentials as user
    from google.oauth2 import service_account

    with open(path, encoding="utf-8") as handle:
        info = json.load(handle)
    kind = info.get("type") if isinstance(info, dict) else None
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=list(GOOGLE_SCOPES)
        )
    if kind == "authorized_user":
        return user.Credentials.from_authorized_user_info(  # type: ignore[no-untyped-call]
            info, scopes=list(GOOGLE_SCOPES)
        )
    raise ValueError("credentials_file: expected a service_account or authorized_user file")


class FoundryKey:
    """A Foundry resource's API key, from the variable ``api_key_env`` names (or its file)."""

    def __init__(self, variable: str) -> None:
        self._variable = variable
        self._key: str | None = None
        self._lock = asyncio.Lock()

    def _read(self) -> str:
        try:
            key = secret_from_env(self._variable, os.environ)
        except ConfigError as exc:
            raise UpstreamUnavailable(
                f"the proxy's Foundry key could not be read: {'; '.join(exc.errors)}"
            ) from None
        if not key.strip():
            raise UpstreamUnavailable(
                f"the proxy has no Foundry key: neither {self._variable} nor"
                f" {self._variable}{FILE_SUFFIX} is set (upstream.api_key_env)"
            )
        return key.strip()

    async def key(self) -> str:
        if self._key is None:
            async with self._lock:
                if self._key is None:
                    self._key = await asyncio.to_thread(self._read)
        return self._key

    async def renew(self) -> str:
        """Read the key again (Foundry refused the one held)."""
        async with self._lock:
            self._key = await asyncio.to_thread(self._read)
            return self._key

    async def close(self) -> None:
        """Nothing held."""


class AzureToken:
    """A Microsoft Entra ID access token for ``scope`` from ``DefaultAzureCredential``."""

    def __init__(self, scope: str) -> None:
        self._scope = scope
        self._credential: Any = None
        self._token = ""
        self._expires_on = 0.0
        self._lock = asyncio.Lock()

    def _fetch(self, fresh: bool) -> tuple[Any, str, float]:
        """(the credential, its token, the token's expiry): a new chain when ``fresh``."""
        from azure.core.exceptions import AzureError
        from azure.identity import DefaultAzureCredential

        credential = self._credential
        try:
            if credential is None or fresh:
                credential = DefaultAzureCredential()
            access = credential.get_token(self._scope)
        except AzureError as exc:
            raise UpstreamUnavailable(
                "the proxy has no usable Microsoft Entra ID credentials for the foundry upstream"
                f" ({type(exc).__name__}; azure-identity's DefaultAzureCredential chain)"
            ) from None
        return credential, str(access.token), float(access.expires_on)

    def _fresh_enough(self) -> bool:
        margin = REFRESH_MARGIN.total_seconds()
        return bool(self._token) and self._expires_on - time.time() > margin

    async def _refresh(self, fresh: bool) -> str:
        old = self._credential
        credential, self._token, self._expires_on = await asyncio.to_thread(self._fetch, fresh)
        self._credential = credential
        if old is not None and old is not credential:
            await asyncio.to_thread(old.close)
        return self._token

    async def token(self) -> str:
        if self._fresh_enough():
            return self._token
        async with self._lock:
            if self._fresh_enough():
                return self._token
            return await self._refresh(fresh=False)

    async def renew(self) -> str:
        """A token from a new chain (Foundry refused the one held), whatever its expiry says."""
        async with self._lock:
            return await self._refresh(fresh=True)

    async def close(self) -> None:
        credential, self._credential = self._credential, None
        if credential is not None:
            await asyncio.to_thread(credential.close)
