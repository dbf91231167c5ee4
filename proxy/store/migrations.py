"""Applying the schema's migrations (``proxy.store.schema``), recorded in ``schema_migrations``;
what is pending, without applying it.

:func:`migrate` runs at every open, in one transaction (SQLite and PostgreSQL DDL are both
transactional) under the backend's migration lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an
advisory lock), so replicas opening the same database at once migrate it exactly once, and a
crash half-way leaves the previous version. A database recorded with a migration this code does
not know (a newer release wrote it) is refused with :class:`SchemaTooNew`, and nothing is changed.

What it says, on the ``context_proxy.store.migrations`` logger, when it applies anything: one line before
(``store schema 7 -> 10: applying 3 migrations (8, 9, 10)``), then one line per migration once the
transaction committed (``store migration 8 applied in 0.412 s: conversations per agent: ...``).
:func:`schema_status` reads what is recorded and what is pending without writing anything
(``context-proxy migrate --check``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from proxy.store.errors import SchemaTooNew
from proxy.store.schema import MIGRATIONS, MIGRATIONS_TABLE, Migration
from proxy.store.sql import Tx

__all__ = [
    "EMPTY",
    "LATEST",
    "MIGRATIONS",
    "Migration",
    "SchemaStatus",
    "SchemaTooNew",
    "migrate",
    "schema_status",
]

log = logging.getLogger("context_proxy.store.migrations")

LATEST = MIGRATIONS[-1].version


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """What a database records against what this release knows."""

    recorded: dict[int, str]  # version -> name, as recorded (empty: a new database)
    pending: tuple[Migration, ...]  # what opening it would apply, in order
    unknown: tuple[int, ...]  # recorded versions this release does not know (too new)

    @property
    def version(self) -> int:
        """The newest migration recorded (0: none)."""
        return max(self.recorded, default=0)

    def too_new(self) -> SchemaTooNew | None:
        if not self.unknown:
            return None
        return SchemaTooNew(self.version, LATEST, self.unknown)


def _status(recorded: dict[int, str]) -> SchemaStatus:
    known = {m.version: m.name for m in MIGRATIONS}
    unknown = tuple(sorted(v for v in recorded if known.get(v) != recorded[v]))
    pending = tuple(m for m in MIGRATIONS if m.version not in recorded)
    return SchemaStatus(dict(recorded), pending, unknown)


EMPTY = _status({})  # a database not made yet: every migration pending


async def _recorded(tx: Tx) -> dict[int, str]:
    if await tx.row(tx.dialect.has_table, "schema_migrations") is None:
        return {}
    rows = await tx.rows("SELECT version, name FROM schema_migrations")
    return {int(r[0]): str(r[1]) for r in rows}


async def schema_status(tx: Tx) -> SchemaStatus:
    """What is recorded and what is pending; reads only (a new database: every migration)."""
    return _status(await _recorded(tx))


async def migrate(
    tx: Tx,
    now: Callable[[], str],
    lock: Callable[[Tx], Coroutine[Any, Any, None]] | None = None,
) -> list[int]:
    """Apply the missing migrations in order, in one transaction (after ``lock``, the backend's
    migration lock); return the versions applied. ``SchemaTooNew`` changes nothing."""
    done: list[tuple[Migration, float]] = []
    pending: tuple[Migration, ...] = ()
    before = 0
    try:
        async with tx.transaction():
            if lock is not None:
                await lock(tx)
            await tx.execute(MIGRATIONS_TABLE)
            status = _status(await _recorded(tx))
            too_new = status.too_new()
            if too_new is not None:
                raise too_new
            pending, before = status.pending, status.version
            if pending:
                log.info(
                    "store schema %s -> %d: applying %d migration%s (%s)",
                    before or "(new store)",
                    LATEST,
                    len(pending),
                    "" if len(pending) == 1 else "s",
                    ", ".join(str(m.version) for m in pending),
                )
            for migration in pending:
                started = time.perf_counter()
                for statement in migration.statements_for(tx.dialect):
                    await tx.execute(statement)
                await tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    migration.version,
                    migration.name,
                    now(),
                )
                done.append((migration, time.perf_counter() - started))
    except BaseException as exc:
        if pending:
            log.warning(
                "store migrations rolled back (%s): the schema stays at version %d",
                type(exc).__name__,
                before,
            )
        raise
    for migration, seconds in done:
        log.info(
            "store migration %d applied in %.3f s: %s", migration.version, seconds, migration.name
        )
    return [m.version for m, _ in done]
