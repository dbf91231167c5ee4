"""The model catalogue (proxy/core/catalogue.py): any spelling names one model; the platforms'
ids as published (profiles, ARNs and geographies sent as given); a model nothing knows by the
published rule, never an invented version suffix; config entries before the rows, value by
value, each value telling where it came from.

Rules relied on: platform.claude.com "Model IDs and versions" (a dateless id is
``anthropic.<id>`` on Bedrock -- Opus 4.6 the last with ``-v1`` -- and itself on Vertex; a dated
one ``anthropic.<id>-v1:0`` and ``name@date``); Claude Code 2.1.197's region -> geography rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.models import catalogue_of
from proxy.config.schema import ConfigError
from proxy.config.settings import parse_config
from proxy.config.upstream import UpstreamTarget
from proxy.core import platform_ids
from proxy.core.catalogue import BUILT_IN, DEFAULT, RULE, Catalogue, make_entry, price_of
from proxy.core.catalogue_data import DEMO_MODEL, MODELS
from proxy.core.model_row import Model, Price

IDS = Catalogue()
ARN = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"


@pytest.mark.parametrize("row", [r for r in MODELS if r.bedrock], ids=lambda r: r.id)
def test_every_spelling_of_a_row_names_the_same_model(row: Model) -> None:
    assert row.bedrock is not None and row.vertex is not None
    spellings = [
        row.id, row.bedrock, row.vertex, *row.aliases,
        f"us.{row.bedrock}", f"global.{row.bedrock}",
        f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.{row.bedrock}",
        f"arn:aws:bedrock:us-east-1::foundation-model/{row.bedrock}",
    ]
    for spelling in spellings:
        assert IDS.anthropic(spelling) == row.id, spelling
        assert IDS.vertex(spelling) == row.vertex, spelling
        assert IDS.window(spelling) == IDS.window(row.id), spelling
        assert IDS.price(spelling) == row.price, spelling
    assert IDS.bedrock(row.id) == row.bedrock
    assert IDS.bedrock(row.vertex, "us") == f"us.{row.bedrock}"
    assert IDS.bedrock_foundation(f"eu.{row.bedrock}") == row.bedrock


def test_claude_codes_default_model_is_known_without_a_version_suffix() -> None:
    assert IDS.bedrock("claude-opus-4-8", "us") == "us.anthropic.claude-opus-4-8"
    assert IDS.bedrock("claude-opus-4-6", "us") == "us.anthropic.claude-opus-4-6-v1"  # the last -v1
    assert IDS.resolve("claude-opus-4-8").bedrock.origin == BUILT_IN


def test_arns_and_ids_with_a_geography_are_sent_as_given() -> None:
    for given_id in (ARN, "eu.anthropic.claude-opus-4-6-v1", "global.anthropic.claude-opus-4-8"):
        assert IDS.bedrock(given_id, "us") == given_id
    assert IDS.anthropic(ARN) == ARN  # an application profile: only Bedrock knows its model
    assert IDS.bedrock("anthropic.claude-opus-4-8", "eu") == "eu.anthropic.claude-opus-4-8"  # bare
    # a configured ARN or profile is sent as given too, whatever profile_geo says
    mine = Catalogue([make_entry("claude-opus-4-8", "models[0]", bedrock=ARN)])
    assert mine.bedrock("claude-opus-4-8", "us") == ARN
    mine = Catalogue([make_entry("claude-opus-4-8", "models[0]", bedrock="eu.anthropic.claude-opus-4-8")])
    assert mine.bedrock("claude-opus-4-8", "us") == "eu.anthropic.claude-opus-4-8"
    assert mine.anthropic("eu.anthropic.claude-opus-4-8") == "claude-opus-4-8"


def test_a_model_nothing_knows_follows_the_published_rule_and_says_so() -> None:
    assert IDS.bedrock("claude-opus-9", "us") == "us.anthropic.claude-opus-9"  # no invented -v1:0
    assert IDS.bedrock("claude-x-20270101") == "anthropic.claude-x-20270101-v1:0"  # dated
    assert IDS.vertex("claude-x-20270101") == "claude-x@20270101"
    assert IDS.vertex("claude-opus-9") == "claude-opus-9"
    assert IDS.foundry("claude-opus-9") == "claude-opus-9"
    assert IDS.derived("claude-opus-9", "bedrock") and not IDS.derived("claude-opus-4-8", "bedrock")
    assert not IDS.derived(ARN, "bedrock")
    unknown = IDS.resolve("claude-opus-9")
    assert not unknown.known
    assert (unknown.context_window.value, unknown.context_window.origin) == (200_000, DEFAULT)
    assert unknown.price.value is None and unknown.binds_thinking.value is False
    assert IDS.anthropic("us.anthropic.claude-fable-9-v1:0") == "claude-fable-9"
    assert IDS.anthropic("gpt-oss-120b") == "gpt-oss-120b"


@given(st.from_regex(r"claude-[a-z]{3,8}-[1-9]-[0-9]", fullmatch=True), st.sampled_from(["", "us", "global"]))
def test_any_unknown_id_round_trips_through_bedrock_and_vertex(name: str, geography: str) -> None:
    assert IDS.anthropic(IDS.bedrock(name, geography)) == name
    assert IDS.anthropic(IDS.vertex(name)) == name


def test_config_entries_come_first_value_by_value_with_their_origin() -> None:
    catalogue = catalogue_of(parse_config({
        "models": [
            {"match": "claude-opus-4-8", "bedrock": "anthropic.claude-opus-4-8-v2", "aliases": ["opus"]},
            {"match": "claude-opus-*", "price": {"input": 1, "output": 2}, "thinking_binding": "prefix"},
            {"match": "claude-brand-new-1", "context_window": 500_000, "vertex": "claude-brand-new-1@x"},
        ],
        "model_ids": [{"anthropic": "claude-sonnet-4-6", "vertex": "claude-sonnet-4-6@y"}],
        "prices": [{"model": "claude-sonnet-4-6", "input": 9, "output": 9}],
    }))
    opus = catalogue.resolve("opus")  # a configured alias
    assert opus.id == "claude-opus-4-8"
    assert (opus.bedrock.value, opus.bedrock.origin) == ("anthropic.claude-opus-4-8-v2", "config models[0]")
    assert (opus.vertex.value, opus.vertex.origin) == ("claude-opus-4-8", BUILT_IN)
    assert (opus.price.value, opus.price.origin) == (Price.standard(1, 2), "config models[1]")
    assert (opus.binds_thinking.value, opus.binds_thinking.origin) == (True, "config models[1]")
    assert (opus.context_window.value, opus.context_window.origin) == (1_000_000, BUILT_IN)
    assert catalogue.anthropic("us.anthropic.claude-opus-4-8-v2") == "claude-opus-4-8"
    new = catalogue.resolve("claude-brand-new-1")
    assert new.known and new.display.origin == "config models[2]"
    assert (new.context_window.value, new.bedrock.origin) == (500_000, RULE)
    assert catalogue.anthropic("claude-brand-new-1@x") == "claude-brand-new-1"
    sonnet = catalogue.resolve("claude-sonnet-4-6")
    assert (sonnet.vertex.value, sonnet.vertex.origin) == ("claude-sonnet-4-6@y", "config model_ids[0]")
    assert sonnet.price.origin == "config prices[0]"
    assert [r.id for r in catalogue.listed()][:2] == ["claude-opus-4-8", "claude-brand-new-1"]
    assert catalogue.priced()[0][0] == "claude-opus-*"


def test_a_glob_entry_may_not_name_one_models_platform_ids() -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.match.*a glob names no one model"):
        parse_config({"models": [{"match": "claude-*", "bedrock": "anthropic.x"}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.context_window"):
        parse_config({"models": [{"match": "x", "context_window": -3}]})
    with pytest.raises(ConfigError, match=r"upstream\.profile_geo"):
        parse_config({"upstream": {"format": "bedrock", "region": "us-east-1", "profile_geo": "mars"}})


@pytest.mark.parametrize(
    ("region", "profile_geo", "geography"),
    [
        ("us-east-1", "auto", "us"), ("us-gov-west-1", "auto", "us-gov"), ("eu-west-3", "auto", "eu"),
        ("ap-northeast-1", "auto", "apac"), ("ca-central-1", "auto", "global"),
        ("eu-west-1", "", ""), ("eu-west-1", "jp", "jp"),
    ],
)
def test_profile_geo_auto_is_claude_codes_region_rule(region: str, profile_geo: str, geography: str) -> None:
    target = UpstreamTarget(format="bedrock", region=region, profile_geo=profile_geo)
    assert target.geography() == geography
    assert UpstreamTarget().profile_geo == "auto"
    assert platform_ids.geography_for_region(region) == geography or profile_geo != "auto"


def test_every_row_cites_its_source_and_never_guesses() -> None:
    assert len({r.id for r in MODELS}) == len(MODELS)
    names = [n for r in MODELS for n in r.spellings()]
    assert len(names) == len(set(names)), "a spelling names two rows"
    for row in MODELS:
        assert row.source.strip(), row.id
        assert row.name.strip(), row.id
        unpublished = [v for v in (row.max_output, row.price) if v is None]
        if unpublished and row.id != DEMO_MODEL:
            assert row.note.strip(), f"{row.id}: a value not published says so in the row"
        if row.bedrock is not None:
            assert platform_ids.is_bedrock_form(row.bedrock) and not platform_ids.carries_geography(row.bedrock)
    for newer in ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-2"):
        assert IDS.resolve(newer).known, newer
        assert IDS.binds_thinking(newer), newer


def test_the_demo_model_has_the_demos_own_price() -> None:
    price = price_of(DEMO_MODEL)
    assert price is not None and price.input > 0
    row = IDS.resolve(DEMO_MODEL).row
    assert row is not None and "demo" in row.source
    assert IDS.listed("bedrock") and DEMO_MODEL not in {r.id for r in IDS.listed("bedrock")}
