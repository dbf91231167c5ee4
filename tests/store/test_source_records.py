"""Signed manifest entries and the source-check audit trail, on both backends (migration 6)."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.sources.manifests import SigningKeys, sign_entry, verify_entry
from proxy.store import Store
from proxy.store.source_records import (
    AuditQuery,
    AuditRow,
    append_audit,
    delete_audit_before,
    get_artifact_manifest,
    list_audit,
    put_artifact_manifest,
)

KEYS = SigningKeys("k1", {"k1": b"k" * 32})


def row(n: int, tenant: str = "acme", session: str = "s1", status: str = "available") -> AuditRow:
    return AuditRow(
        tenant=tenant,
        session=session,
        pointer=f"artifact:{session}:n{n}.txt:" + "a" * 64,
        status=status,
        digest="a" * 64 if status == "available" else None,
        backend="s3",
        detail="",
        duration_ms=1.5,
        asked_by=f"request:chk_{n}",
        checked_at=f"2026-12-0{n}T00:00:00.000000+00:00",
    )


async def test_manifest_entries_round_trip_and_a_rewrite_replaces(store: Store) -> None:
    entry = sign_entry(KEYS, "acme", "s1", "a.txt", 5, "b" * 64, "2026-12-03T08:00:00.000000+00:00")
    await put_artifact_manifest(store, entry)
    assert await get_artifact_manifest(store, "acme", "s1", "a.txt") == entry
    assert await get_artifact_manifest(store, "globex", "s1", "a.txt") is None
    newer = sign_entry(KEYS, "acme", "s1", "a.txt", 6, "c" * 64, "2026-12-03T09:00:00.000000+00:00")
    await put_artifact_manifest(store, newer)
    got = await get_artifact_manifest(store, "acme", "s1", "a.txt")
    assert got == newer and got is not None and verify_entry(KEYS, got)


async def test_audit_rows_filter_page_and_expire(store: Store) -> None:
    await append_audit(store, [row(1), row(2, status="missing"), row(3, session="s2"), row(4, tenant="globex")])
    everything = await list_audit(store, AuditQuery("acme"))
    assert [r.asked_by for r in everything] == ["request:chk_1", "request:chk_2", "request:chk_3"]
    assert everything[0] == dataclasses.replace(row(1), id=everything[0].id)
    assert [r.asked_by for r in await list_audit(store, AuditQuery("acme", status="missing"))] == ["request:chk_2"]
    assert [r.session for r in await list_audit(store, AuditQuery("acme", session="s2"))] == ["s2"]
    window = AuditQuery("acme", since="2026-12-02T00:00:00.000000+00:00", until="2026-12-03T00:00:00.000000+00:00")
    assert [r.asked_by for r in await list_audit(store, window)] == ["request:chk_2"]
    page = await list_audit(store, AuditQuery("acme", after=everything[0].id, limit=1))
    assert [r.asked_by for r in page] == ["request:chk_2"]
    assert await delete_audit_before(store, "2026-12-03T00:00:00.000000+00:00") == 2
    assert [r.asked_by for r in await list_audit(store, AuditQuery("acme"))] == ["request:chk_3"]
    assert [r.tenant for r in await list_audit(store, AuditQuery("globex"))] == ["globex"]
    with pytest.raises(ValueError):
        await delete_audit_before(store, "")


async def test_odd_pointer_text_is_recorded_as_text(store: Store) -> None:
    odd = AuditRow("acme", "s1", "artifact:\x00\udcff", "corrupt", None, "none", "grammar", 0.0, "admin:r", "2026-12-03T00:00:00.000000+00:00")
    await append_audit(store, [odd])
    [got] = await list_audit(store, AuditQuery("acme"))
    assert got.status == "corrupt" and got.pointer.startswith("artifact:")
