"""The store over SQL: the table families composed into one class, whatever the database.

Each family states its queries once (``proxy.store.sql``): durable state (``durable``),
transcripts (``transcripts``), agents (``agents``), what compaction keeps (``plans``), the usage
ledger (``usage``), quota counters (``quota``); the source records and the collector's operations
are functions of a store (``source_records``, ``retention``). A backend subclasses
:class:`SQLStore` with its connections and its three lanes: ``proxy.store.sqlite``,
``proxy.store.postgres``.
"""

from __future__ import annotations

import asyncio

from proxy.store.agents import AgentsFamily
from proxy.store.durable import DurableFamily
from proxy.store.errors import StoreError, StoreUnavailable
from proxy.store.health import StoreHealth
from proxy.store.plans import PlansFamily
from proxy.store.quota import QuotaFamily
from proxy.store.sql import Tx
from proxy.store.transcripts import TranscriptsFamily
from proxy.store.usage import LedgerFamily
from proxy.store.values import AppliedMigration

__all__ = ["PING_TIMEOUT_SECONDS", "SQLStore"]

PING_TIMEOUT_SECONDS = 5.0


class SQLStore(
    DurableFamily, TranscriptsFamily, AgentsFamily, PlansFamily, LedgerFamily, QuotaFamily
):
    """A :class:`proxy.store.base.Store` over SQL; a backend supplies the lanes."""

    def __init__(self) -> None:
        super().__init__()
        self.health = StoreHealth()

    async def applied_migrations(self) -> tuple[AppliedMigration, ...]:
        async def job(tx: Tx) -> tuple[AppliedMigration, ...]:
            rows = await tx.rows(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
            )
            return tuple(AppliedMigration(int(v), str(n), str(at)) for v, n, at in rows)

        return await self._read(job)

    async def ping(self) -> bool:
        """True when the database answers a read of the session table (``/readyz``)."""

        async def job(tx: Tx) -> bool:
            await tx.value("SELECT count(*) FROM (SELECT 1 FROM durable_changes LIMIT 1) AS one")
            return True

        started = self.health.begin()
        try:
            async with asyncio.timeout(PING_TIMEOUT_SECONDS):
                return await self._read(job, "session reads")
        except TimeoutError:  # the read was cancelled before it could report: reported here
            self.health.ended(
                "session reads", started, StoreUnavailable("the store did not answer in time")
            )
            return False
        except StoreError:
            return False
