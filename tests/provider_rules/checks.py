"""The provider's request checks, as pure functions: a request body and its beta names in, a
``Verdict`` out (accepted, with what was dropped and reported; or the exact error to answer).

The order follows what a request goes through: the shape of ``thinking.block_binding`` and of
the compaction parameters, then the compaction blocks it carries, then every thinking block's
signature (altered or forged: always a 400), then the latest assistant message (its thinking
must come back as issued), then the binding checks (end user, model, conversation prefix),
then the turn rules of thinking on what is left after the drops. A transient compaction
failure (529) is decided last, once the request is known to be valid.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from tests.provider_rules.prefix import (
    THINKING_TYPES,
    Site,
    Walker,
    content_blocks,
    is_noop_compaction,
    is_signed_compaction,
    without_markers,
)
from tests.provider_rules.signing import Signer, canonical, digest

BETA_BINDING = "thinking-binding-controls-2026-08-01"
BETA_COMPACT = "compact-2026-09-04"
BETA_THRESHOLD = "compact-2026-01-12"
BETA_INLINE_TOOLS = "inline-tools-2026-09-15"

BEHAVIORS = ("error", "drop_block")
SPELLINGS = ("prefix_mismatch_behavior", "mismatch_behavior")
INSTRUCTIONS_MAX = 16_384
TRIGGER_MIN = 50_000
COMPACTION_FIELDS = frozenset({"type", "content", "encrypted_content", "signature", "tool_changes", "cache_control"})
BINDING_FIELDS = frozenset({*SPELLINGS, "bind_to_end_user", "bind_to_additional_organizations"})


@dataclass(frozen=True)
class Rejection:
    """An error answer: its HTTP status, ``error.type``, message and ``error.details.error_code``."""

    status: int
    message: str
    error_type: str = "invalid_request_error"
    error_code: str | None = None

    def body(self, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.error_code is not None:
            error["details"] = {"error_code": self.error_code}
        return {"type": "error", "error": error, "request_id": request_id}


@dataclass(frozen=True)
class Transformation:
    """One ``input_transformations`` entry."""

    type: str  # "thinking_dropped" | "thinking_mismatch_allowed"
    path: str
    reason: str

    def json(self) -> dict[str, str]:
        return {"type": self.type, "path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class Verdict:
    """What the provider made of one request."""

    endpoint: str  # "messages" | "count_tokens"
    rejection: Rejection | None = None
    transformations: tuple[Transformation, ...] = ()
    report: bool = False  # the binding beta was sent: answers carry ``input_transformations``
    compaction: bool = False  # a valid on-demand compaction request: the provider answers it itself
    dropped: frozenset[str] = frozenset()  # paths removed before the model saw the request

    @property
    def accepted(self) -> bool:
        return self.rejection is None

    def input_transformations(self) -> list[dict[str, str]]:
        return [entry.json() for entry in self.transformations]


@dataclass(frozen=True)
class Settings:
    binding_models: tuple[str, ...]
    account_enforced: bool
    default_behavior: str
    leading_thinking_modes: frozenset[str]
    reject_thinking_when_disabled: bool
    can_read: Callable[[str, str], bool]
    thinking_by_default: tuple[str, ...] = ()

    def binds(self, model: str) -> bool:
        return any(fnmatchcase(model, pattern) for pattern in self.binding_models)

    def thinks_by_default(self, model: str) -> bool:
        return self.binds(model) or any(fnmatchcase(model, pattern) for pattern in self.thinking_by_default)


@dataclass(frozen=True)
class Issued:
    """What the fake remembers of a thinking block it signed, to say what changed since."""

    system: str
    tools: str
    trail: tuple[str, ...]


class Invalid(Exception):
    """Raised inside the checks to stop at the first error; carries the ``Rejection``."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


def _bad(message: str, code: str | None = None) -> Invalid:
    return Invalid(Rejection(400, message, error_code=code))


