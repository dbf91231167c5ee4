"""L1: cut oversized ``tool_result`` contents down to a head and a tail.

A result whose text is over ``policy.tool_result_cap`` tokens keeps ``cap`` tokens' worth of
characters (the character count proportionate to tokens, so the cut is deterministic and needs no
tokenizer round trip): half from the start, half from the end, with a marker between them saying
how much went. In list content only ``text`` blocks are cut (each in proportion to its share);
images, documents and every other block stay as they are.

Never touched: the last message, assistant messages, anything up to a provider ``compaction``
block, and results already cut. Oldest results go first; the layer stops as soon as the view is
under the target. The pipeline spares the recent window (``keep_recent``) on the first pass and
cuts inside it only when pruning (and shrinking the window) cannot get the view under target.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from proxy.core.compaction.context import LayerContext, frozen_len
from proxy.core.compaction.manifest import Truncated
from proxy.core.compaction.view import (
    BlockOp,
    Cut,
    Entry,
    FromClient,
    Keep,
    blocks_of,
    strip_markers,
)

__all__ = ["Artifact", "artifact_of", "artifact_pointer", "cut_text", "truncate", "truncation_marker"]


class Artifact(NamedTuple):
    name: str
    data: bytes
    sha256: str


def artifact_of(content: Any) -> Artifact:
    """The artifact that keeps a cut result's full text: a content-addressed name and its bytes
    (the text itself for a string result; canonical JSON for a list of blocks)."""
    if isinstance(content, str):
        data, suffix = content.encode("utf-8", "surrogatepass"), "txt"
    else:
        data, suffix = orjson.dumps(content, option=orjson.OPT_SORT_KEYS), "json"
    digest = hashlib.sha256(data).hexdigest()
    return Artifact(f"tool-result-{digest[:32]}.{suffix}", data, digest)


def artifact_pointer(session: str, content: Any) -> str:
    artifact = artifact_of(content)
    return f"artifact:{session}:{artifact.name}:{artifact.sha256}"


def truncation_marker(removed: int, total: int, pointer: str | None = None) -> str:
    """The note left where a result was cut; ``pointer`` names where the full text is kept."""
    text = f"[context-proxy: truncated {removed} of {total} tokens from this tool result"
    if pointer is not None:
        text += f"; full text: {pointer}"
    return text + "]"


def cut_text(text: str, tokens: int, keep_tokens: int, pointer: str | None = None) -> str:
    """``text`` (``tokens`` long) cut to about ``keep_tokens``: head, marker, tail."""
    keep_chars = len(text) * max(keep_tokens, 0) // max(tokens, 1)
    head = (keep_chars + 1) // 2
    tail = keep_chars - head
    marker = truncation_marker(max(tokens - keep_tokens, 0), tokens, pointer)
    parts = [text[:head], marker]
    if tail > 0:
        parts.append(text[len(text) - tail :])
    return "\n".join(p for p in parts if p)


def _cut_content(content: Any, ctx: LayerContext, pointer: str | None) -> Any | None:
    """The cut content of one tool_result, or ``None`` when it is within the cap."""
    cap = ctx.policy.tool_result_cap
    count = ctx.text_tokens
    if isinstance(content, str):
        tokens = count(content)
        return cut_text(content, tokens, cap, pointer) if tokens > cap else None
    if not isinstance(content, list):
        return None
    sizes = [
        count(b["text"])
        if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        else 0
        for b in content
    ]
    total = sum(sizes)
    if total <= cap:
        return None
    out: list[Any] = []
    for block, size in zip(content, sizes, strict=True):
        if size == 0:
            out.append(block)
            continue
        keep = cap * size // total
        out.append({**block, "text": cut_text(block["text"], size, keep, pointer)})
    return out


def truncate(
    entries: Sequence[Entry], ctx: LayerContext, stop: int | None = None, extra: int = 0
) -> tuple[list[Entry], list[Truncated]]:
    """Apply L1 oldest-first until the view is under the target.

    ``stop``: only entries before it are cut (the recent window is spared); ``extra``: raw tokens
    of the request outside ``entries`` (when ``entries`` is part of a view)."""
    view = list(entries)
    records: list[Truncated] = []
    raw = sum(e.tokens for e in view) + extra
    if ctx.calibrated_total(raw) <= ctx.policy.target:
        return view, records
    count = ctx.counter.count_block
    end = len(view) - 1 if stop is None else min(stop, len(view) - 1)
    for i in range(frozen_len(view), end):
        entry = view[i]
        item = entry.item
        if entry.role != "user" or not isinstance(item, FromClient):
            continue
        content = blocks_of(entry.message)
        ops: list[BlockOp] = (
            list(item.blocks) if item.blocks is not None else [Keep(j) for j in range(len(content))]
        )
        found: list[Truncated] = []
        for j, block in enumerate(content):
            op = ops[j]
            if not isinstance(op, Keep):
                continue  # already cut by an earlier compaction
            if not isinstance(block, Mapping) or block.get("type") != "tool_result":
                continue
            original = block.get("content")
            pointer = (
                artifact_pointer(ctx.artifact_session, original)
                if ctx.artifact_session is not None
                else None
            )
            new_content = _cut_content(original, ctx, pointer)
            if new_content is None:
                continue
            before = count(block)
            after = count({**block, "content": new_content})
            if after >= before:
                continue
            ops[j] = Cut(op.index, strip_markers(new_content))
            found.append(
                Truncated(item.origin, str(block.get("tool_use_id", "")), before, after, pointer)
            )
        if not found:
            continue
        view[i] = ctx.entry(FromClient(item.origin, tuple(ops)))
        raw += view[i].tokens - entry.tokens
        records.extend(found)
        if ctx.calibrated_total(raw) <= ctx.policy.target:
            break
    return view, records
