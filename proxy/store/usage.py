"""The usage family: the ledger in the store, one row per upstream call, per tenant (the table:
migrations 5 and 9 of :mod:`proxy.store.schema`).

The same SQL serves both backends (``proxy.store.sql``). Rows keep the billed usage figures in
columns (and the provider's whole ``usage`` object as JSON), the provider's compaction share and
notes, the time twice (``at``: ISO 8601 text as shown; ``at_ms``: epoch milliseconds, for ranges
and buckets). Aggregates are computed in SQL as the additive :class:`proxy.core.ledger.Sums` per
model (and per time bucket or session); pricing them is the core's job.

``id`` is assigned by the store and increases; it is the paging cursor. On PostgreSQL two
replicas' concurrent batches may commit out of id order, so a reader paging by id at that very
moment can miss a row committed late; ranges by time are exact.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from proxy.core.bounded import FunctionMemo
from proxy.core.durable import FieldError, InvalidWrite
from proxy.core.ledger import KINDS, SUM_FIELDS, LedgerEntry, ProviderNotes, Sums, Usage
from proxy.store.checks import check_keys, storable
from proxy.store.schema import LEDGER_COLUMNS as COLUMNS
from proxy.store.sql import Jobs, Row, Tx

__all__ = [
    "MAX_USAGE_LIMIT",
    "LedgerFamily",
    "UsageGroup",
    "UsageQuery",
    "UsageRow",
    "check_entry",
    "cutoff_ms",
]

MAX_USAGE_LIMIT = 1000
# rows of an aggregate answer (buckets x models, sessions x models); one more is returned when
# there are more (the caller refuses the range rather than answer with part of it)
MAX_GROUPS = 100_000
DELETE_CHUNK = 5000
_MAX_TEXT = 1000

_INSERT = (
    f"INSERT INTO usage_ledger ({', '.join(COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in COLUMNS)})"
)
_SELECT = f"SELECT id, {', '.join(COLUMNS)} FROM usage_ledger"

_HAS_REMOVED = (
    "usage_json IS NOT NULL AND tokens_after > 0 AND tokens_before > tokens_after"
)
_REMOVED = "CAST(tokens_before - tokens_after AS DOUBLE PRECISION)"
# what the answer was sampled from: the billed figures minus the provider's compaction iterations
_SENT_READ = (
    "(COALESCE(cache_read_input_tokens, 0) - COALESCE(provider_compaction_cache_read_input_tokens, 0))"
)
_SENT_UNCACHED = (
    "(COALESCE(input_tokens, 0) + COALESCE(cache_creation_input_tokens, 0)"
    " - COALESCE(provider_compaction_input_tokens, 0)"
    " - COALESCE(provider_compaction_cache_creation_input_tokens, 0))"
)


def _sum(column: str) -> str:
    return f"COALESCE(SUM({column}), 0)"


def _priced_5m(creation: str, one_hour: str) -> str:
    return (
        f"COALESCE(SUM(CASE WHEN COALESCE({creation}, 0) > COALESCE({one_hour}, 0)"
        f" THEN COALESCE({creation}, 0) - COALESCE({one_hour}, 0) ELSE 0 END), 0)"
    )

# One SQL expression per field of ``Sums``, in its order (``proxy.core.ledger.row_sums`` is the
# same per row, in Python; a test checks they agree).
_SUM_SQL: dict[str, str] = {
    "calls": "COUNT(*)",
    "client_calls": "SUM(CASE WHEN kind = 'client' THEN 1 ELSE 0 END)",
    "summary_calls": "SUM(CASE WHEN kind = 'summary' THEN 1 ELSE 0 END)",
    "retrieval_calls": "SUM(CASE WHEN kind = 'retrieval' THEN 1 ELSE 0 END)",
    "errors": "SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END)",
    "input_tokens": "COALESCE(SUM(input_tokens), 0)",
    "cache_creation_input_tokens": "COALESCE(SUM(cache_creation_input_tokens), 0)",
    "cache_creation_5m_input_tokens": "COALESCE(SUM(cache_creation_5m), 0)",
    "cache_creation_1h_input_tokens": "COALESCE(SUM(cache_creation_1h), 0)",
    "cache_read_input_tokens": "COALESCE(SUM(cache_read_input_tokens), 0)",
    "output_tokens": "COALESCE(SUM(output_tokens), 0)",
    "tokens_before": "COALESCE(SUM(tokens_before), 0)",
    "tokens_after": "COALESCE(SUM(tokens_after), 0)",
    "compaction_events": "SUM(CASE WHEN plan = 'new' AND compaction_id IS NOT NULL"
    " AND compaction_id <> '' THEN 1 ELSE 0 END)",
    "summary_failures": "SUM(CASE WHEN summary = 'failed' THEN 1 ELSE 0 END)",
    "removed_read": f"COALESCE(SUM(CASE WHEN {_HAS_REMOVED} THEN {_REMOVED}"
    f" * {_SENT_READ} / tokens_after ELSE 0 END), 0)",
    "removed_uncached": f"COALESCE(SUM(CASE WHEN {_HAS_REMOVED} THEN {_REMOVED}"
    f" * {_SENT_UNCACHED} / tokens_after ELSE 0 END), 0)",
    "priced_5m": _priced_5m("cache_creation_input_tokens", "cache_creation_1h"),
    "provider_compactions": _sum("provider_compactions"),
    "provider_compaction_input_tokens": _sum("provider_compaction_input_tokens"),
    "provider_compaction_cache_creation_input_tokens": _sum(
        "provider_compaction_cache_creation_input_tokens"
    ),
    "provider_compaction_cache_creation_1h_input_tokens": _sum(
        "provider_compaction_cache_creation_1h"
    ),
    "provider_compaction_cache_read_input_tokens": _sum(
        "provider_compaction_cache_read_input_tokens"
    ),
    "provider_compaction_output_tokens": _sum("provider_compaction_output_tokens"),
    "priced_5m_provider_compaction": _priced_5m(
        "provider_compaction_cache_creation_input_tokens", "provider_compaction_cache_creation_1h"
    ),
    "thinking_blocks_dropped": _sum("thinking_blocks_dropped"),
}
assert tuple(_SUM_SQL) == SUM_FIELDS
_SUMS = ", ".join(_SUM_SQL.values())


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Which rows: ``since_ms <= at_ms < until_ms``, equal fields, ``id > after``."""

    since_ms: int | None = None
    until_ms: int | None = None
    session: str | None = None
    model: str | None = None
    kind: str | None = None
    after: int = 0
    limit: int = 100
    before: int | None = None  # ``id < before`` (with ``descending``: paging newest first)
    descending: bool = False


