"""L3: drop whole old interactions between the first user turn and the recent window.

Landmarks of a view (indices into the entries):

* the *head*: everything before the first assistant message (messages[0], the original intent,
  and anything before it), extended past the last provider ``compaction`` block (it and
  everything before it is never touched) up to the next assistant message. The head always ends
  on a user (or system) entry;
* the *window*: the last ``keep_recent`` messages, widened toward older messages until it starts
  with a client assistant message, so no tool_use/tool_result pair (and no assistant turn) is ever
  split. The latest assistant message is therefore always in the window. When the window alone
  is over the target it shrinks the same way, whole interactions at a time, down to the latest
  assistant message (no thrash: the next turns stay under the threshold and reuse the plan);
* the *interactions* in between: an interaction is an assistant message and every non-assistant
  message up to the next assistant message (its user reply, role-system entries). A previous
  bridge pair right after the head is the first interaction.

The oldest interactions go first, whole, until the view (with the bridge it will need) is under
the target. ``role: "system"`` entries of removed interactions are kept, right after the bridge
(or the head). Text the user typed in removed user messages (plain turns, or text next to
tool_results) is carried into the bridge, without the client's own wrappers (``noise``); images
and tool results are not. A previous bridge is
always replaced, never kept next to a new one: its summary goes into the new summary request
(incremental summarisation) and its carried texts are carried again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.core.compaction.bridge import Bridge, carry_texts
from proxy.core.compaction.context import LayerContext, frozen_len
from proxy.core.compaction.noise import typed_text
from proxy.core.compaction.view import Entry, FromClient, Inserted, Message, blocks_of

__all__ = ["Region", "choose_region", "typed_user_texts", "window_start"]


@dataclass(frozen=True, slots=True)
class Region:
    """A cut: what stays (``head``, ``system``, ``rest``) and what goes (``removed``)."""

    head: tuple[Entry, ...]
    removed: tuple[Entry, ...]  # client messages that go, in order (no system, no old bridge)
    system: tuple[Entry, ...]  # role-system entries of the removed span, kept
    rest: tuple[Entry, ...]  # from the first kept interaction to the end
    previous: Bridge | None  # the bridge this cut replaces
    carried: tuple[str, ...]  # the user texts the new bridge carries
    removed_tokens: int  # raw tokens of everything removed, old bridge included
    # raw tokens of the view this cut makes, with the bridge at its largest (a summary of
    # ``summary_max_tokens``): what the request will weigh at most once the summary is in
    kept_tokens: int = 0
    # every entry the cut takes out, in order (removed messages, role-system entries, an old
    # bridge): with the head, what a provider compaction summarises
    span: tuple[Entry, ...] = ()

    def assemble(self, bridge: Bridge, ctx: LayerContext) -> list[Entry]:
        """The new view with ``bridge`` (if not empty) between the head and the rest; a
        provider compaction's bridge replaces the head too (its block comes first)."""
        inserted: list[Entry] = []
        if not bridge.empty:
            for message in bridge.messages():
                inserted.append(ctx.entry(Inserted(message)))
        if bridge.compaction is not None:
            return [*inserted, *self.system, *self.rest]
        return [*self.head, *inserted, *self.system, *self.rest]

    @property
    def head_indices(self) -> tuple[int, ...]:
        """The client messages of the head (a provider compaction summarises them too)."""
        return tuple(e.origin for e in self.head if e.origin is not None)

    @property
    def message_indices(self) -> tuple[int, ...]:
        return tuple(e.origin for e in self.removed if e.origin is not None)

    @property
    def tool_use_ids(self) -> tuple[str, ...]:
        ids: list[str] = []
        for entry in self.removed:
            for block in blocks_of(entry.message):
                if isinstance(block, Mapping) and block.get("type") == "tool_use":
                    uid = block.get("id")
                    if isinstance(uid, str):
                        ids.append(uid)
        return tuple(ids)


def typed_user_texts(message: Message) -> list[str]:
    """Text the user typed in a user message: a string content, or its ``text`` blocks, without
    what the client wrote there itself (``noise.typed_text``: reminders, notifications, the
    slash-command envelope, interruption markers)."""
    if message.get("role") != "user":
        return []
    content = message.get("content")
    if isinstance(content, str):
        typed = typed_text(content)
        return [typed] if typed else []
    out: list[str] = []
    for block in blocks_of(message):
        if isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            typed = typed_text(text) if isinstance(text, str) else ""
            if typed:
                out.append(typed)
    return out


def _head_end(entries: Sequence[Entry]) -> int:
    """Index of the first entry after the head (the first assistant after the frozen part)."""
    start = max(frozen_len(entries), 1)
    for i in range(start, len(entries)):
        if entries[i].role == "assistant":
            return i
    return len(entries)


def _window_start(entries: Sequence[Entry], keep_recent: int) -> int:
    for i in range(len(entries) - keep_recent, -1, -1):
        if entries[i].role == "assistant" and isinstance(entries[i].item, FromClient):
            return i
    return -1


