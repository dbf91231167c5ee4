"""``ProviderRules``: the fake provider's configuration, secret and memory, and the one place
that checks requests and builds (signed) answers for them."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from tests.provider_rules.answers import (
    Turn,
    default_summary,
    net_tool_changes,
    stream_events,
    usage,
)
from tests.provider_rules.checks import (
    BETA_INLINE_TOOLS,
    Issued,
    Settings,
    Verdict,
    check,
    compaction_content_digest,
    thinking_binding,
    threshold_edit,
    tool_changes_digest,
    walker,
)
from tests.provider_rules.prefix import ORIGIN, THINKING_TYPES
from tests.provider_rules.signing import Signer, canonical, digest

BINDING_MODELS = ("claude-fable-5-1*", "claude-mythos-5-1*")
# [TROUBLE]'s table: "Always on" or "On" by default (the others are "Off")
THINKING_BY_DEFAULT = ("claude-fable-5*", "claude-mythos-5*", "claude-mythos-preview*", "claude-opus-5*", "claude-sonnet-5*")
_DATED = re.compile(r"-\d{8}$")
_REGISTRY_LIMIT = 20_000


def betas_of(values: Iterable[str]) -> frozenset[str]:
    """The beta names of ``anthropic-beta`` header values (comma-joined, possibly repeated)."""
    return frozenset(name.strip() for value in values for name in value.split(",") if name.strip())


def same_model(a: str, b: str) -> bool:
    return _DATED.sub("", a) == _DATED.sub("", b)


class ProviderRules:
    """The provider's 2026 rules for thinking-block binding and compaction, as a fake.

    ``binding_models``: glob patterns of the models that check the end user and the conversation
    prefix. ``account_enforced``: the account was created on or after 2026-08-31, so the prefix
    check applies without the request asking for it. ``default_behavior``: what applies with the
    binding beta and no behaviour set ("error" per the provider's docs and SDK; Bedrock's page
    says "drop_block"). ``leading_thinking_modes``: the thinking types under which a final
    assistant message in a tool loop must start with thinking (docs: manual "enabled" only).
    ``reject_thinking_when_disabled``: the 400 for thinking in the final assistant message while
    thinking is disabled. ``can_read(reader, producer)``: the model check (default: a model
    reads its own blocks; the binding models read every other model's; no other model reads
    theirs). ``thinking_by_default``: glob patterns of the models that think when a request has
    no ``thinking`` (the binding models always do). ``summarize(messages, instructions)``: the
    compaction summary. ``secret``: the HMAC key (random unless given).
    """

    def __init__(
        self,
        *,
        binding_models: Sequence[str] = BINDING_MODELS,
        account_enforced: bool = True,
        default_behavior: str = "error",
        leading_thinking_modes: Collection[str] = ("enabled",),
        reject_thinking_when_disabled: bool = True,
        can_read: Callable[[str, str], bool] | None = None,
        summarize: Callable[[Sequence[Any], str | None], str] = default_summary,
        thinking_by_default: Sequence[str] = THINKING_BY_DEFAULT,
        secret: bytes | None = None,
    ) -> None:
        if default_behavior not in ("error", "drop_block"):
            raise ValueError(f"default_behavior must be 'error' or 'drop_block', not {default_behavior!r}")
        self.settings = Settings(
            binding_models=tuple(binding_models),
            account_enforced=account_enforced,
            default_behavior=default_behavior,
            leading_thinking_modes=frozenset(leading_thinking_modes),
            reject_thinking_when_disabled=reject_thinking_when_disabled,
            can_read=can_read or self._default_can_read,
            thinking_by_default=tuple(thinking_by_default),
        )
        self.summarize = summarize
        self.signer = Signer(secret if secret is not None else os.urandom(32))
        self._issued: dict[str, Issued] = {}
        self._ids = itertools.count(1)
        self._refusals: int | None = 0  # None: refuse every compaction

    # -- configuration -----------------------------------------------------------------------
    def binds(self, model: str) -> bool:
        return self.settings.binds(model)

    def _default_can_read(self, reader: str, producer: str) -> bool:
        if same_model(reader, producer) or self.binds(reader):
            return True
        return not self.binds(producer)

    def refuse_compaction(self, times: int | None = None) -> None:
        """Answer the next ``times`` requests that produce or carry a compaction block (all of
        them if ``None``) with the 529 ``compaction_unavailable``; ``times=0`` stops refusing."""
        self._refusals = times

    def _refusing(self) -> bool:
        if self._refusals is None:
            return True
        if self._refusals > 0:
            self._refusals -= 1
            return True
        return False

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):020d}"

    # -- checking ----------------------------------------------------------------------------
    def check(self, endpoint: str, body: Mapping[str, Any], betas: Collection[str]) -> Verdict:
        """Checks a request to ``/v1/messages`` (``"messages"``) or ``/v1/messages/count_tokens``
        (``"count_tokens"``); ``betas`` as :func:`betas_of` reads them."""
        return check(
            endpoint,
            body,
            frozenset(betas),
            settings=self.settings,
            signer=self.signer,
            lookup=self._issued.get,
            refuse_compaction=self._refusing,
        )

    # -- signing -----------------------------------------------------------------------------
    def sign(
        self,
        body: Mapping[str, Any],
        betas: Collection[str],
        content: Sequence[Mapping[str, Any]],
        *,
        message_id: str | None = None,
        model: str | None = None,
    ) -> list[dict[str, Any]]:
        """``content`` (an answer to ``body``) with every thinking block's ``signature`` and
        every redacted_thinking block's ``data`` made by the provider for that request."""
        model = model or str(body.get("model"))
        message_id = message_id or self.next_id("msg")
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        binding = thinking_binding(body, frozenset(betas), self.settings.thinks_by_default(model))
        current = walker(body, self.signer).walk()
        messages = body.get("messages")
        index = len(messages) if isinstance(messages, list) else 0
        current.begin_message(index, "assistant")
        count = sum(1 for block in content if block.get("type") in THINKING_TYPES)
        signed: list[dict[str, Any]] = []
        n = 0
        for j, block in enumerate(content):
            out = dict(block)
            if out.get("type") in THINKING_TYPES:
                prefix, chain, trail = current.position()
                payload = {
                    "k": "r" if out["type"] == "redacted_thinking" else "t",
                    "m": model,
                    "u": None if user_id is None else digest("user", str(user_id)),
                    "b": binding.bind_to_end_user,
                    "p": prefix,
                    "c": chain if chain is not None else ORIGIN,
                    "i": message_id,
                    "n": n,
                    "N": count,
                }
                if out["type"] == "thinking":
                    text = str(out.get("thinking", ""))
                    payload |= {"h": digest("text", text), "o": text == ""}
                    out["signature"] = self.signer.seal(payload)
                    token = out["signature"]
                else:
                    out["data"] = self.signer.seal(payload)
                    token = out["data"]
                self._remember(token, Issued(current.system, current.tools, tuple(t.digest for t in trail)))
                n += 1
            current.feed_block(index, j, "assistant", out)
            signed.append(out)
        return signed

    def thinking_block(self, body: Mapping[str, Any], betas: Collection[str], text: str) -> dict[str, Any]:
        """One signed thinking block, as the first block of an answer to ``body``."""
        return self.sign(body, betas, [{"type": "thinking", "thinking": text}])[0]

    def _remember(self, token: str, issued: Issued) -> None:
        if len(self._issued) >= _REGISTRY_LIMIT:
            self._issued.pop(next(iter(self._issued)))
        self._issued[token] = issued

    # -- answers -----------------------------------------------------------------------------
    def answer(
        self, body: Mapping[str, Any], betas: Collection[str], turn: Turn, verdict: Verdict | None = None
    ) -> dict[str, Any]:
        """The whole message that answers ``body`` as ``turn`` asks."""
        content: list[dict[str, Any]] = []
        pause = False
        iterations: list[dict[str, Any]] | None = None
        if turn.threshold_compaction:
            edit = threshold_edit(body)
            if edit is None:
                raise ValueError("Turn(threshold_compaction=True) answers a request without a compact_20260112 edit")
            pause = bool(edit.get("pause_after_compaction"))
            summary = self.summarize(body.get("messages") or [], edit.get("instructions"))
            content.append({"type": "compaction", "content": summary})
            iterations = [usage(len(canonical(body.get("messages") or [])) // 4, len(summary) // 4, type="compaction")]
        if not pause:
            if turn.thinking is not None:
                content.append({"type": "thinking", "thinking": turn.thinking})
            if turn.redacted:
                content.append({"type": "redacted_thinking"})
            if turn.text is not None:
                content.append({"type": "text", "text": turn.text})
            if turn.tool_use is not None:
                name, tool_input = turn.tool_use
                content.append({"type": "tool_use", "id": turn.tool_id or self.next_id("toolu"), "name": name, "input": dict(tool_input)})
            if iterations is not None:
                iterations.append(usage(turn.input_tokens, turn.output_tokens, type="message", model=body.get("model")))
        message_id = self.next_id("msg")
        stop_reason = turn.stop_reason or ("compaction" if pause else "tool_use" if turn.tool_use else "end_turn")
        message: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": self.sign(body, betas, content, message_id=message_id),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage(turn.input_tokens, turn.output_tokens),
        }
        if iterations is not None:
            message["usage"]["iterations"] = iterations
        if turn.threshold_compaction or turn.applied_edits:
            message["context_management"] = {"applied_edits": [dict(edit) for edit in turn.applied_edits]}
        if verdict is not None and verdict.report:
            message["input_transformations"] = verdict.input_transformations()
        return message

    def compaction_answer(self, body: Mapping[str, Any], betas: Collection[str], verdict: Verdict | None = None) -> dict[str, Any]:
        """The answer to an on-demand compaction request: one signed block, no reply."""
        messages = body.get("messages") or []
        config = body.get("compaction")
        instructions = config.get("instructions") if isinstance(config, Mapping) else None
        model = str(body.get("model"))
        summary = self.summarize(messages, instructions if isinstance(instructions, str) else None)
        block: dict[str, Any] = {"type": "compaction", "content": summary}
        if BETA_INLINE_TOOLS in betas:
            block["tool_changes"] = net_tool_changes(messages)
        current = walker(body, self.signer).walk()
        if self.binds(model):  # the summary may stand in for the messages in later prefix checks
            chain, thought = current.chain, current.thought
        else:
            chain, thought = digest("opaque", compaction_content_digest(block)), None
        block["signature"] = self.signer.seal(
            {
                "k": "c",
                "m": model,
                "cd": compaction_content_digest(block),
                "tg": tool_changes_digest(block.get("tool_changes")),
                "mc": chain,
                "tc": thought,
            }
        )
        message: dict[str, Any] = {
            "id": self.next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [block],
            "stop_reason": "compaction",
            "stop_sequence": None,
            "usage": usage(iterations=[usage(len(canonical(messages)) // 4, len(summary) // 4, type="compaction")]),
        }
        if verdict is not None and verdict.report:
            message["input_transformations"] = verdict.input_transformations()
        return message

    @staticmethod
    def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return stream_events(message)