@dataclass(frozen=True, slots=True)
class UsageRow:
    id: int
    entry: LedgerEntry


@dataclass(frozen=True, slots=True)
class UsageGroup:
    """Sums of one model's rows in one bucket (``key``: its index from ``since_ms``) or one
    session (``key``: the session id)."""

    key: int | str
    model: str
    first_ms: int
    last_ms: int
    sums: Sums


def cutoff_ms(cutoff: datetime | str | float) -> int:
    """An instant as epoch milliseconds: an aware datetime, ISO 8601 text with an offset, or
    epoch seconds. ``InvalidWrite`` otherwise."""
    if isinstance(cutoff, str):
        try:
            cutoff = datetime.fromisoformat(cutoff)
        except ValueError:
            raise InvalidWrite([FieldError("cutoff", "expected ISO 8601 with an offset")]) from None
    if isinstance(cutoff, datetime):
        if cutoff.tzinfo is None:
            raise InvalidWrite([FieldError("cutoff", "expected a time with an offset")])
        return int(cutoff.timestamp() * 1000)
    if isinstance(cutoff, int | float) and not isinstance(cutoff, bool):
        return int(cutoff * 1000)
    raise InvalidWrite([FieldError("cutoff", "expected a datetime, ISO 8601 text or seconds")])


def iso_of_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def check_entry(e: object, name: str = "entry") -> list[FieldError]:
    """What is wrong with a ledger entry (nothing: ``[]``); the store writes only good ones."""
    if not isinstance(e, LedgerEntry):
        return [FieldError(name, "expected a ledger entry")]
    errors: list[FieldError] = []
    tenant, session = e.tenant, e.session
    if type(tenant) is str and (session is None or type(session) is str):
        keys = _key_problems(tenant, session)  # a handful of tenants and sessions, over and over
    else:
        keys = _key_problems.__wrapped__(tenant, session)
    errors.extend(FieldError(f"{name}.{f.field}", f.message) for f in keys)
    if e.kind not in KINDS:
        errors.append(FieldError(f"{name}.kind", "expected client, summary or retrieval"))
    if not isinstance(e.at_ms, int) or isinstance(e.at_ms, bool):
        errors.append(FieldError(f"{name}.at_ms", "expected epoch milliseconds"))
    count = e.provider_compactions
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        errors.append(FieldError(f"{name}.provider_compactions", "expected a count"))
    if e.provider_compaction is not None and not isinstance(e.provider_compaction, Usage):
        errors.append(FieldError(f"{name}.provider_compaction", "expected usage figures"))
    if e.provider_notes is not None and not isinstance(e.provider_notes, ProviderNotes):
        errors.append(FieldError(f"{name}.provider_notes", "expected provider notes"))
    for field_name in ("model", "route", "layers", "plan", "summary", "compaction_id",
                       "request_id", "at", "agent"):  # fmt: skip
        value = getattr(e, field_name)
        if value is not None and (not isinstance(value, str) or len(value) > _MAX_TEXT):
            errors.append(FieldError(f"{name}.{field_name}", "expected short text"))
        elif isinstance(value, str) and not storable(value):
            errors.append(FieldError(f"{name}.{field_name}", "contains a NUL or invalid Unicode"))
    return errors


