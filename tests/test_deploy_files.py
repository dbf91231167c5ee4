"""docker-compose.yml, the Dockerfile and deploy/kubernetes, checked without a Docker engine or a
cluster: parsed, their config files validated like ``context-proxy check-config`` does, their
secrets run through the proxy's own readers, the Kubernetes manifests validated offline against
the schemas kubernetes-validate bundles, and (tests/test_replicas.py) the processes they describe
run directly."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import re
import shlex
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.config.environment import admin_tokens_from_env, store_password_from_env
from proxy.config.reference import rows
from proxy.config.settings import AuthConfig, Config, load_config
from proxy.tenancy.policies import load_tenancy

ROOT = Path(__file__).resolve().parent.parent
REPLICAS = ("proxy-1", "proxy-2")
DEMO_REPLICAS = ("demo-1", "demo-2")
S3_REPLICAS = ("s3-1", "s3-2")
S3_SERVICES = ("minio", "minio-init")
IMAGE_CONFIG = "/etc/context-proxy/config.yaml"  # the Dockerfile's default
PROXIES = (*REPLICAS, *DEMO_REPLICAS, *S3_REPLICAS)
KUBERNETES = ROOT / "deploy" / "kubernetes"
# After the drain's grace: the runner's shutdown (2 s), the usage ledger's flush (at most 5 s),
# the transcripts and audit rows still queued. terminationGracePeriodSeconds must cover it too.
CLEANUP_SECONDS = 10


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
        assert (url.username, url.password) == (pg["POSTGRES_USER"], None)  # no password in files
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


def _dockerfile() -> list[str]:
    return (ROOT / "Dockerfile").read_text().splitlines()


def _image_config() -> tuple[Path, Config]:
    """The file the Dockerfile copies to the image's CONTEXT_PROXY_CONFIG, validated."""
    copies = {line.split()[2]: line.split()[1] for line in _dockerfile() if line.startswith("COPY")}
    source = ROOT / copies[IMAGE_CONFIG]
    config = load_config(source)
    load_tenancy(config, source=str(source))
    return source, config


def test_the_image_default_config_is_valid() -> None:
    source, config = _image_config()
    assert source == ROOT / "examples" / "docker.yaml"
    lines = _dockerfile()
    assert f"VOLUME {config.state_dir}" in lines
    assert f"EXPOSE {config.listen.port}" in lines and config.listen.host == "0.0.0.0"
    healthcheck = " ".join(lines[lines.index(next(x for x in lines if x.startswith("HEALTHCHECK"))):][:2])
    assert f"http://127.0.0.1:{config.listen.port}/healthz" in healthcheck


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
        environ = {k: _interpolate(str(v), S3_ENV) for k, v in service["environment"].items()}
        tenancy = load_tenancy(
            dataclasses.replace(config, policies_dir=str(policies_dir)),
            environ=environ,
            source=str(config_path),
        )
        (tenant,) = tenancy.tenants
        store = tenant.sources.object_store
        assert store is not None and tenant.sources.signing is not None
        assert (
            urlsplit(store.endpoint).hostname == "minio" and urlsplit(store.endpoint).port == 9000
        )
        assert f"mc mb --ignore-existing local/{store.bucket}" in init
        # the user minio-init creates is the one the proxies sign with: the same variables
        minio_init_env = services["minio-init"]["environment"]
        assert store.credentials.access_key_id == _interpolate(minio_init_env["TEAM_S3_ACCESS_KEY_ID"], S3_ENV)
        assert store.credentials.secret_access_key == _interpolate(
            minio_init_env["TEAM_S3_SECRET_ACCESS_KEY"], S3_ENV
        )
        assert '"$TEAM_S3_ACCESS_KEY_ID" "$TEAM_S3_SECRET_ACCESS_KEY"' in _interpolate(init, S3_ENV)
        policies.append(tenant.sources)
    (url,) = stores
    database = urlsplit(url).path.lstrip("/")
    init_sql = (ROOT / "examples" / "postgres-init.sql").read_text()
    assert f"CREATE DATABASE {database}" in init_sql
    assert policies[0] == policies[1]


# --- secrets --------------------------------------------------------------------------------------

