"""What a compaction run is and what it gives: its input, its state, its outcomes, its result.

``compact`` (``pipeline``) makes a ``Run`` and answers ``Done`` or a step the edge must take
(``NeedsNaming``, ``NeedsSummary``); ``steps`` continues from there. Both build the result here
(``finalize``: the view, and a new plan stored in the cache when the run changed the view).
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.core.compaction.bridge import Bridge, TranscriptNaming
from proxy.core.compaction.context import LayerContext, compaction_end, frozen_len
from proxy.core.compaction.digest import Digests
from proxy.core.compaction.manifest import ManifestRecord
from proxy.core.compaction.markers import cap_markers
from proxy.core.compaction.plan import LAYERS, Plan, PlanCache, PlanView
from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.provider import CompactionCall
from proxy.core.compaction.prune import Region
from proxy.core.compaction.retrieval import plan_names_pointers, view_names_pointers
from proxy.core.compaction.summarize import SummaryPlan, SummaryRequest
from proxy.core.compaction.view import Entry, FromClient, Message, role_of
from proxy.core.tokens import Canonical

__all__ = [
    "CompactionInput",
    "CompactionOutcome",
    "CompactionResult",
    "Continuation",
    "Done",
    "NeedsNaming",
    "NeedsSummary",
    "PlanStatus",
    "Run",
    "SummaryStatus",
    "finalize",
    "marked_item",
    "output",
    "unchanged",
    "view_of",
]

PlanStatus = Literal["new", "reused", "none"]
SummaryStatus = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class CompactionInput:
    """The parsed client request (never mutated) and the model's calibration ratio."""

    system: object
    tools: object
    messages: Sequence[Message]
    model: str
    calibration: float = 1.0  # real / estimate; estimates are multiplied by it
    # With a session, each cut tool result's full text is named as an artifact of it (the edge
    # stores the bytes of ``artifact_of(...)``), and the truncation marker carries its pointer.
    artifact_session: str | None = None
    # With a session whose transcript holds these messages, the bridge names the removed turns
    # by their transcript pointers (the model can read them back: context_proxy_retrieve).
    transcript: TranscriptNaming | None = None
    # the canonical JSON of (some of) ``messages`` when the edge made it already
    canonical: Canonical | None = None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The view to forward and what was done to get it. Token figures are calibrated."""

    messages: list[Message]
    tokens_before: int
    tokens_after: int
    layers: tuple[str, ...]
    plan_status: PlanStatus
    summary_status: SummaryStatus
    manifest: tuple[ManifestRecord, ...]
    compaction_id: str | None
    changed: bool
    over_hard_limit: bool
    plan: Plan | None  # the plan in effect (``new``: persist it; ``reused``: already known)
    # of the request's messages: a later request that re-uses these message objects (a
    # ``Resent`` list) takes them instead of hashing its history again
    digests: Digests | None = None
    # summariser calls this request's compaction made (0 unless ``plan_status`` is ``new``)
    summary_calls: int = 0


@dataclass(frozen=True, slots=True)
class Run:
    request: CompactionInput
    policy: CompactionPolicy
    plans: PlanCache
    tenant: str
    ctx: LayerContext
    hashes: tuple[str, ...]
    tokens_before: int
    base: Plan | None  # the plan the starting view came from
    # per client message: False when it certainly holds no cache_control marker (a view message
    # made from it then holds none either)
    marked: tuple[bool, ...]
    digests: Digests


@dataclass(frozen=True, slots=True)
class Continuation:
    """Everything ``step`` / ``finish`` need after a summary call. Opaque to the edge."""

    run: Run
    region: Region
    records: tuple[ManifestRecord, ...]
    applied: tuple[str, ...]
    summary: SummaryPlan | None = None  # the chain of calls (None: one call, no plan kept)
    index: int = 0  # the call this continuation waits for (0-based)
    provider: bool = False  # it waits for the provider's compaction (``provider``)
    provider_failed: bool = False  # the provider's compaction failed: the proxy summarises
    earlier_calls: int = 0  # calls made before this chain (a failed provider compaction)

    @property
    def calls(self) -> int:
        """Calls of the whole chain."""
        return self.summary.calls if self.summary is not None else 1

    @property
    def origins(self) -> tuple[int, ...]:
        """The client message indices the awaited call's text renders."""
        return self.summary.origins[self.index] if self.summary is not None else ()


@dataclass(frozen=True, slots=True)
class Done:
    result: CompactionResult


@dataclass(frozen=True, slots=True)
class NeedsSummary:
    """A summary call to make: the proxy's summary model (``SummaryRequest``: answer with its
    text) or the provider's compaction (``CompactionCall``: answer with ``block_of_answer``)."""

    summary_request: SummaryRequest | CompactionCall
    continuation: Continuation


