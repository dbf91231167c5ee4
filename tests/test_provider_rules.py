"""The fake provider rules (tests/provider_rules) against the published rules they encode,
driven through a real FakeUpstream with the official SDK (and raw aiohttp where the exact
bytes matter). Each test names the source it encodes; the quotes are in the package docstring
of tests/provider_rules ([THINK], [TROUBLE], [BEDROCK], [SDK], [COMPACTION], [COMPACT-THINK],
[MIDSYS], [OBSERVED])."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from anthropic.types.compaction_block_ambiguous_error import CompactionBlockAmbiguousError
from anthropic.types.compaction_block_misplaced_error import CompactionBlockMisplacedError
from anthropic.types.compaction_content_mismatch_error import CompactionContentMismatchError
from anthropic.types.compaction_incomplete_turn_error import CompactionIncompleteTurnError
from anthropic.types.compaction_nothing_to_summarize_error import CompactionNothingToSummarizeError
from anthropic.types.compaction_signature_invalid_error import CompactionSignatureInvalidError
from anthropic.types.compaction_tool_changes_mismatch_error import (
    CompactionToolChangesMismatchError,
)
from anthropic.types.compaction_unavailable_error import CompactionUnavailableError

from tests.harness import LoopThread
from tests.provider_rules import (
    BETA_BINDING,
    BETA_COMPACT,
    BETA_INLINE_TOOLS,
    BETA_THRESHOLD,
    ProviderRules,
    Turn,
    betas_of,
)
from tests.provider_rules.signing import Signer
from tests.upstream import FakeUpstream, RecordedRequest, Reply

FABLE = "claude-fable-5-1"
OPUS = "claude-opus-5"  # thinks, does not bind
SONNET = "claude-sonnet-4-5"  # manual ("enabled") thinking
SYSTEM = "You are a careful agent. Read files with the tool."
TOOLS: list[dict[str, Any]] = [
    {"name": "read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
]
PREFIX_400 = (
    "{path}: Invalid `signature` in `thinking` block. The block is bound to a different conversation. "
    'Remove the block, or set `thinking.block_binding.{field}` to "drop_block".'
)
NO_BETA = " That setting requires the `thinking-binding-controls-2026-08-01` value in the `anthropic-beta` header."
ERROR = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}}
DROP = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
SECRET = b"one provider"  # rules swapped mid-test keep the secret, so earlier blocks stay genuine


@pytest.fixture
def rules(upstream: FakeUpstream) -> Iterator[ProviderRules]:
    provider = ProviderRules(secret=SECRET)
    upstream.use_rules(provider)
    yield provider
    upstream.use_rules(None)


@pytest.fixture
def client(upstream: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=upstream.url, api_key="test-key", max_retries=0)


@dataclass
class Chat:
    """A conversation a faithful client keeps: answers appended verbatim, tool results after."""

    client: anthropic.Anthropic
    upstream: FakeUpstream
    model: str = FABLE
    system: Any = SYSTEM
    tools: list[dict[str, Any]] = field(default_factory=lambda: copy.deepcopy(TOOLS))
    messages: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "user", "content": "Read the files."}])
    betas: list[str] = field(default_factory=list)
    thinking: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def params(self, **overrides: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "max_tokens": 4096, "messages": self.messages, **self.extra}
        if self.system is not None:
            params["system"] = self.system
        if self.tools:
            params["tools"] = self.tools
        if self.thinking is not None:
            params["thinking"] = self.thinking
        if self.betas:
            params["betas"] = self.betas
        params.update(overrides)
        return {key: value for key, value in params.items() if value is not None}

    def raw(self, **overrides: Any) -> dict[str, Any]:
        """The answer's JSON exactly as the fake sent it (the SDK raises on an error status)."""
        response = self.client.beta.messages.with_raw_response.create(**self.params(**overrides))
        body: dict[str, Any] = orjson.loads(response.http_response.content)
        return body

    def step(self, turn: Turn, **overrides: Any) -> dict[str, Any]:
        self.upstream.script(turn)
        answer = self.raw(**overrides)
        self.take(answer)
        return answer

    def take(self, answer: dict[str, Any]) -> None:
        self.messages.append({"role": "assistant", "content": answer["content"]})
        uses = [block for block in answer["content"] if block["type"] == "tool_use"]
        if uses:
            self.messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": use["id"], "content": f"contents of {use['input'].get('path')}"}
                        for use in uses
                    ],
                }
            )

    def loop(self, turns: int, **overrides: Any) -> None:
        for k in range(turns):
            self.step(Turn(thinking=f"Step {k}: read f{k}.", tool_use=("read", {"path": f"f{k}"})), **overrides)