# -- thinking configuration -------------------------------------------------------------------
@dataclass(frozen=True)
class Binding:
    kind: str  # the thinking type in effect: "adaptive" | "enabled" | "disabled" | ...
    behavior: str | None  # the request's mismatch behaviour, None if it sets none
    spelling: str  # the field name to quote in messages
    bind_to_end_user: bool


def thinking_binding(body: Mapping[str, Any], betas: Collection[str], thinks: bool) -> Binding:
    """The request's thinking settings; ``thinks``: the model thinks when ``thinking`` is absent."""
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if not isinstance(kind, str):
        kind = "adaptive" if thinks else "disabled"
    default = Binding(kind, None, SPELLINGS[0], True)
    if not isinstance(thinking, Mapping) or "block_binding" not in thinking:
        return default
    where = f"thinking.{kind}.block_binding"
    if BETA_BINDING not in betas or kind not in ("adaptive", "enabled"):
        raise _bad(f"{where}: Extra inputs are not permitted")
    settings = thinking["block_binding"]
    if settings is None:
        return default
    if not isinstance(settings, Mapping):
        raise _bad(f"{where}: Input should be a valid dictionary")
    for key in settings:
        if key not in BINDING_FIELDS:
            raise _bad(f"{where}.{key}: Extra inputs are not permitted")
    values = {key: settings.get(key) for key in SPELLINGS if settings.get(key) is not None}
    for key, value in values.items():
        if value not in BEHAVIORS:
            raise _bad(f"{where}.{key}: Input should be 'error' or 'drop_block'")
    if len(set(values.values())) > 1:
        raise _bad(
            f"{where}: `prefix_mismatch_behavior` and `mismatch_behavior` name the same setting and "
            "were sent with different values; send one of them."
        )
    bind = settings.get("bind_to_end_user")
    if bind is not None and not isinstance(bind, bool):
        raise _bad(f"{where}.bind_to_end_user: Input should be a valid boolean")
    spelling = next(iter(values), SPELLINGS[0])
    return Binding(kind, next(iter(values.values()), None), spelling, bind is not False)


# -- compaction parameters and blocks ---------------------------------------------------------
def _blocks(messages: Sequence[Any]) -> list[tuple[int, int, str, Mapping[str, Any]]]:
    found = []
    for i, message in enumerate(messages):
        if isinstance(message, Mapping):
            role = str(message.get("role"))
            for j, block in enumerate(content_blocks(message.get("content"))):
                found.append((i, j, role, block))
    return found


def check_compaction_parameter(body: Mapping[str, Any], betas: Collection[str]) -> bool:
    """Validates a top-level ``compaction``; True if the request is an on-demand compaction."""
    if body.get("compaction") is None:
        return False
    if BETA_COMPACT not in betas:
        raise _bad("compaction: Extra inputs are not permitted")
    config = body["compaction"]
    if not isinstance(config, Mapping) or config.get("type") != "summarize":
        raise _bad("compaction.type: Input should be 'summarize'")
    for key in config:
        if key not in ("type", "instructions"):
            raise _bad(f"compaction.{key}: Extra inputs are not permitted")
    instructions = config.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("compaction.instructions: Input should be a valid string")
    if isinstance(instructions, str) and len(instructions) > INSTRUCTIONS_MAX:
        raise _bad(f"compaction.instructions: String should have at most {INSTRUCTIONS_MAX} characters")
    if body.get("context_management") is not None:
        raise _bad("`compaction` cannot be combined with `context_management`; send one or the other.")
    if body.get("stop_sequences"):
        raise _bad("`stop_sequences` cannot be used with `compaction`: a compaction request samples no reply. Remove `stop_sequences`.")
    output_config = body.get("output_config")
    if isinstance(output_config, Mapping) and output_config.get("format") is not None:
        raise _bad("`output_config.format` cannot be used with `compaction`: a compaction request samples no reply. Remove `output_config.format`.")
    tool_choice = body.get("tool_choice")
    forced = tool_choice.get("type") if isinstance(tool_choice, Mapping) else None
    if forced in ("any", "tool"):
        raise _bad(f"`tool_choice` of type `{forced}` cannot be used with `compaction`: use `auto` or `none`, or leave it out.")
    return True


