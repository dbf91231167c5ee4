"""The idempotency key of each transcript event: where it stands in its conversation. Pure.

The recorder (``proxy.server.context.durable``) stores every message of a conversation, and every
answer, exactly once under one of these keys (``proxy.store.transcripts``); compaction names the
events it removed by looking their keys up (``proxy.core.compaction.pipeline``: ``NeedsNaming``).
Both compute them from the same prefix hashes (``proxy.core.compaction.plan.prefix_hashes``:
canonical JSON with the ``cache_control`` markers left out), so a key is the same on every
replica, on every later turn and whatever marker a client moved since: a key names a message by
its place in the conversation and the conversation before it, never by bytes a client decorates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["answer_key", "message_key"]


def message_key(position: int, message: Any, hashes: Sequence[str]) -> str:
    """The idempotency key of message ``position`` of the conversation ``hashes`` describes.

    An assistant message is keyed by the conversation before it (``a<pos>:<hash of 0..pos-1>``):
    it is the one answer to that conversation, whether the proxy recorded it from the stream or
    the client sent it back (whichever is recorded first stands; the client's copy differs in
    bytes). Any other message is keyed by the conversation through it (``m<pos>:<hash of
    0..pos>``): an edited or new message is a new event, the same one re-sent is not."""
    if isinstance(message, Mapping) and message.get("role") == "assistant":
        return answer_key(position, hashes)
    return f"m{position}:{hashes[position + 1]}"


def answer_key(position: int, hashes: Sequence[str]) -> str:
    """The key of the answer to the conversation's first ``position`` messages."""
    return f"a{position}:{hashes[position]}"
