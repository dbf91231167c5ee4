"""Tool-protocol validation of a parsed Messages request.

The proxy rewrites conversations (compaction drops and summarises turns), so it must know, before
touching a history, that every tool call in it is properly paired. This module checks exactly what
pairing needs, nothing more: alternation, empty content, thinking rules and the like are the
provider's business and pass through.

One linear pass over ``messages``, no copies of the input, no regular expressions. Violations are
worded like the provider's own 400 messages (``messages.N.content.M: ...``) so a client sees the
same text whether the proxy or the upstream rejects it.

Rules
-----
Shape (checked first; the first shape problem wins over any tool-protocol problem):
  * every entry is an object with ``role`` in {user, assistant, system} and ``content`` a string or
    a list of objects each carrying a string ``type``;
  * tool blocks carry the id fields that pairing needs (``id`` / ``tool_use_id`` as strings).

Client tools (``tool_use`` -> ``tool_result``):
  * ``tool_use`` ids are unique across the whole conversation;
  * every ``tool_use`` of an assistant entry is answered in the *immediately next entry* of
    ``messages``, which must be a user message. A ``role: "system"`` entry or a second assistant
    entry in between is a violation, and so is a last assistant entry with unanswered ``tool_use``;
  * the ``tool_result`` blocks come first in that user message (text, images... may follow).
    Among themselves results may come in any order relative to the uses: the provider accepts a
    permuted order, so "out of order" here only means a result placed after a non-result block;
  * a result whose id is not a ``tool_use`` of the previous entry (or whose previous entry has no
    ``tool_use`` at all) is unexpected; a second result for the same id is a duplicate.

Server tools (``server_tool_use`` + any ``*_tool_result`` other than ``tool_result`` and
``mcp_tool_result``; ``mcp_tool_use`` + ``mcp_tool_result``):
  * they pair inside the assistant turn, the result after its use. A turn is a run of consecutive
    assistant entries (the provider merges them), which keeps ``pause_turn`` continuations valid;
  * a use may stay unanswered only in the last assistant turn (a paused turn being continued).

Roles: ``tool_use``/server uses and server results belong to assistant messages, ``tool_result``
to user messages; anywhere else is a violation. Unknown block types pass untouched.

Resuming: ``scan_messages`` also hands back the validator's state (``Checkpoint``) after chosen
messages, and starts from such a state for a list whose first messages are those very messages;
the result is the one of validating the whole list (the state is a function of the messages
before it). The edge uses it for the history an agent re-sends every turn.

Ordering of the report: the first *shape* violation in scan order; otherwise the tool-protocol
violation that comes first in message order, where ``messages.N`` sorts before
``messages.N.content.0``. (A missing result is attributed to the assistant entry that made the
call, so it is reported before any problem found later in the answering message.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["Checkpoint", "Violation", "scan_messages", "validate_messages", "validate_request"]


@dataclass(frozen=True, slots=True)
class Violation:
    """Why a request breaks the tool protocol, worded like the provider's 400 message."""

    message: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The validator's state after the first ``index`` messages of a list, when nothing was
    wrong with them: what ``scan_messages`` resumes from, for a list that starts with the very
    same messages (an agent re-sends its history every turn; see ``proxy.core.reparse``).

    The state depends on nothing but those messages' values, so resuming gives exactly the
    result of validating the whole list."""

    index: int
    client_ids: frozenset[str]
    pending: tuple[tuple[str, bool], ...] | None
    pending_at: int
    run_uses: tuple[tuple[str, str], ...]
    run_open: tuple[tuple[str, tuple[int, str]], ...]
    prev_role: object


_MCP_USE = "mcp_tool_use"
_MCP_RESULT = "mcp_tool_result"
_SERVER_USE = "server_tool_use"
_ASSISTANT_ONLY_USES = frozenset({"tool_use", _SERVER_USE, _MCP_USE})


def validate_request(body: Mapping[str, object]) -> Violation | None:
    """Validate the ``messages`` of a parsed request body: presence, shape, tool protocol."""
    if "messages" not in body:
        return Violation("messages: Field required")
    return validate_messages(body["messages"])


def _is_server_result(block_type: str) -> bool:
    return block_type.endswith("_tool_result") and block_type != "tool_result"


def _wrong_role(i: int, j: int, block_type: str, role: str) -> str:
    home = "user" if block_type == "tool_result" else "assistant"
    return (
        f"messages.{i}.content.{j}: `{block_type}` blocks are only allowed in {home} messages, "
        f"found in {'an' if role == 'assistant' else 'a'} {role} message."
    )


def _missing_results(i: int, ids: list[str]) -> str:
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block "
        "in the next message."
    )


def _unanswered_server_uses(open_uses: dict[str, tuple[int, str]]) -> tuple[int, str]:
    first_i, first_kind = next(iter(open_uses.values()))
    ids = [k for k, (mi, kind) in open_uses.items() if mi == first_i and kind == first_kind]
    text = (
        f"messages.{first_i}: `{first_kind}` ids were found without a corresponding result block: "
        f"{', '.join(ids)}. Each `{first_kind}` block must be followed by its result block in the "
        "same assistant turn; only the last assistant turn may end with an unanswered "
        f"`{first_kind}` (a `pause_turn` being continued)."
    )
    return first_i, text


def validate_messages(messages: object) -> Violation | None:
    """Return the first tool-protocol violation of ``messages``, or ``None`` when it is valid."""
    return scan_messages(messages)[0]


def scan_messages(
    messages: object, resume: Checkpoint | None = None, keep: Collection[int] = ()
) -> tuple[Violation | None, list[Checkpoint]]:
    """``validate_messages``, and the validator's ``Checkpoint`` after the first ``k`` messages
    for each ``k`` in ``keep`` that it passes with nothing found wrong so far (none when it
    stops at a malformed message).

    ``resume``: start from that checkpoint instead of the first message; it must come from a
    list whose first ``resume.index`` messages are these very messages (same values)."""
    if not isinstance(messages, list):
        return Violation("messages: Input should be a valid list"), []

    # First tool-protocol violation in message order: (message index, block index, text).
    # Message-level violations use block index -1 so they sort before the message's blocks.
    found: tuple[int, int, str] | None = None

    def report(i: int, j: int, text: str) -> None:
        nonlocal found
        if found is None or (i, j) < (found[0], found[1]):
            found = (i, j, text)

    client_ids: set[str] = set()  # every client tool_use id seen so far
    pending: dict[str, bool] | None = None  # tool_use ids of the previous entry -> answered yet
    pending_at = -1
    run_uses: dict[str, str] = {}  # server/mcp use id -> its type, in the current assistant turn
    run_open: dict[str, tuple[int, str]] = {}  # unanswered server/mcp uses -> (message, type)
    prev_role: object = None
    start = 0
    if resume is not None:
        if resume.index > len(messages):
            raise ValueError("the checkpoint is past the end of the messages")
        start = resume.index
        client_ids = set(resume.client_ids)
        pending = None if resume.pending is None else dict(resume.pending)
        pending_at = resume.pending_at
        run_uses = dict(resume.run_uses)
        run_open = dict(resume.run_open)
        prev_role = resume.prev_role
    kept: list[Checkpoint] = []
    # the ids only ever grow: checkpoints share one frozenset while none is added
    frozen_ids: frozenset[str] = resume.client_ids if resume is not None else frozenset()

    for i, msg in enumerate(messages[start:] if start else messages, start):
        if keep and i in keep and found is None:
            if len(frozen_ids) != len(client_ids):
                frozen_ids = frozenset(client_ids)
            kept.append(
                _checkpoint(i, frozen_ids, pending, pending_at, run_uses, run_open, prev_role)
            )
        if not isinstance(msg, dict):
            return Violation(
                f'messages.{i}: each message must be an object with "role" and "content"'
            ), []
        role = msg.get("role")
        if role != "user" and role != "assistant" and role != "system":
            return Violation(f'messages.{i}: role must be "user", "assistant" or "system"'), []
        content = msg.get("content")
        if isinstance(content, str):
            blocks: list[object] = []
        elif isinstance(content, list):
            blocks = content
        else:
            return Violation(
                f"messages.{i}: content must be a string or a list of content blocks"
            ), []

        if role == "user":
            expected = pending
            answered = 0
            in_prefix = True  # still inside the leading run of tool_result blocks
            late = False  # an expected result placed after a non-result block
            for j, block in enumerate(blocks):
                if not isinstance(block, dict):
                    return _bad_block(i, j), []
                t = block.get("type")
                if t == "tool_result":
                    uid = block.get("tool_use_id")
                    if not isinstance(uid, str):
                        return _missing_field(i, j, "tool_result", "tool_use_id"), []
                    if expected is not None and uid in expected:
                        if expected[uid]:
                            report(
                                i,
                                j,
                                f"messages.{i}.content.{j}: each tool_use must have a single "
                                f"result. Found multiple `tool_result` blocks with id: {uid}",
                            )
                        else:
                            expected[uid] = True
                            answered += 1
                            if not in_prefix:
                                late = True
                    else:
                        report(
                            i,
                            j,
                            f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                            f"`tool_result` blocks: {uid}. Each `tool_result` block must have a "
                            "corresponding `tool_use` block in the previous message.",
                        )
                    continue
                in_prefix = False
                if t == "text":
                    continue
                if not isinstance(t, str):
                    return _bad_block(i, j), []
                if t in _ASSISTANT_ONLY_USES or _is_server_result(t):
                    report(i, j, _wrong_role(i, j, t, "user"))
            if expected is not None:
                if answered < len(expected):
                    missing = [uid for uid, done in expected.items() if not done]
                    report(pending_at, -1, _missing_results(pending_at, missing))
                elif late:
                    report(
                        i,
                        -1,
                        f"messages.{i}: Did not find {len(expected)} `tool_result` block(s) at "
                        "the beginning of this message. Messages following `tool_use` blocks "
                        "must begin with a matching number of `tool_result` blocks.",
                    )
            pending = None

        elif role == "assistant":
            if pending is not None:
                report(pending_at, -1, _missing_results(pending_at, list(pending)))
            if prev_role != "assistant":  # a new assistant turn starts
                if run_open:
                    at, text = _unanswered_server_uses(run_open)
                    report(at, -1, text)
                    run_open = {}
                if run_uses:
                    run_uses = {}
            new_pending: dict[str, bool] | None = None
            for j, block in enumerate(blocks):
                if not isinstance(block, dict):
                    return _bad_block(i, j), []
                t = block.get("type")
                if t == "text" or t == "thinking":
                    continue
                if not isinstance(t, str):
                    return _bad_block(i, j), []
                if t == "tool_use":
                    uid = block.get("id")
                    if not isinstance(uid, str):
                        return _missing_field(i, j, "tool_use", "id"), []
                    if uid in client_ids:
                        report(
                            i, j, f"messages.{i}.content.{j}: `tool_use` ids must be unique: {uid}"
                        )
                    else:
                        client_ids.add(uid)
                    if new_pending is None:
                        new_pending = {}
                    new_pending[uid] = False
                elif t == "tool_result":
                    report(i, j, _wrong_role(i, j, t, "assistant"))
                elif t == _SERVER_USE or t == _MCP_USE:
                    uid = block.get("id")
                    if not isinstance(uid, str):
                        return _missing_field(i, j, t, "id"), []
                    if uid in run_uses:
                        report(i, j, f"messages.{i}.content.{j}: `{t}` ids must be unique: {uid}")
                    else:
                        run_uses[uid] = t
                        run_open[uid] = (i, t)
                elif t.endswith("_tool_result"):
                    uid = block.get("tool_use_id")
                    if not isinstance(uid, str):
                        return _missing_field(i, j, t, "tool_use_id"), []
                    want = _MCP_USE if t == _MCP_RESULT else _SERVER_USE
                    if run_uses.get(uid) != want:
                        report(
                            i,
                            j,
                            f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `{t}` "
                            f"blocks: {uid}. Each `{t}` block must have a corresponding `{want}` "
                            "block before it.",
                        )
                    elif uid not in run_open:
                        report(
                            i,
                            j,
                            f"messages.{i}.content.{j}: each `{want}` must have a single result. "
                            f"Found multiple `{t}` blocks with id: {uid}",
                        )
                    else:
                        del run_open[uid]
            pending = new_pending
            pending_at = i

        else:  # role == "system": text only; it is "the next message" after a tool_use entry
            if pending is not None:
                report(pending_at, -1, _missing_results(pending_at, list(pending)))
                pending = None
            for j, block in enumerate(blocks):
                if not isinstance(block, dict):
                    return _bad_block(i, j), []
                t = block.get("type")
                if not isinstance(t, str):
                    return _bad_block(i, j), []
                if t in _ASSISTANT_ONLY_USES or t == "tool_result" or _is_server_result(t):
                    report(i, j, _wrong_role(i, j, t, "system"))
        prev_role = role

    if keep and len(messages) in keep and found is None:
        if len(frozen_ids) != len(client_ids):
            frozen_ids = frozenset(client_ids)
        kept.append(
            _checkpoint(
                len(messages), frozen_ids, pending, pending_at, run_uses, run_open, prev_role
            )
        )
    if pending is not None:  # the conversation ends on an assistant entry with unanswered calls
        report(pending_at, -1, _missing_results(pending_at, list(pending)))
    # Unanswered server uses in the last assistant turn are a pause_turn continuation: allowed.
    return (None, kept) if found is None else (Violation(found[2]), [])


def _checkpoint(
    index: int,
    client_ids: frozenset[str],
    pending: dict[str, bool] | None,
    pending_at: int,
    run_uses: dict[str, str],
    run_open: dict[str, tuple[int, str]],
    prev_role: object,
) -> Checkpoint:
    return Checkpoint(
        index,
        client_ids,
        None if pending is None else tuple(pending.items()),
        pending_at,
        tuple(run_uses.items()),
        tuple(run_open.items()),
        prev_role,
    )


def _bad_block(i: int, j: int) -> Violation:
    return Violation(
        f'messages.{i}.content.{j}: each content block must be an object with a string "type"'
    )


def _missing_field(i: int, j: int, block_type: str, field: str) -> Violation:
    return Violation(
        f'messages.{i}.content.{j}: `{block_type}` blocks must have a string "{field}"'
    )
