"""Source checks: one entry point for every reader (durable injection, the admin API), which
picks the backend per tenant policy, verifies signed manifests, and records the audit trail.

For each pointer, in order (nothing is looked up before parsing and authorisation passed):

* ``parse_pointer`` -> ``corrupt`` / ``unsupported`` (backend ``none``);
* :func:`authorise` -> ``denied`` (backend ``none``, detail ``policy``);
* an ``artifact:`` pointer of a tenant with ``object_store`` -> :class:`StoreArtifacts` (``s3``);
* a ``transcript:`` pointer -> the store itself (:class:`PointerResolver`: the event the store
  numbered ``seq``, or ``missing``; backend ``store``);
* other artifacts -> the local :class:`SourceResolver` in a worker thread (``local``). With
  signing keys, a local artifact that has a manifest entry must match it (else ``corrupt``); one
  without an entry (written before signing was configured) stays ``available``, audited
  ``unsigned``.

Every check becomes an :class:`AuditRow` handed to the batched :class:`AuditLog`: the answer never
waits for it. Local checks of one batch share the batch's duration evenly (they share directory
fds, so they are timed together).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from proxy.core.bounded import CacheView
from proxy.core.pointers import ArtifactPointer, BadPointer, TranscriptPointer, parse_pointer
from proxy.sources.artifact_files import write_artifact
from proxy.sources.audit_log import AuditLog
from proxy.sources.manifests import ManifestEntry, sign_entry, verify_entry
from proxy.sources.object_store import S3Client
from proxy.sources.pointer_resolver import Fetched, PointerResolver
from proxy.sources.policy import SourcePolicy, authorise
from proxy.sources.resolver import Resolution, SourceResolver
from proxy.sources.store_artifacts import Checked, StoreArtifacts
from proxy.store.base import Store, StoreError
from proxy.store.source_records import (
    AuditRow,
    append_audit,
    get_artifact_manifest,
    put_artifact_manifest,
)

__all__ = ["SourceChecks"]

log = logging.getLogger("context_proxy.sources")

_CORRUPT = Resolution("corrupt", None)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _audit_row(
    tenant: str,
    session: str | None,
    text: object,
    item: tuple[Resolution, str, str, float],
    *,
    asked_by: str,
    checked_at: str,
) -> AuditRow:
    resolution, backend, detail, duration = item
    parsed = parse_pointer(text)
    return AuditRow(
        tenant=tenant,
        session=session or ("" if isinstance(parsed, BadPointer) else parsed.session),
        pointer=text if isinstance(text, str) else repr(type(text)),
        status=resolution.status,
        digest=resolution.evidence_sha256,
        backend=backend,
        detail=detail,
        duration_ms=duration,
        asked_by=asked_by,
        checked_at=checked_at,
    )


class SourceChecks:
    def __init__(
        self, local: SourceResolver, store: Store, *, client: S3Client | None = None
    ) -> None:
        self.local = local
        self.store = store
        self.pointers = PointerResolver(
            store, local, max_excerpt_chars=local.limits.max_excerpt_chars
        )
        self.client = client or S3Client()
        self.artifacts = StoreArtifacts(
            self.client,
            self._lookup,
            self._put_manifest,
            max_excerpt_chars=local.limits.max_excerpt_chars,
            cache_entries=local.limits.cache_entries,
        )
        self.audit = AuditLog(self._write_audit)

    def caches(self) -> tuple[CacheView, ...]:
        """What the checks keep per pointer (for the metrics)."""
        return (self.local.cache, self.artifacts.cache)

    async def _lookup(self, tenant: str, session: str, name: str) -> ManifestEntry | None:
        return await get_artifact_manifest(self.store, tenant, session, name)

    async def _put_manifest(self, entry: ManifestEntry) -> None:
        await put_artifact_manifest(self.store, entry)

    async def _write_audit(self, rows: Sequence[AuditRow]) -> None:
        await append_audit(self.store, rows)

    async def close(self) -> None:
        await self.audit.close()
        await self.client.close()

    # -- reading ------------------------------------------------------------------------------

    async def resolve_many(
        self,
        tenant: str,
        policy: SourcePolicy,
        pointers: Iterable[object],
        *,
        excerpt: bool = False,
        session: str | None = None,
        asked_by: str = "",
    ) -> tuple[Resolution, ...]:
        texts = list(pointers)
        out: list[tuple[Resolution, str, str, float] | None] = [None] * len(texts)
        local: list[int] = []
        remote: list[tuple[int, ArtifactPointer]] = []
        for i, text in enumerate(texts):
            parsed = parse_pointer(text)
            if isinstance(parsed, BadPointer):
                out[i] = (Resolution(parsed.status, None), "none", "grammar", 0.0)
            elif not authorise(parsed, policy):
                out[i] = (Resolution("denied", None), "none", "policy", 0.0)
            elif isinstance(parsed, ArtifactPointer) and policy.object_store is not None:
                remote.append((i, parsed))
            else:
                local.append(i)

        async def check_remote(i: int, pointer: ArtifactPointer) -> None:
            assert policy.object_store is not None
            started = time.perf_counter()
            try:
                checked = await self.artifacts.check(
                    tenant, pointer, policy.object_store, policy.signing, excerpt=excerpt
                )
            except StoreError:
                checked = Checked(Resolution("missing", None), "unavailable:manifests")
            duration = (time.perf_counter() - started) * 1000
            out[i] = (checked.resolution, "s3", checked.detail, duration)

        tasks = [check_remote(i, p) for i, p in remote]
        if local:
            tasks.append(self._check_local(tenant, policy, texts, local, out, excerpt))
        await asyncio.gather(*tasks)
        checked_at = _now()
        rows = []
        results = []
        for text, item in zip(texts, out, strict=True):
            assert item is not None
            results.append(item[0])
            rows.append(
                _audit_row(tenant, session, text, item, asked_by=asked_by, checked_at=checked_at)
            )
        self.audit.record(rows)
        return tuple(results)

    async def fetch(
        self,
        tenant: str,
        policy: SourcePolicy,
        pointer: object,
        *,
        session: str | None = None,
        asked_by: str = "",
    ) -> Fetched:
        """One pointer's resolution and, when ``available``, the exact verified bytes (an
        artifact's content, a transcript event's record): the same order of checks as
        :meth:`resolve_many` (grammar, policy, then the backend), audited the same way. A store
        that cannot be read, or a resource error of the file side, renders ``missing`` (audited
        ``unavailable:...``)."""
        started = time.perf_counter()
        parsed = parse_pointer(pointer)
        backend, detail = "none", ""
        if isinstance(parsed, BadPointer):
            fetched, detail = Fetched(Resolution(parsed.status, None), None), "grammar"
        elif not authorise(parsed, policy):
            fetched, detail = Fetched(Resolution("denied", None), None), "policy"
        elif isinstance(parsed, ArtifactPointer) and policy.object_store is not None:
            backend = "s3"
            try:
                checked, data = await self.artifacts.read(
                    tenant, parsed, policy.object_store, policy.signing
                )
            except StoreError:
                checked, data = Checked(Resolution("missing", None), "unavailable:manifests"), None
            fetched, detail = Fetched(checked.resolution, data), checked.detail
        else:
            backend = "store" if isinstance(parsed, TranscriptPointer) else "local"
            try:
                fetched = await self.pointers.fetch(tenant, policy, pointer)
            except StoreError:
                fetched, detail = Fetched(Resolution("missing", None), None), "unavailable:store"
            except OSError as exc:  # resources (EMFILE...), not a property of the source
                fetched = Fetched(Resolution("missing", None), None)
                detail = f"unavailable:{type(exc).__name__}"
            if (
                isinstance(parsed, ArtifactPointer)
                and policy.signing is not None
                and fetched.resolution.status == "available"
            ):
                resolution, detail = await self._signed_local(
                    tenant, policy, parsed, fetched.resolution
                )
                if resolution.status != "available":
                    fetched = Fetched(resolution, None)
        duration = (time.perf_counter() - started) * 1000
        item = (fetched.resolution, backend, detail, duration)
        self.audit.record(
            [_audit_row(tenant, session, pointer, item, asked_by=asked_by, checked_at=_now())]
        )
        return fetched

    async def _check_local(
        self,
        tenant: str,
        policy: SourcePolicy,
        texts: list[object],
        indexes: list[int],
        out: list[tuple[Resolution, str, str, float] | None],
        excerpt: bool,
    ) -> None:
        started = time.perf_counter()
        # StoreError propagates: the caller renders the store as unavailable (never a guess).
        found = await self.pointers.resolve_many(
            tenant, policy, [texts[i] for i in indexes], excerpt=excerpt
        )
        checked: list[tuple[Resolution, str]] = [(r, "") for r in found]
        if policy.signing is not None:
            for n, i in enumerate(indexes):
                parsed = parse_pointer(texts[i])
                if isinstance(parsed, ArtifactPointer) and found[n].status == "available":
                    checked[n] = await self._signed_local(tenant, policy, parsed, found[n])
        share = (time.perf_counter() - started) * 1000 / len(indexes)
        for (resolution, detail), i in zip(checked, indexes, strict=True):
            backend = "store" if isinstance(parse_pointer(texts[i]), TranscriptPointer) else "local"
            out[i] = (resolution, backend, detail, share)

    async def _signed_local(
        self, tenant: str, policy: SourcePolicy, pointer: ArtifactPointer, found: Resolution
    ) -> tuple[Resolution, str]:
        assert policy.signing is not None
        try:
            entry = await self._lookup(tenant, pointer.session, pointer.name)
        except StoreError:
            return Resolution("missing", None), "unavailable:manifests"
        if entry is None:
            return found, "unsigned"
        if not verify_entry(policy.signing, entry):
            return _CORRUPT, "signature"
        if entry.sha256 != found.evidence_sha256:
            return _CORRUPT, "manifest-mismatch"
        return found, ""

    # -- writing ------------------------------------------------------------------------------

    async def write_artifacts(
        self,
        tenant: str,
        policy: SourcePolicy,
        session: str,
        artifacts: Sequence[tuple[str, bytes]],
    ) -> None:
        """Store each (name, bytes) where the tenant's artifacts live, with its signed manifest
        entry. Raises ``OSError``/``ValueError`` (local), ``ObjectStoreError`` or ``StoreError``."""
        settings, signing = policy.object_store, policy.signing
        if settings is not None:
            if signing is None:  # load_tenancy never builds this
                raise ValueError("an object store without signing keys")
            for name, data in artifacts:
                await self.artifacts.write(tenant, session, name, data, settings, signing)
            return
        root = policy.artifact_root
        if root is None:
            return

        def write_all() -> list[str]:
            return [write_artifact(root, session, name, data) for name, data in artifacts]

        pointers = await asyncio.to_thread(write_all)
        if signing is None:
            return
        for (name, data), pointer in zip(artifacts, pointers, strict=True):
            digest = pointer.rsplit(":", 1)[1]
            await self._put_manifest(
                sign_entry(signing, tenant, session, name, len(data), digest, _now())
            )
