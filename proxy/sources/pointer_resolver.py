"""Resolve a tenant's source pointers: transcripts against the store, artifacts through files.

``transcript:<session>:<seq>`` is verified against the store itself -- the record of truth -- so
it can only ever mean the event the store numbered ``seq`` (``available`` with the SHA-256 of
that event's :func:`~proxy.sources.transcript_records.record_bytes`) or ``missing``. The JSONL
export is a projection for people and tools; nothing it contains (or lacks) changes what a
pointer resolves to. Artifacts are verified by an :class:`ArtifactSource` (the local files:
:class:`~proxy.sources.resolver.SourceResolver`; another backend can stand beside it).

Order of decisions for one pointer: the strict grammar (``corrupt`` / ``unsupported``), then the
tenant's policy (``denied``; a transcript pointer needs ``transcript`` in the allowed kinds, a
configured transcript root and a matching session pattern, as before), then the lookup. Another
tenant's session is simply absent from this tenant's store rows: ``missing``.

API (also for retrieval): :meth:`PointerResolver.resolve_many` -> statuses and digests (with
excerpts for the admin preview); :meth:`PointerResolver.fetch` -> status plus the verified bytes.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.core.pointers import BadPointer, TranscriptPointer, parse_pointer
from proxy.sources.policy import SourcePolicy, authorise
from proxy.sources.resolver import Resolution
from proxy.sources.transcript_records import record_bytes
from proxy.store.base import Store

__all__ = ["ArtifactSource", "Fetched", "PointerResolver"]

_MISSING = Resolution("missing", None)
_DENIED = Resolution("denied", None)


class ArtifactSource(Protocol):
    """Verifies artifact pointers (and reads verified artifact bytes); blocking, thread-safe."""

    def resolve_many(
        self, pointer_texts: Iterable[object], policy: SourcePolicy, *, excerpt: bool = False
    ) -> tuple[Resolution, ...]: ...

    def read(self, pointer_text: object, policy: SourcePolicy) -> tuple[Resolution, bytes | None]:
        """The resolution and, when ``available``, the bytes whose digest it verified."""
        ...


@dataclass(frozen=True, slots=True)
class Fetched:
    """A resolved pointer and, when ``available``, the exact bytes its digest was taken over
    (a transcript event's record, an artifact's content)."""

    resolution: Resolution
    data: bytes | None


def _excerpt(data: bytes, max_chars: int) -> str:
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)[:max_chars]


class PointerResolver:
    def __init__(self, store: Store, artifacts: ArtifactSource, max_excerpt_chars: int = 2000):
        self.store = store
        self.artifacts = artifacts
        self.max_excerpt_chars = max_excerpt_chars

    async def resolve_many(
        self,
        tenant: str,
        policy: SourcePolicy,
        pointers: Sequence[object],
        *,
        excerpt: bool = False,
    ) -> tuple[Resolution, ...]:
        """Resolve in order. Raises ``StoreError`` when the store cannot be read, ``OSError``
        for resource errors of the file side (never a property of a source)."""
        out: list[Resolution | None] = [None] * len(pointers)
        files: list[int] = []
        for i, text in enumerate(pointers):
            parsed = parse_pointer(text)
            if isinstance(parsed, TranscriptPointer):
                if not authorise(parsed, policy):
                    out[i] = _DENIED
                    continue
                data = await self._record(tenant, parsed)
                out[i] = self._resolution(data, excerpt)
            elif isinstance(parsed, BadPointer):
                out[i] = Resolution(parsed.status, None)
            else:
                files.append(i)
        if files:
            found = await asyncio.to_thread(
                self.artifacts.resolve_many, [pointers[i] for i in files], policy, excerpt=excerpt
            )
            for i, resolution in zip(files, found, strict=True):
                out[i] = resolution
        return tuple(r if r is not None else _MISSING for r in out)

    async def resolve(
        self, tenant: str, policy: SourcePolicy, pointer: object, *, excerpt: bool = False
    ) -> Resolution:
        return (await self.resolve_many(tenant, policy, [pointer], excerpt=excerpt))[0]

    async def fetch(self, tenant: str, policy: SourcePolicy, pointer: object) -> Fetched:
        """The pointer's resolution and its verified bytes (``None`` unless ``available``)."""
        parsed = parse_pointer(pointer)
        if isinstance(parsed, BadPointer):
            return Fetched(Resolution(parsed.status, None), None)
        if isinstance(parsed, TranscriptPointer):
            if not authorise(parsed, policy):
                return Fetched(_DENIED, None)
            data = await self._record(tenant, parsed)
            return Fetched(self._resolution(data, False), data)
        resolution, data = await asyncio.to_thread(self.artifacts.read, pointer, policy)
        return Fetched(resolution, data if resolution.status == "available" else None)

    async def _record(self, tenant: str, pointer: TranscriptPointer) -> bytes | None:
        events = await self.store.transcript_events(
            tenant, pointer.session, pointer.sequence - 1, 1, agent=pointer.agent
        )
        if not events or events[0].seq != pointer.sequence:
            return None
        return record_bytes(events[0])

    def _resolution(self, data: bytes | None, excerpt: bool) -> Resolution:
        if data is None:
            return _MISSING
        text = _excerpt(data, self.max_excerpt_chars) if excerpt else None
        return Resolution("available", hashlib.sha256(data).hexdigest(), text)
