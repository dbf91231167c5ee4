"""The edge side of compaction: decide whether to compact, run the pure pipeline (off the event
loop when the request is large), make the summary call, and describe the outcome in headers.

The pure core (``proxy.core.compaction``) decides *what* to send; this module only loads what it
needs, performs the model call for L4 with the request's own credentials (through
``proxy.server.compaction.summaries``: once across replicas, under a store lease), and reports.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ParamSpec

import orjson
from multidict import CIMultiDictProxy

from proxy.config.compaction import limits_for, policy_from_config
from proxy.config.limits import LimitsConfig
from proxy.config.settings import CompactionConfig
from proxy.core.bounded import Bounded, CacheView
from proxy.core.catalogue import Catalogue, built_in
from proxy.core.compaction import (
    CompactionInput,
    CompactionOutcome,
    CompactionPolicy,
    CompactionResult,
    Done,
    NeedsNaming,
    Plan,
    PlanCache,
    compact,
    named,
    step,
)
from proxy.core.compaction.bridge import TranscriptNaming
from proxy.core.compaction.context import compaction_end
from proxy.core.compaction.digest import Digests, Resent
from proxy.core.compaction.provider import COMPACT_BETA, leads_with_compaction
from proxy.core.compaction.retrieval import with_tool
from proxy.core.conversation import Conversation
from proxy.core.durable import InvalidWrite
from proxy.core.errors import PromptTooLong
from proxy.core.limits import Limits, betas_of
from proxy.core.tokens import Canonical, TokenCounter
from proxy.server.compaction.calibration import SharedCalibration
from proxy.server.compaction.counting import Counting, count_while_forwarding, with_digests
from proxy.server.compaction.naming import transcript_sequences
from proxy.server.compaction.plan_reads import SCOPE_SEPARATOR, PlanReads, anchor_of
from proxy.server.compaction.summaries import Summaries
from proxy.server.http import spans
from proxy.server.http.metrics import Metrics
from proxy.store import Store, StoreError

_P = ParamSpec("_P")
log = logging.getLogger("context_proxy.compaction")

# Request header: ``x-compaction: off`` opts one request out. It is the proxy's own control
# header and is not forwarded upstream.
OPT_OUT_HEADER = "x-compaction"


def compaction_runs(headers: Mapping[str, str], config: CompactionConfig) -> bool:
    """Whether a request is compacted (or counted) at all: the tenant's compaction is enabled
    and the client did not opt out with ``x-compaction: off``."""
    return config.enabled and headers.get(OPT_OUT_HEADER, "").strip().lower() != "off"


def defers_to_provider(body: Mapping[str, Any]) -> bool:
    """True when the client already asks the provider to clear or compact server-side.

    ``clear_thinking_*`` alone (Claude Code always sends it) is not a reason to defer.
    """
    if body.get("compaction") is not None:
        return True
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if not isinstance(edits, list):
        return False
    for edit in edits:
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if isinstance(kind, str) and kind.startswith(("clear_tool_uses_", "compact_")):
            return True
    return False


def carries_compaction(messages: Sequence[Any], made: Digests | None) -> bool:
    """Whether the client's messages hold a provider ``compaction`` block (its own threshold or
    on-demand compaction): found through the digests' search when they were made (a message
    whose canonical JSON never shows ``"compaction"`` holds none), else by a walk."""
    return compaction_end(messages, maybe=made.compaction if made is not None else None) > 0


def _headers(
    before: int, after: int, layers: str, plan: str, summary: str, compaction_id: str | None
) -> dict[str, str]:
    headers = {
        "x-compaction-tokens-before": str(before),
        "x-compaction-tokens-after": str(after),
        "x-compaction-layers": layers,
        "x-compaction-plan": plan,
        "x-compaction-summary": summary,
    }
    if compaction_id:
        headers["x-compaction-id"] = compaction_id
    return headers


def result_headers(result: CompactionResult) -> dict[str, str]:
    headers = _headers(
        result.tokens_before,
        result.tokens_after,
        ",".join(result.layers) or "none",
        result.plan_status,
        result.summary_status,
        result.compaction_id if result.changed else None,
    )
    if result.summary_calls:
        headers["x-compaction-summary-calls"] = str(result.summary_calls)
    return headers


# a request's report headers as its compaction span's attributes
_REPORT_ATTRIBUTES = (
    ("x-compaction-tokens-before", "context_proxy.compaction.tokens_before", int),
    ("x-compaction-tokens-after", "context_proxy.compaction.tokens_after", int),
    ("x-compaction-layers", "context_proxy.compaction.layers", lambda v: tuple(v.split(","))),
    ("x-compaction-plan", "context_proxy.compaction.plan", str),
    ("x-compaction-summary", "context_proxy.compaction.summary", str),
    ("x-compaction-summary-calls", "context_proxy.compaction.summary_calls", int),
    ("x-compaction-id", "context_proxy.compaction.id", str),
)


def report_attributes(report: Mapping[str, str]) -> dict[str, Any]:
    """The ``x-compaction-*`` report as span attributes."""
    return {name: convert(report[header]) for header, name, convert in _REPORT_ATTRIBUTES if header in report}


def _in_span(
    prepare: Callable[_P, Coroutine[Any, Any, Prepared]],
) -> Callable[_P, Coroutine[Any, Any, Prepared]]:
    """``prepare`` in a ``context_proxy.compaction`` span that carries its report (layers,
    tokens before and after, plan, summary; the summary calls are its children); a request
    counted while forwarded reports in its ``settle`` span."""

    @functools.wraps(prepare)
    async def traced(*args: _P.args, **kwargs: _P.kwargs) -> Prepared:
        with spans.span("context_proxy.compaction") as span:
            prepared = await prepare(*args, **kwargs)
            if span.recording:
                span.set_many(report_attributes(prepared.headers))
                span.set("context_proxy.compaction.counting", prepared.counting is not None)
            return prepared

    return traced


def _estimate(result: CompactionResult, ratio: float) -> int:
    """The uncalibrated estimate of the forwarded view (what calibration compares with)."""
    return round(result.tokens_after / ratio) if ratio > 0 else result.tokens_after


def _with_retrieval(
    view: dict[str, Any], result: CompactionResult, config: CompactionConfig
) -> dict[str, Any] | None:
    """The view with the retrieval tool, when the tenant offers it and the view carries it
    (``retrieval.with_tool``: it names a pointer the model can redeem, asks for a new assistant
    turn, declares tools)."""
    if not config.retrieval.enabled:
        return None
    return with_tool(view, result.plan)


def _compacts_anew(outcome: CompactionOutcome) -> bool:
    """The pipeline is about to make a new plan (rather than reuse one or leave the view)."""
    return not isinstance(outcome, Done) or outcome.result.plan_status == "new"


def plan_scope(tenant: str, conversation: Conversation | None) -> str:
    """Whose plans a request may reuse. A plan's view may name one conversation's sources (its
    transcript events in the bridge, its session's artifacts in truncation markers), so with a
    session, plans belong to the conversation (the session's main one, or one agent's): the
    same history sent as another conversation compacts afresh (same layers, its own summary,
    its own pointers). Without a session a plan names nothing and the tenant's requests share
    it. The main conversation keeps the keys plans had before agents (``<session>``)."""
    if conversation is None:
        return tenant
    return f"{tenant}{SCOPE_SEPARATOR}{conversation.scope}"


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to forward, and what to report about it."""

    body: bytes
    changed: bool
    headers: dict[str, str]
    calibration_key: str  # tenant and model: calibration figures never cross tenants
    estimate: int | None  # uncalibrated estimate of the forwarded view, for calibration
    result: CompactionResult | None = None
    # The forwarded body, when it offers the retrieval tool (the edge answers its calls).
    view: dict[str, Any] | None = None
    # The exact count of a request forwarded as sent while it runs (``settle`` reports it).
    counting: Counting | None = None
    # The forwarded body as a value, when compaction changed it (``None``: the body the edge
    # handed in is what ``body`` holds)
    forwarded: dict[str, Any] | None = None
    # betas the forwarded body needs beside the client's: the view leads with the provider's
    # compaction block (``summary.mode: provider``), which needs its beta on every request
    betas: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _RequestPolicy:
    config: CompactionConfig  # the very object the entry is for (its id is the key)
    policy: CompactionPolicy


# Policies memoised: a tenant's compaction settings for a request's limits (a handful in
# practice; clients choose models, betas and max_tokens, so bounded). A miss recomputes the
# policy (microseconds). Memory per entry (measured: tests/test_bounded_caches.py).
POLICIES = 4096
POLICY_BYTES = 400


class CompactionService:
    """Per-process compaction state: the token counter, calibration, plans, the summariser."""

    def __init__(
        self,
        config: CompactionConfig,
        upstream_base_url: str,
        metrics: Metrics,
        catalogue: Catalogue | None = None,
        limits: LimitsConfig | None = None,
    ) -> None:
        limits = limits or LimitsConfig()
        self.config = config
        self.catalogue = catalogue or built_in()  # the models' windows
        self._policies: Bounded[tuple[CompactionConfig, Limits | None], CompactionPolicy] = (
            Bounded("compaction_policies", POLICIES, entry_bytes=POLICY_BYTES)
        )
        self._request_policies: Bounded[tuple[int, str, str, int | None], _RequestPolicy] = (
            Bounded("request_policies", POLICIES, entry_bytes=POLICY_BYTES)
        )
        self.counter = TokenCounter(
            cache_size=limits.token_memo_blocks, message_cache_size=limits.token_memo_messages
        )
        self.calibration = SharedCalibration(limits.calibration_keys, metrics, self._background)
        self.plans = PlanCache(config.max_plans, max_bytes=limits.plan_cache_bytes)
        self.plan_reads = PlanReads(self.plans)  # the store read-through, and where it had none
        self.metrics = metrics
        # The shared store (set by the app once it is open): plans go there so that every
        # replica forwards the same view for a conversation; ``plans`` is its read-through cache.
        self.store: Store | None = None
        self._writes: set[asyncio.Task[None]] = set()
        # the L4 call, under a store lease
        self.summaries = Summaries(config, upstream_base_url, metrics, self._background)

    def caches(self) -> tuple[CacheView, ...]:
        """What this service keeps per conversation, tenant or model (for the metrics)."""
        return (
            *self.counter.caches,
            self.plans,
            self.plan_reads.absent.cache,
            *self.calibration.caches(),
            self._policies,
            self._request_policies,
        )

    @property
    def summary_calls(self) -> int:
        """L4 calls this process made."""
        return self.summaries.calls

    async def warm_up(self) -> None:
        """Load the tokenizer at start-up, off the loop, not on the first request."""
        await asyncio.to_thread(self.counter.count_text, "warm up")

    async def close(self) -> None:
        if self._writes:
            await asyncio.wait(self._writes, timeout=5)
        await self.summaries.close()

    def policy_for(self, config: CompactionConfig, limits: Limits | None = None) -> CompactionPolicy:
        """The policy of a tenant's compaction settings for a request's limits (memoised:
        configs and limits are frozen values; a few distinct ones in practice)."""
        key = (config, limits)
        policy = self._policies.get(key)
        if policy is None:
            policy = policy_from_config(config, limits)
            self._policies.put(key, policy)
        return policy

    def _request_policy(
        self, config: CompactionConfig, model: str, beta_header: str, max_tokens: object
    ) -> CompactionPolicy:
        """The policy for a request's limits (``limits_for``: its model's window, its betas,
        its ``max_tokens``), memoised per tenant config (by identity: the entry holds it, so the
        id is not reused while it is there), model, betas header and integer ``max_tokens``:
        looking the model up in the catalogue on every request costs more than the rest
        of a small request's pre-check."""
        key: tuple[int, str, str, int | None] | None = None
        if max_tokens is None or (isinstance(max_tokens, int) and not isinstance(max_tokens, bool)):
            key = (id(config), model, beta_header, max_tokens)
            found = self._request_policies.get(key)
            if found is not None and found.config is config:
                return found.policy
        limits = limits_for(config, model, betas_of(beta_header), max_tokens, self.catalogue)
        policy = self.policy_for(config, limits)
        if key is not None:
            self._request_policies.put(key, _RequestPolicy(config, policy))
        return policy

    @_in_span
    async def prepare(
        self,
        headers: CIMultiDictProxy[str],
        body: dict[str, Any],
        raw: bytes | None,
        tenant: str,
        config: CompactionConfig | None = None,
        artifact_session: str | None = None,
        upstream_headers: Mapping[str, str] | None = None,
        transcript: TranscriptNaming | None = None,
        offer_retrieval: bool = False,
        canonical: Canonical | None = None,
        conversation: Conversation | None = None,
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> Prepared:
        """What to forward for ``body``. ``raw`` is the client's exact bytes for ``body``, or
        ``None`` when the edge already changed the body (durable context was injected);
        ``canonical``: what the edge made of its messages' canonical JSON; ``conversation``:
        whose plans and summaries these are (``plan_scope``); ``transcript``: the conversation
        whose transcript names the removed turns, looked up when something is removed (after
        ``settled``: what the recorder queued for it is stored)."""
        config = config or self.config
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        assert isinstance(model, str)
        # limits follow the model: its window (1M with the beta, where supported), less the
        # request's max_tokens for an ``auto`` hard limit
        policy = self._request_policy(
            config, model, ",".join(headers.getall("anthropic-beta", [])), body.get("max_tokens")
        )
        key = f"{tenant}/{model}"
        as_sent = raw if raw is not None else orjson.dumps(body)
        changed_by_edge = raw is None
        if not compaction_runs(headers, config):
            self.metrics.compactions.labels("off").inc()
            report = _headers(0, 0, "none", "none", "skipped", None)
            return Prepared(as_sent, changed_by_edge, report, key, None)
        if defers_to_provider(body):
            self.metrics.compactions.labels("deferred").inc()
            report = _headers(0, 0, "deferred", "none", "skipped", None)
            return Prepared(as_sent, changed_by_edge, report, key, None)

        ratio = await self.calibration.ratio(self.store, tenant, model, key)
        scope = plan_scope(tenant, conversation)
        request = CompactionInput(
            system=body.get("system"),
            tools=body.get("tools"),
            messages=body["messages"],
            model=model,
            calibration=ratio,
            artifact_session=artifact_session,
            transcript=transcript,
            canonical=canonical,
        )
        try:
            offload = len(as_sent) > config.offload_bytes and not self._seen_before(
                body["messages"], config.offload_bytes
            )
            # a large body never seen before is hashed and counted in a thread (below): not here
            counting = made = None
            if not offload:  # its digests, made once: they hold the anchor, compact() takes them
                made, request = with_digests(request)
            anchor = anchor_of(request.messages)
            await self._prefetch_plans(scope, anchor)
            if not offload:
                counting = count_while_forwarding(
                    request, made, policy, self.counter, self.plans, scope, anchor
                )
            if counting is not None:  # under the threshold whatever the count: forward now
                return Prepared(as_sent, changed_by_edge, {}, key, None, counting=counting)
            if carries_compaction(request.messages, made):
                # the provider compacts this conversation itself: its signed block must reach it
                # verbatim with everything around it, so no layer of ours touches the messages
                self.metrics.compactions.labels("deferred").inc()
                report = _headers(0, 0, "deferred", "none", "skipped", None)
                return Prepared(as_sent, changed_by_edge, report, key, None)
            outcome = await self._off_loop(
                offload, compact, request, policy, self.counter, self.plans, scope
            )
        except orjson.JSONEncodeError:
            # Valid JSON that orjson cannot write back (nested deeper than its 254 levels):
            # it cannot be hashed or counted, so it is forwarded as it came.
            log.warning("[compact] skipped: a message nests too deep to serialise")
            self.metrics.compactions.labels("off").inc()
            report = _headers(0, 0, "none", "none", "skipped", None)
            return Prepared(as_sent, changed_by_edge, report, key, None)
        if _compacts_anew(outcome) and await self._prefetch_plans(scope, anchor, refresh=True):
            # Another replica compacted this conversation since this one last looked: its
            # (newer) plan is what every replica must forward from now on, not the one just made.
            if isinstance(outcome, Done) and outcome.result.plan is not None:
                self.plans.discard(outcome.result.plan)
            outcome = await self._off_loop(
                offload, compact, request, policy, self.counter, self.plans, scope
            )
        while not isinstance(outcome, Done):
            if isinstance(outcome, NeedsNaming):
                # the removed turns' events: only now, when something is removed
                assert transcript is not None
                if settled is not None:
                    await settled()
                with spans.span(spans.STORE_READ, {"context_proxy.store.kind": "transcript_seqs"}):
                    found = await transcript_sequences(self.store, tenant, transcript, outcome.keys)
                outcome = await self._off_loop(
                    offload, named, outcome.continuation, outcome.sequences(found)
                )
                continue
            # one call, or a bounded chain of them (the region is over the summariser's input
            # budget): each call is its own leased key, so replicas share every link
            summary = await self.summaries.once(
                self.store,
                outcome.summary_request,
                tenant,
                config,
                upstream_headers or headers,
                "" if conversation is None else conversation.scope,
            )
            outcome = await self._off_loop(offload, step, outcome.continuation, summary)
        result = outcome.result
        if result.plan_status == "new" and result.plan is not None:
            await self._persist_plan(result.plan)
        self.metrics.child(self.metrics.compactions, result.plan_status).inc()
        report = result_headers(result)
        if result.changed:
            log.info(
                "[compact] id=%s layers=%s tokens=%d->%d plan=%s summary=%s",
                result.compaction_id,
                ",".join(result.layers) or "none",
                result.tokens_before,
                result.tokens_after,
                result.plan_status,
                result.summary_status,
            )
        if result.over_hard_limit:
            raise PromptTooLong(
                f"prompt is too long: {result.tokens_after} tokens > {policy.hard_limit} maximum"
                f" (tokens before compaction: {result.tokens_before}; after: {result.tokens_after};"
                f" layers tried: {','.join(result.layers) or 'none'})",
                headers=report,
            )
        estimate = _estimate(result, ratio)
        if not result.changed:
            return Prepared(as_sent, changed_by_edge, report, key, estimate, result)
        view = {**body, "messages": result.messages}
        betas = (COMPACT_BETA,) if leads_with_compaction(result.messages) else ()
        offered = _with_retrieval(view, result, config) if offer_retrieval else None
        if offered is not None:
            return Prepared(
                orjson.dumps(offered), True, report, key, estimate, result, offered,
                forwarded=offered, betas=betas,
            )
        return Prepared(
            orjson.dumps(view), True, report, key, estimate, result, forwarded=view, betas=betas
        )

    def deferred(self, prepared: Prepared, body: bytes, changed: bool) -> Prepared:
        """``prepared`` with compaction undone: ``body`` forwarded instead (the client's own
        messages), reported as ``deferred`` (the thinking guard: the client chose ``error``)."""
        report = _headers(0, 0, "deferred", "none", "skipped", None)
        return Prepared(body, changed, report, prepared.calibration_key, None)

    async def settle(self, prepared: Prepared) -> Prepared:
        """``prepared`` with its report, once the count of a request forwarded while it was
        being counted is done (the same report as had it been counted first)."""
        counting = prepared.counting
        if counting is None:
            return prepared
        # every message was dumped and hashed before the count started (else no bound): the
        # count cannot fail to serialise, and under the bound it compacts nothing
        with spans.span("context_proxy.compaction.count") as span:
            outcome = await counting.task
        result = outcome.result if isinstance(outcome, Done) else None
        if result is None or result.changed:  # cannot be: said, and reported as skipped
            log.error("[compact] a request counted while forwarded came out compacted")
            prepared.headers.update(_headers(0, 0, "none", "none", "skipped", None))
            return replace(prepared, counting=None)
        self.metrics.child(self.metrics.compactions, result.plan_status).inc()
        prepared.headers.update(result_headers(result))
        if span.recording:
            span.set_many(report_attributes(prepared.headers))
        estimate = _estimate(result, counting.ratio)
        return replace(prepared, estimate=estimate, result=result, counting=None)

    async def _prefetch_plans(self, scope: str, anchor: str | None, *, refresh: bool = False) -> bool:
        """Read the conversation's plans through to the store (see ``plan_reads``): unless the
        cache holds some or the store had none a moment ago; always with ``refresh`` (about to
        compact). True when a plan the cache lacked was added."""
        return await self.plan_reads.prefetch(self.store, scope, anchor, refresh=refresh)

    async def _persist_plan(self, plan: Plan) -> None:
        """Store a new plan before answering, so the next turn may go to another replica."""
        with spans.span(spans.STORE_WRITE, {"context_proxy.store.kind": "plan"}):
            await self.plan_reads.persist(self.store, plan)

    def _seen_before(self, messages: list[Any], new_bytes_limit: int) -> bool:
        """The next turn of a conversation counted before: only its last messages are new (and
        small), so the work is cheap enough for the loop; a cold or large one goes to a thread.

        A re-sent history (``Resent``) tells which messages an earlier request had (and counted):
        those are neither dumped nor looked up again."""
        n = len(messages)
        if n < 3:
            return False
        known = messages.known if isinstance(messages, Resent) else None
        if known is None:
            new = sum(len(orjson.dumps(m)) for m in messages[-2:])
            return new < new_bytes_limit and self.counter.seen_message(messages[-3])
        had = known.messages

        def resent(i: int) -> bool:
            return i < len(had) and had[i] is messages[i]

        if not resent(n - 3):
            return False
        new = sum(len(orjson.dumps(messages[i])) for i in (n - 2, n - 1) if not resent(i))
        return new < new_bytes_limit

    async def _off_loop(self, offload: bool, fn: Any, *args: Any) -> Any:
        """Large requests are counted and compacted in a worker thread: other streams never
        stall behind a cold 200k-token count."""
        if offload:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def observe(self, key: str, estimate: int | None, real: int | None) -> None:
        """Calibrate with the provider's usage (:meth:`SharedCalibration.observe`)."""
        self.calibration.observe(self.store, key, estimate, real)

    def _background(self, work: Coroutine[Any, Any, object]) -> None:
        """Run store work that nobody waits for (``close`` waits for it, briefly)."""

        async def run() -> None:
            try:
                await work
            except (StoreError, InvalidWrite) as exc:
                if self.store is not None:
                    self.store.health.lost("summary leases", exc, "a lease not released")

        task = asyncio.get_running_loop().create_task(run())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