# What Compose would find in .env for the s3 profile (docs/operations/deployment.md makes it).
S3_ENV = {
    "MINIO_ROOT_PASSWORD": "minio-root-password-for-the-test",
    "TEAM_S3_SECRET_ACCESS_KEY": "team-secret-for-the-test",
    "TEAM_MANIFEST_KEY_1": "0123456789abcdef0123456789abcdef-manifest-key",
}
_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation, the forms the compose file uses: ``${VAR}``, ``${VAR:-default}``
    and ``$$`` (a literal ``$``, for the container's shell)."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1)) or (m.group(2) or "")

    return _INTERPOLATION.sub(one, value)


SECRET_NAME = re.compile(r"PASSW|SECRET|TOKEN|KEY(?!_ID)")


def test_no_secret_is_written_in_the_compose_file(compose: dict[str, Any]) -> None:
    """Every secret-bearing variable is a file under /run/secrets or Compose's interpolation of
    its own environment (.env), never a value; every declared secret comes from a variable."""
    for name, service in compose["services"].items():
        for key, value in service.get("environment", {}).items():
            if not SECRET_NAME.search(key):
                continue
            if key.endswith("_FILE"):
                assert str(value).startswith("/run/secrets/"), (name, key)
            else:
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:-)?\}", str(value)), (name, key, "a literal?")
    for name, secret in compose["secrets"].items():
        assert set(secret) == {"environment"} and re.fullmatch(r"[A-Z0-9_]+", secret["environment"]), name
    command = " ".join(compose["services"]["minio-init"]["command"])
    assert '"$$MINIO_ROOT_PASSWORD"' in command and '"$$TEAM_S3_SECRET_ACCESS_KEY"' in command
    assert "change-me" not in (ROOT / "docker-compose.yml").read_text()


def _secret_of(compose: dict[str, Any], service: dict[str, Any], variable: str) -> str:
    """The Docker secret a ``*_FILE`` variable of ``service`` reads: mounted there, declared."""
    path = service["environment"][variable]
    name = path.removeprefix("/run/secrets/")
    assert path == f"/run/secrets/{name}" and name in service["secrets"] and name in compose["secrets"]
    return name


