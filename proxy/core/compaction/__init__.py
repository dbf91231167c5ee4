"""Compaction: keep a long conversation inside the context window, stably across turns.

Four layers, lightest first, applied only when a request is over the policy's threshold and only
until it is under ``threshold * target_ratio``: L1 ``truncate`` (cut oversized tool results), L2
``dedup`` (drop superseded file reads), L3 ``prune`` (drop whole old interactions), L4
``summarize`` (replace what L3 dropped with a model-written summary in a bridge turn). A ``Plan``
remembers each compaction so later turns reuse the same view and keep the provider's prompt cache.

Pure: no I/O, no clock, no logging of content; the edge makes the summary call (see ``pipeline``).
"""

from proxy.core.compaction.bridge import Bridge
from proxy.core.compaction.manifest import ManifestRecord, Removed, Summarized, Truncated
from proxy.core.compaction.pipeline import (
    CompactionInput,
    CompactionOutcome,
    CompactionResult,
    Continuation,
    Done,
    NeedsNaming,
    NeedsSummary,
    compact,
    finish,
    named,
    run_compaction,
    step,
)
from proxy.core.compaction.plan import LAYERS, Plan, PlanCache, prefix_hashes
from proxy.core.compaction.policy import (
    DEFAULT_READ_TOOLS,
    DEFAULT_SUMMARY_PROMPT,
    CompactionPolicy,
    ReadTool,
)
from proxy.core.compaction.summarize import SummaryPlan, SummaryRequest
from proxy.core.compaction.truncate import truncation_marker

__all__ = [
    "DEFAULT_READ_TOOLS",
    "DEFAULT_SUMMARY_PROMPT",
    "LAYERS",
    "Bridge",
    "CompactionInput",
    "CompactionOutcome",
    "CompactionPolicy",
    "CompactionResult",
    "Continuation",
    "Done",
    "ManifestRecord",
    "NeedsNaming",
    "NeedsSummary",
    "Plan",
    "PlanCache",
    "ReadTool",
    "Removed",
    "Summarized",
    "SummaryPlan",
    "SummaryRequest",
    "Truncated",
    "compact",
    "finish",
    "named",
    "prefix_hashes",
    "run_compaction",
    "step",
    "truncation_marker",
]
