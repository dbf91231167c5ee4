"""What a thinking block is bound to: the conversation before it, as the provider plausibly
hashes it (see the package docstring for the sources and the reasons).

``Walker`` reads a request's ``system``, ``tools`` and ``messages`` in order and keeps two
running digests:

- the *message chain*: every non-thinking block, normalised (``cache_control`` markers left
  out, a string ``content`` read as one text block, canonical JSON so key order never
  matters), plus a marker where a new turn starts. Consecutive messages of one role are one
  turn (the API merges them), and a ``role: "system"`` message is merged into the turn before
  it, but its blocks count: editing or removing one changes what follows it;
- the *thinking chain*: every thinking or redacted_thinking block, by its signature. The first
  block after the start (or after a compaction block) is trusted to continue the chain it
  recorded, so a leading run of thinking blocks may be removed; removing or moving any other
  thinking block breaks every later one.

A thinking block is bound to ``digest(system+tools, message chain)`` and to the thinking chain
before it. Thinking blocks are left out of the message chain on purpose: that is what lets a
leading run of them go without touching the others.

A signed (on-demand) ``compaction`` block first in ``messages`` stands for the messages it
summarised: the walk resumes from the chains its signature recorded, and the next message
always starts a new turn. A threshold compaction block restarts both chains from the block
itself, and what comes before it is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.provider_rules.signing import canonical, digest

THINKING_TYPES = ("thinking", "redacted_thinking")
ORIGIN = digest("thinking-chain-origin")

Record = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


def content_blocks(content: Any) -> list[Mapping[str, Any]]:
    """A message's content as blocks: a string is one text block (the SDK's shorthand)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block if isinstance(block, Mapping) else {"type": "?", "value": block} for block in content]
    return []


def without_markers(block: Mapping[str, Any]) -> dict[str, Any]:
    """The block without ``cache_control`` (on it, and on the items of a tool_result's content)."""
    out = {key: value for key, value in block.items() if key != "cache_control"}
    inner = out.get("content")
    if out.get("type") == "tool_result" and isinstance(inner, list):
        out["content"] = [
            {k: v for k, v in item.items() if k != "cache_control"} if isinstance(item, Mapping) else item
            for item in inner
        ]
    return out


def system_digest(body: Mapping[str, Any]) -> str:
    system = body.get("system")
    blocks = [] if system is None else content_blocks(system)
    return digest("system", canonical([without_markers(block) for block in blocks]))


def tools_digest(body: Mapping[str, Any]) -> str:
    """Tools marked ``defer_loading: true`` are not part of the prefix (compaction-thinking-blocks
    page: "`system` and the `tools` not marked `defer_loading: true` don't change")."""
    tools = body.get("tools")
    kept = [
        without_markers(tool) if isinstance(tool, Mapping) else tool
        for tool in (tools if isinstance(tools, list) else [])
        if not (isinstance(tool, Mapping) and tool.get("defer_loading") is True)
    ]
    return digest("tools", canonical(kept))


def is_signed_compaction(block: Mapping[str, Any]) -> bool:
    return block.get("type") == "compaction" and block.get("signature") is not None


def is_threshold_compaction(block: Mapping[str, Any]) -> bool:
    """An unsigned compaction block with content: what threshold compaction returns."""
    return block.get("type") == "compaction" and block.get("signature") is None and block.get("content") is not None


def is_noop_compaction(block: Mapping[str, Any]) -> bool:
    """A failed compaction (``content: null``, unsigned): the provider treats it as a no-op."""
    return block.get("type") == "compaction" and block.get("signature") is None and block.get("content") is None


def block_identity(block: Mapping[str, Any]) -> str:
    key = block.get("data") if block.get("type") == "redacted_thinking" else block.get("signature")
    return digest("thinking", str(block.get("type")), canonical(key))


def last_threshold_compaction(messages: Sequence[Any]) -> tuple[int, int] | None:
    found: tuple[int, int] | None = None
    for i, message in enumerate(messages):
        if isinstance(message, Mapping):
            for j, block in enumerate(content_blocks(message.get("content"))):
                if is_threshold_compaction(block):
                    found = (i, j)
    return found


@dataclass(frozen=True)
class Token:
    """One element of the message chain, with where it came from (for saying what changed)."""

    digest: str
    path: str


