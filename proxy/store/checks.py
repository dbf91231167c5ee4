"""What the store refuses before any query runs (pure): every check raises ``InvalidWrite``
naming each bad field, and nothing is written.

A value one backend cannot hold is refused on both (text with a NUL character or invalid
Unicode: PostgreSQL cannot store it; an integer beyond 64 bits: neither can), so the same call
gets the same answer whichever database is underneath, and a store can move between them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

import orjson

from proxy.core.durable import FieldError, InvalidWrite, check_timestamp
from proxy.core.pointers import is_valid_agent_id, is_valid_session_id
from proxy.store.values import EVENT_TYPES, TranscriptEvent

__all__ = [
    "DEFAULT_EVENT_LIMIT",
    "DEFAULT_PLAN_LIMIT",
    "MAX_BIGINT",
    "MAX_EVENT_LIMIT",
    "MAX_KEY_CHARS",
    "check_calibration",
    "check_event_range",
    "check_keys",
    "check_keys_list",
    "check_plan_limit",
    "check_prefix",
    "check_settle",
    "check_storable",
    "check_summary_claim",
    "encode_events",
    "encode_manifest",
    "encode_plan",
    "storable",
]

DEFAULT_EVENT_LIMIT = 1000
MAX_EVENT_LIMIT = 10_000
DEFAULT_PLAN_LIMIT = 4  # plans of one conversation fetched at once (``PlanCache``'s default)
MAX_PLAN_LIMIT = 100
MAX_TENANT_CHARS = 200
MAX_KEY_CHARS = 200  # summary keys and holders, model names, transcript event keys
MAX_BIGINT = 2**63 - 1


def check_keys(tenant: object, session: object | None = None, agent: object = "") -> None:
    """Raise ``InvalidWrite`` unless the tenant (and session id, and agent id: ``""`` for the
    session's main conversation) are usable keys."""
    errors: list[FieldError] = []
    if (
        not isinstance(tenant, str)
        or not tenant
        or len(tenant) > MAX_TENANT_CHARS
        or any(unicodedata.category(ch).startswith(("C", "Z")) for ch in tenant)
    ):
        errors.append(FieldError("tenant", "expected a non-empty tenant id without spaces"))
    if session is not None and not is_valid_session_id(session):
        errors.append(FieldError("session", "not a valid session id"))
    if agent != "" and not is_valid_agent_id(agent):
        errors.append(FieldError("agent", "not a valid agent id"))
    if errors:
        raise InvalidWrite(errors)


def storable(value: str) -> bool:
    """Text every backend can hold: no NUL character, valid UTF-8 (no lone surrogates)."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_storable(fields: Iterable[tuple[str, object]]) -> None:
    errors = [
        FieldError(name, "contains a NUL character or invalid Unicode")
        for name, value in fields
        if isinstance(value, str) and not storable(value)
    ]
    if errors:
        raise InvalidWrite(errors)


def encode_events(events: Sequence[TranscriptEvent]) -> list[bytes]:
    """Each event's content as JSON bytes; ``InvalidWrite`` naming every bad field."""
    if not events:
        raise InvalidWrite([FieldError("events", "expected at least one event")])
    errors: list[FieldError] = []
    encoded: list[bytes] = []
    seen: set[str] = set()
    for i, event in enumerate(events):
        prefix = f"events[{i}]"
        if not isinstance(event, TranscriptEvent):
            errors.append(FieldError(prefix, "expected a transcript event"))
            continue
        if not isinstance(event.event_id, str) or not event.event_id.strip():
            errors.append(FieldError(f"{prefix}.event_id", "expected a non-empty id"))
        elif event.event_id in seen:
            errors.append(FieldError(f"{prefix}.event_id", "repeated in this batch"))
        else:
            seen.add(event.event_id)
        problem = check_timestamp(event.recorded_at)
        if problem:
            errors.append(FieldError(f"{prefix}.recorded_at", problem))
        if event.type not in EVENT_TYPES:
            errors.append(FieldError(f"{prefix}.type", "expected message or answer"))
        if not isinstance(event.role, str) or not event.role:
            errors.append(FieldError(f"{prefix}.role", "expected a non-empty role"))
        if not isinstance(event.complete, bool):
            errors.append(FieldError(f"{prefix}.complete", "expected true or false"))
        try:
            encoded.append(orjson.dumps(event.content))
        except TypeError:
            errors.append(FieldError(f"{prefix}.content", "not JSON-serialisable"))
    if errors:
        raise InvalidWrite(errors)
    return encoded


def check_prefix(prefix_count: object, prefix_hash: object) -> None:
    errors: list[FieldError] = []
    if isinstance(prefix_count, bool) or not isinstance(prefix_count, int) or prefix_count < 0:
        errors.append(FieldError("prefix_count", "expected an integer >= 0"))
    elif prefix_count > MAX_BIGINT:
        errors.append(FieldError("prefix_count", "too large"))
    if not isinstance(prefix_hash, str):
        errors.append(FieldError("prefix_hash", "expected a string"))
    if errors:
        raise InvalidWrite(errors)


def check_event_range(after_seq: object, limit: object) -> None:
    """``transcript_events``' paging: ``after_seq >= 0``, ``1 <= limit <= MAX_EVENT_LIMIT``."""
    errors: list[FieldError] = []
    if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
        errors.append(FieldError("after_seq", "expected an integer >= 0"))
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_EVENT_LIMIT:
        errors.append(FieldError("limit", f"expected an integer from 1 to {MAX_EVENT_LIMIT}"))
    if errors:
        raise InvalidWrite(errors)


def check_keys_list(keys: Iterable[object]) -> None:
    """Transcript event keys: 1 to ``MAX_KEY_CHARS`` printable ASCII characters each."""
    errors = [
        FieldError(f"events[{i}].key", f"expected 1-{MAX_KEY_CHARS} printable ASCII characters")
        for i, key in enumerate(keys)
        if not isinstance(key, str)
        or not 0 < len(key) <= MAX_KEY_CHARS
        or not key.isascii()
        or not key.isprintable()
    ]
    if errors:
        raise InvalidWrite(errors)


def encode_manifest(compaction_id: object, manifest_json: object) -> str:
    """The manifest text, checked to be one JSON value; ``InvalidWrite`` otherwise."""
    errors: list[FieldError] = []
    if not isinstance(compaction_id, str) or not compaction_id.strip():
        errors.append(FieldError("compaction_id", "expected a non-empty id"))
    if not isinstance(manifest_json, str):
        errors.append(FieldError("manifest_json", "expected JSON text"))
    else:
        try:
            orjson.loads(manifest_json)
        except orjson.JSONDecodeError:
            errors.append(FieldError("manifest_json", "not valid JSON"))
    if errors:
        raise InvalidWrite(errors)
    assert isinstance(manifest_json, str)
    return manifest_json


def encode_plan(anchor: object, prefix_hash: object, prefix_len: object, plan_json: object) -> str:
    """The plan text, checked to be a JSON object; ``InvalidWrite`` naming every bad field."""
    errors: list[FieldError] = []
    if not isinstance(anchor, str) or not anchor.strip():
        errors.append(FieldError("anchor", "expected a non-empty hash"))
    if not isinstance(prefix_hash, str) or not prefix_hash.strip():
        errors.append(FieldError("prefix_hash", "expected a non-empty hash"))
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 1:
        errors.append(FieldError("prefix_len", "expected an integer >= 1"))
    elif prefix_len > MAX_BIGINT:
        errors.append(FieldError("prefix_len", "too large"))
    if not isinstance(plan_json, str):
        errors.append(FieldError("plan_json", "expected JSON text"))
    else:
        try:
            if not isinstance(orjson.loads(plan_json), dict):
                errors.append(FieldError("plan_json", "expected a JSON object"))
        except orjson.JSONDecodeError:
            errors.append(FieldError("plan_json", "not valid JSON"))
    if errors:
        raise InvalidWrite(errors)
    assert isinstance(plan_json, str)
    return plan_json


def check_plan_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidWrite([FieldError("limit", "expected an integer >= 1")])
    return min(limit, MAX_PLAN_LIMIT)


def _finite_positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < float(value) < float("inf")
    )


