"""Naming the turns compaction removes by their transcript pointers.

A bridge names the removed messages as the events the conversation's transcript holds for them.
The recorder keys each event by its place in the conversation (``proxy.core.event_keys``), so
the pipeline asks, only when it is about to remove something (``NeedsNaming``), which sequence
numbers the transcript gave those keys; a message the transcript does not hold (the store was
down when it was sent, or it was recorded under another conversation) is simply not named.

Why keys, not "message ``i`` is event ``i + 1``": a conversation's transcript may interleave
other traffic of the same identity (Claude Code's side requests), and the first message as a
client re-sends it differs in bytes from the one recorded (Claude Code moves its
``cache_control`` marker to its newest message on every request). Keys leave out both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from proxy.core.compaction.bridge import TranscriptNaming
from proxy.core.conversation import Conversation
from proxy.core.durable import InvalidWrite
from proxy.core.pointers import TranscriptPointer
from proxy.sources.policy import SourcePolicy, authorise
from proxy.store.base import Store, StoreError

__all__ = ["transcript_naming", "transcript_sequences"]

log = logging.getLogger("context_proxy.retrieval")


def transcript_naming(policy: SourcePolicy, conversation: Conversation) -> TranscriptNaming | None:
    """The conversation whose transcript holds the request's messages, when the tenant's policy
    lets its pointers be named (else ``None``: the bridge names no pointers)."""
    if not authorise(TranscriptPointer(conversation.session, 1, conversation.agent), policy):
        return None
    return TranscriptNaming(conversation.session, conversation.agent)


async def transcript_sequences(
    store: Store | None, tenant: str, naming: TranscriptNaming, keys: Sequence[str]
) -> dict[str, int]:
    """The sequence numbers the conversation's transcript gave ``keys`` (a failing store names
    nothing: the bridge then carries no pointers, never wrong ones)."""
    if store is None or not keys:
        return {}
    try:
        return await store.transcript_seqs(tenant, naming.session, keys, agent=naming.agent)
    except StoreError as exc:
        store.health.lost("transcript naming", exc, "the removed turns are not named")
        return {}
    except InvalidWrite as exc:
        log.warning("[retrieval] removed turns not named: %s", type(exc).__name__)
        return {}
