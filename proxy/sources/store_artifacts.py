"""Artifacts on an S3-compatible object store: keys, the verifying reader, and the writer.

Key of an artifact: ``<prefix><session>/tool-results/<name>``, built only from the tenant's
configured prefix and the *parsed* pointer's session and name (never a URL or a key from the
pointer), then normalised (``posixpath.normpath``) and refused unless the result is unchanged
and still starts with the prefix. The grammar already rules out ``/``, ``..`` and ``.``; the check
is the second line of defence, and is what a test with escaping names exercises.

Verification of an ``artifact:`` pointer, after parsing and :func:`authorise` (no network call
before both passed):

1. the manifest entry is read from the store (``artifact_manifests``);
2. the object is fetched (at most ``max_object_bytes``) under the tenant's concurrency bound;
3. ``available`` only if the SHA-256 of the bytes read starts with the pointer's digest, equals
   the entry's ``sha256``, the size equals the entry's ``size``, and the entry's HMAC signature
   verifies under the tenant's key named by its ``key_id``. A missing entry, a bad signature or a
   mismatch is ``corrupt``; 404 is ``missing``; 3xx/400/401/403 are ``denied``.

A store outage (timeout, refused connection, 5xx) renders ``missing`` with detail
``unavailable`` in the audit trail, as an unreachable local root does, and is never cached.

Cache: a verified result is kept under (tenant, settings, signing keys, pointer, excerpt) with the
object's ETag and the *whole* manifest entry it was verified against; a warm check is a HEAD
(same ETag) and the entry read (equal in every field): no GET, no hashing. Any other entry, or
none, sends the check back to the object (GET, hash, full verification), so an entry edited
after a warm check is ``corrupt`` just as the same edit made before any check.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import posixpath
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime

from proxy.core.bounded import Bounded
from proxy.core.pointers import ArtifactPointer, format_pointer
from proxy.sources.layout import TOOL_RESULTS_DIR
from proxy.sources.manifests import ManifestEntry, SigningKeys, sign_entry, verify_entry
from proxy.sources.object_store import Fetched, ObjectStoreSettings, S3Client
from proxy.sources.resolver import Resolution

__all__ = ["Checked", "StoreArtifacts", "object_key"]

ManifestLookup = Callable[[str, str, str], Awaitable[ManifestEntry | None]]
ManifestWrite = Callable[[ManifestEntry], Awaitable[None]]


def object_key(settings: ObjectStoreSettings, session: str, name: str) -> str | None:
    """The object key of an artifact, or ``None`` if it would not lie under the prefix."""
    key = f"{settings.prefix}{session}/{TOOL_RESULTS_DIR}/{name}"
    normalised = posixpath.normpath(key)
    if normalised != key or not normalised.startswith(settings.prefix):
        return None
    if normalised.startswith("/") or "//" in normalised:
        return None
    return normalised


@dataclass(frozen=True, slots=True)
class Checked:
    resolution: Resolution
    detail: str = ""


@dataclass(frozen=True, slots=True)
class _Verified:
    """A cached ``available``: the object's ETag and the entry (every field) it was checked with."""

    etag: str
    entry: ManifestEntry
    resolution: Resolution


def _excerpt(data: bytes, max_chars: int) -> str:
    head = data[: 4 * max_chars]
    return codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False)[:max_chars]


# Memory one verified object takes (its key, the manifest entry, the ETag and the resolution with
# its excerpt; tests/test_bounded_caches.py)
VERIFIED_BYTES = 4300


