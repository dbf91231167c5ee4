"""One Messages request as it passes through the chain: the ``Exchange``.

Every stage (``proxy.server.exchange.stages``) reads and writes the request's state here and
nowhere else: what one stage hands the next is a named field, listed below with the stage that
writes it. Stages are per-process objects, so what a stage keeps between its own hooks lives
here too (marked *own*). Design and the field table: docs/ARCHITECTURE.md, "The request path:
a chain of stages".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from multidict import CIMultiDict

from proxy.core.compaction import CompactionResult
from proxy.core.conversation import Conversation
from proxy.core.protocol import Checkpoint
from proxy.core.reparse import Parsed
from proxy.core.tokens import Canonical
from proxy.server.compaction.service import Prepared
from proxy.server.context.durable import Turn
from proxy.server.http import spans
from proxy.server.ledger import CallContext
from proxy.server.quota import Ticket
from proxy.server.relay.accumulate import AnswerAccumulator
from proxy.server.relay.forward import RelayOutcome
from proxy.server.relay.rounds import HiddenRounds
from proxy.server.relay.usage import UsageTap
from proxy.server.upstream.response import UpstreamResponse
from proxy.tenancy.tenants import Tenant

# How an exchange ended (docs/ARCHITECTURE.md, the runner): the relay returned (``answered``);
# the proxy answered itself before anything went upstream (``refused``: 400, 413, 429, or the
# platform refusing the body before sending it); the provider failed it (``upstream_failed``:
# 502/504); the client went away (``client_gone``); a bug (``failed``).
Ended = Literal["answered", "refused", "upstream_failed", "client_gone", "failed"]


# A relay that takes over from the plain one (the retrieval loop's ``run``): it writes the answer
# to the client (the upstream's answer, the headers to add, the time spent before the call, the
# tap to feed what it writes), and may call the provider again.
Relay = Callable[
    [UpstreamResponse, Mapping[str, str], float, Callable[[bytes], None]],
    Awaitable[tuple[web.StreamResponse, RelayOutcome]],
]


@dataclass(slots=True, eq=False)
class Exchange:
    """One Messages request, from its body read to the end of its answer."""

    # -- given by the handler ---------------------------------------------------------------
    request: web.Request  # the request the answer is written to (the client's, or a format's clone)
    route: str  # "messages" or "count_tokens"
    raw: bytes  # what goes upstream when nothing changes (as sent: maybe compressed)
    text: bytes  # its JSON
    started: float  # perf_counter() when the body began to be read
    tenant: Tenant
    # the client's headers for the upstream (hop-by-hop ones dropped, the tenant's credentials);
    # GuardThinking adds a beta, the forward step compaction's betas
    upstream_headers: CIMultiDict[str]
    # what the proxy adds to the answer, also to an error answer (Admit, InjectDurable, Compact,
    # GuardThinking)
    headers: dict[str, str] = field(default_factory=dict)

    # -- Identify ---------------------------------------------------------------------------
    conversation: Conversation | None = None  # session and agent; None without a session
    # -- Validate ---------------------------------------------------------------------------
    parsed: Parsed | None = None  # the body as parsed through the memo (Remember reads it)
    # the request as it will be forwarded so far: the client's parsed body, then (InjectDurable)
    # with the durable block; never the client's own object once changed
    body: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)  # the validator's states
    canonical: Canonical | None = None  # the new messages' canonical JSON, for compaction
    # -- InjectDurable ----------------------------------------------------------------------
    faithful: bytes | None = None  # the client's exact bytes while ``body`` is still theirs
    shared: tuple[str, ...] = ()  # the durable block's pointers (any agent may read them back)
    # -- Admit ------------------------------------------------------------------------------
    ticket: Ticket | None = None  # the request's budgets and rate limits
    # -- Book (own) -------------------------------------------------------------------------
    calls: Token[CallContext | None] | None = None
    # -- Record (own); Record and GuardThinking ask for the answer folded -------------------
    turn: Turn | None = None
    wants_answer: bool = False
    # -- Compact (GuardThinking replaces ``prepared``) ---------------------------------------
    prepared: Prepared | None = None  # what to forward, and what to report about it
    compaction: CompactionResult | None = None  # the compaction's result (digests, plan)
    # -- GuardThinking (own) ----------------------------------------------------------------
    learn_from: int | None = None  # where a binding model's answer's blocks will stand
    # -- Retrieve ---------------------------------------------------------------------------
    relay: Relay | None = None  # takes over from the plain relay
    rounds: HiddenRounds | None = None  # the hidden rounds' calls and records
    # -- Trace (own) ------------------------------------------------------------------------
    call_span: spans.Span = spans.NO_SPAN
    # -- the forward step -------------------------------------------------------------------
    sent_at: tuple[str, int] | None = None  # when the client's call was sent (ledger time)
    sent: float = 0.0  # the same, perf_counter()
    upstream: UpstreamResponse | None = None  # the provider's answer (status, headers)
    usage: UsageTap | None = None  # what the answer says of its usage, id, model, stop reason
    answer: AnswerAccumulator | None = None  # the answer folded (when ``wants_answer``, a 200)
    message: dict[str, Any] | None = None  # the folded answer, once the relay ended
    outcome: RelayOutcome | None = None  # what the relay saw
    response: web.StreamResponse | None = None  # the client's response
    # -- the runner -------------------------------------------------------------------------
    ended: Ended | None = None
    error: BaseException | None = None  # what ended it, when it did not end with an answer

    def feed(self, data: bytes) -> None:
        """The relay's tap: each chunk it wrote to the client, to the answer's readers (sans-I/O:
        nothing is held back from the client)."""
        usage = self.usage
        if usage is not None:
            usage.feed(data)
        answer = self.answer
        if answer is not None:
            answer.feed(data)

    @property
    def hidden_rounds(self) -> int:
        """How many hidden retrieval rounds the answer took."""
        return self.rounds.count if self.rounds is not None else 0
