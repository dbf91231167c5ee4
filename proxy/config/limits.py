"""The ``limits:`` section: request sizes, concurrency, client connections, and the bound of
everything the proxy keeps in memory per session, conversation, tenant or key (the body memo, the
token memos, thinking records, plans, durable states, source checks...: docs/operations/memory.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.schema import check, non_negative, positive


def _cache_bound(value: int) -> str | None:
    return None if value >= 0 else "a number >= 0 (0 keeps nothing)"


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata=check(
            positive,
            doc="Larger request bodies get 413 `request_too_large`, without contacting the upstream"
            " (32 MiB: the provider's own limit).",
        ),
    )
    max_concurrent_requests: int = field(
        default=4096,
        metadata=check(positive, doc="Requests handled at once; beyond it 529 `overloaded_error` with `retry-after`."),
    )
    header_timeout: float = field(
        default=10.0,
        metadata=check(
            positive,
            doc="Seconds to receive a complete request head, from a new connection's start or a"
            " kept-alive one's first byte; then 408 (if part of a head came) and the connection closes.",
        ),
    )
    body_timeout: float = field(
        default=30.0,
        metadata=check(
            positive,
            doc="Longest silence while reading a request body (not counted while the proxy itself is"
            " not reading); then the connection closes and the request is abandoned (nothing left upstream).",
        ),
    )
    idle_timeout: float = field(
        default=75.0,
        metadata=check(positive, doc="Keep-alive: an idle connection between requests closes after this many seconds."),
    )
    max_connections: int = field(
        default=10_000,
        metadata=check(
            positive,
            doc="Open client connections; one more closes the oldest connection with no request in"
            " progress (idle or still sending its head), or the new one when every connection is busy:"
            " a request in progress is never cut for room. Capped by the open-files limit, whose soft"
            " value is raised to the hard one at start.",
        ),
    )
    # The bounded caches (`proxy/core/bounded.py`): what the proxy keeps per session, conversation,
    # tenant or key, each bounded (least recently used out first), so that a replica that is never
    # restarted holds at most their sum whatever number of sessions passes through. A miss only
    # costs work, never another answer (docs/operations/memory.md).
    body_memo_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=check(
            _cache_bound,
            doc="The body memo (`proxy/core/reparse.py`): the latest body of each conversation (per"
            " tenant and credential) kept parsed, so the next turn parses only its new bytes. Bytes of"
            " body text kept; with its parsed objects it takes ~3.3x that in memory. A miss: the whole"
            " body parsed, validated and hashed again. `0` turns it off.",
        ),
    )
    token_memo_blocks: int = field(
        default=50_000,
        metadata=check(
            _cache_bound,
            doc="Token counts of content blocks, by content hash (~180 bytes each). A miss: the block"
            " is tokenised again. `0` turns it off.",
        ),
    )
    token_memo_messages: int = field(
        default=50_000,
        metadata=check(
            _cache_bound,
            doc="Token counts of whole messages, by their marker-free hash (~180 bytes each). A miss:"
            " the message is counted block by block (through the block memo). `0` turns it off.",
        ),
    )
    thinking_records: int = field(
        default=20_000,
        metadata=check(
            _cache_bound,
            doc="What each thinking block an answer brought was made under, on models that bind"
            " thinking to its prefix (~240 bytes each). A miss: the block is judged as one made"
            " elsewhere: stale when the proxy changed what precedes it, so it is dropped (or the"
            " provider asked to drop it) though it may have been valid. `0` keeps none.",
        ),
    )
    plan_cache_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata=check(
            _cache_bound,
            doc="Compaction plans kept in memory, as bytes of their JSON (their objects take ~3.8x"
            " that; `compaction.max_plans` bounds their number too; the conversation served last keeps"
            " its plans whatever their size). A miss: the conversation's plans are read from the store"
            " again before its next turn.",
        ),
    )
    durable_states: int = field(
        default=512,
        metadata=check(
            _cache_bound,
            doc="Sessions whose folded durable state the store keeps (~2.5 KB for a state of a few"
            " items). A miss: the session's whole durable history is read and folded again, instead of"
            " the rows after the cached one.",
        ),
    )
    transcript_exports: int = field(
        default=4096,
        metadata=check(
            _cache_bound,
            doc="Transcript files (a session's, or one agent's) whose length the JSONL export"
            " remembers as it left them (~680 bytes each). A miss: the export reads the file's last"
            " line back from the store and counts the file's lines before appending.",
        ),
    )
    source_checks: int = field(
        default=1024,
        metadata=check(
            _cache_bound,
            doc="Verified source pointers: a local artifact's or transcript's digest and excerpt, by"
            " the file's identity, and an object-store artifact's, by its ETag (up to ~4 KB each). A"
            " miss: the file (or object) is read and hashed again.",
        ),
    )
    calibration_keys: int = field(
        default=1024,
        metadata=check(
            _cache_bound,
            doc="Tenant and model pairs whose real/estimate token ratio the process keeps (~720 bytes"
            " each). A miss: the figure is read from the store again (the default ratio when it has"
            " none).",
        ),
    )
    cache_idle_seconds: float = field(
        default=600.0,
        metadata=check(
            non_negative,
            doc="What is kept per conversation or session (the body memo, compaction plans, durable"
            " states, transcript export marks) is forgotten after this many seconds without a turn of"
            " that conversation, so memory follows the conversations still going, not every one"
            " seen since start (checked every tenth of it, at most every minute). Ten minutes: past"
            " the provider's default prompt-cache lifetime (5 minutes), when a returning turn pays"
            " for its prefix anyway; a forgotten entry costs only its miss (a parse, one store read)."
            " Thinking records, token counts and source checks are kept until their bounds push them"
            " out. `0` forgets nothing when idle.",
        ),
    )
