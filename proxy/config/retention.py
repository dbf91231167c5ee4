"""The ``retention:`` section: what the garbage collector deletes
(``proxy/server/maintenance/retention.py``), per kind; a tenant policy may override the kinds."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.schema import check, doc, non_negative, positive


@dataclass(frozen=True, slots=True)
class KindRetention:
    """How long / how much of one kind of stored thing a tenant keeps (0 = no limit)."""

    max_age_days: float = field(default=0.0, metadata=check(non_negative, doc="Older rows are deleted (0 = no limit)."))
    max_rows: int = field(
        default=0, metadata=check(non_negative, doc="Rows kept per tenant, the newest (0 = no limit).")
    )


@dataclass(frozen=True, slots=True)
class ArtifactRetention:
    max_age_days: float = field(
        default=90.0, metadata=check(non_negative, doc="Files older than this are deleted (0 = no limit).")
    )
    max_bytes: int = field(
        default=0, metadata=check(non_negative, doc="Bytes kept per tenant, the newest files (0 = no limit).")
    )


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """``retention:``: what the garbage collector deletes (proxy/server/maintenance/retention.py).
    The kinds can be overridden per tenant in its policy file; the scheduling keys are per
    process."""

    enabled: bool = field(
        default=True,
        metadata=doc("Run the collector in this process (a tenant's `retention.enabled: false` spares that tenant)."),
    )
    interval_seconds: float = field(
        default=3600.0,
        metadata=check(
            positive,
            doc="How often each replica tries to run it (the first try at a random moment of the first interval).",
        ),
    )
    batch_size: int = field(
        default=500, metadata=check(positive, doc="Rows (or files) per statement; the event loop runs between batches.")
    )
    lease_seconds: float = field(
        default=300.0,
        metadata=check(
            positive,
            doc="One replica runs at a time, holding a lease row in the store (renewed every batch);"
            " a crashed runner's lease expires after this.",
        ),
    )
    plans: KindRetention = field(default=KindRetention(30.0, 100_000), metadata=doc("Compaction plans."))
    summaries: KindRetention = field(
        default=KindRetention(30.0, 100_000), metadata=doc("L4 summaries (a lease still held is never deleted).")
    )
    manifests: KindRetention = field(default=KindRetention(90.0, 100_000), metadata=doc("Compaction manifests."))
    calibration: KindRetention = field(
        default=KindRetention(90.0, 1_000),
        metadata=doc("Calibration figures not refreshed for that long (a model no longer used)."),
    )
    transcripts: KindRetention = field(
        default=KindRetention(90.0, 0),
        metadata=doc("Recorded transcript events in the store (events a durable pointer or a stored plan names are kept)."),
    )
    artifacts: ArtifactRetention = field(
        default=ArtifactRetention(),
        metadata=doc(
            "Cut tool results under the tenant's `artifact_root`, by file time and total size (kept"
            " while a plan or a durable pointer names them)."
        ),
    )
    usage_ledger: KindRetention = field(default=KindRetention(90.0, 0), metadata=doc("Usage ledger rows."))
    source_audit: KindRetention = field(
        default=KindRetention(90.0, 0), metadata=doc("The source-check audit trail (`GET /admin/v1/audit`).")
    )