@dataclass(frozen=True, slots=True)
class NeedsNaming:
    """The removed messages (client indices) and their transcript event keys
    (``proxy.core.event_keys``): the edge looks up which sequence numbers the conversation's
    transcript gave them, and continues with ``named``."""

    indices: tuple[int, ...]
    keys: tuple[str, ...]  # one per index
    continuation: Continuation

    def sequences(self, found: Mapping[str, int]) -> dict[int, int]:
        """``found`` (event key -> sequence number, as the store answered) by message index."""
        return {i: found[k] for i, k in zip(self.indices, self.keys, strict=True) if k in found}


CompactionOutcome = Done | NeedsSummary | NeedsNaming


def unchanged(run: Run) -> CompactionResult:
    return CompactionResult(
        messages=list(run.request.messages),
        tokens_before=run.tokens_before,
        tokens_after=run.tokens_before,
        layers=(),
        plan_status="none",
        summary_status="skipped",
        manifest=(),
        compaction_id=None,
        changed=False,
        over_hard_limit=run.tokens_before > run.policy.hard_limit,
        plan=None,
        digests=run.digests,
    )


def output(
    run: Run, messages: Sequence[Message], marked: Sequence[bool], frozen: int
) -> list[Message]:
    """The view's messages as forwarded: markers capped. ``marked``: per view message, whether it
    may hold a marker; ``frozen``: ``compaction_end`` of the view."""
    request = run.request
    stop = len(messages) - 1
    while stop >= 0 and role_of(messages[stop]) != "assistant":
        stop -= 1
    if stop < 0:
        stop = len(messages) - 1
    return cap_markers(
        request.system,
        request.tools,
        messages,
        max(1, frozen),
        min(stop, len(messages) - 1),
        marked,
    )


def marked_item(run: Run, item: object) -> bool:
    """Whether the view message of ``item`` may hold a marker (only its source's can)."""
    return not isinstance(item, FromClient) or run.marked[item.origin]


def view_of(
    run: Run, entries: Sequence[Entry], client_frozen: int, compaction_id: str
) -> PlanView:
    """The ``PlanView`` of a plan whose items are ``entries`` (made from this request)."""
    tokens = tuple(
        [
            None
            if isinstance(e.item, FromClient)
            and (e.item.blocks is None or run.marked[e.item.origin])
            else e.tokens
            for e in entries
        ]
    )
    return PlanView(tokens, frozen_len(entries), client_frozen, compaction_id)


def finalize(
    run: Run,
    entries: Sequence[Entry],
    records: Sequence[ManifestRecord],
    applied: Sequence[str],
    summary_status: SummaryStatus,
    bridge: Bridge | None,
) -> CompactionResult:
    """Build the result; store a new plan when this run changed the view."""
    n = len(run.request.messages)
    base = run.base
    if not applied:
        if base is None:
            return unchanged(run)
        plan: Plan = base
        status: PlanStatus = "reused"
    else:
        last = entries[-1].item
        if not (isinstance(last, FromClient) and last.origin == n - 1 and last.blocks is None):
            raise AssertionError("compaction changed the last message")
        done = {*applied, *(base.layers if base is not None else ())}
        if bridge is None and base is not None:
            bridge = base.bridge
        items = tuple(e.item for e in entries[:-1])
        kept = None if bridge is None or bridge.empty else bridge
        plan = Plan(
            tenant=run.tenant,
            anchor=run.hashes[1],
            prefix_len=n - 1,
            prefix_hash=run.hashes[n - 1],
            items=items,
            layers=tuple(layer for layer in LAYERS if layer in done),
            manifest=(*(base.manifest if base is not None else ()), *records),
            bridge=kept,
            summary_status=summary_status,
            # once a view of the conversation named a pointer, its later views do, or keep the
            # tool (retrieval.plan_names_pointers)
            pointers=view_names_pointers(items, kept) or plan_names_pointers(base),
        )
        client_frozen = compaction_end(run.request.messages[: n - 1])
        run.plans.put(plan, view_of(run, entries[:-1], client_frozen, plan.compaction_id))
        status = "new"
    tokens_after = run.ctx.total(entries)
    return CompactionResult(
        messages=output(
            run,
            [e.message for e in entries],
            [marked_item(run, e.item) for e in entries],
            frozen_len(entries),
        ),
        tokens_before=run.tokens_before,
        tokens_after=tokens_after,
        layers=plan.layers,
        plan_status=status,
        summary_status=summary_status if status == "new" else "skipped",
        manifest=plan.manifest,
        compaction_id=plan.compaction_id,
        changed=True,
        over_hard_limit=tokens_after > run.policy.hard_limit,
        plan=plan,
        digests=run.digests,
    )