def test_the_proxies_read_the_admin_token_and_the_database_password_from_docker_secrets(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """Every replica reads the admin token and postgres' own password from the same secrets; run
    through the proxy's readers, they become its admin token and its store URL's password."""
    services = compose["services"]
    postgres = _secret_of(compose, services["postgres"], "POSTGRES_PASSWORD_FILE")
    assert "POSTGRES_PASSWORD" not in services["postgres"]["environment"]
    values = {postgres: "db password: #@/ it holds", "admin_token": "compose-admin-token-0123456789"}
    for name, value in values.items():
        (tmp_path / name).write_text(value + "\n")  # as Compose writes a secret from a variable
    for name in PROXIES:
        service = services[name]
        assert _secret_of(compose, service, "CONTEXT_PROXY_STORE_PASSWORD_FILE") == postgres
        assert _secret_of(compose, service, "CONTEXT_PROXY_ADMIN_TOKEN_FILE") == "admin_token"
        environ = {
            k: str(tmp_path / v.removeprefix("/run/secrets/")) if k.endswith("_FILE") else str(v)
            for k, v in service["environment"].items()
        }
        digest = hashlib.sha256(values["admin_token"].encode()).digest()
        assert admin_tokens_from_env(environ) == (digest,)
        config = load_config(ROOT / _mounts(service)[service["environment"]["CONTEXT_PROXY_CONFIG"]])
        url = urlsplit(config.with_store_password(store_password_from_env(environ)).store_url)
        assert url.password is not None and url.username == "context_proxy"
    assert {k for k, v in compose["secrets"].items()} == {postgres, "admin_token"}
    assert compose["secrets"][postgres] == {"environment": "POSTGRES_PASSWORD"}
    assert compose["secrets"]["admin_token"] == {"environment": "CONTEXT_PROXY_ADMIN_TOKEN"}


def _store_urls() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        found[path.name] = load_config(path).store.url
    found["kubernetes"] = _kubernetes_config()[1].store.url
    return found


def test_no_example_store_url_holds_a_password() -> None:
    urls = _store_urls()
    assert [name for name, url in urls.items() if url.startswith("postgresql")]  # there are some
    for name, url in urls.items():
        assert urlsplit(url).password is None, name


def test_the_example_policies_are_valid_and_keep_their_data_under_state_dir(tmp_path: Path) -> None:
    config = Config(auth=AuthConfig(mode="keys"), policies_dir=str(ROOT / "policies"), state_dir=str(tmp_path))
    tenancy = load_tenancy(
        config, environ={"ACME_ANTHROPIC_KEY": "sk-acme", "GLOBEX_ANTHROPIC_KEY": "sk-globex"}
    )
    assert {t.name for t in tenancy.tenants} == {"acme", "globex"}
    for tenant in tenancy.tenants:
        for root in (tenant.sources.transcript_root, tenant.sources.artifact_root):
            assert root is not None and root.startswith(str(tmp_path) + os.sep), (tenant.name, root)


def test_the_example_config_lists_every_key_with_its_default() -> None:
    """examples/context-proxy.yaml says it lists every key with its built-in default."""
    path = ROOT / "examples" / "context-proxy.yaml"
    assert load_config(path) == Config()
    data = yaml.safe_load(path.read_text())
    for key in rows(Config):
        if "[]" in key.path:
            continue
        node: Any = data
        for part in key.path.split("."):
            assert isinstance(node, dict) and part in node, key.path
            node = node[part]


# --- a single container ---------------------------------------------------------------------------


def _doc_commands(page: Path, program: str) -> list[list[str]]:
    """The shell commands of ``page``'s bash blocks that start with ``program`` (continuation
    lines joined), as words."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[: len(program.split())] == program.split():
                commands.append(words)
    return commands


def test_the_docker_run_recipe_fits_the_image() -> None:
    """docs/operations/deployment.md's `docker run`: the image it builds, the state volume where
    the image keeps its state, the port it listens on, a stop timeout longer than the drain, and
    secrets passed by name only (never a value on the command line)."""
    page = ROOT / "docs" / "operations" / "deployment.md"
    (run,) = _doc_commands(page, "docker run")
    builds = _doc_commands(page, "docker build")
    _, config = _image_config()
    assert run[-1] == builds[0][builds[0].index("-t") + 1]
    options = dict(itertools.pairwise(run))
    assert float(options["--stop-timeout"]) > config.shutdown.grace_seconds
    volume = options["-v"].split(":")
    assert volume[1] == config.state_dir
    assert options["-p"].split(":")[-1] == str(config.listen.port)
    passed = [run[i + 1] for i, word in enumerate(run) if word == "-e"]
    assert passed == ["CONTEXT_PROXY_ADMIN_TOKEN"]  # from the shell: no "=value" here


# --- Kubernetes -----------------------------------------------------------------------------------


def _kubernetes_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def _kind(kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for _, d in _kubernetes_documents() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def _kubernetes_config() -> tuple[Path, Config]:
    import tempfile

    data = _kind("ConfigMap", "context-proxy-config")["data"]
    path = Path(tempfile.mkdtemp(prefix="k8s-config-")) / "config.yaml"
    path.write_text(data["config.yaml"])
    return path, load_config(path)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the validation tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.usefixtures("no_network")
def test_the_kubernetes_manifests_validate_offline_against_the_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    documents = _kubernetes_documents()
    kinds = sorted(d["kind"] for _, d in documents)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]
    for version in ("1.29.0", kubernetes_validate.latest_version()):
        for _, document in documents:
            kubernetes_validate.validate(document, version, strict=True)  # raises when invalid
    broken = _kind("Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.29.0", strict=True)


def test_kustomize_applies_every_manifest_but_the_secret() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files - {"secret.yaml"}  # a reapply must not blank it
    assert all(v == "" for v in _kind("Secret")["stringData"].values())  # no value in the file


def _container() -> dict[str, Any]:
    (container,) = _kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def test_the_kubernetes_config_and_policies_are_valid_and_wired(tmp_path: Path) -> None:
    """The ConfigMaps pass check-config's checks with the Secret's values as the Deployment passes
    them; the mounts, the port and the variables are where the configuration says."""
    _, config = _kubernetes_config()
    container = _container()
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e for e in container["env"]}
    config_volume = next(n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "context-proxy-config")
    assert env["CONTEXT_PROXY_CONFIG"]["value"] == f"{mounts[config_volume]}/config.yaml"
    policy_volume = next(n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "context-proxy-policies")
    assert mounts[policy_volume] == config.policies_dir
    assert mounts["state"] == config.state_dir and "emptyDir" in volumes["state"]
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", config.listen.port)
    assert config.listen.host == "0.0.0.0" and config.auth.mode == "keys"
    secret_keys = set(_kind("Secret")["stringData"])
    environ: dict[str, str] = {}
    for name, item in env.items():
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == _kind("Secret")["metadata"]["name"] and ref["key"] in secret_keys
            environ[name] = f"value-of-{ref['key']}"
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in _kind("ConfigMap", "context-proxy-policies")["data"].items():
        (policies / name).write_text(text)
    tenancy = load_tenancy(dataclasses.replace(config, policies_dir=str(policies)), environ=environ)
    assert [t.name for t in tenancy.tenants] == ["team"]
    assert tenancy.tenants[0].provider.api_key == environ["TEAM_ANTHROPIC_API_KEY"]
    assert tenancy.tenants[0].api_key_hashes == ()  # nobody gets in until hashes are added
    url = urlsplit(config.with_store_password(environ["CONTEXT_PROXY_STORE_PASSWORD"]).store_url)
    assert url.scheme == "postgresql" and url.password == "value-of-store-password"


def test_the_probes_and_the_grace_period_fit_the_drain() -> None:
    """/readyz for readiness, /healthz for liveness and start-up; the pod's grace period covers
    the preStop sleep, the proxy's drain (shutdown.grace_seconds) and its cleanup."""
    container = _container()
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    _, config = _kubernetes_config()
    probes = {k: container[k]["httpGet"] for k in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "http"}
    assert probes["livenessProbe"] == probes["startupProbe"] == {"path": "/healthz", "port": "http"}
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    needed = float(command[1]) + config.shutdown.grace_seconds + CLEANUP_SECONDS
    assert pod["terminationGracePeriodSeconds"] >= needed
    strategy = _kind("Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


def test_the_service_and_the_disruption_budget_select_the_pods() -> None:
    deployment = _kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _kind("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    pdb = _kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
