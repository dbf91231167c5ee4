"""What every consumer of an upstream answer reads: ``aiohttp.ClientResponse``'s few members.

The relay, the retrieval loop, the usage tap and the summary client read ``status``, ``reason``,
``headers``, ``content.iter_any()`` and ``read()`` of an Anthropic-format answer. An answer from
another platform is an :class:`AdaptedResponse` with those members: its status and headers as the
Anthropic API would have sent them, its body translated as it streams (Bedrock's event-stream
frames become SSE bytes), so nothing downstream changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, Protocol

from multidict import CIMultiDict, CIMultiDictProxy


class Content(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...


class UpstreamResponse(Protocol):
    """The members of ``aiohttp.ClientResponse`` the proxy reads."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content(self) -> Any: ...

    async def read(self) -> bytes: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any: ...


class _Chunks:
    """``content``: the body, read once, as it arrives."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._chunks


async def _once(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body


class AdaptedResponse:
    """An answer in Anthropic form from another platform's (``release`` ends the source's)."""

    def __init__(
        self,
        status: int,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes],
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.status = status
        self.reason: str | None = None
        self._headers = CIMultiDictProxy(CIMultiDict(headers))
        chunks = _once(body) if isinstance(body, bytes) else body
        self.content = _Chunks(chunks)
        self._release = release

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.content.iter_any()])

    def release(self) -> None:
        self._release()

    async def __aenter__(self) -> AdaptedResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
