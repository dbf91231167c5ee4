"""What a stage of the request path is: a feature's three moments in an exchange.

A stage is one object per process (its services given when the app starts); everything about
one request is on the :class:`~proxy.server.exchange.exchange.Exchange` it is handed. Each hook
is optional: the chain calls only the ones a stage defines (``Chain`` looks once, at start-up).
"""

from __future__ import annotations

from typing import ClassVar

from proxy.server.exchange.exchange import Exchange


class Stage:
    """One feature of the request path (subclass it; define the hooks it needs)."""

    name: ClassVar[str]  # how the chain, its tests and its readers call it
    count_tokens: ClassVar[bool] = True  # takes part in /v1/messages/count_tokens as well

    async def request(self, ex: Exchange) -> None:
        """Before the request goes upstream, in list order. Raise a ``ProxyError`` to answer
        it here (nothing goes upstream; the stages after this one never see it)."""

    async def response(self, ex: Exchange) -> None:
        """The upstream answered (``ex.upstream``: status and headers, the body not yet read),
        or its call failed (``ex.error``), in reverse list order, before the client's answer
        begins: what to add to the answer's headers."""

    def end(self, ex: Exchange) -> None:
        """The exchange is over (``ex.ended`` says how), in reverse list order; only for a stage
        whose ``request`` returned. Records what it did: queue, never wait; never raise."""


def defines(stage: Stage, hook: str) -> bool:
    """Whether ``stage`` has its own ``hook`` (not the base class's empty one)."""
    return getattr(type(stage), hook) is not getattr(Stage, hook)
