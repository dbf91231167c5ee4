"""The catalogue's rows: every model and beta the proxy knows, each citing where it came from.

Read by :mod:`proxy.core.catalogue` only. To add a model the day it ships: one :class:`Model`
row below (its page on platform.claude.com gives the id, window, output and prices; the
platforms' ids follow :mod:`proxy.core.platform_ids` unless a page says otherwise), then
``python -m pytest tests/test_catalogue_oracle.py`` (it names every model and beta Claude Code
knows that is missing here) and ``python docs/render_models.py`` (the reference page).

Sources, cited by name in the rows:

* ``CC``: Claude Code 2.1.197's own model catalogue (the ``provider_ids`` of each model in its
  bundle; the Bedrock ids there are the ``us.`` inference profiles of the base ids below) and
  the betas it sends per platform. tests/test_catalogue_oracle.py reads it from the pinned
  binary and compares.
* ``PAGE(slug)``: the model's page, https://platform.claude.com/docs/en/models/<slug>/overview
  (context window, max output, prices).
* ``PRICING``: https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing").
* ``IDS``: https://platform.claude.com/docs/en/about-claude/models/model-ids-and-versions (the
  id rules: a dateless id is ``anthropic.<id>`` on Bedrock and itself on Vertex).
* ``FOUNDRY``: https://platform.claude.com/docs/en/build-with-claude/claude-in-microsoft-foundry
  (the models deployable there; a deployment is named after the model id by default).
* ``VERTEX``: https://platform.claude.com/docs/en/build-with-claude/claude-on-vertex-ai.

A value no page we read publishes is ``None`` and the row says so (never a guess).
"""

from __future__ import annotations

from proxy.core.model_row import Beta, Model, Price

__all__ = [
    "BETAS",
    "BETA_1M",
    "DEFAULT_CONTEXT_WINDOW",
    "DEMO_MODEL",
    "MODELS",
    "REPLAY_MODEL",
    "SUMMARY_MODEL",
]

CC = "Claude Code 2.1.197 catalogue"
PRICING = "https://platform.claude.com/docs/en/about-claude/pricing"
IDS = "https://platform.claude.com/docs/en/about-claude/models/model-ids-and-versions"
FOUNDRY = "https://platform.claude.com/docs/en/build-with-claude/claude-in-microsoft-foundry"
VERTEX = "https://platform.claude.com/docs/en/build-with-claude/claude-on-vertex-ai"
CONTEXT = "https://platform.claude.com/docs/en/build-with-claude/context-windows"


def PAGE(slug: str) -> str:
    return f"https://platform.claude.com/docs/en/models/{slug}/overview"


# The window of a model no row or entry knows: the Claude API's standard window (CONTEXT).
DEFAULT_CONTEXT_WINDOW = 200_000
# The beta that opens the 1M window on the models whose row has ``context_window_1m`` (CONTEXT).
BETA_1M = "context-1m-2025-08-07"
# The proxy's own summariser (compaction.summary.model) and replay's model when a file names none.
SUMMARY_MODEL = "claude-haiku-4-5"
REPLAY_MODEL = "claude-sonnet-4-5"
# The keyless demo provider's one model (proxy/demo/upstream.py).
DEMO_MODEL = "claude-demo-1"

_M = 1_000_000
_K128 = 128_000
_OPUS_45 = Price(5, 6.25, 10, 0.5, 25)
_OPUS_4 = Price(15, 18.75, 30, 1.5, 75)
_SONNET_4 = Price(3, 3.75, 6, 0.3, 15)
_SONNET_5 = Price(2, 2.5, 4, 0.2, 10)
_FABLE_5 = Price(10, 12.5, 20, 1, 50)
_FABLE_51 = Price(10, 12.5, 20, 0.25, 50)
_FABLE_52 = Price(8, 10, 16, 0.2, 40)
_NEWER = "newer than Claude Code 2.1.197"
_RULE_IDS = f"Bedrock, Vertex ids: the dateless rule of {IDS}"

