"""The edge side of durable context: which session a request belongs to, the block injected into
``system``, and the transcript the proxy records.

Durable state never passes through the lossy layers: it is read from the store, its pointers are
re-verified against the tenant's trusted roots (in a worker thread), and the pure renderer turns
it into one deterministic text block. Only the store's write API changes it.

Transcripts: each request's *new* messages (those after the recorded prefix) and each final
answer become events with contiguous sequence numbers (``transcript:<session>:<seq>``), written
to the store and exported to ``<transcript_root>/<session>.jsonl`` so that pointers resolve.
Recording runs in background tasks, in order per session, and never delays the relay.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from proxy.core.compaction import CompactionResult, Truncated, prefix_hashes
from proxy.core.compaction.truncate import artifact_of
from proxy.core.compaction.view import blocks_of
from proxy.core.pointers import is_valid_session_id
from proxy.core.render import render_state, render_unavailable
from proxy.errors import InvalidRequest
from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.sources.transcript_files import TranscriptEvent as FileEvent
from proxy.sources.transcript_files import append_events
from proxy.store.base import Store, StoreError, TranscriptEvent

log = logging.getLogger("context_proxy.durable")

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id")
# Suffix of the recorded prefix hash: the session's last event is an answer.
ANSWERED = "+answered"
STATUSES = ("available", "missing", "denied", "corrupt", "unsupported")


def session_from(headers: CIMultiDictProxy[str]) -> str | None:
    """``x-session-id``, else Claude Code's ``X-Claude-Code-Session-Id``, else none."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value is not None:
            if not is_valid_session_id(value):
                raise InvalidRequest(
                    f"{name}: invalid session id (expected 1-200 characters of [A-Za-z0-9._-],"
                    " starting with a letter or a digit)"
                )
            return value
    return None


def with_system_block(body: Mapping[str, Any], block: str) -> dict[str, Any]:
    """A new body whose ``system`` ends with ``block`` (the client's text unchanged before it)."""
    ours = {"type": "text", "text": block}
    system = body.get("system")
    if system is None or system == "":
        blocks: list[Any] = [ours]
    elif isinstance(system, str):
        blocks = [{"type": "text", "text": system}, ours]
    elif isinstance(system, list):
        blocks = [*system, ours]
    else:
        raise InvalidRequest("system: Input should be a valid string or list of text blocks")
    return {**body, "system": blocks}