@dataclass(frozen=True)
class Site:
    """Where a thinking or redacted_thinking block sits, and what it is bound to there."""

    index: int
    block_index: int
    role: str
    block: Mapping[str, Any]
    prefix: str
    chain: str | None  # None: first since the start or the last compaction (its own record is trusted)
    trail: tuple[Token, ...]  # the message chain before it
    ignored: bool  # before the last threshold compaction block: the provider ignores it

    @property
    def path(self) -> str:
        return f"messages.{self.index}.content.{self.block_index}"


class Walker:
    """Walks a conversation, recording a ``Site`` for every thinking block (see module docstring).

    ``thinking_record`` opens a thinking block's signature (``None`` if it is not intact);
    ``compaction_record`` opens a signed compaction block's (``None`` if it is not intact).
    """

    def __init__(
        self,
        body: Mapping[str, Any],
        *,
        thinking_record: Record,
        compaction_record: Record,
    ) -> None:
        self.system = system_digest(body)
        self.tools = tools_digest(body)
        self.head = digest("system+tools", self.system, self.tools)
        self.chain = digest("messages", self.head)
        self.thought: str | None = None
        self.role: str | None = None
        self.tokens: list[Token] = []
        self.sites: list[Site] = []
        self._thinking_record = thinking_record
        self._compaction_record = compaction_record
        messages = body.get("messages")
        self._messages: list[Any] = messages if isinstance(messages, list) else []
        self._ignore_before = last_threshold_compaction(self._messages)

    # -- the request -----------------------------------------------------------------------
    def walk(self) -> Walker:
        for i, message in enumerate(self._messages):
            if isinstance(message, Mapping):
                self.feed_message(i, message)
        return self

    def feed_message(self, i: int, message: Mapping[str, Any]) -> None:
        role = str(message.get("role"))
        self.begin_message(i, role, message)
        for j, block in enumerate(content_blocks(message.get("content"))):
            self.feed_block(i, j, role, block)

    def begin_message(self, i: int, role: str, message: Mapping[str, Any] | None = None) -> None:
        if role == "system":
            if self.role is None:
                self._push(digest("turn", "system"), f"messages.{i}")
                self.role = "system"
            meta = {k: v for k, v in (message or {}).items() if k not in ("role", "content")}
            if meta:
                self._push(digest("system-message", canonical(meta)), f"messages.{i}")
        elif role != self.role:
            self._push(digest("turn", role), f"messages.{i}")
            self.role = role

    def position(self) -> tuple[str, str | None, tuple[Token, ...]]:
        """What a thinking block placed here would be bound to: (prefix, chain, trail)."""
        return digest("prefix", self.head, self.chain), self.thought, tuple(self.tokens)

    def feed_block(self, i: int, j: int, role: str, block: Mapping[str, Any]) -> None:
        kind = block.get("type")
        path = f"messages.{i}.content.{j}"
        if kind in THINKING_TYPES:
            prefix, chain, trail = self.position()
            ignored = self._ignore_before is not None and (i, j) < self._ignore_before
            self.sites.append(Site(i, j, role, block, prefix, chain, trail, ignored))
            if not ignored:
                record = self._thinking_record(block)
                start = self.thought if self.thought is not None else str((record or {}).get("c", ORIGIN))
                self.thought = digest("chain", start, block_identity(block))
            return
        if kind == "compaction":
            if is_noop_compaction(block):
                return
            if (i, j) == (0, 0) and is_signed_compaction(block):
                record = self._compaction_record(block)
                if record is not None:
                    self.chain, tc = str(record["mc"]), record.get("tc")
                    self.thought = None if tc is None else str(tc)
                else:
                    self.chain, self.thought = digest("unverified", canonical(dict(block))), None
                self.tokens = [Token(digest("compaction", self.chain), path)]
                self.role = None
                return
            if is_threshold_compaction(block):
                self.chain = digest("threshold", self.head, canonical(without_markers(block)))
                self.thought = None
                self.tokens = [Token(self.chain, path)]
                return
        if self.role is None:
            self.begin_message(i, role)
        tag = "system-block" if role == "system" else "block"
        self._push(digest(tag, canonical(without_markers(block))), path)

    def _push(self, token: str, path: str) -> None:
        self.tokens.append(Token(token, path))
        self.chain = digest("link", self.chain, token)
