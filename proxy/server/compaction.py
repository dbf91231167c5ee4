"""The edge side of compaction: decide whether to compact, run the pure pipeline (off the event
loop when the request is large), make the summary call, and describe the outcome in headers.

The pure core (``proxy.core.compaction``) decides *what* to send; this module only loads what it
needs, performs the model call for L4 with the request's own credentials, and reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anthropic
import orjson
from multidict import CIMultiDictProxy

from proxy.compaction_policy import policy_from_config
from proxy.config import CompactionConfig
from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    Plan,
    PlanCache,
    SummaryRequest,
    compact,
    finish,
    prefix_hashes,
)
from proxy.core.durable import InvalidWrite
from proxy.core.tokens import Calibration, TokenCounter
from proxy.errors import PromptTooLong
from proxy.server.metrics import Metrics
from proxy.store import Store, StoreError

log = logging.getLogger("context_proxy.compaction")

# Request header: ``x-compaction: off`` opts one request out. It is the proxy's own control
# header and is not forwarded upstream.
OPT_OUT_HEADER = "x-compaction"


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
    return _headers(
        result.tokens_before,
        result.tokens_after,
        ",".join(result.layers) or "none",
        result.plan_status,
        result.summary_status,
        result.compaction_id if result.changed else None,
    )


def summary_auth_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """The credentials the request itself goes upstream with (the tenant's policy applied)."""
    auth: dict[str, Any] = {}
    if "authorization" in headers:
        auth["Authorization"] = headers["authorization"]
    if "x-api-key" in headers:
        auth["X-Api-Key"] = headers["x-api-key"]
        if "authorization" not in headers:
            auth["Authorization"] = anthropic.omit
    return auth


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to forward, and what to report about it."""

    body: bytes
    changed: bool
    headers: dict[str, str]
    calibration_key: str  # tenant and model: calibration figures never cross tenants
    estimate: int | None  # uncalibrated estimate of the forwarded view, for calibration
    result: CompactionResult | None = None


class CompactionService:
    """Per-process compaction state: the token counter, calibration, plans, the summariser."""

    def __init__(self, config: CompactionConfig, upstream_base_url: str, metrics: Metrics) -> None:
        self.config = config
        self._policies: dict[CompactionConfig, CompactionPolicy] = {}
        self.counter = TokenCounter()
        self.calibration = Calibration()
        self.plans = PlanCache(config.max_plans)
        self.metrics = metrics
        self.summary_calls = 0
        # The shared store (set by the app once it is open): plans go there so that every
        # replica forwards the same view for a conversation; ``plans`` is its read-through cache.
        self.store: Store | None = None
        self._client = anthropic.AsyncAnthropic(
            base_url=upstream_base_url,
            api_key="unused-the-request-credentials-are-sent",
            max_retries=config.summary.max_retries,
            timeout=config.summary.timeout_seconds,
        )

    async def warm_up(self) -> None:
        """Load the tokenizer at start-up, off the loop, not on the first request."""
        await asyncio.to_thread(self.counter.count_text, "warm up")

    async def close(self) -> None:
        await self._client.close()

    def policy_for(self, config: CompactionConfig) -> CompactionPolicy:
        """The policy of a tenant's compaction settings (memoised: configs are frozen values)."""
        policy = self._policies.get(config)
        if policy is None:
            policy = self._policies[config] = policy_from_config(config)
        return policy

    async def prepare(
        self,
        headers: CIMultiDictProxy[str],
        body: dict[str, Any],
        raw: bytes | None,
        tenant: str,
        config: CompactionConfig | None = None,
        artifact_session: str | None = None,
        upstream_headers: Mapping[str, str] | None = None,
    ) -> Prepared:
        """What to forward for ``body``. ``raw`` is the client's exact bytes for ``body``, or
        ``None`` when the edge already changed the body (durable context was injected)."""
        config = config or self.config
        policy = self.policy_for(config)
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        assert isinstance(model, str)
        key = f"{tenant}/{model}"
        as_sent = raw if raw is not None else orjson.dumps(body)
        changed_by_edge = raw is None
        if headers.get(OPT_OUT_HEADER, "").strip().lower() == "off" or not config.enabled:
            self.metrics.compactions.labels("off").inc()
            report = _headers(0, 0, "none", "none", "skipped", None)
            return Prepared(as_sent, changed_by_edge, report, key, None)
        if defers_to_provider(body):
            self.metrics.compactions.labels("deferred").inc()
            report = _headers(0, 0, "deferred", "none", "skipped", None)
            return Prepared(as_sent, changed_by_edge, report, key, None)

        ratio = self.calibration.ratio(key)
        request = CompactionInput(
            system=body.get("system"),
            tools=body.get("tools"),
            messages=body["messages"],
            model=model,
            calibration=ratio,
            artifact_session=artifact_session,
        )
        offload = len(as_sent) > config.offload_bytes and not self._seen_before(
            body["messages"], config.offload_bytes
        )
        await self._prefetch_plans(tenant, request.messages)
        outcome = await self._off_loop(offload, compact, request, policy, self.counter, self.plans, tenant)
        if not isinstance(outcome, Done):
            summary = await self._summarize(outcome.summary_request, upstream_headers or headers)
            outcome = Done(await self._off_loop(offload, finish, outcome.continuation, summary))
        result = outcome.result
        if result.plan_status == "new" and result.plan is not None:
            await self._persist_plan(result.plan)
        self.metrics.compactions.labels(result.plan_status).inc()
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
        estimate = round(result.tokens_after / ratio) if ratio > 0 else result.tokens_after
        if not result.changed:
            return Prepared(as_sent, changed_by_edge, report, key, estimate, result)
        forwarded = orjson.dumps({**body, "messages": result.messages})
        return Prepared(forwarded, True, report, key, estimate, result)

    async def _prefetch_plans(self, tenant: str, messages: Any) -> None:
        """Read through to the store: a conversation another replica compacted has its plans
        there. Only when the cache holds none for the conversation (its anchor: a hash of
        ``messages[0]``); a store failure only costs the reuse (logged)."""
        store = self.store
        if store is None or not isinstance(messages, list) or len(messages) < 2:
            return
        try:
            anchor = prefix_hashes(messages[:1])[1]
        except (TypeError, ValueError):
            return  # not JSON: compaction will not plan it either
        if self.plans.plans(tenant, anchor):
            return
        try:
            stored = await store.plans_for(tenant, anchor)
        except (StoreError, InvalidWrite) as exc:
            log.warning("[compact] plans not read from the store: %s", type(exc).__name__)
            return
        for text in reversed(stored):  # shortest first: the cache keeps the longest ones
            try:
                plan = Plan.from_json(text)
            except ValueError:
                log.warning("[compact] a stored plan is malformed; ignored")
                continue
            if plan.tenant == tenant and plan.anchor == anchor:
                self.plans.put(plan)

    async def _persist_plan(self, plan: Plan) -> None:
        """Store a new plan before answering, so the next turn may go to another replica."""
        store = self.store
        if store is None:
            return
        mine = plan.to_json().decode()
        try:
            stored = await store.put_plan(
                plan.tenant, plan.anchor, plan.prefix_hash, plan.prefix_len, mine
            )
        except (StoreError, InvalidWrite) as exc:
            log.warning("[compact] plan not stored: %s", type(exc).__name__)
            return
        if stored != mine:
            # Another replica stored a plan for this prefix first: from the next turn on, every
            # replica (this one included) forwards that one's view.
            try:
                self.plans.put(Plan.from_json(stored))
            except ValueError:
                log.warning("[compact] a stored plan is malformed; ignored")

    def _seen_before(self, messages: list[Any], new_bytes_limit: int) -> bool:
        """The next turn of a conversation counted before: only its last messages are new (and
        small), so the work is cheap enough for the loop; a cold or large one goes to a thread."""
        if len(messages) < 3:
            return False
        new = sum(len(orjson.dumps(m)) for m in messages[-2:])
        return new < new_bytes_limit and self.counter.seen_message(messages[-3])

    async def _off_loop(self, offload: bool, fn: Any, *args: Any) -> Any:
        """Large requests are counted and compacted in a worker thread: other streams never
        stall behind a cold 200k-token count."""
        if offload:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def _summarize(self, request: SummaryRequest, headers: Mapping[str, str]) -> str | None:
        """The L4 model call. Failure, timeout or an empty answer → ``None`` (keep the view)."""
        self.summary_calls += 1
        try:
            message = await self._client.messages.create(
                model=request.model,
                max_tokens=request.max_tokens,
                system=request.system,
                messages=[{"role": "user", "content": request.text}],
                extra_headers=summary_auth_headers(headers),
            )
        except anthropic.APIError as exc:
            log.warning("[compact] summary call failed: %s", type(exc).__name__)
            return None
        text = "".join(block.text for block in message.content if block.type == "text")
        return text or None

    def observe(self, key: str, estimate: int | None, real: int | None) -> None:
        """Calibrate: the provider's real input size against our estimate of what we sent."""
        if estimate and real:
            self.calibration.observe(key, estimate, real)
