"""The compacted view as an edit script over the client's messages.

A view message is either ``FromClient`` (the client's ``messages[origin]``, whole or with some
blocks dropped and some ``tool_result`` contents cut) or ``Inserted`` (a bridge message written by
the proxy). Plans store these items instead of copies of the messages: a plan is only ever
applied to a request whose prefix hashes equal the plan's, so the client's own blocks are there to
be reused by reference, and a stored plan stays small.

``cache_control`` markers are never stored in an item. They are taken from the *current* request
when the item is materialised: clients such as Claude Code move their breakpoint every turn, and a
marker's position is not part of the provider's cached prefix, so the view always carries the
client's markers of this request on the blocks that survive, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.tokens import MARKER, strip_markers

__all__ = [
    "MARKER",
    "Cut",
    "Entry",
    "FromClient",
    "Inserted",
    "Keep",
    "Message",
    "ViewItem",
    "blocks_of",
    "materialize",
    "role_of",
    "strip_markers",
]

Message = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Keep:
    """The client's block ``index``, as it is in the current request."""

    index: int


@dataclass(frozen=True, slots=True)
class Cut:
    """The client's ``tool_result`` block ``index`` with its ``content`` replaced (L1)."""

    index: int
    content: Any  # a str, or a list of blocks without cache_control markers


BlockOp = Keep | Cut


@dataclass(frozen=True, slots=True)
class FromClient:
    """The client's ``messages[origin]``; ``blocks`` ``None`` means the message as it is."""

    origin: int
    blocks: tuple[BlockOp, ...] | None = None


@dataclass(frozen=True, slots=True)
class Inserted:
    """A message written by the proxy (a bridge turn). Never carries cache_control."""

    message: Message


ViewItem = FromClient | Inserted


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a working view: how it is made, what it is, its raw token estimate."""

    item: ViewItem
    message: Message
    tokens: int

    @property
    def role(self) -> str:
        return role_of(self.message)

    @property
    def origin(self) -> int | None:
        return self.item.origin if isinstance(self.item, FromClient) else None


def role_of(message: Message) -> str:
    role = message.get("role")
    return role if isinstance(role, str) else ""


def blocks_of(message: Message) -> Sequence[Any]:
    """The content blocks of a message (a string content has none)."""
    content = message.get("content")
    return content if isinstance(content, list) else ()


def _with_nested_markers(content: Any, current: Any) -> Any:
    """``content`` (stored without markers) with the markers of the current nested blocks."""
    if not isinstance(content, list) or not isinstance(current, list):
        return content
    if len(content) != len(current):
        return content
    out: list[Any] = []
    for new, old in zip(content, current, strict=True):
        if isinstance(old, Mapping) and MARKER in old and isinstance(new, Mapping):
            out.append({**new, MARKER: old[MARKER]})
        else:
            out.append(new)
    return out


def materialize(item: ViewItem, messages: Sequence[Message]) -> Message:
    """The message an item stands for, built from the current request's ``messages``."""
    if isinstance(item, Inserted):
        return item.message
    source = messages[item.origin]
    if item.blocks is None:
        return source
    content = blocks_of(source)
    blocks: list[Any] = []
    for op in item.blocks:
        if isinstance(op, Keep):
            blocks.append(content[op.index])
        else:
            block = content[op.index]
            blocks.append(
                {**block, "content": _with_nested_markers(op.content, block.get("content"))}
            )
    return {**source, "content": blocks}
