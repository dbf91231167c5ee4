"""The body memo learns this body: where its messages end, the validator's states, their digests."""

from __future__ import annotations

from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage


class Remember(Stage):
    """Once the answer is out (``proxy.core.reparse``): what serves only the conversation's next
    turn, which the client sends after reading this answer. Nothing after an error or a client
    gone (the next request parses in full, as the first did)."""

    name = "remember"

    def end(self, ex: Exchange) -> None:
        parsed = ex.parsed
        if ex.ended != "answered" or parsed is None:
            return
        parsed.remember(ex.checkpoints)
        if ex.compaction is not None:
            parsed.keep_digests(ex.compaction.digests)