def bad_request(call: Any) -> dict[str, Any]:
    with pytest.raises(anthropic.BadRequestError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def message_of(call: Any) -> str:
    return str(bad_request(call)["error"]["message"])


def thinking_paths(messages: list[dict[str, Any]]) -> list[str]:
    return [
        f"messages.{i}.content.{j}"
        for i, message in enumerate(messages)
        if isinstance(message["content"], list)
        for j, block in enumerate(message["content"])
        if block["type"] in ("thinking", "redacted_thinking")
    ]


# -- A. thinking blocks bound to their prefix ------------------------------------------------------
def test_a_20_turn_tool_loop_sent_back_verbatim_passes_every_check(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "Append only": history passed back unchanged keeps every block valid; under the
    beta every answer carries ``input_transformations``, ``[]`` when nothing was dropped."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], thinking=ERROR)
    for k in range(20):
        answer = chat.step(Turn(thinking=f"Step {k}.", tool_use=("read", {"path": f"f{k}"})))
        assert answer["input_transformations"] == []
        assert answer["content"][0]["type"] == "thinking" and answer["content"][0]["signature"]
    final = chat.step(Turn(thinking="All read.", text="Done."))
    assert final["stop_reason"] == "end_turn" and final["input_transformations"] == []
    assert len(thinking_paths(chat.messages)) == 21
    assert all(verdict.accepted and not verdict.dropped for verdict in upstream.verdicts)
    assert len(upstream.verdicts) == 21


def test_without_the_beta_answers_carry_no_input_transformations(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "Without the beta header the field is absent."; [SDK] the JSON and the stream."""
    chat = Chat(client, upstream)
    answer = chat.step(Turn(thinking="Plan.", tool_use=("read", {"path": "a"})))
    assert "input_transformations" not in answer
    upstream.script(Turn(thinking="Go on.", text="ok"))
    with client.beta.messages.stream(**chat.params()) as stream:
        final = stream.get_final_message()
    assert final.input_transformations is None


def test_an_edited_earlier_message_is_the_documented_400_and_never_reaches_the_script(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK]/[TROUBLE]/[FIX]: enforced by default on a new account; the message names the
    first failing block, adds the header sentence without the beta, and may end with what
    changed ([OBSERVED] probe wording)."""
    chat = Chat(client, upstream)
    chat.loop(2)
    edited = copy.deepcopy(chat.messages)
    edited[0]["content"] = "Read the files, then stop."
    upstream.script(Reply({"marker": "scripted"}))
    message = message_of(lambda: chat.raw(messages=edited))
    assert message == (
        PREFIX_400.format(path="messages.1.content.0", field="prefix_mismatch_behavior")
        + NO_BETA
        + " Content before this block differs from when it was created, first at `messages.0.content.0`."
    )
    assert upstream.verdicts[-1].rejection is not None and upstream.verdicts[-1].rejection.status == 400
    assert chat.raw() == {"marker": "scripted"}  # the scripted entry went to the next valid request


def test_with_the_beta_the_400_has_no_header_sentence(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "The last sentence appears only when the request didn't send the beta header";
    [SDK] "error" is the default with the beta ([BEDROCK] says drop_block: see the next test)."""
    chat = Chat(client, upstream, betas=[BETA_BINDING])
    chat.loop(2)
    chat.messages[2]["content"][0]["content"] = "other contents"
    message = message_of(lambda: chat.raw())
    assert message.startswith(PREFIX_400.format(path="messages.3.content.0", field="prefix_mismatch_behavior") + " Content")
    assert "requires the" not in message


def test_the_bedrock_default_and_spelling(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[BEDROCK]: "If `mismatch_behavior` is omitted with the beta value, it behaves like
    "drop_block""; its spelling `mismatch_behavior` is accepted and quoted back."""
    upstream.use_rules(ProviderRules(default_behavior="drop_block"))
    chat = Chat(client, upstream, betas=[BETA_BINDING])
    chat.loop(1)
    chat.messages[0]["content"] = "changed"
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == [
        {"type": "thinking_dropped", "path": "messages.1.content.0", "reason": "prefix_binding_mismatch"}
    ]
    chat.thinking = {"type": "adaptive", "block_binding": {"mismatch_behavior": "error"}}
    assert message_of(lambda: chat.raw()).startswith(PREFIX_400.format(path="messages.1.content.0", field="mismatch_behavior"))


def test_drop_block_drops_every_block_made_before_the_change_and_reports_it_in_message_start(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] drop_block "drops the failing block and every thinking block after it in the
    conversation"; [BEDROCK] streaming: "within the message object inside the `message_start`
    event and is not repeated in `message_delta`". A block made after the change is bound to
    the changed conversation and stays."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], thinking=DROP)
    chat.loop(3)
    chat.messages[2]["content"][0]["content"] = "a reminder injected into an old turn"
    expected = [
        {"type": "thinking_dropped", "path": path, "reason": "prefix_binding_mismatch"}
        for path in ("messages.3.content.0", "messages.5.content.0")
    ]
    answer = chat.step(Turn(thinking="After the edit.", tool_use=("read", {"path": "g"})))
    assert answer["input_transformations"] == expected
    upstream.script(Turn(text="done"))
    with client.beta.messages.stream(**chat.params()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(event for event in events if event.type == "message_start")
    assert [entry.model_dump() for entry in start.message.input_transformations or []] == expected
    assert [entry.model_dump() for entry in final.input_transformations or []] == expected
    assert upstream.verdicts[-1].dropped == {"messages.3.content.0", "messages.5.content.0"}


def test_block_binding_without_the_beta_is_extra_inputs(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[BEDROCK] "`400 thinking.adaptive.block_binding: Extra inputs are not permitted`", with
    the request's thinking type in the path ([THINK]: accepted with adaptive and enabled)."""
    chat = Chat(client, upstream, thinking=DROP)
    assert message_of(lambda: chat.raw()) == "thinking.adaptive.block_binding: Extra inputs are not permitted"
    chat = Chat(client, upstream, model=SONNET, thinking={"type": "enabled", "budget_tokens": 2048, "block_binding": {}})
    assert message_of(lambda: chat.raw()) == "thinking.enabled.block_binding: Extra inputs are not permitted"
    chat.betas = [BETA_BINDING]
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        (
            {"prefix_mismatch_behavior": "drop_block", "mismatch_behavior": "error"},
            "thinking.adaptive.block_binding: `prefix_mismatch_behavior` and `mismatch_behavior` name the same "
            "setting and were sent with different values; send one of them.",
        ),
        ({"prefix_mismatch_behavior": "drop"}, "thinking.adaptive.block_binding.prefix_mismatch_behavior: Input should be 'error' or 'drop_block'"),
        ({"bind_to_end_user": "yes"}, "thinking.adaptive.block_binding.bind_to_end_user: Input should be a valid boolean"),
        ({"drop": True}, "thinking.adaptive.block_binding.drop: Extra inputs are not permitted"),
        ({"prefix_mismatch_behavior": "drop_block", "mismatch_behavior": "drop_block"}, None),
    ],
)
def test_block_binding_values(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream, binding: dict[str, Any], expected: str | None
) -> None:
    """[BEDROCK] "Malformed values return a standard 400 naming the field"; two spellings with
    different values: our own 400 (the brief); the same value in both is one setting."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], thinking={"type": "adaptive", "block_binding": binding})
    if expected is None:
        upstream.script(Turn(text="ok"))
        assert chat.raw()["content"] == [{"type": "text", "text": "ok"}]
    else:
        assert message_of(lambda: chat.raw()) == expected


def test_cache_control_moved_every_turn_like_claude_code_keeps_blocks_valid(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "`cache_control` markers, wherever you place or move them": Claude Code moves its
    marker to the newest message on every request, and marks system and tools too."""
    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    marker = {"type": "ephemeral"}
    chat.system = [{"type": "text", "text": SYSTEM, "cache_control": marker}]
    chat.tools[0]["cache_control"] = marker
    for k in range(6):
        for message in chat.messages:  # the client strips old markers and marks the newest block
            if isinstance(message["content"], list):
                for block in message["content"]:
                    block.pop("cache_control", None)
        last = chat.messages[-1]
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        last["content"][-1]["cache_control"] = marker
        answer = chat.step(Turn(thinking=f"Step {k}.", tool_use=("read", {"path": f"f{k}"})))
        assert answer["input_transformations"] == []


def test_key_order_and_the_string_shorthand_are_not_content(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """Canonical JSON with sorted keys; a string content/system is one text block (the SDK's
    shorthand for the same prompt)."""
    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    chat.loop(2)
    reordered = [
        {key: message[key] for key in reversed(list(message))}
        if not isinstance(message["content"], list)
        else {"content": [dict(reversed(list(block.items()))) for block in message["content"]], "role": message["role"]}
        for message in chat.messages
    ]
    reordered[0] = {"role": "user", "content": [{"type": "text", "text": "Read the files."}]}
    upstream.script(Turn(text="ok"))
    assert chat.raw(messages=reordered, system=[{"type": "text", "text": SYSTEM}])["input_transformations"] == []


@pytest.mark.parametrize(
    ("change", "tail"),
    [
        ({"system": SYSTEM + " Today is Tuesday."}, "The `system` prompt differs from when this block was created."),
        ({"tools": [*TOOLS, {"name": "write", "input_schema": {"type": "object"}}]}, "The `tools` list differs from when this block was created."),
        ({"tools": [*TOOLS, {"name": "grep", "input_schema": {"type": "object"}, "defer_loading": True}]}, None),
        ({"max_tokens": 1000, "output_config": {"effort": "low"}}, None),
    ],
)
def test_system_and_tools_are_the_prefix_deferred_tools_and_settings_are_not(
    rules: ProviderRules,
    client: anthropic.Anthropic,
    upstream: FakeUpstream,
    change: dict[str, Any],
    tail: str | None,
) -> None:
    """[THINK] "Changing the content of the top-level `system` prompt, or adding, removing, or
    editing a tool" invalidates; "Changing `output_config.effort`, `max_tokens`" does not;
    [COMPACT-THINK] tools marked `defer_loading: true` are not part of it."""
    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    chat.loop(1)
    if tail is None:
        upstream.script(Turn(text="ok"))
        assert chat.raw(**change)["input_transformations"] == []
    else:
        assert message_of(lambda: chat.raw(**change)) == PREFIX_400.format(
            path="messages.1.content.0", field="prefix_mismatch_behavior"
        ) + " " + tail


def test_an_appended_system_message_keeps_earlier_blocks_but_removing_it_fails_later_ones(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[MIDSYS]: appending a ``role: "system"`` message keeps the prefix; "Changing or deleting
    a mid-conversation system message after it was sent [...] makes the thinking blocks of all
    later assistant turns invalid" ([BEDROCK]: "a transient system message")."""
    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    chat.loop(1)
    chat.messages.append({"role": "system", "content": "Prefer short answers."})
    chat.loop(1)
    assert upstream.verdicts[-1].accepted
    without = [message for message in chat.messages if message["role"] != "system"]
    upstream.script(Turn(text="ok"))
    assert message_of(lambda: chat.raw(messages=without)).startswith(
        PREFIX_400.format(path="messages.3.content.0", field="prefix_mismatch_behavior")
    )
    chat.messages[3]["content"] = "Prefer long answers."
    assert message_of(lambda: chat.raw()).startswith(PREFIX_400.format(path="messages.4.content.0", field="prefix_mismatch_behavior"))


@pytest.mark.parametrize(
    ("edit", "path", "tail"),
    [
        ("truncate", "messages.1.content.0", "Content before this block is missing since it was created."),
        ("prepend", "messages.3.content.1", "Content before this block is new since it was created, first at `messages.3.content.0`."),
        ("middle", "messages.5.content.0", "An earlier thinking block is missing or out of order."),
        ("forgotten", "messages.1.content.0", None),
    ],
)
def test_the_closing_sentence_names_what_changed(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream, edit: str, path: str, tail: str | None
) -> None:
    """[TROUBLE] "The message usually ends with a sentence naming what changed: [...] content
    that is missing or new, or an earlier thinking block that is missing or out of order." (the
    wordings are ours but the first-difference one, [OBSERVED]); none when the fake does not
    remember the block (another fake with the same secret made it)."""
    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    chat.loop(3)
    messages = copy.deepcopy(chat.messages)
    if edit == "truncate":  # a proxy that cut the oldest exchange
        messages = [messages[0], *messages[3:]]
    elif edit == "prepend":
        messages[3]["content"].insert(0, {"type": "text", "text": "Note."})
    elif edit == "middle":
        del messages[3]["content"][0]
    else:
        upstream.use_rules(ProviderRules(secret=SECRET))
        messages[0]["content"] = "edited"
    message = message_of(lambda: chat.raw(messages=messages))
    assert message == PREFIX_400.format(path=path, field="prefix_mismatch_behavior") + (f" {tail}" if tail else "")


def test_a_leading_run_of_thinking_blocks_may_go_a_block_from_the_middle_may_not(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "Removing a leading run of thinking blocks, oldest first" is fine; "Removing a
    thinking block from anywhere else invalidates every thinking block after it"."""
    chat = Chat(client, upstream, thinking=DROP, betas=[BETA_BINDING])
    chat.loop(4)
    leading = copy.deepcopy(chat.messages)
    del leading[1]["content"][0]
    del leading[3]["content"][0]
    upstream.script(Turn(text="ok"))
    assert chat.raw(messages=leading)["input_transformations"] == []
    middle = copy.deepcopy(chat.messages)
    del middle[3]["content"][0]
    upstream.script(Turn(text="ok"))
    assert chat.raw(messages=middle)["input_transformations"] == [
        {"type": "thinking_dropped", "path": f"messages.{i}.content.0", "reason": "prefix_binding_mismatch"} for i in (5, 7)
    ]


def test_a_block_another_model_cannot_read_is_always_dropped_never_an_error(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK]: no other model reads Fable 5.1's blocks; "Neither value changes the model check,
    which always drops"; reported under the beta, "Without it the drop is silent"; Fable 5.1
    reads the other models' blocks ([TROUBLE]: never "this error")."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], thinking=ERROR)
    chat.loop(2)
    upstream.script(Turn(text="ok"))
    switched = chat.raw(model=OPUS)
    assert switched["input_transformations"] == [
        {"type": "thinking_dropped", "path": path, "reason": "model_binding_mismatch"} for path in thinking_paths(chat.messages)
    ]
    upstream.script(Turn(text="ok"))
    quiet = chat.raw(model=OPUS, betas=None, thinking=None)
    assert "input_transformations" not in quiet and upstream.verdicts[-1].dropped
    for producer in (OPUS, "claude-mythos-5-1"):  # Fable 5.1 reads older models' blocks and Mythos 5.1's
        older = Chat(client, upstream, model=producer, betas=[BETA_BINDING])
        older.loop(2)
        upstream.script(Turn(text="ok"))
        assert older.raw(model=FABLE, thinking=DROP)["input_transformations"] == []


def test_a_model_that_does_not_bind_never_checks_the_prefix(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[BEDROCK]/[THINK]: "Models that don't run the conversation check accept the object and
    report only model-check drops"."""
    chat = Chat(client, upstream, model=OPUS, betas=[BETA_BINDING], thinking=ERROR)
    chat.loop(2)
    chat.messages[0]["content"] = "edited"
    chat.system = "rebuilt"
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []


@pytest.mark.parametrize("model", [FABLE, OPUS])
def test_an_altered_or_forged_signature_is_always_the_plain_400(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream, model: str
) -> None:
    """[THINK] "A tampered or undecryptable signature [...] always returns a 400 [...] with no
    reason clause and `prefix_mismatch_behavior` doesn't apply to it"; [BEDROCK] "regardless
    of these checks or the beta value" — on every model; the redacted_thinking wording."""
    chat = Chat(client, upstream, model=model, betas=[BETA_BINDING], thinking=DROP)
    chat.step(Turn(thinking="One.", redacted=True, tool_use=("read", {"path": "a"})))
    chat.loop(1)
    cases: list[tuple[str, Any, str]] = [
        ("signature", lambda b: b[:-4] + ("AAAA" if not b.endswith("AAAA") else "BBBB"), "thinking"),
        ("signature", lambda b: "EqQBCgIYAhIM1gbcDa9GJwZA2b", "thinking"),
        ("thinking", lambda t: t + " (edited)", "thinking"),
    ]
    for key, alter, kind in cases:
        altered = copy.deepcopy(chat.messages)
        altered[1]["content"][0][key] = alter(altered[1]["content"][0][key])
        assert message_of(lambda m=altered: chat.raw(messages=m)) == f"messages.1.content.0: Invalid `signature` in `{kind}` block"
    redacted = copy.deepcopy(chat.messages)
    redacted[1]["content"][1]["data"] = redacted[1]["content"][1]["data"][::-1]
    assert message_of(lambda: chat.raw(messages=redacted)) == "messages.1.content.1: Invalid `signature` in `redacted_thinking` block"


def test_the_latest_assistant_message_cannot_be_modified(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """Section 3 / [TROUBLE]: "`thinking` or `redacted_thinking` blocks in the latest assistant
    message cannot be modified"; [THINK] "you can't rearrange, edit, or partially drop them"."""
    chat = Chat(client, upstream)
    chat.loop(1)
    chat.step(Turn(thinking="Two.", redacted=True, tool_use=("read", {"path": "b"})))
    expected = (
        "messages.{}.content.{}: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be "
        "modified. These blocks must remain as they were in the original response."
    )
    edited = copy.deepcopy(chat.messages)
    edited[3]["content"][0]["thinking"] = "Two, edited."
    assert message_of(lambda: chat.raw(messages=edited)) == expected.format(3, 0)
    swapped = copy.deepcopy(chat.messages)
    swapped[3]["content"][0], swapped[3]["content"][1] = swapped[3]["content"][1], swapped[3]["content"][0]
    assert message_of(lambda: chat.raw(messages=swapped)) == expected.format(3, 0)
    partial = copy.deepcopy(chat.messages)
    del partial[3]["content"][1]
    assert message_of(lambda: chat.raw(messages=partial)) == expected.format(3, 0)


def test_an_omitted_blocks_text_is_ignored(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[THINK] "Any text you place in the `thinking` field of a round-tripped omitted block is
    ignored."""
    chat = Chat(client, upstream)
    chat.step(Turn(thinking="", tool_use=("read", {"path": "a"})))
    chat.messages[1]["content"][0]["thinking"] = "something a client filled in"
    upstream.script(Turn(text="ok"))
    assert chat.raw()["content"][0]["text"] == "ok"


def test_end_user_binding(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[BEDROCK] "The replaying request carries the same end-user identifier the producing
    request carried — unless the producer set bind_to_end_user to false"; [SDK]
    `end_user_binding_mismatch`. The error's wording is ours."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], extra={"metadata": {"user_id": "alice"}})
    chat.loop(1)
    message = message_of(lambda: chat.raw(metadata={"user_id": "bob"}))
    assert message == (
        "messages.1.content.0: Invalid `signature` in `thinking` block. The block is bound to a different end user. "
        'Remove the block, or set `thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
    )
    upstream.script(Turn(text="ok"))
    assert chat.raw(metadata={"user_id": "bob"}, thinking=DROP)["input_transformations"] == [
        {"type": "thinking_dropped", "path": "messages.1.content.0", "reason": "end_user_binding_mismatch"}
    ]
    unbound = Chat(client, upstream, betas=[BETA_BINDING], extra={"metadata": {"user_id": "alice"}})
    unbound.thinking = {"type": "adaptive", "block_binding": {"bind_to_end_user": False}}
    unbound.loop(1)
    upstream.script(Turn(text="ok"))
    assert unbound.raw(metadata={"user_id": "bob"}, thinking=ERROR)["input_transformations"] == []


def test_an_older_account_reports_a_mismatch_unless_the_request_opts_in(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[THINK] "For accounts created earlier, the API records the condition [...] but doesn't
    act on a mismatch unless the request sets `prefix_mismatch_behavior`"; [SDK]
    `thinking_mismatch_allowed`: "shown to the model all the same"."""
    upstream.use_rules(ProviderRules(account_enforced=False))
    chat = Chat(client, upstream, betas=[BETA_BINDING])
    chat.loop(1)
    chat.messages[0]["content"] = "edited"
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == [
        {"type": "thinking_mismatch_allowed", "path": "messages.1.content.0", "reason": "prefix_binding_mismatch"}
    ]
    assert not upstream.verdicts[-1].dropped
    assert message_of(lambda: chat.raw(thinking=ERROR)).startswith(PREFIX_400.format(path="messages.1.content.0", field="prefix_mismatch_behavior"))


EXPECTED_THINKING = (
    "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` is "
    "enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` "
    "and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def test_in_manual_mode_the_final_assistant_message_must_start_with_thinking(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[OBSERVED] opencode#3077's exact text; [THINK] "In extended (manual) mode, the API
    additionally enforces [...] Adaptive mode relaxes this" (``leading_thinking_modes``)."""
    chat = Chat(client, upstream, model=SONNET)
    chat.step(Turn(tool_use=("read", {"path": "a"})))
    enabled = {"type": "enabled", "budget_tokens": 2048}
    assert message_of(lambda: chat.raw(thinking=enabled)) == EXPECTED_THINKING
    upstream.script(Turn(text="ok"))
    assert chat.raw(thinking={"type": "adaptive"})["content"][0]["text"] == "ok"
    upstream.use_rules(ProviderRules(leading_thinking_modes=("enabled", "adaptive"), secret=SECRET))
    assert message_of(lambda: chat.raw(thinking={"type": "adaptive"})) == EXPECTED_THINKING
    chat.messages.append({"role": "user", "content": "Next question."})  # a new turn: no final assistant message
    upstream.script(Turn(text="ok"))
    assert chat.raw(thinking=enabled)["content"][0]["text"] == "ok"


def test_thinking_in_the_final_assistant_message_while_thinking_is_disabled(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[OBSERVED] forgecode#1853's exact text; [THINK] describes a silent degradation instead
    (``reject_thinking_when_disabled=False``)."""
    chat = Chat(client, upstream, model=SONNET, thinking={"type": "enabled", "budget_tokens": 2048})
    chat.step(Turn(thinking="Plan.", tool_use=("read", {"path": "a"})))
    assert message_of(lambda: chat.raw(thinking={"type": "disabled"})) == (
        "messages.1.content.0: When thinking is disabled, an `assistant` message in the final position cannot contain "
        "`thinking`. To use thinking blocks, enable `thinking` in your request."
    )
    assert "cannot contain" in message_of(lambda: chat.raw(thinking=None))  # no thinking on a non-binding model: off
    upstream.use_rules(ProviderRules(reject_thinking_when_disabled=False, secret=SECRET))
    upstream.script(Turn(text="ok"))
    assert chat.raw(thinking={"type": "disabled"})["content"][0]["text"] == "ok"


def test_the_turn_rules_apply_after_the_drops(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """The brief: the section 3 rules run on what is left after dropping: a Fable 5.1 block
    dropped for the model check leaves a final assistant message without thinking. The path
    names the block as sent (the first one left is content.1)."""
    chat = Chat(client, upstream)
    chat.step(Turn(thinking="Plan.", tool_use=("read", {"path": "a"})))
    assert message_of(lambda: chat.raw(model=SONNET, thinking={"type": "enabled", "budget_tokens": 2048})) == (
        EXPECTED_THINKING.replace("content.0.type", "content.1.type")
    )


def test_count_tokens_runs_the_same_check(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[THINK] "The token counting endpoint runs the same check and returns the same 400";
    [BEDROCK] "the array is not returned by `CountTokens`"."""
    chat = Chat(client, upstream)
    chat.loop(1)
    chat.messages[0]["content"] = "edited"
    params = {k: v for k, v in chat.params().items() if k != "max_tokens"}
    assert message_of(lambda: client.beta.messages.count_tokens(**params)) == (
        PREFIX_400.format(path="messages.1.content.0", field="prefix_mismatch_behavior")
        + NO_BETA
        + " Content before this block differs from when it was created, first at `messages.0.content.0`."
    )
    params |= {"betas": [BETA_BINDING], "thinking": DROP}
    counted = client.beta.messages.with_raw_response.count_tokens(**params)
    assert set(orjson.loads(counted.http_response.content)) == {"input_tokens"}
    assert upstream.verdicts[-1].dropped == {"messages.1.content.0"}


def test_count_tokens_ignores_the_compaction_parameter(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] "The token counting endpoint ignores the `compaction` parameter."; it does
    check the blocks a request carries ([COMPACTION]: "applies existing `compaction` blocks")."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    for betas in ([BETA_COMPACT], [BETA_BINDING]):
        counted = client.beta.messages.with_raw_response.count_tokens(
            model=FABLE, messages=messages, betas=betas, compaction={"type": "summarize"}
        )
        assert set(orjson.loads(counted.http_response.content)) == {"input_tokens"}
    forged: list[Any] = [{"role": "assistant", "content": [{"type": "compaction", "content": "x", "signature": "forged"}]}, *messages]
    with pytest.raises(CompactionSignatureInvalidError):
        client.beta.messages.count_tokens(model=FABLE, messages=forged, betas=[BETA_COMPACT])


def test_a_streamed_answer_round_trips_through_the_sdk(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """Thinking streams as thinking deltas and one signature delta (section 5); the SDK's
    accumulated message, sent back as the SDK serialises it, passes the checks."""
    chat = Chat(client, upstream, betas=[BETA_BINDING], thinking=ERROR)
    for k in range(3):
        upstream.script(Turn(thinking=f"Step {k}.", redacted=k == 1, tool_use=("read", {"path": f"f{k}"})))
        with client.beta.messages.stream(**chat.params()) as stream:
            final = stream.get_final_message()
        assert final.input_transformations == []
        chat.take(final.model_dump(mode="json", exclude_none=True))
    assert [block["type"] for block in chat.messages[3]["content"]] == ["thinking", "redacted_thinking", "tool_use"]
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []


def test_a_script_can_sign_blocks_for_the_request_it_answers(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """The helpers for hand-made answers: ``thinking_block`` (one signed block) and ``sign``
    (every thinking block of a content list, e.g. interleaved), for the request being answered."""
    def interleaved(recorded: RecordedRequest) -> Reply:
        body, betas = recorded.json(), betas_of(recorded.headers.getall("anthropic-beta", []))
        content = rules.sign(body, betas, [
            rules.thinking_block(body, betas, "First."),
            {"type": "text", "text": "Reading."},
            {"type": "thinking", "thinking": "Second."},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
        ])
        return Reply({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": content,
                      "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})

    chat = Chat(client, upstream, thinking=ERROR, betas=[BETA_BINDING])
    upstream.script(interleaved)
    chat.take(chat.raw())
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []
    swapped = copy.deepcopy(chat.messages)
    swapped[1]["content"][0], swapped[1]["content"][2] = swapped[1]["content"][2], swapped[1]["content"][0]
    assert "cannot be modified" in message_of(lambda: chat.raw(messages=swapped))


def test_the_error_answer_on_the_wire(rules: ProviderRules, loop_thread: LoopThread, upstream: FakeUpstream) -> None:
    """The error body's exact shape (section 6), its ``request_id`` equal to the header, and
    ``x-should-retry: false``; a streaming request gets the JSON 400, "before any streaming
    events" ([BEDROCK])."""
    body = {
        "model": FABLE,
        "max_tokens": 10,
        "stream": True,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "made up", "signature": "c2lnbmF0dXJl"}, {"type": "text", "text": "hello"}]},
            {"role": "user", "content": "and?"},
        ],
    }

    async def post() -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession() as session, session.post(
            upstream.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01", "x-api-key": "k"}
        ) as response:
            return response.status, dict(response.headers), await response.read()

    status, headers, raw = loop_thread.run(post())
    assert status == 400 and headers["Content-Type"] == "application/json" and headers["x-should-retry"] == "false"
    assert orjson.loads(raw) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages.1.content.0: Invalid `signature` in `thinking` block"},
        "request_id": headers["request-id"],
    }


def test_without_rules_the_fake_is_unchanged(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Its existing users see no check: a forged block is answered with the default message."""
    forged = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "forged"}]},
        {"role": "user", "content": "and?"},
    ]
    answer = client.messages.create(model=FABLE, max_tokens=10, messages=forged)  # type: ignore[arg-type]
    assert answer.content[0].type == "text" and upstream.verdicts == []


def test_the_signer_rejects_any_change() -> None:
    """The HMAC: every single-character change to a token fails, and another secret's tokens too."""
    signer = Signer(b"secret")
    token = signer.seal({"k": "t", "p": "prefix"})
    assert signer.open(token) == {"k": "t", "p": "prefix"}
    for i in range(len(token)):
        for other in "AB":
            if token[i] != other:
                assert signer.open(token[:i] + other + token[i + 1 :]) is None
    assert Signer(b"other").open(token) is None and signer.open(None) is None and signer.open("") is None


# -- B. the provider's compaction ---------------------------------------------------------------
def compacted_chat(client: anthropic.Anthropic, upstream: FakeUpstream, turns: int = 2, **kwargs: Any) -> Chat:
    chat = Chat(client, upstream, betas=[BETA_COMPACT, BETA_BINDING], thinking=ERROR, **kwargs)
    chat.loop(turns)
    chat.step(Turn(thinking="All read.", text="Done."))
    chat.messages.append({"role": "user", "content": "Summarise what you read."})
    return chat


def test_on_demand_compaction_answers_one_signed_block_and_takes_no_script_entry(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] "returns the block alone with `stop_reason` "compaction"", "The top-level
    `input_tokens` and `output_tokens` are zero", "`usage.iterations` reports it as the
    `compaction` entry"; the response carries no thinking."""
    chat = compacted_chat(client, upstream)
    upstream.script(Reply({"marker": "next"}))
    answer = chat.raw(compaction={"type": "summarize"})
    assert answer["stop_reason"] == "compaction"
    (block,) = answer["content"]
    assert block["type"] == "compaction" and block["signature"] and set(block) == {"type", "content", "signature"}
    assert block["content"].startswith("<summary>Summary of 7 messages (") and "user: Read the files." in block["content"]
    usage = answer["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (0, 0)
    (iteration,) = usage["iterations"]
    assert iteration["type"] == "compaction" and iteration["input_tokens"] > 0 and iteration["output_tokens"] > 0
    assert answer["input_transformations"] == []
    assert chat.raw() == {"marker": "next"}


def test_a_streamed_compaction_is_one_block_start_and_no_delta(
    rules: ProviderRules, loop_thread: LoopThread, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] "one `content_block_start` event carrying the complete block, then
    `content_block_stop`, with no `content_block_delta` events"; the SDK accumulates it."""
    chat = compacted_chat(client, upstream)
    with client.beta.messages.stream(**chat.params(compaction={"type": "summarize"})) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "compaction" and final.content[0].type == "compaction"
    assert not [event for event in events if event.type == "content_block_delta"]
    start = next(event for event in events if event.type == "content_block_start")
    assert start.content_block.model_dump(exclude_none=True) == final.content[0].model_dump(exclude_none=True)
    assert final.usage.iterations is not None and final.usage.iterations[0].type == "compaction"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"betas": [BETA_BINDING]}, "compaction: Extra inputs are not permitted"),
        ({"compaction": {"type": "trim"}}, "compaction.type: Input should be 'summarize'"),
        ({"compaction": {"type": "summarize", "instructions": "x" * 16_385}}, "compaction.instructions: String should have at most 16384 characters"),
        ({"context_management": {"edits": []}}, "`compaction` cannot be combined with `context_management`; send one or the other."),
        ({"stop_sequences": ["END"]}, "`stop_sequences` cannot be used with `compaction`: a compaction request samples no reply. Remove `stop_sequences`."),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            "`output_config.format` cannot be used with `compaction`: a compaction request samples no reply. Remove `output_config.format`.",
        ),
        ({"tool_choice": {"type": "any"}}, "`tool_choice` of type `any` cannot be used with `compaction`: use `auto` or `none`, or leave it out."),
        ({"tool_choice": {"type": "tool", "name": "read"}}, "`tool_choice` of type `tool` cannot be used with `compaction`: use `auto` or `none`, or leave it out."),
        ({"output_config": {"task_budget": {"type": "tokens", "total": 9000, "remaining": 100}}}, "`output_config.task_budget.remaining` cannot be sent with `compaction` or on a request that carries a `compaction` block."),
        ({"tool_choice": {"type": "auto"}}, None),
        ({"compaction": {"type": "summarize", "instructions": "   "}}, None),
    ],
)
def test_compaction_parameter_rules(
    rules: ProviderRules,
    client: anthropic.Anthropic,
    upstream: FakeUpstream,
    overrides: dict[str, Any],
    expected: str | None,
) -> None:
    """[COMPACTION]: the beta is needed (the error doesn't name it), `context_management`,
    `stop_sequences`, `output_config.format` and a forced `tool_choice` are rejected, the task
    budget's `remaining` too, instructions up to 16,384 characters ([SDK]: blank counts as
    absent); parameter errors "carry the message only"."""
    chat = compacted_chat(client, upstream)
    params = {"compaction": {"type": "summarize"}, **overrides}
    if expected is None:
        assert chat.raw(**params)["stop_reason"] == "compaction"
        return
    body = bad_request(lambda: chat.raw(**params))
    assert body["error"] == {"type": "invalid_request_error", "message": expected}


def test_the_summary_names_its_instructions_unless_blank(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] a non-blank `instructions` "replaces that prompt entirely"; [SDK] "An empty
    or whitespace-only value counts as absent." (the fake's summary shows which prompt ran)."""
    chat = compacted_chat(client, upstream)
    plain = chat.raw(compaction={"type": "summarize"})["content"][0]["content"]
    assert chat.raw(compaction={"type": "summarize", "instructions": " \n "})["content"][0]["content"] == plain
    custom = chat.raw(compaction={"type": "summarize", "instructions": "Keep file names."})["content"][0]["content"]
    assert custom != plain and ", under instructions " in custom


def test_what_a_compaction_request_must_hold(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[COMPACTION] "If the last `assistant` turn ends in a tool call with no result yet, the API
    rejects the request"; [SDK] `compaction_incomplete_turn`, `compaction_nothing_to_summarize`."""
    chat = Chat(client, upstream, betas=[BETA_COMPACT])
    chat.step(Turn(thinking="Plan.", tool_use=("read", {"path": "a"})))
    with pytest.raises(CompactionIncompleteTurnError):
        chat.raw(messages=chat.messages[:2], compaction={"type": "summarize"})
    noop = [{"role": "user", "content": [{"type": "compaction", "content": None}]}]
    with pytest.raises(CompactionNothingToSummarizeError):
        chat.raw(messages=noop, compaction={"type": "summarize"})


def test_the_block_goes_first_as_its_own_assistant_message_or_as_the_first_block(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] "Put the block first in `messages`, either as an `assistant` message of its
    own or as the first content block of the first message, whether that is a `user` or
    `assistant` message"; "Two `assistant` messages in a row are fine here"; compact again."""
    chat = compacted_chat(client, upstream)
    block = chat.raw(compaction={"type": "summarize"})["content"][0]
    for messages in (
        [{"role": "assistant", "content": [block]}, {"role": "user", "content": "Go on."}],
        [{"role": "user", "content": [block, {"type": "text", "text": "Go on."}]}],
        [{"role": "assistant", "content": [block]}, {"role": "assistant", "content": "Late reply."}, {"role": "user", "content": "Go on."}],
    ):
        upstream.script(Turn(text="ok"))
        assert chat.raw(messages=messages)["content"] == [{"type": "text", "text": "ok"}]
    again = chat.raw(messages=[{"role": "assistant", "content": [block]}, {"role": "user", "content": "More."}], compaction={"type": "summarize"})
    assert again["content"][0]["content"] != block["content"] and "assistant: " + block["content"][:20] in again["content"][0]["content"]


def test_misplaced_altered_forged_doubled_or_decorated_blocks(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] / [SDK]: `compaction_block_misplaced` (summarized messages left in front;
    in a system message), `compaction_content_mismatch`, `compaction_signature_invalid`,
    `compaction_block_ambiguous`; `cache_control` on the block is allowed ("places a
    breakpoint after the summary"); any other added field is a validation error."""
    chat = compacted_chat(client, upstream)
    block = chat.raw(compaction={"type": "summarize"})["content"][0]
    tail = [{"role": "user", "content": "Go on."}]
    with pytest.raises(CompactionBlockMisplacedError) as caught:
        chat.raw(messages=[*chat.messages, {"role": "assistant", "content": [block]}, *tail])
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error",
        "message": f"messages.{len(chat.messages)}.content.0: `compaction` block must be sent first, in place of the "
        "messages it summarizes; remove those messages.",
        "details": {"error_code": "compaction_block_misplaced"},
    }
    with pytest.raises(CompactionBlockMisplacedError):
        chat.raw(messages=[{"role": "system", "content": [block]}, *tail])
    with pytest.raises(CompactionContentMismatchError):
        chat.raw(messages=[{"role": "assistant", "content": [{**block, "content": block["content"] + " More."}]}, *tail])
    with pytest.raises(CompactionSignatureInvalidError):
        chat.raw(messages=[{"role": "assistant", "content": [{**block, "signature": "sig_forged"}]}, *tail])
    with pytest.raises(CompactionBlockAmbiguousError):
        chat.raw(messages=[{"role": "assistant", "content": [block, block]}, *tail])
    assert message_of(lambda: chat.raw(messages=[{"role": "assistant", "content": [{**block, "citations": None}]}, *tail])) == (
        "messages.0.content.0.citations: Extra inputs are not permitted"
    )
    upstream.script(Turn(text="ok"))
    decorated = [{"role": "assistant", "content": [{**block, "cache_control": {"type": "ephemeral"}}, {"type": "compaction", "content": None}]}]
    assert chat.raw(messages=[*decorated, *tail])["content"][0]["text"] == "ok"


def test_the_beta_is_needed_on_every_request_that_carries_the_block(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] "Send the `compact-2026-09-04` beta header [...] on every later request that
    carries the signed block"; the error is a generic validation one."""
    chat = compacted_chat(client, upstream)
    block = chat.raw(compaction={"type": "summarize"})["content"][0]
    messages = [{"role": "assistant", "content": [block]}, {"role": "user", "content": "Go on."}]
    assert message_of(lambda: chat.raw(messages=messages, betas=[BETA_BINDING])) == (
        "messages.0.content.0.type: Input tag 'compaction' found using 'type' does not match any of the expected tags"
    )
    assert message_of(lambda: chat.raw(messages=messages, betas=[BETA_THRESHOLD], thinking=None)) == (
        "messages.0.content.0.signature: Extra inputs are not permitted"
    )


def test_tool_changes_come_back_as_issued(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[COMPACT-THINK] with `inline-tools-2026-09-15` "the returned block records their net
    effect in its `tool_changes` field, so send the block back unmodified"; [SDK]
    `compaction_tool_changes_mismatch`; without that beta the field is absent."""
    chat = Chat(client, upstream, betas=[BETA_COMPACT, BETA_INLINE_TOOLS])
    chat.messages = [
        {"role": "user", "content": "Start."},
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "grep"}}]},
        {"role": "assistant", "content": "Started."},
        {"role": "user", "content": "Continue."},
    ]
    block = chat.raw(compaction={"type": "summarize"})["content"][0]
    assert block["tool_changes"] == [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "grep"}}]
    tail = [{"role": "user", "content": "Go on."}]
    with pytest.raises(CompactionToolChangesMismatchError):
        chat.raw(messages=[{"role": "assistant", "content": [{**block, "tool_changes": []}]}, *tail])
    assert "tool_changes" not in chat.raw(compaction={"type": "summarize"}, betas=[BETA_COMPACT])["content"][0]


def test_compaction_unavailable_is_a_retryable_529(rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """[COMPACTION] "A transient server problem while producing a block, or while reading one
    you sent back, returns a retryable 529 `overloaded_error` with `error.details.error_code`
    set to `compaction_unavailable`"; the SDK maps it to its class."""
    chat = compacted_chat(client, upstream)
    rules.refuse_compaction(1)
    with pytest.raises(CompactionUnavailableError) as caught:
        chat.raw(compaction={"type": "summarize"})
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert caught.value.response.headers["x-should-retry"] == "true"
    block = chat.raw(compaction={"type": "summarize"})["content"][0]
    rules.refuse_compaction()
    with pytest.raises(CompactionUnavailableError):
        chat.raw(messages=[{"role": "assistant", "content": [block]}, {"role": "user", "content": "Go on."}])
    upstream.script(Turn(text="no block, no refusal"))
    assert chat.raw()["content"][0]["text"] == "no block, no refusal"
    rules.refuse_compaction(0)
    upstream.script(Turn(text="ok"))
    assert chat.raw(messages=[{"role": "assistant", "content": [block]}, {"role": "user", "content": "Go on."}])["content"][0]["text"] == "ok"


def keep_tail(client: anthropic.Anthropic, upstream: FakeUpstream) -> tuple[Chat, dict[str, Any], list[dict[str, Any]]]:
    """The docs' program ([COMPACT-THINK] "Check that the kept thinking held"): two turns with
    thinking, the first compacted, the second kept."""
    chat = Chat(client, upstream, betas=[BETA_COMPACT, BETA_BINDING], thinking=ERROR, tools=[])
    chat.messages = [{"role": "user", "content": "What are the main entities in the app's data model?"}]
    chat.step(Turn(thinking="Entities.", text="Users, recipes."))
    chat.messages.append({"role": "user", "content": "On which date does testing end?"})
    chat.step(Turn(thinking="Count weekdays.", text="March 18."))
    block = chat.raw(messages=chat.messages[:2], compaction={"type": "summarize"})["content"][0]
    return chat, block, chat.messages[2:]


def test_kept_turns_keep_their_thinking_after_the_swap(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACT-THINK]: "A 200 response whose `input_transformations` array is empty means no
    thinking block failed the check"; thinking made after the block is bound to it."""
    chat, block, kept = keep_tail(client, upstream)
    chat.messages = [{"role": "assistant", "content": [block]}, *kept, {"role": "user", "content": "Which day should the release go out?"}]
    answer = chat.step(Turn(thinking="After the swap.", text="Friday."))
    assert answer["input_transformations"] == []
    chat.messages.append({"role": "user", "content": "And the one after?"})
    upstream.script(Turn(text="Monday."))
    assert chat.raw()["input_transformations"] == []


@pytest.mark.parametrize(
    "spoil",
    ["system message between", "system changed later", "compacted with another system", "compacted on a non-binding model", "edited kept turn"],
)
def test_kept_thinking_fails_when_a_condition_does_not_hold(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream, spoil: str
) -> None:
    """[COMPACT-THINK] conditions: a system message "between the block and the kept turns
    breaks their thinking"; a first kept message of the last summarized message's role is
    merged into it; `system` must not change, on the compaction request or after; the
    compaction request must run on a model with preserved thinking; kept turns are sent
    unchanged."""
    chat, block, kept = keep_tail(client, upstream)
    ask = {"role": "user", "content": "Which day should the release go out?"}
    messages = [{"role": "assistant", "content": [block]}, *kept, ask]
    overrides: dict[str, Any] = {}
    bad = "messages.2.content.0"
    if spoil == "system message between":
        messages.insert(1, {"role": "system", "content": "Be brief."})
        bad = "messages.3.content.0"
    elif spoil == "system changed later":
        overrides["system"] = SYSTEM + " (v2)"
    elif spoil == "compacted with another system":
        other = {"messages": chat.messages[:2], "compaction": {"type": "summarize"}, "system": "Other.", "thinking": DROP}
        block = chat.raw(**other)["content"][0]  # its own thinking is dropped there: a changed system
        messages[0] = {"role": "assistant", "content": [block]}
    elif spoil == "compacted on a non-binding model":
        block = chat.raw(messages=chat.messages[:2], compaction={"type": "summarize"}, model=OPUS)["content"][0]
        messages[0] = {"role": "assistant", "content": [block]}
    elif spoil == "edited kept turn":
        messages[1] = {"role": "user", "content": "On which date does testing end? (edited)"}
    message = message_of(lambda: chat.raw(messages=messages, **overrides))
    assert message.startswith(PREFIX_400.format(path=bad, field="prefix_mismatch_behavior"))


@pytest.mark.parametrize("first_kept", ["same role", "system message"])
def test_a_first_kept_message_the_api_merges_into_the_summarized_ones_breaks_kept_thinking(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream, first_kept: str
) -> None:
    """[COMPACT-THINK] "The first kept message must also have a different role from the last
    summarized message, and it can't be a mid-conversation `role: "system"` message.
    Otherwise, the API merges it into the last summarized message." The block sits in a user
    message here, so a kept user message would merge with it if the turn did not start anew."""
    chat = Chat(client, upstream, betas=[BETA_COMPACT, BETA_BINDING], thinking=ERROR, tools=[])
    chat.messages = [{"role": "user", "content": "First question."}]
    chat.step(Turn(thinking="One.", text="First answer."))
    boundary = {"role": "user", "content": "And a detail."} if first_kept == "same role" else {"role": "system", "content": "Be brief."}
    chat.messages += [{"role": "user", "content": "Second question."}, boundary]
    chat.step(Turn(thinking="Two.", text="Second answer."))
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []  # the conversation as it stands holds
    block = chat.raw(messages=chat.messages[:3], compaction={"type": "summarize"})["content"][0]
    swapped = [{"role": "user", "content": [block]}, *chat.messages[3:], {"role": "user", "content": "Go on."}]
    assert message_of(lambda: chat.raw(messages=swapped)).startswith(
        PREFIX_400.format(path="messages.2.content.0", field="prefix_mismatch_behavior")
    )
    kept_apart = [{"role": "user", "content": [block]}, *chat.messages[4:], {"role": "user", "content": "Go on."}]
    assert message_of(lambda: chat.raw(messages=kept_apart)).startswith(
        PREFIX_400.format(path="messages.1.content.0", field="prefix_mismatch_behavior")
    )  # leaving the merged message out is an edit too


def test_threshold_compaction_answer_json_and_stream(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[COMPACTION] threshold: "the API returns a `compaction` block at the start of the
    assistant response"; usage "a `compaction` iteration followed by the main `message`
    iteration"; streaming "a single `content_block_delta` with the complete summary";
    `context_management.applied_edits` on the message (JSON) and top-level in the final
    `message_delta` (stream, section 5)."""
    edit = {"context_management": {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}]}}
    chat = Chat(client, upstream, betas=[BETA_THRESHOLD, BETA_BINDING], thinking=ERROR, extra=edit)
    chat.loop(1)
    answer = chat.step(Turn(threshold_compaction=True, thinking="Continue from the summary.", tool_use=("read", {"path": "b"}), output_tokens=30))
    assert [block["type"] for block in answer["content"]] == ["compaction", "thinking", "tool_use"]
    assert "signature" not in answer["content"][0]
    assert [it["type"] for it in answer["usage"]["iterations"]] == ["compaction", "message"]
    assert answer["usage"]["output_tokens"] == answer["usage"]["iterations"][1]["output_tokens"] == 30
    assert answer["context_management"] == {"applied_edits": []}
    upstream.script(Turn(threshold_compaction=True, text="ok"))
    with client.beta.messages.stream(**chat.params()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [event.delta.type for event in events if event.type == "content_block_delta" and event.index == 0]
    assert deltas == ["compaction_delta"]
    assert final.content[0].type == "compaction" and final.content[0].content == answer["content"][0]["content"].replace(
        answer["content"][0]["content"], final.content[0].content or ""
    )
    assert final.context_management is not None and final.context_management.applied_edits == []
    assert final.usage.iterations is not None and [it.type for it in final.usage.iterations] == ["compaction", "message"]
    cleared = {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 900}
    upstream.script(Turn(text="ok", applied_edits=(cleared,), stop_reason="max_tokens"))
    scripted = chat.raw()
    assert scripted["context_management"] == {"applied_edits": [cleared]} and scripted["stop_reason"] == "max_tokens"


def test_after_a_threshold_block_the_checked_prefix_starts_from_it(
    rules: ProviderRules, client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    """[THINK] "After a compaction, the checked prefix starts from the compaction block";
    [COMPACTION] "all content blocks before it are ignored": earlier content may change, and
    thinking before the block is not even read."""
    edit = {"context_management": {"edits": [{"type": "compact_20260112", "pause_after_compaction": True}]}}
    chat = Chat(client, upstream, betas=[BETA_THRESHOLD, BETA_BINDING], thinking=ERROR, extra=edit)
    chat.loop(2)
    paused = chat.step(Turn(threshold_compaction=True, thinking="never sent"))
    assert paused["stop_reason"] == "compaction" and [b["type"] for b in paused["content"]] == ["compaction"]
    chat.messages.append({"role": "user", "content": "Go on."})
    chat.loop(2)
    chat.messages[0]["content"] = "rewritten before the block"
    chat.messages[1]["content"][0]["signature"] = "tampered"
    upstream.script(Turn(text="ok"))
    assert chat.raw()["input_transformations"] == []
    assert upstream.verdicts[-1].dropped == {"messages.1.content.0", "messages.3.content.0"}
    chat.messages[6]["content"] = "rewritten after the block"
    assert message_of(lambda: chat.raw()).startswith(PREFIX_400.format(path="messages.7.content.0", field="prefix_mismatch_behavior"))


@pytest.mark.parametrize(
    ("betas", "edit", "carry", "expected"),
    [
        ([BETA_BINDING], {"type": "compact_20260112"}, False,
         "context_management.edits.0: Input tag 'compact_20260112' found using 'type' does not match any of the expected tags: 'clear_tool_uses_20250919', 'clear_thinking_20251015'"),
        ([BETA_THRESHOLD], {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 49_999}}, False,
         "context_management.edits.0.trigger.value: Input should be greater than or equal to 50000"),
        ([BETA_THRESHOLD, BETA_COMPACT], {"type": "compact_20260112"}, True,
         "context_management.edits.0: `compact_20260112` cannot run on a request that carries a signed `compaction` block."),
    ],
)
def test_threshold_edit_rules(
    rules: ProviderRules,
    client: anthropic.Anthropic,
    upstream: FakeUpstream,
    betas: list[str],
    edit: dict[str, Any],
    carry: bool,
    expected: str,
) -> None:
    """[COMPACTION]: the edit needs `compact-2026-01-12`, its trigger "must be at least 50,000
    tokens", and "Threshold compaction (`compact_20260112`) can't run on a request that carries
    a signed block"."""
    chat = Chat(client, upstream, betas=[BETA_COMPACT])
    chat.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    if carry:
        block = chat.raw(compaction={"type": "summarize"})["content"][0]
        chat.messages = [{"role": "assistant", "content": [block]}, {"role": "user", "content": "Go on."}]
    assert message_of(lambda: chat.raw(betas=betas, context_management={"edits": [edit]})) == expected


def test_a_threshold_turn_needs_the_edit(rules: ProviderRules) -> None:
    with pytest.raises(ValueError, match="compact_20260112"):
        rules.answer({"model": FABLE, "messages": []}, frozenset(), Turn(threshold_compaction=True))