MODELS: tuple[Model, ...] = (
    # -- in Claude Code 2.1.197's catalogue: its ids are the oracle ---------------------------
    Model(
        "claude-opus-4-8", "Claude Opus 4.8", (), "anthropic.claude-opus-4-8", "claude-opus-4-8",
        "claude-opus-4-8", _M, None, _K128, _OPUS_45,
        source=f"ids: {CC}; window, output: {PAGE('opus-4-8')}; price: {PRICING}",
    ),
    Model(
        "claude-opus-4-7", "Claude Opus 4.7", (), "anthropic.claude-opus-4-7", "claude-opus-4-7",
        "claude-opus-4-7", _M, None, None, _OPUS_45,
        source=f"ids, window: {CC}; price: {PRICING}",
        note="max output: not on a page read",
    ),
    Model(
        "claude-opus-4-6", "Claude Opus 4.6", (), "anthropic.claude-opus-4-6-v1",
        "claude-opus-4-6", "claude-opus-4-6", _M, None, _K128, _OPUS_45,
        source=f"ids: {CC}; window, output: {PAGE('opus-4-6')}; price: {PRICING}",
        note="the last Bedrock id with a -v1 suffix (IDS); Claude Code 2.1.197 counts 200K + the 1M beta",
    ),
    Model(
        "claude-opus-4-5-20251101", "Claude Opus 4.5", ("claude-opus-4-5",),
        "anthropic.claude-opus-4-5-20251101-v1:0", "claude-opus-4-5@20251101", "claude-opus-4-5",
        200_000, None, None, _OPUS_45,
        source=f"ids, window: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-opus-4-1-20250805", "Claude Opus 4.1", ("claude-opus-4-1",),
        "anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4-1@20250805", "claude-opus-4-1",
        200_000, None, None, _OPUS_4,
        source=f"ids, window: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-opus-4-20250514", "Claude Opus 4", ("claude-opus-4-0", "claude-4-opus-20250514"),
        "anthropic.claude-opus-4-20250514-v1:0", "claude-opus-4@20250514", "claude-opus-4",
        200_000, None, None, _OPUS_4,
        source=f"ids, window: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-sonnet-5", "Claude Sonnet 5", (), "anthropic.claude-sonnet-5", "claude-sonnet-5",
        "claude-sonnet-5", _M, None, _K128, _SONNET_5,
        source=f"ids: {CC}; window, output, price: {PAGE('sonnet-5')}",
    ),
    Model(
        "claude-sonnet-4-6", "Claude Sonnet 4.6", (), "anthropic.claude-sonnet-4-6",
        "claude-sonnet-4-6", "claude-sonnet-4-6", _M, None, _K128, _SONNET_4,
        source=f"ids: {CC}; window, output: {PAGE('sonnet-4-6')}; price: {PRICING}",
        note="Claude Code 2.1.197 counts 200K + the 1M beta",
    ),
    Model(
        "claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", ("claude-sonnet-4-5",),
        "anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5@20250929",
        "claude-sonnet-4-5", 200_000, _M, None, _SONNET_4,
        source=f"ids, windows: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-sonnet-4-20250514", "Claude Sonnet 4", ("claude-sonnet-4-0", "claude-4-sonnet-20250514"),
        "anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4@20250514", "claude-sonnet-4",
        200_000, _M, None, _SONNET_4,
        source=f"ids, windows: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-3-7-sonnet-20250219", "Claude Sonnet 3.7",
        ("claude-3-7-sonnet", "claude-3-7-sonnet-latest"),
        "anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7-sonnet@20250219",
        "claude-3-7-sonnet", 200_000, None, None, _SONNET_4,
        source=f"ids: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-3-5-sonnet-20241022", "Claude Sonnet 3.5", ("claude-3-5-sonnet", "claude-3-5-sonnet-latest"),
        "anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet-v2@20241022",
        "claude-3-5-sonnet", 200_000, None, None, None,
        source=f"ids: {CC}",
        note="retired; its price is on no pricing page read (unpriced), max output likewise",
    ),
    Model(
        "claude-haiku-4-5-20251001", "Claude Haiku 4.5", ("claude-haiku-4-5",),
        "anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5@20251001", "claude-haiku-4-5",
        200_000, None, 64_000, Price(1, 1.25, 2, 0.1, 5),
        source=f"ids, window: {CC}; output: {PAGE('sonnet-5-5')} (its comparison table); price: {PRICING}",
    ),
    Model(
        "claude-3-5-haiku-20241022", "Claude Haiku 3.5", ("claude-3-5-haiku", "claude-3-5-haiku-latest"),
        "anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku@20241022", "claude-3-5-haiku",
        200_000, None, None, Price(0.8, 1, 1.6, 0.08, 4),
        source=f"ids: {CC}; price: {PRICING}", note="max output: not on a page read",
    ),
    Model(
        "claude-fable-5", "Claude Fable 5", (), "anthropic.claude-fable-5", "claude-fable-5",
        "claude-fable-5", _M, None, _K128, _FABLE_5,
        source=f"ids: {CC}; window, output: {PAGE('fable-5')}; price: {PRICING}",
    ),
    Model(
        "claude-mythos-5", "Claude Mythos 5", (), None, None, None, _M, None, _K128, _FABLE_5,
        source=f"{CC} (no platform ids); specs and price shared with Fable 5: {PAGE('fable-5')}, {PRICING}",
        note="invitation only; no platform publishes its ids (Bedrock, Vertex: by the rule)",
    ),
    # -- published after Claude Code 2.1.197 ---------------------------------------------------
    Model(
        "claude-opus-5", "Claude Opus 5", (), "anthropic.claude-opus-5", "claude-opus-5",
        "claude-opus-5", _M, None, _K128, _OPUS_45,
        source=f"{_NEWER}: {PAGE('opus-5')}; {_RULE_IDS}; Foundry: {FOUNDRY}",
    ),
    Model(
        "claude-opus-5-5", "Claude Opus 5.5", (), "anthropic.claude-opus-5-5", "claude-opus-5-5",
        "claude-opus-5-5", _M, None, _K128, Price(4, 5, 8, 0.2, 20), binds_thinking=True,
        source=f"{_NEWER}: {PAGE('opus-5-5')}; {_RULE_IDS}; Foundry: {FOUNDRY}",
        note="thinking blocks bound to model and conversation (its page's breaking changes)",
    ),
    Model(
        "claude-sonnet-5-5", "Claude Sonnet 5.5", (), "anthropic.claude-sonnet-5-5",
        "claude-sonnet-5-5", "claude-sonnet-5-5", _M, None, _K128, Price(2, 2.5, 4, 0.1, 10),
        binds_thinking=True,
        source=f"{_NEWER}: {PAGE('sonnet-5-5')}; cache read: {PRICING}; {_RULE_IDS}; Foundry: {FOUNDRY}",
        note="cache reads $0.10 (0.05x input, the pricing page's prompt caching table; $0.20 at launch)",
    ),
    Model(
        "claude-haiku-5-5", "Claude Haiku 5.5", (), "anthropic.claude-haiku-5-5", "claude-haiku-5-5",
        "claude-haiku-5-5", _M, None, _K128, Price(0.1, 0.125, 0.2, 0.01, 0.5), binds_thinking=True,
        source=f"{_NEWER}: {PAGE('haiku-5-5')}; {_RULE_IDS}; Foundry: {FOUNDRY}",
        note="priced at its rate for prompts up to 100,000 tokens; longer prompts are billed 5x"
        " that (its page), which the ledger does not model",
    ),
    Model(
        "claude-fable-5-1", "Claude Fable 5.1", (), "anthropic.claude-fable-5-1", "claude-fable-5-1",
        "claude-fable-5-1", _M, None, _K128, _FABLE_51, binds_thinking=True,
        source=f"{_NEWER}: {PAGE('fable-5-1')}; price: {PRICING}; {_RULE_IDS}; Foundry: {FOUNDRY}",
    ),
    Model(
        "claude-mythos-5-1", "Claude Mythos 5.1", (), None, None, None, _M, None, _K128, _FABLE_51,
        binds_thinking=True,
        source=f"{_NEWER}: price: {PRICING}; specs shared with Fable 5.1: {PAGE('fable-5-1')}",
        note="limited availability; no platform ids published",
    ),
    Model(
        "claude-fable-5-2", "Claude Fable 5.2", (), "anthropic.claude-fable-5-2", "claude-fable-5-2",
        "claude-fable-5-2", _M, None, _K128, _FABLE_52, binds_thinking=True,
        source=f"{_NEWER}: listed on {FOUNDRY}; {_RULE_IDS}",
        note="window, output and price ($8/$40, writes $10/$16, reads $0.20) as reported from the"
        " pricing page by trackers (not read on platform.claude.com itself)",
    ),
    Model(
        "claude-mythos-5-2", "Claude Mythos 5.2", (), None, None, None, _M, None, _K128, _FABLE_52,
        binds_thinking=True,
        source=f"{_NEWER}: shares Fable 5.2's specs and price",
        note="limited availability; no platform ids published; figures as for Fable 5.2",
    ),
    # -- retired, kept so old ledger rows stay priced --------------------------------------------
    Model(
        "claude-3-opus-20240229", "Claude Opus 3", ("claude-3-opus-latest",),
        "anthropic.claude-3-opus-20240229-v1:0", "claude-3-opus@20240229", None,
        200_000, None, None, _OPUS_4, source=f"ids: {VERTEX}, {IDS}; price: {PRICING}",
        note="retired; max output: not on a page read",
    ),
    Model(
        "claude-3-haiku-20240307", "Claude Haiku 3", (),
        "anthropic.claude-3-haiku-20240307-v1:0", "claude-3-haiku@20240307", None,
        200_000, None, None, Price(0.25, 0.3, 0.5, 0.03, 1.25),
        source=f"ids: {VERTEX}, {IDS}; price: {PRICING}", note="max output: not on a page read",
    ),
    # -- the keyless demo provider (proxy/demo/upstream.py) ---------------------------------------
    Model(
        DEMO_MODEL, "Demo model (the keyless demo provider)", (), None, None, None,
        200_000, None, None, _SONNET_4,
        source="the demo provider's own figures, not a provider's price",
        note="priced like Claude Sonnet 4.6 so the demo's console shows savings in real-looking dollars",
    ),
)