@functools.lru_cache(maxsize=4096)
def _key_problems(tenant: object, session: object | None) -> tuple[FieldError, ...]:
    """What ``check_keys`` finds wrong with a tenant and session id (memoised for str keys)."""
    try:
        check_keys(tenant, session)
    except InvalidWrite as exc:
        return tuple(exc.errors)
    return ()


# the key checks' memo, for the metrics (``ledger_key_checks``): a tenant and session, their problems
KEY_CHECKS = FunctionMemo("ledger_key_checks", _key_problems, entry_bytes=330)


_USAGE_COLUMNS = (
    "input_tokens", "cache_creation_input_tokens", "cache_creation_5m", "cache_creation_1h",
    "cache_read_input_tokens", "output_tokens",
)  # fmt: skip
_COMPACTION_COLUMNS = tuple(f"provider_compaction_{c}" for c in _USAGE_COLUMNS)


def _figures(u: Usage | None) -> tuple[int | None, ...]:
    """A usage's figures in the order of :data:`_USAGE_COLUMNS`."""
    if u is None:
        return (None,) * len(_USAGE_COLUMNS)
    return (
        u.input_tokens, u.cache_creation_input_tokens, u.cache_creation_5m, u.cache_creation_1h,
        u.cache_read_input_tokens, u.output_tokens,
    )  # fmt: skip


def _json_text(value: object) -> str | None:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # not JSON (a caller's own object, a lone surrogate): not kept
        return None


def _params(entries: Sequence[LedgerEntry]) -> list[tuple[Any, ...]]:
    errors = [err for i, e in enumerate(entries) for err in check_entry(e, f"entries[{i}]")]
    if errors:
        raise InvalidWrite(errors)
    rows = []
    for e in entries:
        u = e.usage
        raw = None
        if u is not None:
            raw = _json_text(e.provider_usage) if e.provider_usage is not None else None
            raw = raw or _json_text(u.to_json())
        notes = e.provider_notes
        rows.append(
            (
                e.tenant, e.at, e.at_ms, e.session, e.model, e.route, e.kind, int(e.status),
                float(e.latency_ms), e.request_id, e.tokens_before, e.tokens_after, e.layers,
                e.plan, e.summary, e.compaction_id, *_figures(u), raw,
                e.provider_compactions, *_figures(e.provider_compaction),
                None if notes is None else _json_text(notes.to_json()),
                0 if notes is None else notes.thinking_blocks_dropped,
                e.agent,
            )
        )  # fmt: skip
    return rows


def _usage(values: dict[str, Any], columns: tuple[str, ...]) -> Usage | None:
    figures = [values[c] for c in columns]
    return None if all(f is None for f in figures) else Usage(*figures)


def _decode(row: Row) -> UsageRow:
    """A stored row. Its figures are the columns (what the sums add up): the billed ones, or, in a
    row written before migration 9, the top-level ones the ledger billed then."""
    values = dict(zip(("id", *COLUMNS), row, strict=True))
    raw = values["usage_json"]
    provider = orjson.loads(raw) if raw is not None else None
    notes = values["provider_notes"]
    entry = LedgerEntry(
        at=values["at"],
        at_ms=int(values["at_ms"]),
        tenant=values["tenant"],
        session=values["session"],
        model=values["model"],
        route=values["route"],
        kind=values["kind"],
        status=int(values["status"]),
        latency_ms=float(values["latency_ms"]),
        request_id=values["request_id"],
        tokens_before=values["tokens_before"],
        tokens_after=values["tokens_after"],
        layers=values["layers"],
        plan=values["plan"],
        summary=values["summary"],
        compaction_id=values["compaction_id"],
        usage=_usage(values, _USAGE_COLUMNS) if provider is not None else None,
        provider_usage=provider,
        provider_compaction=_usage(values, _COMPACTION_COLUMNS),
        provider_compactions=int(values["provider_compactions"] or 0),
        provider_notes=None if notes is None else ProviderNotes.from_json(
            orjson.loads(notes), int(values["thinking_blocks_dropped"] or 0)
        ),
        agent=values["agent"],
    )
    return UsageRow(int(values["id"]), entry)


