"""What every layer needs to know about the request being compacted, and the view's landmarks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.core.compaction.policy import CompactionPolicy
from proxy.core.compaction.view import (
    Entry,
    FromClient,
    Message,
    ViewItem,
    blocks_of,
    materialize,
)
from proxy.core.tokens import BLOCK_OVERHEAD, TokenCounter, containing

COMPACTION_JSON = b'"compaction"'  # how a compaction block's type shows in canonical JSON

__all__ = ["LayerContext", "calibrate", "compaction_end", "frozen_len", "latest_assistant"]


def calibrate(estimate: int, ratio: float) -> int:
    """An estimate as the provider would count it (``ratio`` = real / estimate)."""
    return int(estimate * ratio + 0.5)


@dataclass(frozen=True, slots=True)
class LayerContext:
    """The request's fixed parts and the knobs; ``fixed`` = raw tokens outside ``messages``."""

    messages: Sequence[Message]
    policy: CompactionPolicy
    counter: TokenCounter
    fixed: int
    ratio: float
    # The session whose artifact store keeps the full text of cut results (None: no session).
    artifact_session: str | None = None

    def entry(self, item: ViewItem) -> Entry:
        message = materialize(item, self.messages)
        return Entry(item, message, self.counter.count_message(message))

    def text_tokens(self, text: str) -> int:
        """Tokens of a piece of text (memoised by the counter)."""
        return max(0, self.counter.count_block(text) - BLOCK_OVERHEAD)

    def total(self, entries: Sequence[Entry]) -> int:
        """Calibrated tokens of a request whose messages are ``entries``."""
        return calibrate(self.fixed + sum(e.tokens for e in entries), self.ratio)

    def calibrated_total(self, raw_message_tokens: int) -> int:
        return calibrate(self.fixed + raw_message_tokens, self.ratio)

    def under_target(self, entries: Sequence[Entry]) -> bool:
        return self.total(entries) <= self.policy.target


def compaction_end(
    messages: Sequence[Message],
    canonical: Sequence[bytes | None] | None = None,
    maybe: Sequence[bool] | None = None,
) -> int:
    """How many leading messages no layer may change: up to the last provider ``compaction``
    block (it must reach the provider verbatim, with everything before it); 0 without one.

    ``canonical``: each message's ``canonical_json``, when known, and every message a ``dict``:
    a message whose JSON does not contain ``"compaction"`` is then skipped without a walk.
    ``maybe`` instead: that search's result (``containing(canonical, COMPACTION_JSON)``)."""
    if maybe is None:
        maybe = (
            containing(canonical, COMPACTION_JSON)
            if canonical is not None
            else [True] * len(messages)
        )
    for i in range(len(messages) - 1, -1, -1):
        if not maybe[i]:
            continue
        for block in blocks_of(messages[i]):
            if isinstance(block, Mapping) and block.get("type") == "compaction":
                return i + 1
    return 0


def frozen_len(entries: Sequence[Entry]) -> int:
    """``compaction_end`` of a view: up to the last *client's* compaction block (a provider
    compaction the proxy asked for is its own bridge, which a later compaction replaces)."""
    return compaction_end(
        [e.message if isinstance(e.item, FromClient) else {} for e in entries]
    )


def latest_assistant(entries: Sequence[Entry]) -> int:
    """Index of the last assistant entry, or -1."""
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].role == "assistant":
            return i
    return -1