def bridge_reserve(bridge: Bridge, ctx: LayerContext) -> int:
    """Raw tokens the new bridge may take: the summary's cap, or the fallback if larger."""
    fallback = 0 if bridge.empty else sum(ctx.counter.count_message(m) for m in bridge.messages())
    if not ctx.policy.summarize:
        return fallback
    with_summary = Bridge("", bridge.carried)
    pair = sum(ctx.counter.count_message(m) for m in with_summary.messages())
    return max(fallback, pair + ctx.policy.summary_max_tokens)


def _latest_client_assistant(entries: Sequence[Entry]) -> int:
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].role == "assistant" and isinstance(entries[i].item, FromClient):
            return i
    return -1


def window_start(entries: Sequence[Entry], keep_recent: int) -> int:
    """Where the recent window (``keep_recent`` messages, widened to start on a client
    assistant message) starts; ``len(entries)`` when there is none."""
    start = _window_start(entries, keep_recent)
    return start if start >= 0 else len(entries)


def choose_region(
    entries: Sequence[Entry], ctx: LayerContext, previous: Bridge | None
) -> Region | None:
    """The smallest cut of whole oldest interactions that reaches the target (or, when none
    does, the cut that keeps the fewest tokens); ``None`` when there is nothing to cut or no cut
    would make the view smaller (a bridge can cost more than a few short turns).

    The cut first goes up to the recent window; when that is not enough (the window alone is
    over the target), the window shrinks, one interaction at a time (an assistant message with
    its replies: pairs never split), down to the latest assistant message and what follows it.
    Otherwise every later turn would be over the threshold again and compact anew."""
    head_end = _head_end(entries)
    window = _window_start(entries, ctx.policy.keep_recent)
    latest = _latest_client_assistant(entries) if ctx.policy.shrink_window else window
    if latest <= head_end:
        return None
    starts = [i for i in range(head_end, latest) if entries[i].role == "assistant"]
    # A previous bridge pair is the first interaction: it always goes with the first real one.
    has_old_bridge = isinstance(entries[head_end].item, Inserted)
    if has_old_bridge:
        starts = starts[1:]
    else:
        previous = None
    if not starts:
        return None
    bounds = [*starts[1:], latest]
    head = tuple(entries[:head_end])
    prev_carried = previous.carried if previous is not None else ()
    prev_summary = previous.summary if previous is not None else None
    current = sum(e.tokens for e in entries)
    # Running figures for "cut everything before bounds[k]": what goes and what stays.
    removed_tokens = sum(e.tokens for e in entries[head_end : starts[0]] if e.role != "system")
    system_tokens = sum(e.tokens for e in entries[head_end : starts[0]] if e.role == "system")
    rest_tokens = sum(e.tokens for e in entries[starts[0] :])
    base = sum(e.tokens for e in head)
    new_texts: list[str] = []
    Cut = tuple[int, int, tuple[str, ...]]  # (kept tokens, k, carried)
    best: Cut | None = None  # the cut that keeps the fewest tokens, up to the window
    deepest: Cut | None = None  # the same, the window's own interactions included
    for k, (start, end) in enumerate(zip(starts, bounds, strict=True)):
        for e in entries[start:end]:
            rest_tokens -= e.tokens
            if e.role == "system":
                system_tokens += e.tokens
                continue
            removed_tokens += e.tokens
            if e.origin is not None:
                new_texts.extend(typed_user_texts(e.message))
        carried = carry_texts(prev_carried, new_texts, ctx.policy.carried_text_cap, ctx.text_tokens)
        reserve = bridge_reserve(Bridge(prev_summary, carried), ctx)
        kept = base + reserve + system_tokens + rest_tokens
        if ctx.calibrated_total(kept) <= ctx.policy.target:
            best = (kept, k, carried)
            break
        if end <= window and (best is None or kept < best[0]):
            best = (kept, k, carried)
        if deepest is None or kept < deepest[0]:
            deepest = (kept, k, carried)
    else:
        # no cut reaches the target: the best one up to the window, unless it leaves the view
        # over the threshold while shrinking the window gets it under (else: thrash)
        threshold = ctx.policy.threshold
        if deepest is not None and ctx.calibrated_total(deepest[0]) <= threshold and (
            best is None or ctx.calibrated_total(best[0]) > threshold
        ):
            best = deepest
        elif best is None:
            best = deepest
    if best is None or best[0] >= current:
        return None  # the bridge would cost more than the cut saves
    _, k, carried = best
    span = entries[head_end : bounds[k]]
    removed = tuple(e for e in span if e.role != "system" and e.origin is not None)
    return Region(
        head=head,
        removed=removed,
        system=tuple(e for e in span if e.role == "system"),
        rest=tuple(entries[bounds[k] :]),
        previous=previous,
        carried=carried,
        removed_tokens=sum(e.tokens for e in span if e.role != "system"),
        kept_tokens=best[0],
        span=tuple(span),
    )
