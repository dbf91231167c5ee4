'''A rule-faithful fake of two of the provider's 2026 behaviours, for proxy tests: thinking
blocks bound to their model, end user and conversation prefix (beta
``thinking-binding-controls-2026-08-01``), and the provider's own compaction (on demand,
beta ``compact-2026-09-04``; at a threshold, beta ``compact-2026-01-12``). Pure logic, no
I/O: ``ProviderRules.check`` turns a request into a ``Verdict``; ``ProviderRules.answer`` /
``compaction_answer`` build the answers, with signatures made for the request they answer.
``tests/upstream.py`` runs it inside ``FakeUpstream`` (opt-in).

Usage::

    rules = ProviderRules()                       # Fable 5.1 / Mythos 5.1 bind; new account
    upstream.use_rules(rules)                     # or FakeUpstream(rules=rules)
    upstream.script(
        Turn(thinking="Read a first.", tool_use=("read", {"path": "a"})),
        Turn(thinking="Done.", text="a says hi."),
    )
    # ... drive the proxy; a history it edited is answered with the provider's 400 ...
    assert upstream.verdicts[-1].input_transformations() == []

Modules: ``signing`` (HMAC tokens), ``prefix`` (what a block is bound to), ``checks`` (the
request checks), ``answers`` (Turn, summaries, SSE), ``rules`` (the facade).


Sources (what was found; cite these in tests)
=============================================

[THINK] "Thinking", platform.claude.com/docs/en/build-with-claude/thinking, section
"Preserved thinking" and the sections before it (stored copy, 2026-09):

- "Starting with Claude Fable 5.1 and Claude Mythos 5.1, a `thinking` or `redacted_thinking`
  block is preserved only: For the model that produced it, or a newer one [...] In the
  conversation that produced it (Claude Fable 5.1 only)." "Claude Mythos 5.1 checks only the
  model condition."
- "Claude Fable 5.1 and Claude Mythos 5.1 read thinking blocks produced by each other, by
  Claude Opus 5, [...] No model other than these two can read a block produced by Claude Fable
  5.1 or Claude Mythos 5.1." "A block the receiving model can't read is dropped. [...] With the
  controls beta header the drop is reported in `input_transformations` as
  `model_binding_mismatch`. Without it the drop is silent."
- "This check is enforced for new accounts created on or after August 31, 2026. For accounts
  created earlier, the API records the condition in the signature but doesn't act on a mismatch
  unless the request sets `thinking.block_binding.prefix_mismatch_behavior`".
- The 400: "messages.5.content.0: Invalid `signature` in `thinking` block. The block is bound to
  a different conversation. Remove the block, or set
  `thinking.block_binding.prefix_mismatch_behavior` to "drop_block". That setting requires the
  `thinking-binding-controls-2026-08-01` value in the `anthropic-beta` header." "The last
  sentence appears only when the request didn't send the beta header. The message can end with
  one more sentence naming the first message that changed." "The token counting endpoint runs
  the same check and returns the same 400."
- "drop_block": "The API then drops the failing block and every thinking block after it in the
  conversation, and reports each one in `input_transformations` as `prefix_binding_mismatch`."
- What doesn't invalidate: "Removing a leading run of thinking blocks, oldest first [...]
  Removing a thinking block from anywhere else invalidates every thinking block after it";
  "Changing `output_config.effort`, `max_tokens`, or other sampling settings"; "`cache_control`
  markers, wherever you place or move them"; "Server-side compaction and context editing [...]
  After a compaction, the checked prefix starts from the compaction block."
- Controls: `prefix_mismatch_behavior`, default `"error"`; "Neither value changes the model
  check, which always drops." "`block_binding` is accepted alongside `thinking.type:
  "adaptive"` and `thinking.type: "enabled"`. Sending it without the beta header returns a 400
  error. Models that don't run the conversation check accept the object and report only
  model-check drops".
- `input_transformations`: "every response from a thinking-capable model carries this
  top-level array. It's empty when nothing was dropped and never `null`"; "When streaming,
  `input_transformations` arrives on the `message` object in the `message_start` event";
  "Without the beta header the field is absent."
- "A tampered or undecryptable signature is a different failure: it always returns a 400
  (`` Invalid `signature` in `thinking` block ``, with no reason clause) and
  `prefix_mismatch_behavior` doesn't apply to it."
- "Within the latest assistant message, the sequence of consecutive `thinking` blocks must
  match what the model generated in the original request: you can't rearrange, edit, or
  partially drop them." "Any text you place in the `thinking` field of a round-tripped omitted
  block is ignored."
- "In extended (manual) mode, the API additionally enforces that the final assistant turn of a
  thinking-enabled request begins with a thinking block. Adaptive mode relaxes this". "If you
  toggle thinking mid-turn [...] the API doesn't error. Instead, it silently disables thinking".

[TROUBLE] "Troubleshooting thinking",
platform.claude.com/docs/en/build-with-claude/thinking-troubleshooting (stored copy,
2026-09-26): the same 400 for "Claude Fable 5.1 or Claude Opus 5.5"; "The message usually ends
with a sentence naming what changed: the `system` prompt, the `tools` list, the first message
or block that differs, content that is missing or new, or an earlier thinking block that is
missing or out of order." "If the message stops after `` Invalid `signature` in `thinking`
block ``, the signature itself didn't verify". "The check is enforced for new accounts [...]
and for any request that sets `thinking.block_binding.prefix_mismatch_behavior`." "A block from
a model the target model can't read never produces this error". The "cannot be modified" 400:
"`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified".

[FIX] "Fix a thinking block bound to a different conversation",
platform.claude.com/docs/en/build-with-claude/preserved-thinking/fix-bound-to-a-different-conversation
(and [OVERVIEW] platform.claude.com/docs/en/build-with-claude/preserved-thinking): the 400
with `thinking.block_binding.prefix_mismatch_behavior`; "'A different conversation' means
different content before the block: the prefix check doesn't compare sessions or users."
"If the prefix differs from what you sent when the block was produced, that block and every
later thinking block are invalid".

[BEDROCK] "Thinking block binding (beta)",
docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-thinking-block-binding.html:
"The account, end-user, and conversation-prefix checks are enforced on Claude Fable 5.1 and
Claude Mythos 5.1. Other thinking-capable models accept the same fields and return
`input_transformations`, but do not run [them]." End user: "The replaying request carries the
same end-user identifier the producing request carried — unless the producer set
bind_to_end_user to false"; `bind_to_end_user` "Boolean, default true"; "pass
`metadata.user_id` [...] unchanged on each request". "A thinking block whose signature has been
altered or cannot be decrypted always returns a 400, regardless of these checks or the beta
value." "Without the beta value, sending `block_binding` returns `400
thinking.adaptive.block_binding: Extra inputs are not permitted`." "If `mismatch_behavior` is
omitted with the beta value, it behaves like "drop_block"." drop_block: "(for a prefix failure,
later thinking blocks in that turn are also removed)"; error: "Not retryable; returned before
any streaming events". "Avoid one-off content injected into earlier turns (for example, a
transient system message [...]). These change the conversation prefix". A newer version of
the page (search excerpt) says instead "Claude Fable 5.1 runs this check. Claude Mythos 5.1
records the same signature but doesn't run it."

[SDK] the `anthropic` wheel 2.16.0 installed here: types/beta/beta_thinking_block_binding_param.py
(`prefix_mismatch_behavior`: ""error" (default) | "drop_block""),
beta_thinking_dropped_input_transformation.py (reasons; "`prefix_binding_mismatch` [...] (the
rest of that turn's consecutive thinking blocks are removed with it, each with this reason)";
"A block that would fail several checks reports one reason, in this order of precedence:
`organization_binding_mismatch`, `end_user_binding_mismatch`, `model_binding_mismatch`,
`prefix_binding_mismatch`"), beta_thinking_mismatch_allowed_input_transformation.py (a block
that failed the conversation check and "was shown to the model all the same, because that check
is not enforced for this request"), beta_message.py (`input_transformations`: "as `[]` when there
is no entry to report"; "When streaming, the array is final in `message_start`").
_error_classes.py and types/compaction_*_error.py: `compaction_block_ambiguous` ("`messages`
holds more than one `compaction` block with content"), `compaction_block_misplaced` ("not the
first block of the conversation, or is in a `system` message"), `compaction_content_mismatch`,
`compaction_incomplete_turn` ("ends on an `assistant` turn that is not finished"),
`compaction_nothing_to_summarize`, `compaction_signature_invalid`,
`compaction_tool_changes_mismatch`, and (529) `compaction_unavailable`; the SDK picks the class
from `error.details.error_code`. beta_compaction_block_param.py: `cache_control` is a field of a
sent compaction block; `tool_changes` "the `tool_addition` and `tool_removal` entries that take
the request's `tools` to the tool set in effect at the end of the range". beta_compaction_config_param.py:
instructions "An empty or whitespace-only value counts as absent." beta_context_management_response.py:
`applied_edits` entries are `clear_tool_uses_20250919` / `clear_thinking_20251015` only.

[COMPACTION] "Compaction", platform.claude.com/docs/en/build-with-claude/compaction (stored
copy, 2026-09-20), "Compact on demand with the `compaction` parameter": "Send the
`compact-2026-09-04` beta header on the request that asks for the summary and on every later
request that carries the signed block." "You can't combine `compaction` with
`context_management`". "The API summarizes every message in the request once, generates no
reply after it, and returns the block alone with `stop_reason` `"compaction"`." "`usage.iterations`
reports it as the `compaction` entry. The top-level `input_tokens` and `output_tokens` are zero".
"If the last `assistant` turn ends in a tool call with no result yet, the API rejects the
request. [...] leave out `stop_sequences`, structured-output `output_config.format`, and a
`tool_choice` of type `any` or `tool`. [...] the API rejects them." Streaming: "one
`content_block_start` event carrying the complete block, then `content_block_stop`, with no
`content_block_delta` events". Placement: "Put the block first in `messages`, either as an
`assistant` message of its own or as the first content block of the first message, whether
that is a `user` or `assistant` message." "If any remain in front of the block, the request
returns a 400 error (`compaction_block_misplaced`). If any remain after it, the API doesn't
reject the request". "Send exactly one `compaction` block per request". "A non-blank
`instructions` string (up to 16,384 characters)". "A transient server problem while producing a
block, or while reading one you sent back, returns a retryable 529 `overloaded_error` with
`error.details.error_code` set to `compaction_unavailable`." "a request that leaves out the
beta header [...] fails with a generic validation error, such as `compaction: Extra inputs are
not permitted`". "Some also carry an `error.details.error_code` that starts with `compaction_`,
mostly the errors about the block itself [...] Parameter errors, such as a field that can't be
combined with `compaction`, carry the message only." "Threshold compaction (`compact_20260112`)
can't run on a request that carries a signed block." "`cache_control` on the block places a
breakpoint after the summary." Task budgets: "Don't send the `remaining` value [...] with
`compaction` or on requests that carry the block. Doing so returns a 400 error." "The token
counting endpoint ignores the `compaction` parameter." Threshold part: `trigger` "`value` must
be at least 50,000 tokens"; "When compaction is triggered, the API returns a `compaction` block
at the start of the assistant response"; with `pause_after_compaction` "the API returns a
message with the `compaction` stop reason"; streaming "a `content_block_start` event, followed
by a single `content_block_delta` with the complete summary content"; "When the API receives a
`compaction` block, all content blocks before it are ignored."

[COMPACT-THINK] "Compaction and preserved thinking",
platform.claude.com/docs/en/build-with-claude/compaction-thinking-blocks: kept turns' thinking
stays valid while "The compaction request runs on a model with preserved thinking"; "The kept
turns directly follow the summarized messages [...] The first kept message must also have a
different role from the last summarized message, and it can't be a mid-conversation `role:
"system"` message. Otherwise, the API merges it into the last summarized message."; "`system`
and the `tools` not marked `defer_loading: true` don't change"; "Compactions from before a
thinking block was produced don't count against it. Thinking produced after a block is in place
is bound to that block"; "A system message placed between the block and the kept turns breaks
their thinking."

[MIDSYS] "Mid-conversation system messages", platform.claude.com/docs/en/build-with-claude/
mid-conversation-system-messages: appended system messages keep the cached prefix. A digest of
that page in a public repository (find_string "makes the thinking blocks of all later") states:
"Changing or deleting a mid-conversation system message after it was sent breaks the cache from
its position on, and on Fable 5.1, Opus 5.5 and Sonnet 5.5 it also makes the thinking blocks of
all later assistant turns invalid."

[OBSERVED] error texts from real answers: anomalyco/opencode#3077 ("messages.1.content.0.type:
Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` is enabled, a
final `assistant` message must start with a thinking block (preceeding the lastmost set of
`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous
turns. To avoid this requirement, disable `thinking`. Please consult our documentation at
https://docs.claude.com/en/docs/build-with-claude/extended-thinking"); tailcallhq/forgecode#1853
and #1195 ("messages.1.content.0: When thinking is disabled, an `assistant` message in the
final position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your
request."); a recorded contract probe in a public repository's test fixture ("[...] Content
before this block differs from when it was created, first at `messages.0.content.0`."); a
third-party live probe log, 2026-10-09 ("400 `compaction_block_misplaced`, "`compaction` block
must be sent first, in place of the messages it summarizes; remove those messages"").


Choices where the sources are silent or disagree
================================================

- Which models check the end user and the prefix: ``binding_models``, default Fable 5.1 and
  Mythos 5.1 (the brief, [BEDROCK]); [THINK] and the newer [BEDROCK] say Mythos 5.1 only records,
  and [TROUBLE] names Opus 5.5 too. Pass ``binding_models=("claude-fable-5-1*",)`` for [THINK].
- Default behaviour with the beta and no setting: ``"error"`` ([THINK], [SDK]); [BEDROCK] says
  ``"drop_block"`` (``default_behavior="drop_block"``). Both spellings are accepted; sent
  together with different values they are a 400 of our own wording; the 400 quotes the
  spelling the request used.
- What a prefix failure drops: each block is checked against its own binding, and a block's
  binding covers every earlier thinking block (a chain) and all earlier non-thinking content. So
  a changed prefix fails every later block made before the change ([THINK] "every thinking
  block after it"), including the rest of its turn's consecutive run ([SDK], [BEDROCK]); a
  block made after the change is bound to the changed conversation and stays valid.
- The model check never errors and always drops ([THINK], [TROUBLE]; [BEDROCK] lumps it with
  the others); between two non-binding models nothing is dropped (older models "ignore or
  drop"; the fake does not model that table). ``can_read`` replaces the rule.
- Mid-conversation ``role: "system"`` messages are part of the prefix, merged into the turn
  before them: appending one leaves earlier blocks valid, editing or removing one later fails
  the blocks after it ([MIDSYS], [COMPACT-THINK], [BEDROCK]). The brief read section 11.3 ("do
  not invalidate [...] later thinking blocks") as "they don't count"; the pages say otherwise.
- Normalisation: ``cache_control`` is left out everywhere, as the docs say ("wherever you place
  or move them": Claude Code moves its marker to the newest message on every request) and as
  the prompt cache does; canonical JSON with sorted keys (key order is not content); a string
  ``content`` or ``system`` is one text block (the SDK's shorthand for the same prompt);
  consecutive messages of one role are one turn (the API merges them, [COMPACT-THINK]); tools
  with ``defer_loading: true`` are left out ([COMPACT-THINK]); thinking blocks are bound by a
  chain of their own, the first block after the start or a compaction block trusting its
  recorded link ("removing a leading run" is fine, a gap elsewhere is not).
- The latest assistant message: edited thinking text there is the "cannot be modified" 400, as
  is a reordered or partly dropped set of one answer's thinking blocks; an edit anywhere else,
  or any altered signature, is the plain ``Invalid `signature``` 400. An omitted-display block's
  text is not checked ([THINK]).
- Final assistant message (for the two turn rules): the last message if it is an assistant
  one, else the last assistant message when the last user message carries tool results. The
  leading-thinking rule applies under ``leading_thinking_modes`` (default ``{"enabled"}``,
  [THINK]; the brief said enabled and adaptive). Thinking in it while thinking is disabled is
  the observed 400 ([OBSERVED]), though [THINK] describes a silent degradation instead
  (``reject_thinking_when_disabled=False``). "Disabled": ``thinking.type == "disabled"``, or no
  ``thinking`` on a model that does not think by default ([TROUBLE]'s table: Fable, Mythos,
  Opus 5 and Sonnet 5 models do; ``thinking_by_default``). Both apply after the drops; like
  every path here, theirs names the block as sent (``messages.N.content.1`` when the block
  before it was dropped).
- End user: binding models only; the producer's ``bind_to_end_user`` and ``metadata.user_id``
  are recorded; a block made without a user id is not bound to one. The error's wording ("bound
  to a different end user") is ours. Organizations are not modelled (one account).
- Thinking blocks before the last threshold compaction block are ignored (not checked, not
  shown, not reported): "all content blocks before it are ignored" ([COMPACTION]).
- count_tokens: the same checks and 400s; never ``input_transformations``; the ``compaction``
  parameter is ignored; no 529.
- Compaction: threshold blocks are unsigned (only on-demand blocks are called "signed"); a
  signed block may carry ``cache_control`` ([COMPACTION], [SDK]; the brief expected a 400) and
  nothing else extra (``Extra inputs are not permitted``); ``encrypted_content`` and
  ``tool_changes`` must come back as issued. Error wordings are ours, after the SDK's
  docstrings, except the misplaced one ([OBSERVED]). "Incomplete turn": the last user/assistant
  message is an assistant message with a ``tool_use``. "Nothing to summarize": no user or
  assistant content but failed (``content: null``) compaction blocks. A signed block stands for
  the messages it summarised in later prefix checks when it was made on a binding model; the
  turn after it always starts anew (so a same-role or system first kept message breaks kept
  thinking, as [COMPACT-THINK] says). ``tool_changes`` only with ``inline-tools-2026-09-15``,
  the last change of each tool winning. The summary is a digest and the first words of each
  message. The 529 is decided after every 400.
- Threshold compaction: the fake never decides to compact; a ``Turn(threshold_compaction=True)``
  does, for a request that configures ``compact_20260112``. ``context_management.applied_edits``
  is ``[]`` unless the turn scripts entries (the SDK types no compaction entry).
'''

from tests.provider_rules.answers import Turn, default_summary, stream_events
from tests.provider_rules.checks import (
    BETA_BINDING,
    BETA_COMPACT,
    BETA_INLINE_TOOLS,
    BETA_THRESHOLD,
    Rejection,
    Transformation,
    Verdict,
)
from tests.provider_rules.rules import BINDING_MODELS, ProviderRules, betas_of

__all__ = [
    "BETA_BINDING",
    "BETA_COMPACT",
    "BETA_INLINE_TOOLS",
    "BETA_THRESHOLD",
    "BINDING_MODELS",
    "ProviderRules",
    "Rejection",
    "Transformation",
    "Turn",
    "Verdict",
    "betas_of",
    "default_summary",
    "stream_events",
]