AWS_MESSAGES = (
    "https://docs.aws.amazon.com/bedrock/latest/userguide/"
    "model-parameters-anthropic-claude-messages-request-response.html"
)
AWS_COMPACTION = "https://docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-compaction.html"
AWS_BINDING = "AWS 'Anthropic Claude Messages API: thinking block binding' (model-parameters-anthropic-claude-messages*)"
LITELLM = "LiteLLM's per-platform table (litellm/anthropic_beta_headers_config.json)"
LITELLM_AZURE = "LiteLLM's per-platform table (litellm/anthropic_beta_headers_config.json, azure_ai)"
GOOGLE = "Vertex AI's Claude feature pages (cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude)"
CC_VERTEX = "Claude Code 2.1.197 sends it to Vertex (its third-party beta list)"
CC_BEDROCK = "Claude Code 2.1.197 sends it to Bedrock in the body's anthropic_beta"
# Foundry mode: Claude Code lets its experimental betas through as for the Claude API (no
# third-party filter for foundry); recorded in Foundry mode with opus-4-6/4-7/4-8, sonnet-4-5[1m],
# sonnet-4-6, sonnet-5, haiku-4-5 and fable-5 (tests/test_claude_code_foundry.py checks that a run
# in Foundry mode loses none of them)
CC_FOUNDRY = "Claude Code 2.1.197 sends it to Foundry in its Foundry mode (recorded)"
CC_FIELDS = "Claude Code 2.1.197 sends the field with the beta"
DOCS = "https://platform.claude.com/docs/en/build-with-claude/"


