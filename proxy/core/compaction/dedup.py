"""L2: drop file reads that a later read of the same file supersedes.

A read is a ``tool_use`` that the policy's ``read_tools`` recognise (Claude Code ``Read``, the
text editor's ``view``, ``read_file``); edits, writes and every other tool are never touched. An
earlier read is superseded by a later one of the same family and normalised path whose result is
present and not an error, and which reads the whole file or exactly the same range.

Removing a read removes its ``tool_use`` from the assistant message and its ``tool_result`` from
the next message; other blocks (parallel calls, text, thinking) stay, by reference. When the
assistant message is left with nothing but thinking, or the user message with nothing, the whole
interaction (that assistant message and its user message) goes, which keeps roles alternating.
A read is left alone when that would also drop text or images the user typed next to the result.

Never touched: the latest assistant message, the last message, anything up to a provider
``compaction`` block. Oldest reads go first; the layer stops as soon as the view is under target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.core.compaction.context import LayerContext, frozen_len, latest_assistant
from proxy.core.compaction.manifest import Removed
from proxy.core.compaction.view import BlockOp, Entry, FromClient, Keep, blocks_of

__all__ = ["dedup", "superseded_reads"]

_THINKING = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True, slots=True)
class _Read:
    position: int  # entry index of the assistant message
    block: int
    tool_use_id: str
    key: tuple[str, str]  # (family, normalised path)
    read_range: tuple[object, ...] | None
    ok: bool  # answered with a result that is not an error
    removable: bool


def _results(message: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    out: dict[str, Mapping[str, object]] = {}
    for block in blocks_of(message):
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            uid = block.get("tool_use_id")
            if isinstance(uid, str):
                out[uid] = block
    return out


def _reads(entries: Sequence[Entry], ctx: LayerContext) -> list[_Read]:
    frozen = frozen_len(entries)
    latest = latest_assistant(entries)
    out: list[_Read] = []
    for i, entry in enumerate(entries):
        if entry.role != "assistant" or i + 1 >= len(entries):
            continue
        answer = entries[i + 1]
        results = _results(answer.message) if answer.role == "user" else {}
        removable = (
            frozen <= i
            and i != latest
            and i + 1 != len(entries) - 1
            and isinstance(entry.item, FromClient)
            and isinstance(answer.item, FromClient)
        )
        for j, block in enumerate(blocks_of(entry.message)):
            if not isinstance(block, Mapping) or block.get("type") != "tool_use":
                continue
            found = ctx.policy.read_of(block.get("name"), block.get("input"))
            uid = block.get("id")
            if found is None or not isinstance(uid, str):
                continue
            tool, path = found
            result = results.get(uid)
            tool_input = block.get("input")
            assert isinstance(tool_input, Mapping)
            out.append(
                _Read(
                    position=i,
                    block=j,
                    tool_use_id=uid,
                    key=(tool.family, path),
                    read_range=tool.read_range(tool_input),
                    ok=result is not None and result.get("is_error") is not True,
                    removable=removable and result is not None,
                )
            )
    return out


def superseded_reads(entries: Sequence[Entry], ctx: LayerContext) -> list[str]:
    """Ids of the removable reads that a later read covers, oldest first."""
    reads = _reads(entries, ctx)
    # Scan newest to oldest, remembering per file the ranges a later good read covers.
    later: dict[tuple[str, str], set[tuple[object, ...] | None]] = {}
    found: list[str] = []
    for read in reversed(reads):
        covered = later.get(read.key)
        wanted = _hashable(read.read_range)
        if read.removable and covered is not None and (None in covered or wanted in covered):
            found.append(read.tool_use_id)
        if read.ok:
            later.setdefault(read.key, set()).add(wanted)
    found.reverse()
    return found


def _hashable(value: tuple[object, ...] | None) -> tuple[object, ...] | None:
    if value is None:
        return None
    return tuple(repr(v) if isinstance(v, list | dict) else v for v in value)


def _ops(entry: Entry) -> list[BlockOp]:
    item = entry.item
    assert isinstance(item, FromClient)
    if item.blocks is not None:
        return list(item.blocks)
    return [Keep(j) for j in range(len(blocks_of(entry.message)))]


def _remove_one(view: list[Entry], uid: str, ctx: LayerContext) -> Removed | None:
    """Remove one read from ``view`` in place (``view`` is the layer's own list)."""
    for i in range(len(view) - 1):
        content = blocks_of(view[i].message)
        j = next(
            (
                j
                for j, b in enumerate(content)
                if isinstance(b, Mapping) and b.get("type") == "tool_use" and b.get("id") == uid
            ),
            None,
        )
        if j is None:
            continue
        assistant, answer = view[i], view[i + 1]
        answer_blocks = blocks_of(answer.message)
        k = next(
            k
            for k, b in enumerate(answer_blocks)
            if isinstance(b, Mapping)
            and b.get("type") == "tool_result"
            and b.get("tool_use_id") == uid
        )
        rest_a = [b for n, b in enumerate(content) if n != j]
        rest_u = [b for n, b in enumerate(answer_blocks) if n != k]
        a_empty = all(isinstance(b, Mapping) and b.get("type") in _THINKING for b in rest_a)
        u_empty = not rest_u
        before = assistant.tokens + answer.tokens
        if a_empty or u_empty:
            leftover_user = [
                b for b in rest_u if not (isinstance(b, Mapping) and b.get("type") == "tool_result")
            ]
            if leftover_user:
                return None  # the user typed something next to the result: keep the read
            del view[i : i + 2]
            return Removed(
                tuple(e.origin for e in (assistant, answer) if e.origin is not None),
                (uid,),
                before,
                "dedup",
            )
        a_item, u_item = assistant.item, answer.item
        assert isinstance(a_item, FromClient) and isinstance(u_item, FromClient)
        a_ops = _ops(assistant)
        u_ops = _ops(answer)
        del a_ops[j]
        del u_ops[k]
        view[i] = ctx.entry(FromClient(a_item.origin, tuple(a_ops)))
        view[i + 1] = ctx.entry(FromClient(u_item.origin, tuple(u_ops)))
        return Removed((), (uid,), before - view[i].tokens - view[i + 1].tokens, "dedup")
    return None


def dedup(entries: Sequence[Entry], ctx: LayerContext) -> tuple[list[Entry], list[Removed]]:
    """Apply L2 oldest-first until the view is under the target."""
    view = list(entries)
    records: list[Removed] = []
    raw = sum(e.tokens for e in view)
    if ctx.calibrated_total(raw) <= ctx.policy.target:
        return view, records
    for uid in superseded_reads(view, ctx):
        record = _remove_one(view, uid, ctx)
        if record is None:
            continue
        records.append(record)
        raw -= record.tokens
        if ctx.calibrated_total(raw) <= ctx.policy.target:
            break
    return view, records