def _short_key(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value.strip()) and len(value) <= MAX_KEY_CHARS


def check_summary_claim(key: object, holder: object, seconds: object, what: str) -> None:
    """``InvalidWrite`` unless the summary key, holder and a duration are usable."""
    errors: list[FieldError] = []
    if not _short_key(key):
        errors.append(FieldError("key", f"expected a non-empty key of at most {MAX_KEY_CHARS}"))
    if not _short_key(holder):
        errors.append(FieldError("holder", "expected a non-empty holder id"))
    if not _finite_positive(seconds):
        errors.append(FieldError(what, "expected a positive number of seconds"))
    if errors:
        raise InvalidWrite(errors)


def check_settle(key: object, holder: object, text: object, retry_seconds: object) -> None:
    """``InvalidWrite`` unless ``settle_summary``'s arguments are usable."""
    check_summary_claim(key, holder, retry_seconds, "retry_seconds")
    if text is not None and not isinstance(text, str):
        raise InvalidWrite([FieldError("text", "expected text or null")])


def check_calibration(model: object, ratio: object | None = None, *, with_ratio: bool) -> None:
    errors: list[FieldError] = []
    if not isinstance(model, str) or len(model) > MAX_KEY_CHARS:
        errors.append(FieldError("model", f"expected a model name of at most {MAX_KEY_CHARS}"))
    if with_ratio and not _finite_positive(ratio):
        errors.append(FieldError("ratio", "expected a positive finite number"))
    if errors:
        raise InvalidWrite(errors)