def _on(
    bedrock: str | None = None, vertex: str | None = None, foundry: str | None = None
) -> dict[str, str]:
    """The platforms that accept a beta, each with its evidence."""
    named = {"bedrock": bedrock, "vertex": vertex, "foundry": foundry}
    return {platform: source for platform, source in named.items() if source}


_BOTH_CC_FOUNDRY = f"{CC_FOUNDRY}; {LITELLM_AZURE}"

BETAS: tuple[Beta, ...] = (
    Beta("claude-code-20250219", accepted=_on(vertex=CC_VERTEX, foundry=CC_FOUNDRY)),
    Beta(
        "interleaved-thinking-2025-05-14",
        accepted=_on(f"{AWS_MESSAGES}; {CC_BEDROCK}", f"{GOOGLE}; {CC_VERTEX}", _BOTH_CC_FOUNDRY),
    ),
    Beta(
        BETA_1M, (), CONTEXT,
        _on(f"{AWS_MESSAGES}; {CC_BEDROCK}", f"{GOOGLE}; {CC_VERTEX}", _BOTH_CC_FOUNDRY),
    ),
    Beta(
        "context-management-2025-06-27", ("context_management",), f"{DOCS}context-editing",
        _on(AWS_MESSAGES, f"{GOOGLE}; {CC_VERTEX}", _BOTH_CC_FOUNDRY),
    ),
    Beta(
        "effort-2025-11-24", ("output_config.effort",), f"{DOCS}effort",
        _on(LITELLM, CC_VERTEX, _BOTH_CC_FOUNDRY),
    ),
    Beta(
        "tool-search-tool-2025-10-19",
        accepted=_on(f"{LITELLM}; {CC_BEDROCK}", f"{LITELLM}; {CC_VERTEX}"),
    ),
    Beta("advanced-tool-use-2025-11-20", accepted=_on(foundry=_BOTH_CC_FOUNDRY)),
    Beta(
        "web-search-2025-03-05",
        accepted=_on(vertex=f"{LITELLM}; {CC_VERTEX}", foundry=_BOTH_CC_FOUNDRY),
    ),
    Beta("prompt-caching-scope-2026-01-05", accepted=_on(foundry=_BOTH_CC_FOUNDRY)),
    Beta("mid-conversation-system-2026-04-07", accepted=_on(foundry=CC_FOUNDRY)),
    Beta(
        "structured-outputs-2025-12-15", ("output_config.format",), CC_FIELDS,
        _on(vertex=CC_VERTEX),
    ),
    Beta("afk-mode-2026-01-31", accepted=_on(vertex=CC_VERTEX)),
    Beta("fallback-credit-2026-06-01", accepted=_on(vertex=CC_VERTEX, foundry=CC_FOUNDRY)),
    Beta(
        "compact-2026-01-12",
        ("context_management.edits[type=compact_20260112]", "messages[].content[type=compaction]"),
        f"{DOCS}compaction", _on(AWS_COMPACTION, LITELLM),
    ),
    Beta(
        "compact-2026-09-04", ("compaction", "messages[].content[type=compaction]"),
        f"{DOCS}compaction (on-demand)", _on(vertex=LITELLM),
    ),
    Beta(
        "thinking-binding-controls-2026-08-01", ("thinking.block_binding",),
        f"{DOCS}preserved-thinking", _on(AWS_BINDING, LITELLM),
    ),
    Beta("thinking-display-updates-2026-08-18", accepted=_on(LITELLM, LITELLM, LITELLM_AZURE)),
    Beta("computer-use-2024-10-22", accepted=_on(AWS_MESSAGES, GOOGLE)),
    Beta("computer-use-2025-01-24", accepted=_on(AWS_MESSAGES, LITELLM, LITELLM_AZURE)),
    Beta("computer-use-2025-11-24", accepted=_on(LITELLM, LITELLM, LITELLM_AZURE)),
    Beta("token-efficient-tools-2025-02-19", accepted=_on(AWS_MESSAGES)),
    Beta("output-128k-2025-02-19", accepted=_on(AWS_MESSAGES)),
    Beta("fine-grained-tool-streaming-2025-05-14", accepted=_on(LITELLM)),
    Beta("tool-examples-2025-10-29", accepted=_on(LITELLM)),
    Beta("code-execution-2025-08-25", accepted=_on(foundry=LITELLM_AZURE)),
    Beta("web-fetch-2025-09-10", accepted=_on(foundry=LITELLM_AZURE)),
    Beta("files-api-2025-04-14", accepted=_on(foundry=LITELLM_AZURE)),
    Beta("skills-2025-10-02", accepted=_on(foundry=LITELLM_AZURE)),
    Beta(
        "structured-outputs-2025-11-13", ("output_format",), f"{DOCS}structured-outputs",
        _on(foundry=LITELLM_AZURE),
    ),
    Beta("mcp-client-2025-04-04", ("mcp_servers",), f"{DOCS}mcp-connector", _on(foundry=LITELLM_AZURE)),
    Beta("mcp-client-2025-11-20", ("mcp_servers",), f"{DOCS}mcp-connector", _on(foundry=LITELLM_AZURE)),
    # accepted on no platform: dropped there together with their fields
    Beta("fast-mode-2026-02-01", ("speed",), f"{DOCS}fast-mode"),
    Beta("task-budgets-2026-03-13", ("output_config.task_budget",), CC_FIELDS),
    Beta("cache-diagnosis-2026-04-07", ("diagnostics",), CC_FIELDS),
)
