"""The edge side of durable context: which session (and which of its conversations) a request
belongs to, the block injected into ``system``, and the transcripts the proxy records.

Durable state never passes through the lossy layers: it is read from the store, its pointers are
re-verified (transcripts against the store, artifacts under the tenant's trusted roots in a worker
thread: ``proxy.sources.pointer_resolver``), and the pure renderer turns it into one
deterministic text block. Only the store's write API changes it.

Transcripts: each conversation of a session (its main one, and each agent's: ``x-agent-id`` or
Claude Code's ``x-claude-code-agent-id``, see ``proxy.core.conversation``) has its own transcript.
Each message and each final answer is one event with a contiguous sequence number
(``transcript:<session>:<seq>``, ``transcript:<session>:<agent>:<seq>``), exactly once whatever
the replicas, retries, racing requests or crashes: events are keyed by their place in the
conversation (``proxy.core.event_keys``) and the store appends only keys it does not hold
(``proxy.store.transcripts``). The store is then projected to
``<transcript_root>/<session>.jsonl`` and ``<transcript_root>/agents/<session>/<agent>.jsonl``
(``proxy.sources.transcript_files.export_session``). Recording runs in background tasks, in order
per conversation, and never delays the relay. Durable state is the session's, shared by its
agents. Design and why: docs/ARCHITECTURE.md, "Transcripts: one record of truth".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from proxy.core.bounded import CacheView
from proxy.core.compaction import CompactionResult, Truncated
from proxy.core.compaction.digest import digests
from proxy.core.compaction.truncate import artifact_of
from proxy.core.compaction.view import blocks_of
from proxy.core.conversation import Conversation
from proxy.core.durable import InvalidWrite
from proxy.core.errors import InvalidRequest
from proxy.core.event_keys import answer_key, message_key
from proxy.core.pointers import is_valid_agent_id, is_valid_session_id
from proxy.core.render import render_state, render_unavailable
from proxy.server.http import spans
from proxy.sources.checks import SourceChecks
from proxy.sources.object_store import ObjectStoreError
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import SourceResolver
from proxy.sources.transcript_files import ExportMarks, StoredRecord, export_session
from proxy.sources.transcript_records import record_bytes
from proxy.store.base import (
    KeyedEvent,
    Prefix,
    Recorded,
    Store,
    StoreBusy,
    StoreError,
    TranscriptEvent,
)

log = logging.getLogger("context_proxy.durable")

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id")
# The agent a request's conversation belongs to, and the one that spawned it: ours first, then
# Claude Code's (a subagent's requests carry its agent id with the main session's id).
AGENT_HEADERS = ("x-agent-id", "x-claude-code-agent-id")
PARENT_HEADERS = ("x-parent-agent-id", "x-claude-code-parent-agent-id")
# Suffix of a prefix hash recorded before migration 4 (the session's last event was an answer).
ANSWERED = "+answered"
# How long, in the background, a request's recording waits for the answer its history carries
# back to be recorded by the replica that relayed it (see ``DurableContext._await_answer``).
ANSWER_WAIT_SECONDS = 2.0
# Recordings, manifests and exports queued at most: a store that stalls (a lock held elsewhere, a
# slow disk) must not make them pile up in memory without end. Beyond it a request's recording is
# skipped, as when the store fails: its messages are recorded from the conversation's next request
# (their keys are idempotent), an answer from the client's copy of it in the next turn.
MAX_PENDING = 10_000
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


def _agent_header(headers: CIMultiDictProxy[str], names: tuple[str, ...]) -> str:
    for name in names:
        value = headers.get(name)
        if value is None or value == "":
            continue
        if not is_valid_agent_id(value):
            raise InvalidRequest(
                f"{name}: invalid agent id (expected 1-200 characters of [A-Za-z0-9._-],"
                " starting with a letter or a digit)"
            )
        return value
    return ""


def conversation_from(headers: CIMultiDictProxy[str]) -> Conversation | None:
    """The request's conversation: its session (``session_from``) and, for an agent's request,
    the agent (``x-agent-id``, else ``x-claude-code-agent-id``) and its parent
    (``x-parent-agent-id``, else ``x-claude-code-parent-agent-id``; ``""``: the session's main
    conversation). No session: ``None`` (an agent id alone names nothing to record). A
    malformed id is a 400."""
    session = session_from(headers)
    agent = _agent_header(headers, AGENT_HEADERS)
    parent = _agent_header(headers, PARENT_HEADERS)
    if session is None:
        return None
    if not agent or parent == agent:
        parent = ""
    return Conversation(session, agent, parent)


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
    # The id the source checks were audited under (asked_by "request:<id>"); None: no checks.
    check_id: str | None = None
    # the source pointers the block names (the model may read them back, whichever agent asks)
    sources: tuple[str, ...] = ()

    def headers(self, conversation: Conversation) -> dict[str, str]:
        headers = {
            "x-compaction-session": conversation.session,
            "x-durable-sources": ",".join(f"{s}={self.counts.get(s, 0)}" for s in STATUSES),
        }
        if conversation.agent:
            headers["x-compaction-agent"] = conversation.agent
        if self.check_id is not None:
            headers["x-durable-check-id"] = self.check_id
        if not self.available:
            headers["x-durable-context"] = "unavailable"
        return headers


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class DurableContext:
    """Reads and renders a session's durable state; records its transcript."""

    def __init__(
        self,
        store: Store,
        resolver: SourceResolver,
        checks: SourceChecks | None = None,
        *,
        export_files: int = 4096,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.store = store
        self.max_pending = max_pending
        self.skipped = 0  # recordings skipped because too many were queued
        self.resolver = resolver
        self.checks = checks if checks is not None else SourceChecks(resolver, store)
        # the recordings and exports in progress, per conversation: entries leave when done
        self._chains: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._exports: dict[tuple[str, str, str, str], asyncio.Task[None]] = {}
        self._export_again: set[tuple[str, str, str, str]] = set()
        self._marks = ExportMarks(export_files)

    def caches(self) -> tuple[CacheView, ...]:
        """What the durable context keeps per session or pointer (for the metrics)."""
        return (self._marks.files, *self.checks.caches())

    def forget_idle(self, now: float, idle: float) -> int:
        """Forget where the exports left the files of sessions idle for ``idle`` seconds."""
        return self._marks.forget_idle(now, idle)

    async def injection(self, tenant: str, policy: SourcePolicy, session: str) -> Injection:
        try:
            with spans.span(spans.STORE_READ, {"context_proxy.store.kind": "durable_state"}):
                state = await self.store.current_state(tenant, session)
        except StoreError as exc:
            self.store.health.lost("durable context", exc, "the request gets the unavailable block")
            return Injection(render_unavailable(), {}, False)
        sources = [i.source for i in state.facts]
        sources += [i.source for i in state.pending]
        sources += [i.source for i in state.evidence]
        if not sources:
            return Injection(None, {}, True)
        pointers = sorted(set(sources))
        check_id = f"chk_{uuid.uuid4().hex}"
        try:
            with spans.span("context_proxy.source.checks", {"context_proxy.source.pointers": len(pointers)}):
                resolutions = await self.checks.resolve_many(
                    tenant, policy, pointers, session=session, asked_by=f"request:{check_id}"
                )
        except (StoreError, OSError) as exc:  # the store, or resources (EMFILE...): never a 500
            if isinstance(exc, StoreError):
                self.store.health.lost("source checks", exc, "the request gets the unavailable block")
            else:
                log.warning("[durable] sources could not be checked: %s", type(exc).__name__)
            return Injection(render_unavailable(), {}, False)
        counts: dict[str, int] = dict(Counter(r.status for r in resolutions))
        block = render_state(state, dict(zip(pointers, resolutions, strict=True)))
        return Injection(block, counts, True, check_id, tuple(pointers))

    # -- what compaction cut -----------------------------------------------------------------

    async def keep_compaction(
        self,
        tenant: str,
        policy: SourcePolicy,
        conversation: Conversation,
        messages: Sequence[Any],
        result: CompactionResult,
    ) -> None:
        """For a new compaction: store each cut tool result's full text as an artifact of the
        session (before the request is forwarded: the marker the model sees names it), and the
        manifest (which names the agent, for an agent's conversation)."""
        session = conversation.session
        artifacts = []
        for record in result.manifest:
            if not isinstance(record, Truncated) or record.artifact_key is None:
                continue
            for block in blocks_of(messages[record.message_index]):
                if isinstance(block, Mapping) and block.get("tool_use_id") == record.tool_use_id:
                    artifacts.append(artifact_of(block.get("content")))
                    break
        if artifacts:
            try:
                with spans.span(spans.STORE_WRITE, {"context_proxy.store.kind": "artifacts", "context_proxy.store.items": len(artifacts)}):
                    await self.checks.write_artifacts(
                        tenant, policy, session, [(a.name, a.data) for a in artifacts]
                    )
            except StoreError as exc:
                self.store.health.lost("artifact manifests", exc, "cut tool results not stored")
            except (OSError, ValueError, ObjectStoreError) as exc:
                log.warning("[durable] cut tool results not stored: %s", type(exc).__name__)
        if result.compaction_id is not None:
            data: dict[str, Any] = {
                "compaction_id": result.compaction_id,
                "tokens_before": result.tokens_before,
                "tokens_after": result.tokens_after,
                "layers": list(result.layers),
                "summary": result.summary_status,
                "records": [r.to_json() for r in result.manifest],
            }
            if conversation.agent:
                data["agent"] = conversation.agent
            bridge = result.plan.bridge if result.plan is not None else None
            if bridge is not None and bridge.transcript is not None:
                # the events the bridge names: what the removed turns are in the transcript
                data["transcript"] = bridge.transcript.to_json()
            self._chain(
                tenant,
                conversation,
                self._put_manifest(tenant, conversation, messages, result, data),
                "compaction manifests",
            )

    async def _put_manifest(
        self,
        tenant: str,
        conversation: Conversation,
        messages: Sequence[Any],
        result: CompactionResult,
        data: dict[str, Any],
    ) -> None:
        """Store the manifest, with the transcript event each message its records name was
        recorded as (``events``: message index -> sequence number; looked up by event key once
        this request's messages are recorded: it runs after them in the conversation's chain)."""
        indices = sorted(
            {i for r in result.manifest for i in _indices(r)} & set(range(len(messages)))
        )
        hashes = result.digests.hashes if result.digests is not None else ()
        if indices and len(hashes) == len(messages) + 1:
            keys = {message_key(i, messages[i], hashes): i for i in indices}
            try:
                found = await self.store.transcript_seqs(
                    tenant, conversation.session, list(keys), agent=conversation.agent
                )
            except StoreError as exc:
                self.store.health.lost("transcript naming", exc, "a manifest without events")
                found = {}
            events = {str(keys[k]): seq for k, seq in found.items()}
            if events:
                data["events"] = events
        manifest = orjson.dumps(data).decode()
        assert result.compaction_id is not None
        await self.store.put_manifest(tenant, result.compaction_id, conversation.session, manifest)

    # -- transcripts ----------------------------------------------------------------------

    def record_request(
        self,
        tenant: str,
        policy: SourcePolicy,
        conversation: Conversation,
        messages: Sequence[Any],
    ) -> Turn:
        """Record the request's new messages, in the background, after earlier records of its
        conversation; the returned turn is what ``record_answer`` needs."""
        turn = Turn(
            tenant, policy, conversation, len(messages), asyncio.get_running_loop().create_future()
        )
        self._chain(tenant, conversation, self._record_messages(turn, messages))
        return turn

    def record_answer(self, turn: Turn, message: Mapping[str, Any] | None, complete: bool) -> None:
        """Record the final answer (``complete``: the stream ended with ``message_stop``)."""
        self._chain(turn.tenant, turn.conversation, self._record_answer(turn, message, complete))

    async def drain(self) -> None:
        """Wait for every pending record and export (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.checks.audit.flush()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self, tenant: str, conversation: Conversation) -> None:
        """Wait until what was queued for the conversation so far is recorded (a retrieval of
        its transcript, or naming its removed turns, reads it back)."""
        pending = self._chains.get((tenant, conversation.session, conversation.agent))
        if pending is not None:
            await asyncio.gather(pending, return_exceptions=True)

    def _chain(
        self, tenant: str, conversation: Conversation, work: Any, what: str = "transcripts"
    ) -> None:
        if len(self._tasks) >= self.max_pending:
            work.close()  # never started: nothing of it ran
            self.skipped += 1
            self.store.health.lost(
                what,
                StoreBusy(f"more than {self.max_pending} records queued"),
                "recorded from the session's next request",
            )
            return
        key = (tenant, conversation.session, conversation.agent)
        previous = self._chains.get(key)

        async def run() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await work
            except (StoreError, InvalidWrite) as exc:  # field names and fixed texts: no content
                self.store.health.lost(what, exc, "recorded from the session's next request")
            except (OSError, ValueError) as exc:
                log.warning("[durable] %s not recorded: %s", what, type(exc).__name__)

        task = asyncio.get_running_loop().create_task(run())
        self._chains[key] = task
        self._track(task)

        def done(t: asyncio.Task[None]) -> None:
            if self._chains.get(key) is t:
                del self._chains[key]

        task.add_done_callback(done)

    async def _record_messages(self, turn: Turn, messages: Sequence[Any]) -> None:
        try:
            hashes = await asyncio.to_thread(_hashes, messages)
        except BaseException:
            turn.hashes.set_result(None)
            raise
        turn.hashes.set_result(hashes)
        if not messages:
            return
        tenant, conversation = turn.tenant, turn.conversation
        session, agent = conversation.session, conversation.agent
        head = await self.store.recorded_prefix(tenant, session, agent=agent)
        count, recorded = head.count, head.hash.removesuffix(ANSWERED)
        start = count if 0 < count <= len(messages) and hashes[count] == recorded else 0
        if start and head.hash.endswith(ANSWERED) and _role(messages[start]) == "assistant":
            start += 1  # recorded before migration 4 (no key): that answer is its event
        keyed = [
            KeyedEvent(key, self._event(tenant, conversation, key, "message", message, True))
            for key, message in (
                (message_key(i, messages[i], hashes), messages[i])
                for i in range(start, len(messages))
            )
        ]
        if not keyed:  # a retry of a recorded request: nothing new
            return
        if count > 0:
            await self._await_answer(tenant, conversation, messages, hashes, start)
        recorded_now = await self.store.record_transcript(
            tenant,
            session,
            keyed,
            Prefix(len(messages), hashes[-1]),
            agent=agent,
            parent=conversation.parent,
        )
        self._exported(turn, recorded_now)

    async def _await_answer(
        self,
        tenant: str,
        conversation: Conversation,
        messages: Sequence[Any],
        hashes: Sequence[str],
        start: int,
    ) -> None:
        """The latest assistant message followed by the client's next turn is usually the
        answer another replica (or this one) is recording right now: wait a moment for it, so
        that it is recorded as that answer, before the messages after it (every replica records
        the same events in the same order). Background only; bounded by ``ANSWER_WAIT_SECONDS``."""
        last = next(
            (
                i
                for i in range(len(messages) - 2, start - 1, -1)
                if _role(messages[i]) == "assistant"
            ),
            None,
        )
        if last is None:
            return
        slot = answer_key(last, hashes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_WAIT_SECONDS
        pause = 0.01
        while not await self.store.transcript_keys_held(
            tenant, conversation.session, [slot], agent=conversation.agent
        ):
            if loop.time() + pause > deadline:
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def _record_answer(
        self, turn: Turn, message: Mapping[str, Any] | None, complete: bool
    ) -> None:
        if not turn.hashes.done():  # the request's record never ran (cancelled): nothing to key
            return
        hashes = turn.hashes.result()
        if hashes is None:
            return
        content: Any = dict(message) if message is not None else None
        if message is not None and complete:
            key = answer_key(turn.count, hashes)
        else:  # a cut answer is kept, but never stands for the turn's answer
            digest = hashlib.sha256(orjson.dumps(content)).hexdigest()[:16]
            key = f"x{turn.count}:{hashes[turn.count]}:{digest}"
        conversation = turn.conversation
        event = self._event(turn.tenant, conversation, key, "answer", content, complete)
        recorded = await self.store.record_transcript(
            turn.tenant,
            conversation.session,
            [KeyedEvent(key, event)],
            Prefix(turn.count, hashes[turn.count]),
            agent=conversation.agent,
            parent=conversation.parent,
        )
        self._exported(turn, recorded)

    @staticmethod
    def _event(
        tenant: str, conversation: Conversation, key: str, kind: Any, message: Any, complete: bool
    ) -> TranscriptEvent:
        if kind == "answer":
            role, content = "assistant", message
        else:
            role = str(message.get("role", "")) if isinstance(message, Mapping) else ""
            content = message.get("content") if isinstance(message, Mapping) else message
        # the main conversation's ids are as before agents; an agent's event includes its agent
        where = conversation.session
        if conversation.agent:
            where = f"{conversation.session}\0{conversation.agent}"
        identity = hashlib.sha256(f"{tenant}\0{where}\0{key}".encode()).hexdigest()[:32]
        return TranscriptEvent(
            event_id=f"evt_{identity}",
            recorded_at=_now(),
            type=kind,
            role=role or "unknown",
            content=content,
            complete=complete,
        )

    # -- the JSONL export: a projection of the store ---------------------------------------

    def _exported(self, turn: Turn, recorded: Recorded) -> None:
        root = turn.policy.transcript_root
        if root is None or not recorded.seqs:
            return
        conversation = turn.conversation
        key = (turn.tenant, conversation.session, conversation.agent, root)
        if key in self._exports:
            self._export_again.add(key)
            return
        task = asyncio.get_running_loop().create_task(self._export(*key))
        self._exports[key] = task
        self._track(task)

    async def _export(self, tenant: str, session: str, agent: str, root: str) -> None:
        key = (tenant, session, agent, root)
        loop = asyncio.get_running_loop()

        def fetch(after: int, limit: int) -> list[StoredRecord]:
            events = asyncio.run_coroutine_threadsafe(
                self.store.transcript_events(tenant, session, after, limit, agent=agent), loop
            ).result()
            return [StoredRecord(e.seq, e.event.event_id, record_bytes(e)) for e in events]

        try:
            while True:
                self._export_again.discard(key)
                try:
                    await asyncio.to_thread(
                        export_session, root, session, fetch, self._marks, agent
                    )
                except StoreError as exc:
                    self.store.health.lost("transcript exports", exc, "repaired on the next export")
                    return
                except (OSError, ValueError) as exc:
                    log.warning("[durable] transcript export failed: %s", type(exc).__name__)
                    return
                if key not in self._export_again:
                    return
        finally:
            self._exports.pop(key, None)


@dataclass(frozen=True, slots=True)
class Turn:
    """A request being recorded: what its answer needs (the request's prefix hashes)."""

    tenant: str
    policy: SourcePolicy
    conversation: Conversation
    count: int  # messages in the request: the answer is message ``count`` of the conversation
    hashes: asyncio.Future[tuple[str, ...] | None]


def _indices(record: Any) -> tuple[int, ...]:
    """The client message indices a manifest record names."""
    if isinstance(record, Truncated):
        return (record.message_index,)
    return tuple(getattr(record, "message_indices", ()))


def _role(message: Any) -> object:
    return message.get("role") if isinstance(message, Mapping) else None


def _hashes(messages: Sequence[Any]) -> tuple[str, ...]:
    """``prefix_hashes`` of the messages (through the digests a re-sent body carries)."""
    return digests(messages, hashed=True).hashes
