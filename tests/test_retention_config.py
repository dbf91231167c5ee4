"""``retention:`` in the config and in tenant policies; the collector in the running proxy."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest

from proxy.config.retention import KindRetention, RetentionConfig
from proxy.config.schema import ConfigError
from proxy.config.settings import load_config, parse_config
from proxy.server.maintenance.retention import RETENTION
from proxy.tenancy.policies import PolicyError, load_tenancy
from tests.conftest import ProxyFactory
from tests.harness import LoopThread


def test_defaults_and_a_partial_section_keep_each_kinds_defaults() -> None:
    config = parse_config({"retention": {"plans": {"max_rows": 5}}})
    assert config.retention.plans == KindRetention(max_age_days=30.0, max_rows=5)
    assert config.retention.manifests == KindRetention(90.0, 100_000)
    assert config.retention.enabled and config.retention.interval_seconds == 3600


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"plans": {"max_age_days": -1}}, "key 'retention.plans.max_age_days': expected a number >= 0"),
        ({"interval_seconds": 0}, "key 'retention.interval_seconds': expected a positive number"),
        ({"artifacts": {"max_rows": 3}}, "key 'retention.artifacts.max_rows': unknown key"),
        ({"ledger": {}}, "key 'retention.ledger': unknown key"),
    ],
)
def test_bad_retention_keys_are_named(section: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"retention": section}, "proxy.yaml")
    assert problem in str(caught.value)


def _policy(tmp_path: Path, retention: str) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(
        f"name: acme\nprovider: {{mode: passthrough}}\nretention:\n{retention}"
    )
    return policies


def test_a_tenant_overrides_the_kinds_and_inherits_the_rest(tmp_path: Path) -> None:
    policies = _policy(tmp_path, "  enabled: false\n  transcripts: {max_age_days: 7}\n")
    config = parse_config(
        {"policies_dir": str(policies), "retention": {"transcripts": {"max_rows": 9}}}
    )
    (tenant,) = load_tenancy(config, environ={}).tenants
    assert tenant.retention is not None
    assert tenant.retention.transcripts == KindRetention(7.0, 9)
    assert tenant.retention.enabled is False
    assert tenant.retention.plans == config.retention.plans


def test_a_tenant_cannot_set_the_schedule(tmp_path: Path) -> None:
    policies = _policy(tmp_path, "  interval_seconds: 5\n")
    with pytest.raises(PolicyError) as caught:
        load_tenancy(parse_config({"policies_dir": str(policies)}), environ={})
    assert "key 'retention.interval_seconds': expected it in the config file" in str(caught.value)


def test_the_proxy_runs_the_collector_and_counts_it(
    make_proxy: ProxyFactory, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(retention={"interval_seconds": 3600})
    report = loop_thread.run(proxy.app[RETENTION].run_once())
    assert report.outcome == "completed"
    text = httpx.get(f"{proxy.url}/metrics", trust_env=False).text
    assert 'context_proxy_gc_runs_total{outcome="completed"} 1.0' in text
    assert "context_proxy_gc_last_completed_timestamp_seconds" in text


def test_the_example_file_lists_the_retention_defaults() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "context-proxy.yaml"
    assert load_config(example).retention == RetentionConfig()