@dataclass(frozen=True, slots=True)
class Injection:
    block: str | None  # None: nothing to inject (no durable state for this session)
    counts: Mapping[str, int]
    available: bool  # False: the store could not be read (the block says so)

    def headers(self, session: str) -> dict[str, str]:
        headers = {
            "x-compaction-session": session,
            "x-durable-sources": ",".join(f"{s}={self.counts.get(s, 0)}" for s in STATUSES),
        }
        if not self.available:
            headers["x-durable-context"] = "unavailable"
        return headers


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class DurableContext:
    """Reads and renders a session's durable state; records its transcript."""

    def __init__(self, store: Store, resolver: SourceResolver) -> None:
        self.store = store
        self.resolver = resolver
        self._chains: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def injection(self, tenant: str, policy: SourcePolicy, session: str) -> Injection:
        try:
            state = await self.store.current_state(tenant, session)
        except StoreError as exc:
            log.warning("[durable] store unavailable for a session read: %s", type(exc).__name__)
            return Injection(render_unavailable(), {}, False)
        sources = [i.source for i in state.facts]
        sources += [i.source for i in state.pending]
        sources += [i.source for i in state.evidence]
        if not sources:
            return Injection(None, {}, True)
        pointers = sorted(set(sources))
        resolutions = await asyncio.to_thread(self.resolver.resolve_many, pointers, policy)
        counts: dict[str, int] = dict(Counter(r.status for r in resolutions))
        block = render_state(state, dict(zip(pointers, resolutions, strict=True)))
        return Injection(block, counts, True)

    # -- what compaction cut -----------------------------------------------------------------

    async def keep_compaction(
        self,
        tenant: str,
        policy: SourcePolicy,
        session: str,
        messages: Sequence[Any],
        result: CompactionResult,
    ) -> None:
        """For a new compaction: store each cut tool result's full text as an artifact (before
        the request is forwarded: the marker the model sees names it), and the manifest."""
        artifacts = []
        for record in result.manifest:
            if not isinstance(record, Truncated) or record.artifact_key is None:
                continue
            for block in blocks_of(messages[record.message_index]):
                if isinstance(block, Mapping) and block.get("tool_use_id") == record.tool_use_id:
                    artifacts.append(artifact_of(block.get("content")))
                    break
        root = policy.artifact_root
        if artifacts and root is not None:

            def write_all() -> None:
                for artifact in artifacts:
                    write_artifact(root, session, artifact.name, artifact.data)

            try:
                await asyncio.to_thread(write_all)
            except (OSError, ValueError) as exc:
                log.warning("[durable] cut tool results not stored: %s", type(exc).__name__)
        if result.compaction_id is not None:
            manifest = orjson.dumps(
                {
                    "compaction_id": result.compaction_id,
                    "tokens_before": result.tokens_before,
                    "tokens_after": result.tokens_after,
                    "layers": list(result.layers),
                    "summary": result.summary_status,
                    "records": [r.to_json() for r in result.manifest],
                }
            ).decode()
            self._chain(
                tenant,
                session,
                self.store.put_manifest(tenant, result.compaction_id, session, manifest),
            )

    # -- transcripts ----------------------------------------------------------------------

    def record_request(
        self, tenant: str, policy: SourcePolicy, session: str, messages: Sequence[Any]
    ) -> None:
        """Record the request's new messages, in the background, after earlier records."""
        self._chain(tenant, session, self._record_messages(tenant, policy, session, messages))

    def record_answer(
        self,
        tenant: str,
        policy: SourcePolicy,
        session: str,
        message: Mapping[str, Any] | None,
        complete: bool,
    ) -> None:
        content: Any = dict(message) if message is not None else None
        event = TranscriptEvent(
            event_id=f"evt_{uuid.uuid4().hex}",
            recorded_at=_now(),
            type="answer",
            role="assistant",
            content=content,
            complete=complete,
        )
        answered = message is not None
        self._chain(
            tenant, session, self._append(tenant, policy, session, [event], None, answered=answered)
        )

    async def drain(self) -> None:
        """Wait for every pending record (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def settled(self, tenant: str, session: str) -> None:
        """Wait until what was queued for the session so far is recorded (a retrieval of its
        transcript reads it back)."""
        pending = self._chains.get((tenant, session))
        if pending is not None:
            await asyncio.gather(pending, return_exceptions=True)

    def _chain(self, tenant: str, session: str, work: Any) -> None:
        key = (tenant, session)
        previous = self._chains.get(key)

        async def run() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await work
            except (StoreError, OSError, ValueError) as exc:
                log.warning("[durable] transcript not recorded: %s", type(exc).__name__)

        task = asyncio.get_running_loop().create_task(run())
        self._chains[key] = task
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._chains.get(key) is t:
                del self._chains[key]

        task.add_done_callback(done)

    async def _record_messages(
        self, tenant: str, policy: SourcePolicy, session: str, messages: Sequence[Any]
    ) -> None:
        if not messages:
            return
        hashes = await asyncio.to_thread(prefix_hashes, messages)
        recorded = await self.store.recorded_prefix(tenant, session)
        answered = recorded.hash.endswith(ANSWERED)
        recorded_hash = recorded.hash.removesuffix(ANSWERED)
        start = 0
        if 0 < recorded.count <= len(messages) and hashes[recorded.count] == recorded_hash:
            start = recorded.count
            # The first new message is usually our own answer coming back: recorded already.
            if answered and start < len(messages) and messages[start].get("role") == "assistant":
                start += 1
        new = messages[start:]
        if not new:
            return
        recorded_at = _now()
        events = [
            TranscriptEvent(
                event_id=f"evt_{uuid.uuid4().hex}",
                recorded_at=recorded_at,
                type="message",
                role=str(message.get("role", "")),
                content=message.get("content"),
                complete=True,
            )
            for message in new
        ]
        await self._append(tenant, policy, session, events, (len(messages), hashes[-1]))

    async def _append(
        self,
        tenant: str,
        policy: SourcePolicy,
        session: str,
        events: list[TranscriptEvent],
        prefix: tuple[int, str] | None,
        *,
        answered: bool = False,
    ) -> None:
        if prefix is None:
            current = await self.store.recorded_prefix(tenant, session)
            prefix = (current.count, current.hash.removesuffix(ANSWERED))
        if answered:
            # Kept in the store, not in a process, so the replica that gets the next request
            # (whose history carries this answer back) knows not to record it twice.
            prefix = (prefix[0], prefix[1] + ANSWERED)
        first = await self.store.append_transcript(tenant, session, events, prefix[0], prefix[1])
        if policy.transcript_root is None:
            return
        exported = [
            FileEvent(
                event_id=e.event_id,
                type=e.type if e.complete else f"{e.type}.incomplete",
                role=e.role,
                content=e.content,
                recorded_at=e.recorded_at,
            )
            for e in events
        ]
        root = policy.transcript_root
        pointers = await asyncio.to_thread(append_events, root, session, exported)
        expected = f"transcript:{session}:{first}"
        if pointers and pointers[0] != expected:
            log.warning("[durable] transcript export out of step with the store")