def _task_budget_remaining(body: Mapping[str, Any]) -> bool:
    output_config = body.get("output_config")
    budget = output_config.get("task_budget") if isinstance(output_config, Mapping) else None
    return isinstance(budget, Mapping) and budget.get("remaining") is not None


def check_compaction_request(messages: Sequence[Any]) -> None:
    """What a compaction request's messages must hold (after the blocks were checked)."""
    talk = [m for m in messages if isinstance(m, Mapping) and m.get("role") in ("user", "assistant")]
    if talk and talk[-1].get("role") == "assistant":
        if any(block.get("type") == "tool_use" for block in content_blocks(talk[-1].get("content"))):
            raise _bad(
                "The compaction request ends on an `assistant` turn that is not finished: send the "
                "`tool_result` blocks for its `tool_use` blocks first.",
                "compaction_incomplete_turn",
            )
    if not any(
        not is_noop_compaction(block) for message in talk for block in content_blocks(message.get("content"))
    ):
        raise _bad("`messages` holds no `user` or `assistant` content to summarize.", "compaction_nothing_to_summarize")


def tool_changes_digest(value: Any) -> str | None:
    if value is None:
        return None
    items = [without_markers(item) if isinstance(item, Mapping) else item for item in value] if isinstance(value, list) else value
    return digest("tool_changes", canonical(items))


def compaction_content_digest(block: Mapping[str, Any]) -> str:
    return digest("compaction", canonical([block.get("content"), block.get("encrypted_content")]))


def check_compaction_blocks(messages: Sequence[Any], betas: Collection[str], signer: Signer) -> bool:
    """Validates the compaction blocks a request carries; True if it carries a signed one."""
    blocks = [(i, j, role, block) for i, j, role, block in _blocks(messages) if block.get("type") == "compaction"]
    if not blocks:
        return False
    if BETA_COMPACT not in betas and BETA_THRESHOLD not in betas:
        i, j, _, _ = blocks[0]
        raise _bad(f"messages.{i}.content.{j}.type: Input tag 'compaction' found using 'type' does not match any of the expected tags")
    signed = [entry for entry in blocks if is_signed_compaction(entry[3])]
    if not signed:
        return False
    i, j, role, block = signed[0]
    where = f"messages.{i}.content.{j}"
    if BETA_COMPACT not in betas:
        raise _bad(f"{where}.signature: Extra inputs are not permitted")
    with_content = [entry for entry in signed if entry[3].get("content") is not None]
    if len(with_content) > 1:
        i2, j2, _, _ = with_content[1]
        raise _bad(
            f"messages.{i2}.content.{j2}: `messages` holds more than one `compaction` block with content. "
            "Send only the block the conversation returned last.",
            "compaction_block_ambiguous",
        )
    if role == "system":
        raise _bad(
            f"{where}: A `compaction` block cannot be sent in a `system` message. Send it first in "
            "`messages`, in place of the messages it summarizes.",
            "compaction_block_misplaced",
        )
    if (i, j) != (0, 0):
        raise _bad(
            f"{where}: `compaction` block must be sent first, in place of the messages it summarizes; "
            "remove those messages.",
            "compaction_block_misplaced",
        )
    for key in block:
        if key not in COMPACTION_FIELDS:
            raise _bad(f"{where}.{key}: Extra inputs are not permitted")
    record = signer.open(block.get("signature"))
    if record is None or record.get("k") != "c":
        raise _bad(
            f"{where}: The `compaction` block's `signature` does not verify. Send the block exactly as it was returned.",
            "compaction_signature_invalid",
        )
    if compaction_content_digest(block) != record.get("cd"):
        raise _bad(
            f"{where}: The `compaction` block's `content` differs from the summary its `signature` recorded. "
            "Send the block exactly as it was returned.",
            "compaction_content_mismatch",
        )
    if tool_changes_digest(block.get("tool_changes")) != record.get("tg"):
        raise _bad(
            f"{where}: The `compaction` block's `tool_changes` differs from what was returned with the block. "
            "Send the block exactly as it was returned.",
            "compaction_tool_changes_mismatch",
        )
    return True


