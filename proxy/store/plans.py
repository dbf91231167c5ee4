"""What compaction keeps: plans, compaction manifests, summary leases and calibration, on both
backends (``plans``, ``manifests``, ``summaries``, ``calibration``).

* **Plans** are stored once per ``(tenant, prefix hash)``: two replicas that compacted the same
  prefix at once keep the first plan (the insert waits for a concurrent one of the same key).
* **Manifests** are stored once per compaction id; the identical one again is a no-op, another
  one a :class:`ManifestConflict`.
* **Summary leases**: one summary per ``(tenant, key)`` across every replica. The row is locked
  for the decision (created first as an expired pending row, so two claimers of a new key queue
  on the same row; SQLite's transaction holds the file's lock), and lease times come from the
  database's clock (``Dialect.epoch_now``), so replicas on several hosts agree on them. What to
  answer and write is decided by :func:`decide_claim` / :func:`decide_settle` (pure).
* **Calibration**: the tenant's real/estimate ratio per model, last writer wins.
"""

from __future__ import annotations

import proxy.store.clock as clock
from proxy.store.checks import (
    DEFAULT_PLAN_LIMIT,
    check_calibration,
    check_keys,
    check_plan_limit,
    check_settle,
    check_storable,
    check_summary_claim,
    encode_manifest,
    encode_plan,
    storable,
)
from proxy.store.durable import lock_session
from proxy.store.errors import ManifestConflict
from proxy.store.sql import Jobs, Tx
from proxy.store.values import StoredManifest, SummaryClaim, SummaryRow

__all__ = ["PlansFamily", "decide_claim", "decide_settle"]


def decide_claim(
    row: SummaryRow | None, holder: str, now: float, lease_seconds: float
) -> tuple[SummaryClaim, SummaryRow | None]:
    """What ``claim_summary`` answers for the stored ``row``, and the row to write (or None)."""
    if row is not None and row.state == "ok":
        return SummaryClaim("ok", row.text), None
    if row is not None and row.expires_at > now:
        if row.state == "failed":
            return SummaryClaim("failed"), None
        if row.holder != holder:
            return SummaryClaim("held", wait_seconds=row.expires_at - now), None
    # absent, expired, or our own lease (a renewal): take it
    return (
        SummaryClaim("acquired", wait_seconds=lease_seconds),
        SummaryRow("pending", holder, now + lease_seconds, None),
    )


def decide_settle(
    row: SummaryRow | None, holder: str, text: str | None, now: float, retry_seconds: float
) -> SummaryRow | None:
    """The row ``settle_summary`` writes, or None when ``holder`` no longer holds the lease."""
    if row is None or row.state != "pending" or row.holder != holder:
        return None
    if text is None:
        return SummaryRow("failed", holder, now + retry_seconds, None)
    return SummaryRow("ok", holder, now, text)


async def _locked_summary(tx: Tx, tenant: str, key: str) -> tuple[SummaryRow, float]:
    """The summary row, locked until the transaction ends, and the database's clock."""
    await tx.execute(
        "INSERT INTO summaries (tenant, summary_key, state, holder, expires_at, summary,"
        " updated_at) VALUES (?, ?, 'pending', '', 0, NULL, ?)"
        " ON CONFLICT (tenant, summary_key) DO NOTHING",
        tenant,
        key,
        clock.now_iso(),
    )
    row = await tx.row(
        f"SELECT state, holder, expires_at, summary, {tx.dialect.epoch_now}"
        f" FROM summaries WHERE tenant = ? AND summary_key = ?{tx.dialect.for_update}",
        tenant,
        key,
    )
    assert row is not None  # inserted above, in this transaction
    state, holder, expires_at, text, now = row
    return SummaryRow(state, str(holder), float(expires_at), text), float(now)


async def _write_summary(tx: Tx, tenant: str, key: str, row: SummaryRow) -> None:
    await tx.execute(
        "UPDATE summaries SET state = ?, holder = ?, expires_at = ?, summary = ?, updated_at = ?"
        " WHERE tenant = ? AND summary_key = ?",
        row.state,
        row.holder,
        row.expires_at,
        row.text,
        clock.now_iso(),
        tenant,
        key,
    )


