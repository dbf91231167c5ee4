"""The edge side of thinking-block binding: never show a binding model a stale block.

For a request to a model that binds thinking blocks to their prefix (``proxy.core.thinking``),
after compaction and durable context decided what to forward:

* nothing the request replays is stale: forwarded as decided;
* the client chose nothing: the proxy asks the provider to drop the stale blocks (the beta
  ``thinking-binding-controls-2026-08-01`` is added to ``anthropic-beta`` and
  ``thinking.block_binding.prefix_mismatch_behavior = "drop_block"`` to the body), so a rewrite
  of ours is never a 400 and a block that is still valid is never lost: the provider keeps it;
* thinking is off (``thinking.type: disabled``, where no ``block_binding`` can go), or the
  tenant's platform does not take the beta (it would be dropped with ``block_binding``: Foundry):
  the proxy removes the stale blocks itself;
* the client chose ``drop_block``: forwarded as decided (the provider drops them);
* the client chose ``error``: the proxy does not cause the error. It forwards the client's own
  messages (compaction ``deferred``) with the ``system`` and ``tools`` it decided, when that
  replays nothing stale, else the client's request exactly as sent.

``x-compaction-thinking: <action>=<count>`` says which (``none=0`` when nothing was stale). The
provider's own report of what it dropped, ``input_transformations``, reaches the client untouched.

What blocks were made under is learnt from every answer of a binding model (``learn``): the
binding key of the forwarded request where each of its thinking blocks stands. An answer that
took hidden retrieval rounds is not learnt (its later rounds' blocks were made under a view the
client never sends): its blocks count as unknown, like those of an answer another replica
relayed, and are judged against the client's own prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict

from proxy.core.catalogue import Catalogue, built_in
from proxy.core.thinking import (
    BindingRecords,
    Decision,
    PrefixKeys,
    answer_bindings,
    decide,
    stale_blocks,
    thinking_blocks,
    with_drop_block,
    without_blocks,
)

__all__ = ["THINKING_HEADER", "Guarded", "ThinkingGuard", "with_beta"]

THINKING_HEADER = "x-compaction-thinking"


def with_beta(headers: CIMultiDict[str], beta: str) -> None:
    """Add ``beta`` to the request's ``anthropic-beta`` list (kept as sent otherwise)."""
    values = headers.getall("anthropic-beta", [])
    present = {b.strip() for v in values for b in v.split(",")}
    if beta in present:
        return
    if values:
        headers.popall("anthropic-beta")
        headers["anthropic-beta"] = ",".join([*values, beta])
    else:
        headers["anthropic-beta"] = beta


@dataclass(frozen=True, slots=True)
class Guarded:
    """What to forward after the check: ``body`` (``None``: forward as decided before, bytes
    unchanged), whether compaction was undone (``deferred``: the client's own messages), the
    report header, and where an answer's blocks will stand (``end``, for ``learn``)."""

    body: dict[str, Any] | None
    decision: Decision
    end: int
    deferred: bool = False
    as_sent: bool = False  # the client's request exactly as sent

    @property
    def header(self) -> str:
        return f"{self.decision.action}={self.decision.count}"


def _own_by_identity(messages: Sequence[Any], own: Sequence[int]) -> dict[int, int]:
    return {id(m): h for m, h in zip(messages, own, strict=False)}


class ThinkingGuard:
    """Per process: which models bind, and what the blocks seen made were bound to."""

    def __init__(self, catalogue: Catalogue | None = None, max_records: int = 20_000) -> None:
        self._catalogue = catalogue or built_in()
        self._binds: dict[str, bool] = {}
        self.records = BindingRecords(max_records)

    def binds(self, model: object) -> bool:
        if not isinstance(model, str):
            return False
        found = self._binds.get(model)
        if found is None:
            if len(self._binds) > 4096:
                self._binds.clear()
            found = self._binds[model] = self._catalogue.binds_thinking(model)
        return found

    def check(
        self,
        client: Mapping[str, Any],
        forwarded: Mapping[str, Any],
        decided: Mapping[str, Any],
        own: Sequence[int] = (),
        can_ask: bool = True,
    ) -> Guarded:
        """The guard's answer for a request of a binding model. ``client``: the request as the
        client sent it; ``forwarded``: what compaction and durable context decided;
        ``decided``: ``forwarded`` with the client's messages (durable context only, compaction
        left out); ``own``: the marker-free hashes of the client's messages (the compaction
        digests), when known; ``can_ask``: the upstream platform takes the binding beta."""
        messages = client["messages"]
        known = _own_by_identity(messages, own)

        def keys(body: Mapping[str, Any]) -> PrefixKeys:
            view = body["messages"]
            return PrefixKeys(
                body.get("system"), body.get("tools"), view, lambda i: known.get(id(view[i]))
            )

        fwd = keys(forwarded)
        blocks = thinking_blocks(forwarded["messages"])
        if not blocks:
            return Guarded(None, Decision("none", 0), fwd.end)
        mine = keys(client)
        theirs = {b.ident: mine.at(b.message, b.index) for b in thinking_blocks(messages)}
        decision = decide(forwarded, fwd, blocks, self.records, theirs, can_ask)
        if decision.action in ("none", "forwarded"):
            return Guarded(None, decision, fwd.end)
        if decision.action == "asked-to-drop":
            return Guarded(with_drop_block(forwarded), decision, fwd.end)
        if decision.action == "dropped":
            view = without_blocks(forwarded["messages"], decision.stale)
            body = {**forwarded, "messages": view}
            return Guarded(body, decision, keys(body).end)
        # the client chose "error": its own messages, with our system and tools if that is safe
        candidate = keys(decided)
        if not stale_blocks(candidate, thinking_blocks(messages), self.records, theirs):
            return Guarded(dict(decided), decision, candidate.end, deferred=True)
        return Guarded(dict(client), decision, mine.end, deferred=True, as_sent=True)

    def learn(self, end: int, answer: Mapping[str, Any] | None) -> None:
        """Remember what the thinking blocks of ``answer`` (made after a request whose key
        ends at ``end``) are bound to."""
        if answer is not None:
            self.records.learn(answer_bindings(end, answer))

    def end_of(self, body: Mapping[str, Any], own: Callable[[int], int | None] | None = None) -> int:
        """Where an answer to ``body`` starts (for a request the guard did not check)."""
        return PrefixKeys(body.get("system"), body.get("tools"), body["messages"], own).end