class StoreArtifacts:
    """Reads and writes tenants' artifacts on their object stores; shared by every request."""

    def __init__(
        self,
        client: S3Client,
        lookup: ManifestLookup,
        write_manifest: ManifestWrite,
        *,
        max_excerpt_chars: int = 2000,
        cache_entries: int = 4096,
    ) -> None:
        self.client = client
        self._lookup = lookup
        self._write_manifest = write_manifest
        self._max_excerpt_chars = max_excerpt_chars
        # bounded (``object_store_checks`` in the metrics): a miss gets and hashes the object
        # again instead of a HEAD
        self.cache: Bounded[Hashable, _Verified] = Bounded(
            "object_store_checks", cache_entries, entry_bytes=VERIFIED_BYTES
        )
        self._limits: dict[tuple[str, int], asyncio.Semaphore] = {}
        self.gets = 0
        self.heads = 0

    def _semaphore(self, tenant: str, settings: ObjectStoreSettings) -> asyncio.Semaphore:
        key = (tenant, settings.max_concurrency)
        found = self._limits.get(key)
        if found is None:
            found = self._limits[key] = asyncio.Semaphore(settings.max_concurrency)
        return found

    async def check(
        self,
        tenant: str,
        pointer: ArtifactPointer,
        settings: ObjectStoreSettings,
        signing: SigningKeys | None,
        *,
        excerpt: bool = False,
    ) -> Checked:
        key = object_key(settings, pointer.session, pointer.name)
        if key is None:
            return Checked(Resolution("denied", None), "prefix")
        entry = await self._lookup(tenant, pointer.session, pointer.name)
        cache_key = (tenant, settings, signing, pointer, excerpt)
        cached = self.cache.peek(cache_key)
        async with self._semaphore(tenant, settings):
            # The cached answer stands only for the very entry it was verified with: equal in
            # every field (dataclass equality: tenant, session, name, size, sha256, written_at,
            # key_id, signature, and any field added later). With the same signing keys (in the
            # cache key) and the same object (ETag), the cold path would see the same inputs and
            # give the same answer. Not "the signature column is unchanged": the other columns
            # can change beside it. Not "the HMAC verifies": an earlier entry of this name,
            # signed with the tenant's own key and put back, verifies too but describes other
            # bytes, and on this path the bytes are not read. Any other entry goes to the object.
            if cached is not None and entry is not None and entry == cached.entry:
                self.heads += 1
                head = await self.client.get(settings, key, head=True)
                if head.status == "found" and head.etag is not None and head.etag == cached.etag:
                    self.cache.touch(cache_key)
                    return Checked(cached.resolution, "cached")
                if head.status != "found":
                    return self._refused(head)
            self.gets += 1
            fetched = await self.client.get(settings, key)
        if fetched.status != "found":
            return self._refused(fetched)
        checked = self._verify(tenant, pointer, fetched.data, entry, signing, excerpt)
        if checked.resolution.status == "available" and fetched.etag and entry is not None:
            self.cache.put(cache_key, _Verified(fetched.etag, entry, checked.resolution))
        return checked

    async def read(
        self,
        tenant: str,
        pointer: ArtifactPointer,
        settings: ObjectStoreSettings,
        signing: SigningKeys | None,
    ) -> tuple[Checked, bytes | None]:
        """The object's verified bytes (as ``check`` verifies them; never cached): ``None``
        with any status but ``available``."""
        key = object_key(settings, pointer.session, pointer.name)
        if key is None:
            return Checked(Resolution("denied", None), "prefix"), None
        entry = await self._lookup(tenant, pointer.session, pointer.name)
        async with self._semaphore(tenant, settings):
            self.gets += 1
            fetched = await self.client.get(settings, key)
        if fetched.status != "found":
            return self._refused(fetched), None
        checked = self._verify(tenant, pointer, fetched.data, entry, signing, False)
        available = checked.resolution.status == "available"
        return checked, fetched.data if available else None

    @staticmethod
    def _refused(fetched: Fetched) -> Checked:
        if fetched.status == "too_large":
            return Checked(Resolution("corrupt", None), "size")
        if fetched.status == "unavailable":
            return Checked(Resolution("missing", None), f"unavailable:{fetched.detail}")
        if fetched.status == "denied":
            return Checked(Resolution("denied", None), fetched.detail)
        return Checked(Resolution("missing", None), fetched.detail)

    def _verify(
        self,
        tenant: str,
        pointer: ArtifactPointer,
        data: bytes,
        entry: ManifestEntry | None,
        signing: SigningKeys | None,
        excerpt: bool,
    ) -> Checked:
        digest = hashlib.sha256(data).hexdigest()
        corrupt = Resolution("corrupt", None)
        if not digest.startswith(pointer.digest):
            return Checked(corrupt, "digest")
        if entry is None:
            return Checked(corrupt, "no-manifest")
        if signing is None or not verify_entry(signing, entry):
            return Checked(corrupt, "signature")
        if (entry.tenant, entry.session, entry.name) != (tenant, pointer.session, pointer.name):
            return Checked(corrupt, "manifest-mismatch")
        if entry.sha256 != digest or entry.size != len(data):
            return Checked(corrupt, "manifest-mismatch")
        text = _excerpt(data, self._max_excerpt_chars) if excerpt else None
        return Checked(Resolution("available", digest, text))

    async def write(
        self,
        tenant: str,
        session: str,
        name: str,
        data: bytes,
        settings: ObjectStoreSettings,
        signing: SigningKeys,
    ) -> str:
        """PUT the object, then record its signed manifest entry; return the pointer."""
        key = object_key(settings, session, name)
        if key is None:
            raise ValueError("invalid artifact name")
        digest = hashlib.sha256(data).hexdigest()
        async with self._semaphore(tenant, settings):
            await self.client.put(settings, key, data)
        written_at = datetime.now(UTC).isoformat(timespec="microseconds")
        await self._write_manifest(
            sign_entry(signing, tenant, session, name, len(data), digest, written_at)
        )
        return format_pointer(ArtifactPointer(session, name, digest))
