"""``upstream:`` in the config and in tenant policies: validated once, every problem named."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config.schema import ConfigError
from proxy.config.settings import parse_config
from proxy.config.upstream import UpstreamTarget
from proxy.tenancy.policies import PolicyError, load_tenancy


@pytest.mark.parametrize(
    ("upstream", "problem"),
    [
        ({"format": "azure"}, "key 'upstream.format': expected one of anthropic, bedrock, vertex, foundry, got 'azure'"),
        ({"format": "foundry"}, "key 'upstream.resource': expected a Foundry resource name or an endpoint_url with format foundry (one of them), got neither"),
        ({"format": "foundry", "resource": "r", "endpoint_url": "https://r.services.ai.azure.com/anthropic"}, "(one of them), got both"),
        ({"format": "foundry", "resource": "r.services.ai.azure.com"}, "key 'upstream.resource': expected a Foundry resource name"),
        ({"format": "foundry", "resource": "r", "api_key_env": "sk-ant-pasted key"}, "key 'upstream.api_key_env': expected the name of an environment variable"),
        ({"format": "foundry", "resource": "r", "entra_scope": "https://ai.azure.com"}, "key 'upstream.entra_scope': expected an Entra ID scope"),
        ({"format": "bedrock"}, "key 'upstream.region': expected an AWS region with format bedrock, missing"),
        ({"format": "vertex", "project": "p"}, "key 'upstream.location': expected a value with format vertex, missing"),
        ({"endpoint_url": "ftp://x"}, "key 'upstream.endpoint_url': expected"),
        ({"beta_fields": [{"fields": ["a"]}]}, "key 'upstream.beta_fields[0].beta': expected a beta name"),
        ({"beta_fields": [{"beta": "b", "fields": ["a..b"]}]}, "key 'upstream.beta_fields[0].fields': expected a field path"),
    ],
)
def test_bad_upstream_keys_are_named(upstream: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstream": upstream})
    assert problem in str(caught.value)


def test_a_pasted_key_in_api_key_env_is_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstream": {"format": "foundry", "resource": "r", "api_key_env": "0123 secret"}})
    assert "0123 secret" not in str(caught.value)


def test_a_foundry_target_from_its_resource_or_endpoint() -> None:
    config = parse_config({"upstream": {"format": "foundry", "resource": "my-res", "api_key_env": "K"}})
    assert (config.upstream.resource, config.upstream.api_key_env) == ("my-res", "K")
    assert config.upstream.entra_scope == "https://cognitiveservices.azure.com/.default"


def test_model_id_entries_need_an_anthropic_id() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_ids": [{"bedrock": "anthropic.x-v1:0"}]})
    assert "key 'model_ids[0].anthropic': expected a model id" in str(caught.value)


def _policy(tmp_path: Path, text: str) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "t.yaml").write_text("name: t\nprovider: {mode: passthrough}\n" + text)
    return policies


def test_a_policy_inherits_the_configs_platform_unless_it_names_another(tmp_path: Path) -> None:
    base = {"upstream": {"format": "bedrock", "region": "eu-west-1", "profile_geo": "eu"},
            "state_dir": str(tmp_path)}
    policies = _policy(tmp_path, "upstream: {profile_geo: global}\n")
    tenant = load_tenancy(parse_config({**base, "policies_dir": str(policies)})).tenants[0]
    assert tenant.upstream == UpstreamTarget(format="bedrock", region="eu-west-1", profile_geo="global")
    (policies / "t.yaml").write_text(
        "name: t\nprovider: {mode: passthrough}\nupstream: {format: vertex, project: p, location: global}\n"
    )
    tenant = load_tenancy(parse_config({**base, "policies_dir": str(policies)})).tenants[0]
    assert tenant.upstream == UpstreamTarget(format="vertex", project="p", location="global")  # no region


def test_a_policys_incomplete_platform_is_an_error_naming_the_file(tmp_path: Path) -> None:
    policies = _policy(tmp_path, "upstream: {format: vertex, project: p}\n")
    with pytest.raises(PolicyError) as caught:
        load_tenancy(parse_config({"policies_dir": str(policies), "state_dir": str(tmp_path)}))
    assert f"{policies / 't.yaml'}: key 'upstream.location': expected a value with format vertex" in str(caught.value)


def test_without_a_policy_the_default_tenant_has_the_configs_platform(tmp_path: Path) -> None:
    config = parse_config({"upstream": {"format": "vertex", "project": "p", "location": "us-east5"}})
    assert load_tenancy(config).tenants[0].upstream.format == "vertex"
    assert load_tenancy(parse_config({})).tenants[0].upstream == UpstreamTarget()
