"""docker-compose.yml and the Dockerfile, checked without a Docker engine: parsed, their config
files validated like ``context-proxy check-config`` does, and (tests/test_replicas.py) the
processes they describe run directly."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.config.settings import Config, load_config
from proxy.tenancy.tenants import load_tenancy

ROOT = Path(__file__).resolve().parent.parent
REPLICAS = ("proxy-1", "proxy-2")
DEMO_REPLICAS = ("demo-1", "demo-2")
S3_REPLICAS = ("s3-1", "s3-2")
S3_SERVICES = ("minio", "minio-init")
IMAGE_CONFIG = "/etc/context-proxy/config.yaml"  # the Dockerfile's default


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of a service's short-syntax volumes (``source:target[:mode]``)."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        mounts[target] = source
    return mounts


def _config_of(service: dict[str, Any]) -> tuple[Path, Config]:
    """The host file mounted where CONTEXT_PROXY_CONFIG points, validated (check-config)."""
    target = service["environment"]["CONTEXT_PROXY_CONFIG"]
    source = _mounts(service)[target]
    assert source.startswith("./"), source
    path = ROOT / source
    config = load_config(path)
    load_tenancy(config, source=str(path))  # what check-config validates besides the file
    return path, config


def _host_port(service: dict[str, Any], container_port: int) -> int:
    (mapping,) = service["ports"]
    host, container = mapping.split(":")
    assert int(container) == container_port
    return int(host)


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        "postgres",
        *REPLICAS,
        "lb",
        "fake-upstream",
        *DEMO_REPLICAS,
        *S3_SERVICES,
        *S3_REPLICAS,
    }
    assert services["postgres"]["image"] == "postgres:15"
    for name in (*REPLICAS, *DEMO_REPLICAS, "fake-upstream"):
        build = services[name]["build"]
        assert build["context"] == "."
        assert (ROOT / build["dockerfile"]).is_file()
    assert services["lb"]["image"].startswith("nginx:")


def test_replicas_share_the_postgres_store_and_the_state_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg = services["postgres"]["environment"]
    stores = set()
    for name in REPLICAS:
        service = services[name]
        _, config = _config_of(service)
        url = urlsplit(config.store_url)
        assert url.scheme == "postgresql"
        assert (url.hostname, url.port) == ("postgres", 5432)
        assert (url.username, url.password) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])
        assert url.path == "/" + pg["POSTGRES_DB"]
        assert config.listen.host == "0.0.0.0"
        stores.add(config.store_url)
        volume = _mounts(service)[config.state_dir]
        assert volume == "proxy-state" and volume in compose["volumes"]
        # The grace period fits inside the stop timeout, so SIGTERM drains before SIGKILL.
        assert config.shutdown.grace_seconds < int(service["stop_grace_period"].rstrip("s"))
    assert len(stores) == 1


def test_volumes_are_declared(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for source in _mounts(service).values():
            if source.startswith("./"):
                assert (ROOT / source).is_file(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: {source}"
    assert _mounts(compose["services"]["postgres"])["/var/lib/postgresql/data"] == "postgres-data"


def test_start_order_waits_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in REPLICAS:
        assert services[name]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in DEMO_REPLICAS:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "fake-upstream": {"condition": "service_healthy"},
        }
    assert services["lb"]["depends_on"] == {
        name: {"condition": "service_healthy"} for name in REPLICAS
    }


def test_health_checks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    for name in (*REPLICAS, *DEMO_REPLICAS):
        _, config = _config_of(services[name])
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{config.listen.port}/readyz" in test
    assert "/healthz" in " ".join(services["fake-upstream"]["healthcheck"]["test"])


def test_distinct_host_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    ports = {
        name: _host_port(services[name], _config_of(services[name])[1].listen.port)
        for name in (*REPLICAS, *DEMO_REPLICAS)
    }
    assert (ports["proxy-1"], ports["proxy-2"]) == (8081, 8082)
    assert len(set(ports.values())) == len(ports)
    assert _host_port(services["lb"], 8080) == 8080


def test_the_load_balancer_fronts_both_replicas(compose: dict[str, Any]) -> None:
    lb = compose["services"]["lb"]
    conf = (ROOT / _mounts(lb)["/etc/nginx/conf.d/default.conf"]).read_text()
    servers = re.findall(r"^\s*server\s+([\w-]+):(\d+)", conf, re.MULTILINE)
    ports = {name: _config_of(compose["services"][name])[1].listen.port for name in REPLICAS}
    assert sorted(servers) == sorted((name, str(port)) for name, port in ports.items())
    assert "proxy_buffering off;" in conf  # SSE streams pass through as they come
    assert re.search(r"^\s*listen\s+8080;", conf, re.MULTILINE)


def test_demo_profile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    defaults = {name for name, s in services.items() if "profiles" not in s}
    demo = {name for name, s in services.items() if "demo" in s.get("profiles", [])}
    assert defaults == {"postgres", *REPLICAS, "lb"}
    assert demo == {"fake-upstream", *DEMO_REPLICAS}
    fake = services["fake-upstream"]
    assert fake["command"] == [
        "context-proxy",
        "demo-upstream",
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
    ]
    urls = set()
    for name in DEMO_REPLICAS:
        _, config = _config_of(services[name])
        assert config.upstream.base_url == "http://fake-upstream:9000"
        urls.add(config.store_url)
        assert _mounts(services[name])[config.state_dir] == "demo-state"
    (demo_url,) = urls
    real_url = _config_of(services["proxy-1"])[1].store_url
    assert urlsplit(demo_url).netloc == urlsplit(real_url).netloc  # same server
    database = urlsplit(demo_url).path.lstrip("/")
    assert database != urlsplit(real_url).path.lstrip("/")  # its own database, made at init:
    init = _mounts(services["postgres"])
    scripts = [
        source
        for target, source in init.items()
        if target.startswith("/docker-entrypoint-initdb.d/")
    ]
    assert any(f"CREATE DATABASE {database}" in (ROOT / s).read_text() for s in scripts)


def test_the_image_default_config_is_valid() -> None:
    config = load_config(ROOT / "examples" / "docker.yaml")
    assert config.state_dir == "/var/lib/context-proxy"
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", 8080)


def test_dockerfile_installs_the_package_and_its_config() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copies = [line.split()[1] for line in lines if line.startswith("COPY")]
    for source in copies:
        assert (ROOT / source).exists(), source
    assert 'CMD ["context-proxy", "serve"]' in lines
    assert f"ENV CONTEXT_PROXY_CONFIG={IMAGE_CONFIG}" in lines
    assert "VOLUME /var/lib/context-proxy" in lines


def test_the_test_fixtures_ship_with_the_repository() -> None:
    """A fresh clone with nothing beside it must pass: every fixture lives under tests/data, with
    the licence notice of each shipped file (CC0 / MIT)."""
    from tests import shared_data

    data = ROOT / "tests" / "data"
    if not os.environ.get("CONTEXT_PROXY_SHARED"):
        assert shared_data.DATA == data
    for path in (
        shared_data.CC_TRANSCRIPT,
        shared_data.CC_SESSION_FILE,
        shared_data.TRAVERSAL_PAYLOADS,
    ):
        assert path.is_file(), path
    licences = {p.name for p in (data / "transcripts" / "LICENSES").iterdir()}
    assert {"M-Claude_CC0-1.0.txt", "SWE-agent_MIT.txt", "tau-bench_MIT.txt"} <= licences
    assert (data / "claude-code-sessions" / "M-Claude_CC0-1.0.txt").is_file()
    tracked = ROOT / "tests"
    offenders = [
        p
        for p in tracked.rglob("*.py")
        if p != Path(__file__).resolve()
        and ("../shared" in p.read_text() or 'parents[2] / "shared"' in p.read_text())
    ]
    assert offenders == []


def test_s3_profile_replicas_share_only_postgres_and_the_bucket(compose: dict[str, Any]) -> None:
    services = compose["services"]
    s3 = {name for name, s in services.items() if "s3" in s.get("profiles", [])}
    assert s3 == {*S3_SERVICES, *S3_REPLICAS}
    minio = services["minio"]
    assert minio["image"].startswith("minio/minio:") and minio["command"][:2] == ["server", "/data"]
    init = " ".join(services["minio-init"]["command"])
    stores, policies = set(), []
    for name in S3_REPLICAS:
        service = services[name]
        mounts = _mounts(service)
        assert all(source.startswith("./") for source in mounts.values()), mounts  # no volume
        assert all(entry.endswith(":ro") for entry in service["volumes"])
        assert service["depends_on"]["minio-init"] == {
            "condition": "service_completed_successfully"
        }
        config_path = ROOT / mounts[service["environment"]["CONTEXT_PROXY_CONFIG"]]
        config = load_config(config_path)
        assert config.state_dir not in mounts  # its own scratch space, never shared
        stores.add(config.store_url)
        host_policies = {
            t: ROOT / src for t, src in mounts.items() if t.startswith(config.policies_dir)
        }
        assert host_policies, "the policies are mounted"
        policies_dir = next(iter(host_policies.values())).parent
        tenancy = load_tenancy(
            dataclasses.replace(config, policies_dir=str(policies_dir)),
            environ={k: str(v) for k, v in service["environment"].items()},
            source=str(config_path),
        )
        (tenant,) = tenancy.tenants
        store = tenant.sources.object_store
        assert store is not None and tenant.sources.signing is not None
        assert (
            urlsplit(store.endpoint).hostname == "minio" and urlsplit(store.endpoint).port == 9000
        )
        assert f"mc mb --ignore-existing local/{store.bucket}" in init
        assert (
            store.credentials.access_key_id in init and store.credentials.secret_access_key in init
        )
        policies.append(tenant.sources)
    (url,) = stores
    database = urlsplit(url).path.lstrip("/")
    init_sql = (ROOT / "examples" / "postgres-init.sql").read_text()
    assert f"CREATE DATABASE {database}" in init_sql
    assert policies[0] == policies[1]