def check_threshold_edits(body: Mapping[str, Any], betas: Collection[str], carries_signed: bool) -> None:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    for k, edit in enumerate(edits if isinstance(edits, list) else []):
        if not isinstance(edit, Mapping) or edit.get("type") != "compact_20260112":
            continue
        if BETA_THRESHOLD not in betas:
            raise _bad(
                f"context_management.edits.{k}: Input tag 'compact_20260112' found using 'type' does not "
                "match any of the expected tags: 'clear_tool_uses_20250919', 'clear_thinking_20251015'"
            )
        trigger = edit.get("trigger")
        value = trigger.get("value") if isinstance(trigger, Mapping) else None
        if isinstance(value, int) and value < TRIGGER_MIN:
            raise _bad(f"context_management.edits.{k}.trigger.value: Input should be greater than or equal to {TRIGGER_MIN}")
        if carries_signed:
            raise _bad(f"context_management.edits.{k}: `compact_20260112` cannot run on a request that carries a signed `compaction` block.")


def threshold_edit(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    for edit in edits if isinstance(edits, list) else []:
        if isinstance(edit, Mapping) and edit.get("type") == "compact_20260112":
            return edit
    return None


# -- thinking blocks --------------------------------------------------------------------------
def thinking_record(signer: Signer, block: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = "r" if block.get("type") == "redacted_thinking" else "t"
    record = signer.open(block.get("data") if kind == "r" else block.get("signature"))
    return record if record is not None and record.get("k") == kind else None


def compaction_record(signer: Signer, block: Mapping[str, Any]) -> dict[str, Any] | None:
    record = signer.open(block.get("signature"))
    if record is None or record.get("k") != "c" or compaction_content_digest(block) != record.get("cd"):
        return None
    return record


def walker(body: Mapping[str, Any], signer: Signer) -> Walker:
    return Walker(
        body,
        thinking_record=lambda block: thinking_record(signer, block),
        compaction_record=lambda block: compaction_record(signer, block),
    )


def _invalid_signature(site: Site) -> Invalid:
    return _bad(f"{site.path}: Invalid `signature` in `{site.block.get('type')}` block")


def _not_modifiable(site: Site) -> Invalid:
    return _bad(
        f"{site.path}: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be "
        "modified. These blocks must remain as they were in the original response."
    )


def check_integrity(sites: Sequence[Site], records: dict[int, dict[str, Any]], latest: int | None) -> None:
    """Every thinking block the provider reads must carry a signature it made; the thinking text
    must be the one signed (an edit to the latest assistant message's thinking has its own 400),
    and the latest assistant message must hold each response's thinking blocks complete and in
    order."""
    for n, site in enumerate(sites):
        if site.ignored:
            continue
        record = records.get(n)
        if record is None:
            raise _invalid_signature(site)
        if site.block.get("type") == "thinking" and not record.get("o"):
            if digest("text", str(site.block.get("thinking"))) != record.get("h"):
                raise _not_modifiable(site) if site.index == latest else _invalid_signature(site)
    groups: dict[str, list[tuple[dict[str, Any], Site]]] = {}
    for n, site in enumerate(sites):
        if site.index == latest and not site.ignored:
            groups.setdefault(str(records[n].get("i")), []).append((records[n], site))
    for members in groups.values():
        for expected, (record, site) in enumerate(members):
            if record.get("n") != expected:
                raise _not_modifiable(site)
        if len(members) != members[0][0].get("N"):
            raise _not_modifiable(members[-1][1])


def what_changed(issued: Issued | None, current: Walker, site: Site) -> str | None:
    """The closing sentence naming what changed (the docs say the real one "usually" has one)."""
    if issued is None:
        return None
    if issued.system != current.system:
        return "The `system` prompt differs from when this block was created."
    if issued.tools != current.tools:
        return "The `tools` list differs from when this block was created."
    now = site.trail
    for k, before in enumerate(issued.trail):
        if k >= len(now):
            return "Content before this block is missing since it was created."
        if now[k].digest != before:
            return f"Content before this block differs from when it was created, first at `{now[k].path}`."
    if len(now) > len(issued.trail):
        return f"Content before this block is new since it was created, first at `{now[len(issued.trail)].path}`."
    return "An earlier thinking block is missing or out of order."


def _bound_elsewhere(site: Site, binding: Binding, betas: Collection[str], whom: str, tail: str | None) -> Invalid:
    message = (
        f"{site.path}: Invalid `signature` in `{site.block.get('type')}` block. The block is bound to a different "
        f"{whom}. Remove the block, or set `thinking.block_binding.{binding.spelling}` to \"drop_block\"."
    )
    if BETA_BINDING not in betas:
        message += f" That setting requires the `{BETA_BINDING}` value in the `anthropic-beta` header."
    if tail:
        message += " " + tail
    return _bad(message)


def check_bindings(
    body: Mapping[str, Any],
    betas: Collection[str],
    settings: Settings,
    binding: Binding,
    current: Walker,
    records: dict[int, dict[str, Any]],
    lookup: Callable[[str], Issued | None],
) -> tuple[list[Transformation], set[str]]:
    """The end-user, model and prefix checks; returns the report and the dropped paths."""
    model = str(body.get("model"))
    binds = settings.binds(model)
    enforced = binds and (settings.account_enforced or binding.behavior is not None)
    behavior = binding.behavior or (settings.default_behavior if BETA_BINDING in betas else "error")
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    user = None if user_id is None else digest("user", str(user_id))
    entries: list[Transformation] = []
    dropped: set[str] = set()
    for n, site in enumerate(current.sites):
        if site.ignored:
            dropped.add(site.path)  # before a threshold compaction block: the provider ignores it
            continue
        record = records[n]
        user_failed = binds and bool(record.get("b")) and record.get("u") is not None and record.get("u") != user
        prefix_failed = binds and not (
            record.get("p") == site.prefix and (site.chain is None or record.get("c") == site.chain)
        )
        if user_failed and enforced:
            reason = "end_user_binding_mismatch"
        elif not settings.can_read(model, str(record.get("m"))):
            entries.append(Transformation("thinking_dropped", site.path, "model_binding_mismatch"))
            dropped.add(site.path)
            continue
        elif prefix_failed and enforced:
            reason = "prefix_binding_mismatch"
        elif user_failed or prefix_failed:
            why = "end_user_binding_mismatch" if user_failed else "prefix_binding_mismatch"
            entries.append(Transformation("thinking_mismatch_allowed", site.path, why))
            continue
        else:
            continue
        if behavior == "error":
            if reason == "end_user_binding_mismatch":
                raise _bound_elsewhere(site, binding, betas, "end user", None)
            signature = site.block.get("data") if site.block.get("type") == "redacted_thinking" else site.block.get("signature")
            raise _bound_elsewhere(site, binding, betas, "conversation", what_changed(lookup(str(signature)), current, site))
        entries.append(Transformation("thinking_dropped", site.path, reason))
        dropped.add(site.path)
    return entries, dropped


def check_turn_rules(body: Mapping[str, Any], settings: Settings, binding: Binding, dropped: set[str]) -> None:
    """Section 3's thinking rules on the final assistant message, after the drops."""
    talk = [(i, m) for i, m in enumerate(body.get("messages") or []) if isinstance(m, Mapping) and m.get("role") != "system"]
    if not talk:
        return
    last_i, last = talk[-1]
    final: int | None = None
    if last.get("role") == "assistant":
        final = last_i
    elif any(block.get("type") == "tool_result" for block in content_blocks(last.get("content"))):
        earlier = [i for i, m in talk[:-1] if m.get("role") == "assistant"]
        final = earlier[-1] if earlier else None
    if final is None:
        return
    kept = [
        (j, block)
        for j, block in enumerate(content_blocks(body["messages"][final].get("content")))
        if f"messages.{final}.content.{j}" not in dropped
    ]
    if binding.kind in settings.leading_thinking_modes and kept and kept[0][1].get("type") not in THINKING_TYPES:
        j, block = kept[0]
        raise _bad(
            f"messages.{final}.content.{j}.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{block.get('type')}`. When `thinking` is enabled, a final `assistant` message must start with a "
            "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
            "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please "
            "consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )
    if binding.kind == "disabled" and settings.reject_thinking_when_disabled:
        for j, block in kept:
            if block.get("type") in THINKING_TYPES:
                raise _bad(
                    f"messages.{final}.content.{j}: When thinking is disabled, an `assistant` message in the final "
                    "position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your request."
                )


# -- the whole request ------------------------------------------------------------------------
@dataclass
class Outcome:
    """Working state of one ``check`` (mutable while checking, frozen into a ``Verdict``)."""

    compaction: bool = False
    carries_signed: bool = False
    entries: list[Transformation] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)


def check(
    endpoint: str,
    body: Mapping[str, Any],
    betas: Collection[str],
    *,
    settings: Settings,
    signer: Signer,
    lookup: Callable[[str], Issued | None],
    refuse_compaction: Callable[[], bool],
) -> Verdict:
    """Checks one ``/v1/messages`` (``endpoint="messages"``) or ``/v1/messages/count_tokens``
    (``"count_tokens"``) request. ``refuse_compaction`` is asked (once, last) whether the
    provider's compaction is unavailable for this request."""
    report = BETA_BINDING in betas  # a count_tokens answer is not a message: it never carries them
    messages = body.get("messages")
    if not isinstance(messages, list):
        return Verdict(endpoint, report=report)
    outcome = Outcome()
    try:
        binding = thinking_binding(body, betas, settings.thinks_by_default(str(body.get("model"))))
        if endpoint == "messages":
            outcome.compaction = check_compaction_parameter(body, betas)
        outcome.carries_signed = check_compaction_blocks(messages, betas, signer)
        if (outcome.compaction or outcome.carries_signed) and _task_budget_remaining(body):
            raise _bad("`output_config.task_budget.remaining` cannot be sent with `compaction` or on a request that carries a `compaction` block.")
        check_threshold_edits(body, betas, outcome.carries_signed)
        if outcome.compaction:
            check_compaction_request(messages)
        current = walker(body, signer).walk()
        records = {n: thinking_record(signer, site.block) for n, site in enumerate(current.sites) if not site.ignored}
        latest = max((i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"), default=None)
        check_integrity(current.sites, {n: r for n, r in records.items() if r is not None}, latest)
        present = {n: r for n, r in records.items() if r is not None}
        outcome.entries, outcome.dropped = check_bindings(body, betas, settings, binding, current, present, lookup)
        check_turn_rules(body, settings, binding, outcome.dropped)
        if (outcome.compaction or outcome.carries_signed) and endpoint == "messages" and refuse_compaction():
            raise Invalid(Rejection(529, "Compaction is temporarily unavailable. Retry the request.", "overloaded_error", "compaction_unavailable"))
    except Invalid as failed:
        return Verdict(endpoint, rejection=failed.rejection, report=report)
    return Verdict(
        endpoint,
        transformations=tuple(outcome.entries),
        report=report,
        compaction=outcome.compaction,
        dropped=frozenset(outcome.dropped),
    )