class PlansFamily(Jobs):
    """``put_manifest``, ``get_manifest``, ``put_plan``, ``plans_for``, ``claim_summary``,
    ``settle_summary``, ``put_calibration``, ``get_calibration``."""

    async def put_manifest(
        self, tenant: str, compaction_id: str, session: str, manifest_json: str
    ) -> None:
        check_keys(tenant, session)
        text = encode_manifest(compaction_id, manifest_json)
        check_storable([("compaction_id", compaction_id), ("manifest_json", text)])

        async def job(tx: Tx) -> None:
            async with tx.transaction():
                now = clock.now_iso()
                # Waits for a concurrent insert of the same id to commit or roll back.
                inserted = await tx.row(
                    "INSERT INTO manifests (tenant, compaction_id, session, manifest, stored_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, compaction_id) DO NOTHING"
                    " RETURNING 1",
                    tenant,
                    compaction_id,
                    session,
                    text,
                    now,
                )
                if inserted is not None:
                    await lock_session(tx, tenant, session, now)
                    return
                row = await tx.row(
                    "SELECT session, manifest FROM manifests WHERE tenant = ? AND compaction_id = ?",
                    tenant,
                    compaction_id,
                )
                if row is None or (row[0], row[1]) != (session, text):
                    raise ManifestConflict("another manifest is stored under this compaction id")

        await self._run(job)

    async def get_manifest(self, tenant: str, compaction_id: str) -> StoredManifest | None:
        check_keys(tenant)
        if not isinstance(compaction_id, str) or not storable(compaction_id):
            return None  # could never have been stored

        async def job(tx: Tx) -> StoredManifest | None:
            row = await tx.row(
                "SELECT session, manifest, stored_at FROM manifests"
                " WHERE tenant = ? AND compaction_id = ?",
                tenant,
                compaction_id,
            )
            if row is None:
                return None
            return StoredManifest(compaction_id, str(row[0]), str(row[1]), str(row[2]))

        return await self._read(job)

    async def put_plan(
        self, tenant: str, anchor: str, prefix_hash: str, prefix_len: int, plan_json: str
    ) -> str:
        check_keys(tenant)
        text = encode_plan(anchor, prefix_hash, prefix_len, plan_json)
        check_storable([("anchor", anchor), ("prefix_hash", prefix_hash), ("plan_json", text)])

        async def job(tx: Tx) -> str:
            async with tx.transaction():
                # Waits for a concurrent insert of the same key to commit or roll back.
                await tx.execute(
                    "INSERT INTO plans (tenant, prefix_hash, anchor, prefix_len, plan_json,"
                    " created_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (tenant, prefix_hash) DO NOTHING",
                    tenant,
                    prefix_hash,
                    anchor,
                    prefix_len,
                    text,
                    clock.now_iso(),
                )
                stored = await tx.value(
                    "SELECT plan_json FROM plans WHERE tenant = ? AND prefix_hash = ?",
                    tenant,
                    prefix_hash,
                )
                return text if stored is None else str(stored)

        return await self._run(job)

    async def plans_for(
        self, tenant: str, anchor: str, limit: int = DEFAULT_PLAN_LIMIT
    ) -> tuple[str, ...]:
        check_keys(tenant)
        limit = check_plan_limit(limit)
        if not isinstance(anchor, str) or not storable(anchor):
            return ()  # could never have been stored

        async def job(tx: Tx) -> tuple[str, ...]:
            rows = await tx.rows(
                "SELECT plan_json FROM plans WHERE tenant = ? AND anchor = ?"
                " ORDER BY prefix_len DESC, prefix_hash LIMIT ?",
                tenant,
                anchor,
                limit,
            )
            return tuple(str(text) for (text,) in rows)

        return await self._read(job)

    async def claim_summary(
        self, tenant: str, key: str, holder: str, lease_seconds: float
    ) -> SummaryClaim:
        check_keys(tenant)
        check_summary_claim(key, holder, lease_seconds, "lease_seconds")
        check_storable([("key", key), ("holder", holder)])

        async def job(tx: Tx) -> SummaryClaim:
            async with tx.transaction():
                row, now = await _locked_summary(tx, tenant, key)
                claim, write = decide_claim(row, holder, now, lease_seconds)
                if write is not None:
                    await _write_summary(tx, tenant, key, write)
                return claim

        return await self._run(job)

    async def settle_summary(
        self, tenant: str, key: str, holder: str, text: str | None, retry_seconds: float
    ) -> None:
        check_keys(tenant)
        check_settle(key, holder, text, retry_seconds)
        check_storable([("key", key), ("holder", holder), ("text", text)])

        async def job(tx: Tx) -> None:
            async with tx.transaction():
                row, now = await _locked_summary(tx, tenant, key)
                write = decide_settle(row, holder, text, now, retry_seconds)
                if write is not None:
                    await _write_summary(tx, tenant, key, write)

        await self._run(job)

    async def put_calibration(self, tenant: str, model: str, ratio: float) -> None:
        check_keys(tenant)
        check_calibration(model, ratio, with_ratio=True)
        check_storable([("model", model)])

        async def job(tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO calibration (tenant, model, ratio, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, model) DO UPDATE"
                " SET ratio = excluded.ratio, updated_at = excluded.updated_at",
                tenant,
                model,
                float(ratio),
                clock.now_iso(),
            )

        await self._run(job)

    async def get_calibration(self, tenant: str, model: str) -> float | None:
        check_keys(tenant)
        check_calibration(model, with_ratio=False)
        if not storable(model):
            return None  # could never have been stored

        async def job(tx: Tx) -> float | None:
            ratio = await tx.value(
                "SELECT ratio FROM calibration WHERE tenant = ? AND model = ?", tenant, model
            )
            return None if ratio is None else float(ratio)

        return await self._read(job)
