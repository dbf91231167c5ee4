"""docker-compose.yml and the Dockerfile, checked without a Docker engine: parsed, and the
process they describe run directly."""

from __future__ import annotations

from pathlib import Path

import yaml

from proxy.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_describes_the_proxy_with_a_state_volume() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    proxy = compose["services"]["proxy"]
    assert proxy["build"]["context"] == "."
    assert (ROOT / proxy["build"]["dockerfile"]).is_file()
    volume, target = proxy["volumes"][0].split(":")
    assert volume in compose["volumes"]
    config = load_config(ROOT / "examples" / "docker.yaml")
    assert config.state_dir == target  # the state folder is the mounted volume
    assert proxy["environment"]["CONTEXT_PROXY_CONFIG"] == "/etc/context-proxy/config.yaml"
    assert "/readyz" in " ".join(proxy["healthcheck"]["test"])
    assert proxy["ports"] == [f"{config.listen.port}:{config.listen.port}"]
    # The grace period fits inside the stop timeout, so SIGTERM drains before SIGKILL.
    assert config.shutdown.grace_seconds < int(proxy["stop_grace_period"].rstrip("s"))


def test_dockerfile_installs_the_package_and_its_config() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copies = [line.split()[1] for line in lines if line.startswith("COPY")]
    for source in copies:
        assert (ROOT / source).exists(), source
    assert 'CMD ["context-proxy", "serve"]' in lines
    assert "ENV CONTEXT_PROXY_CONFIG=/etc/context-proxy/config.yaml" in lines