def _where(tenant: str, q: UsageQuery) -> tuple[str, list[Any]]:
    clauses = ["tenant = ?"]
    params: list[Any] = [tenant]
    for column, value in (("session", q.session), ("model", q.model), ("kind", q.kind)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if q.since_ms is not None:
        clauses.append("at_ms >= ?")
        params.append(q.since_ms)
    if q.until_ms is not None:
        clauses.append("at_ms < ?")
        params.append(q.until_ms)
    return " AND ".join(clauses), params


def _rows_sql(tenant: str, q: UsageQuery) -> tuple[str, list[Any]]:
    where, params = _where(tenant, q)
    limit = max(1, min(q.limit, MAX_USAGE_LIMIT))
    if q.before is not None:
        where += " AND id < ?"
        params.append(q.before)
    order = "DESC" if q.descending else ""
    return (
        f"{_SELECT} WHERE {where} AND id > ? ORDER BY id {order} LIMIT ?",
        [*params, q.after, limit],
    )


def _groups_sql(
    tenant: str, q: UsageQuery, by: Literal["bucket", "session"], bucket_ms: int
) -> tuple[str, list[Any]]:
    where, params = _where(tenant, q)
    if by == "bucket":
        if q.since_ms is None or bucket_ms < 1:
            raise InvalidWrite([FieldError("bucket", "needs since and a bucket length")])
        key = "(at_ms - ?) / ?"
        key_params: list[Any] = [q.since_ms, bucket_ms]
    else:
        key = "session"
        key_params = []
        where += " AND session IS NOT NULL"
    sql = (
        f"SELECT {key} AS k, model, MIN(at_ms), MAX(at_ms), {_SUMS} FROM usage_ledger"
        f" WHERE {where} GROUP BY k, model ORDER BY k, model LIMIT {MAX_GROUPS + 1}"
    )
    return sql, [*key_params, *params]


def _group(row: Row) -> UsageGroup:
    key, model, first, last, *sums = row
    values: dict[str, Any] = {
        name: float(v) if name.startswith("removed_") else int(v)
        for name, v in zip(SUM_FIELDS, sums, strict=True)
    }
    return UsageGroup(
        key if isinstance(key, str) else int(key), model, int(first), int(last), Sums(**values)
    )


def _delete_sql(tenant: str | None) -> str:
    scope = "tenant = ? AND " if tenant is not None else ""
    return (
        "DELETE FROM usage_ledger WHERE id IN (SELECT id FROM usage_ledger"
        f" WHERE {scope}at_ms < ? LIMIT {DELETE_CHUNK})"
    )


def _checked_query(tenant: str, q: UsageQuery) -> None:
    check_keys(tenant)
    if not isinstance(q, UsageQuery):
        raise InvalidWrite([FieldError("query", "expected a usage query")])


class LedgerFamily(Jobs):
    """``record_usage``, ``usage_rows``, ``usage_groups``, ``delete_usage_before``."""

    async def record_usage(self, entries: Sequence[LedgerEntry]) -> None:
        """Append ledger rows (any tenants), all or nothing; ``InvalidWrite`` names bad ones."""
        rows = _params(tuple(entries))
        if not rows:
            return

        async def job(tx: Tx) -> None:
            async with tx.transaction():
                await tx.executemany(_INSERT, rows)

        await self._run(job)

    async def usage_rows(self, tenant: str, query: UsageQuery) -> tuple[UsageRow, ...]:
        _checked_query(tenant, query)
        sql, params = _rows_sql(tenant, query)

        async def job(tx: Tx) -> tuple[UsageRow, ...]:
            return tuple(_decode(r) for r in await tx.rows(sql, *params))

        # the write lane: after the ledger batches queued before (a flush, then a read)
        return await self._run(job)

    async def usage_groups(
        self,
        tenant: str,
        query: UsageQuery,
        by: Literal["bucket", "session"],
        bucket_ms: int = 0,
    ) -> tuple[UsageGroup, ...]:
        _checked_query(tenant, query)
        sql, params = _groups_sql(tenant, query, by, bucket_ms)

        async def job(tx: Tx) -> tuple[UsageGroup, ...]:
            return tuple(_group(r) for r in await tx.rows(sql, *params))

        return await self._run(job)

    async def delete_usage_before(
        self, tenant: str | None, cutoff: datetime | str | float
    ) -> int:
        """Delete the rows (of ``tenant``, or of every tenant) recorded before ``cutoff``, in
        chunks (a short write lock each); returns how many."""
        if tenant is not None:
            check_keys(tenant)
        ms = cutoff_ms(cutoff)
        sql = _delete_sql(tenant)
        params = (tenant, ms) if tenant is not None else (ms,)

        async def job(tx: Tx) -> int:
            return await tx.execute(sql, *params)

        total = 0
        while True:
            deleted = await self._run(job)
            total += deleted
            if deleted < DELETE_CHUNK:
                return total
