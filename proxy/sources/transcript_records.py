"""The one byte form of a recorded transcript event: what its pointer's SHA-256 is taken over.

``transcript:<session>:<seq>`` names the event the store numbered ``seq``. Its evidence is the
SHA-256 of :func:`record_bytes` of that event -- the same bytes as the line the JSONL export
(``transcript_files``) writes for it, and the same digest the admin API's transcript pages show.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib

import orjson

from proxy.store.base import RecordedEvent

__all__ = ["SCHEMA_VERSION", "record_bytes", "record_sha256"]

SCHEMA_VERSION = 1


def record_bytes(recorded: RecordedEvent) -> bytes:
    """The event as one compact JSON object, without a newline, keys in this order::

    {"schema_version", "sequence", "recorded_at", "session_id", "event_id", "type", "role",
     "content"}

    ``type`` is ``message``, ``answer``, or ``answer.incomplete`` for a cut answer. An agent's
    event has ``"agent_id"`` right after ``session_id``; the main conversation's records are as
    they were before agents (their digests, and the pointers naming them, unchanged).
    """
    event = recorded.event
    record: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "sequence": recorded.seq,
        "recorded_at": event.recorded_at,
        "session_id": recorded.session,
    }
    if recorded.agent:
        record["agent_id"] = recorded.agent
    record["event_id"] = event.event_id
    record["type"] = event.type if event.complete else f"{event.type}.incomplete"
    record["role"] = event.role
    record["content"] = event.content
    return orjson.dumps(record)


def record_sha256(recorded: RecordedEvent) -> str:
    return hashlib.sha256(record_bytes(recorded)).hexdigest()
