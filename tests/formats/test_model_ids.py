"""The model-id table: the published triples read in any spelling, unknown ids by the published
patterns, a config's entries before the built-ins."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.model_ids import BUILT_IN, ModelId, ModelIds

IDS = ModelIds()


@pytest.mark.parametrize("entry", BUILT_IN, ids=lambda e: e.anthropic)
def test_every_spelling_of_a_built_in_names_the_same_model(entry: ModelId) -> None:
    spellings = [
        entry.anthropic, entry.bedrock, entry.vertex, *entry.aliases,
        f"us.{entry.bedrock}", f"global.{entry.bedrock}",
        f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.{entry.bedrock}",
        f"arn:aws:bedrock:us-east-1::foundation-model/{entry.bedrock}",
    ]
    for spelling in spellings:
        assert IDS.anthropic(spelling) == entry.anthropic, spelling
        assert IDS.vertex(spelling) == entry.vertex, spelling
    assert IDS.bedrock(entry.anthropic) == entry.bedrock
    assert IDS.bedrock(entry.vertex, geo="us") == f"us.{entry.bedrock}"


def test_a_bedrock_spelling_or_arn_is_kept_as_sent() -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc"
    assert IDS.bedrock("eu.anthropic.claude-opus-4-6-v1") == "eu.anthropic.claude-opus-4-6-v1"
    assert IDS.bedrock(arn) == arn  # an application profile: only Bedrock knows its model
    assert IDS.anthropic(arn) == arn


def test_unknown_ids_follow_the_published_patterns() -> None:
    assert IDS.anthropic("us.anthropic.claude-fable-5-1-v1:0") == "claude-fable-5-1"
    assert IDS.bedrock("claude-fable-5-1") == "anthropic.claude-fable-5-1-v1:0"
    assert IDS.vertex("claude-fable-5-1") == "claude-fable-5-1"
    assert IDS.anthropic("claude-mythos-5-1@20261001") == "claude-mythos-5-1-20261001"
    assert IDS.vertex("claude-mythos-5-1-20261001") == "claude-mythos-5-1@20261001"
    assert IDS.anthropic("gpt-oss-120b") == "gpt-oss-120b"


def test_a_config_entry_wins_over_the_built_in() -> None:
    own = ModelIds([ModelId("claude-sonnet-4-6", "anthropic.claude-sonnet-4-6-v2:0", "claude-sonnet-4-6@x")])
    assert own.bedrock("claude-sonnet-4-6") == "anthropic.claude-sonnet-4-6-v2:0"
    assert own.anthropic("anthropic.claude-sonnet-4-6") == "claude-sonnet-4-6"  # built-in still read
    assert ModelIds(built_in=False).bedrock("claude-sonnet-4-6") == "anthropic.claude-sonnet-4-6-v1:0"


@given(st.from_regex(r"claude-[a-z]{3,8}-[1-9]-[0-9]", fullmatch=True), st.sampled_from(["", "us.", "global."]))
def test_any_unknown_id_round_trips_through_bedrock_and_vertex(name: str, geo: str) -> None:
    assert IDS.anthropic(geo + IDS.bedrock(name)) == name
    assert IDS.anthropic(IDS.vertex(name)) == name
