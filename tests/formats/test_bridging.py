"""The bridging table: a beta the upstream does not accept goes with the body fields it enables.

The table is the catalogue's beta rows (proxy/core/catalogue_data.py), each citing its evidence;
tests/test_catalogue_oracle.py checks it against what Claude Code 2.1.197 sends per platform.
Sources for the built-in lists (checked with the search tool, December 2026):
- AWS, "Anthropic Claude Messages API: request and response" (``anthropic_beta`` in the body) and
  the Claude pages beside it (extended thinking, compaction, thinking block binding):
  https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html
- the provider's "Claude on Vertex AI": https://docs.anthropic.com/en/api/claude-on-vertex-ai
- LiteLLM's per-platform table after Claude Code's "invalid beta flag" on Bedrock:
  https://docs.litellm.ai/blog/claude-code-beta-headers-incident (and coder/aibridge#221)
"""

from __future__ import annotations

import copy

import pytest

from proxy.core.catalogue_data import BETAS
from proxy.formats.bridging import ACCEPTED, FIELDS, Bridging, betas_of, bridge, path_problem

BEDROCK = Bridging.for_platform("bedrock")
VERTEX = Bridging.for_platform("vertex")


def test_first_party_betas_are_sent_to_neither_platform_and_claude_codes_own_to_vertex() -> None:
    for beta in ("prompt-caching-scope-2026-01-05", "oauth-2025-04-20", "files-api-2025-04-14",
                 "fast-mode-2026-02-01", "mid-conversation-system-2026-04-07"):
        assert beta not in ACCEPTED["bedrock"] and beta not in ACCEPTED["vertex"]
    for beta in ("context-management-2025-06-27", "context-1m-2025-08-07", "effort-2025-11-24",
                 "interleaved-thinking-2025-05-14", "thinking-binding-controls-2026-08-01"):
        assert beta in ACCEPTED["bedrock"] and beta in ACCEPTED["vertex"]
    # Claude Code sends its own beta to Vertex itself (its Vertex mode), never in Bedrock's body
    assert "claude-code-20250219" in ACCEPTED["vertex"] and "claude-code-20250219" not in ACCEPTED["bedrock"]
    # on-demand compaction: Google Cloud lists it, Bedrock's pages state it differently
    assert "compact-2026-09-04" in ACCEPTED["vertex"] and "compact-2026-09-04" not in ACCEPTED["bedrock"]


@pytest.mark.parametrize(
    ("betas", "body", "kept", "fields", "out"),
    [
        # nothing dropped: the body is the client's own object
        (["context-1m-2025-08-07"], {"a": 1}, ["context-1m-2025-08-07"], [], {"a": 1}),
        # on-demand compaction dropped with its field and the blocks it made
        (
            ["compact-2026-09-04"],
            {"compaction": {"type": "summarize"}, "messages": [
                {"role": "user", "content": [{"type": "compaction", "content": "s"}, {"type": "text", "text": "q"}]},
                {"role": "user", "content": "plain"},
            ]},
            [],
            ["compaction", "messages[].content[type=compaction]"],
            {"messages": [
                {"role": "user", "content": [{"type": "text", "text": "q"}]},
                {"role": "user", "content": "plain"},
            ]},
        ),
        # threshold compaction dropped: only its edit goes, context editing stays with its beta
        (
            ["context-management-2025-06-27", "compact-2026-01-12"],
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}, {"type": "compact_20260112"}]}},
            ["context-management-2025-06-27"],
            ["context_management.edits[type=compact_20260112]"],
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        ),
        # a nested field: the rest of its parent stays
        (
            ["effort-2025-11-24"],
            {"output_config": {"effort": "high", "format": {"type": "json_schema"}}},
            [],
            ["output_config.effort"],
            {"output_config": {"format": {"type": "json_schema"}}},
        ),
        # a dropped beta whose field is absent: reported as a beta, no field
        (["fast-mode-2026-02-01"], {"a": 1}, [], [], {"a": 1}),
    ],
)
def test_bridge_drops_a_beta_and_its_fields_together(
    betas: list[str], body: dict[str, object], kept: list[str], fields: list[str], out: dict[str, object]
) -> None:
    bridging = Bridging(frozenset({"context-1m-2025-08-07", "context-management-2025-06-27"}))
    before = copy.deepcopy(body)
    bridged = bridge(body, betas, bridging)
    assert list(bridged.betas) == kept
    assert list(bridged.dropped_fields) == fields
    assert bridged.body == out
    assert body == before  # the client's body is never changed
    if not fields:
        assert bridged.body is body


def test_a_field_two_betas_claim_stays_while_one_is_kept() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "compaction", "content": "s"}]}]}
    bridging = Bridging(frozenset({"compact-2026-01-12"}))
    bridged = bridge(body, ["compact-2026-01-12", "compact-2026-09-04"], bridging)
    assert bridged.dropped_betas == ("compact-2026-09-04",)
    assert bridged.body == body and bridged.dropped_fields == ()


def test_config_entries_replace_the_built_in_pairs_and_list() -> None:
    bridging = Bridging.for_platform("bedrock", ["x-beta"], {"y-beta": ("y_field",)})
    assert bridging.accepted == frozenset({"x-beta"})
    bridged = bridge({"y_field": 1, "z": 2}, ["x-beta", "y-beta"], bridging)
    assert bridged.body == {"z": 2} and bridged.betas == ("x-beta",)


def test_beta_header_values_are_split_trimmed_and_kept_once_in_order() -> None:
    assert betas_of(["a, b", "b,c,", " "]) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("path", "ok"),
    [("context_management", True), ("messages[].content[type=compaction]", True),
     ("thinking.block_binding", True), ("a..b", False), ("", False), ("a[type=]", False)],
)
def test_field_paths_are_checked(path: str, ok: bool) -> None:
    assert (path_problem(path) is None) is ok


def test_the_vertex_table_is_its_own() -> None:
    bridged = bridge({"compaction": {"type": "summarize"}}, ["compact-2026-09-04"], VERTEX)
    assert bridged.betas == ("compact-2026-09-04",) and "compaction" in bridged.body
    bridged = bridge({"compaction": {"type": "summarize"}}, ["compact-2026-09-04"], BEDROCK)
    assert bridged.betas == () and bridged.body == {}


def test_every_row_of_the_table_cites_its_evidence() -> None:
    assert len({b.name for b in BETAS}) == len(BETAS)  # one row per beta
    for beta in BETAS:
        assert all(source.strip() for source in beta.accepted.values()), beta.name
        assert set(beta.accepted) <= {"bedrock", "vertex", "foundry"}, beta.name
        if beta.fields:
            assert beta.fields_source.strip(), beta.name
            assert all(path_problem(p) is None for p in beta.fields), beta.name
    assert FIELDS["effort-2025-11-24"] == ("output_config.effort",)
