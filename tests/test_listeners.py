"""The admin listener (``listen.admin_port``) and the start-up log, on a real ``serve`` process.

With an admin port, ``/admin``, ``/console`` and ``/metrics`` are served there only: the client
port answers 404 for them exactly as for a path that does not exist, and the admin port serves
nothing else; ``/healthz`` and ``/readyz`` are on both. The process runs with its stderr on a
pseudo-terminal, as a person starts it, so the one-time console link is printed: it must name
the port the console is on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from proxy.config.schema import ConfigError
from proxy.config.settings import parse_config
from proxy.server.http.runner import store_text
from tests.harness import OnTerminal
from tests.upstream import FakeUpstream, Reply, message_json

# a shell's admin token would turn the one-time link off
ADMIN_VARIABLES = ("CONTEXT_PROXY_ADMIN_TOKEN", "CONTEXT_PROXY_ADMIN_TOKEN_SHA256", "CONTEXT_PROXY_CONFIG")


@pytest.fixture
def split(tmp_path: Path, upstream: FakeUpstream) -> Iterator[tuple[OnTerminal, str, str]]:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\n"
        "listen: {admin_port: 0}\nshutdown: {grace_seconds: 2}\n"
    )
    served = OnTerminal(["--config", str(config), "--port", "0"], drop=ADMIN_VARIABLES)
    try:
        client = served.wait_for(r"listening on (http://127\.0\.0\.1:\d+) upstream=\S+ \(the API\)")
        admin = served.wait_for(r"admin listener on (http://127\.0\.0\.1:\d+): /admin, /console and /metrics")
        yield served, client.group(1), admin.group(1)
    finally:
        served.stop()


def test_admin_routes_only_on_the_admin_listener(
    split: tuple[OnTerminal, str, str], upstream: FakeUpstream, tmp_path: Path
) -> None:
    served, client_url, admin_url = split
    assert client_url != admin_url
    # the start-up log names how clients authenticate, the tenants, the store, each listener
    served.wait_for(
        re.escape(f"auth.mode passthrough, 1 tenant (default); store SQLite {tmp_path}/context-proxy.db")
    )
    with httpx.Client(timeout=30, trust_env=False, follow_redirects=False) as http:
        missing = http.get(client_url + "/no/such/path")
        assert missing.status_code == 404
        for path in ("/metrics", "/admin/v1/sessions", "/console/", "/console/signin", "/admin"):
            hidden = http.get(client_url + path)
            assert hidden.status_code == 404, path
            assert hidden.json()["error"] == {
                "type": "not_found_error", "message": f"GET {path}: not found"
            }  # exactly as a path that does not exist
            assert hidden.headers["content-type"] == missing.headers["content-type"]
        assert http.get(admin_url + "/metrics").text.startswith("# HELP")
        assert http.get(admin_url + "/admin/v1/sessions").status_code == 401  # there, and guarded
        assert http.get(admin_url + "/console/").headers["location"] == "/console/signin"
        for url in (client_url, admin_url):
            assert http.get(url + "/healthz").json() == {"status": "ok"}
            assert http.get(url + "/readyz").json() == {"status": "ready"}
        # the API is on the client port only
        upstream.script(Reply(message_json("hello")))
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        key = {"x-api-key": "sk-ant-listener-test-0001"}
        assert http.post(client_url + "/v1/messages", json=body, headers=key).status_code == 200
        refused = http.post(admin_url + "/v1/messages", json=body, headers=key)
        assert refused.status_code == 404 and refused.json()["error"]["type"] == "not_found_error"
        assert http.head(admin_url + "/").status_code == 404
        assert len(upstream.requests) == 1  # nothing reached the provider through the admin port

        # the one-time console link names the admin port, and signs in there
        link = served.wait_for(r"Console sign-in for tenant default, .*?: (http://\S+/console/signin#token=(\S+))")
        assert link.group(1).startswith(admin_url + "/console/signin#token=")
        signed = http.post(
            admin_url + "/console/signin", data={"token": link.group(2), "link": "1"},
            headers={"Origin": admin_url},
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/console/"
        # the console's pages learn where clients send requests (their empty state says so)
        me = http.get(admin_url + "/console/api/me").json()
        assert me == {"tenant": "default", "ledger": True, "client_port": int(client_url.rsplit(":", 1)[1])}


def test_without_an_admin_port_one_listener_serves_everything(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(f"upstream: {{base_url: '{upstream.url}'}}\nstate_dir: '{tmp_path}'\n")
    served = OnTerminal(["--config", str(config), "--port", "0"], drop=ADMIN_VARIABLES)
    try:
        url = served.wait_for(
            r"listening on (http://127\.0\.0\.1:\d+) upstream=\S+ \(the API, /admin, /console and /metrics\)"
        ).group(1)
        assert "admin listener" not in served.text
        with httpx.Client(timeout=30, trust_env=False) as http:
            assert http.get(url + "/metrics").status_code == 200
            assert http.get(url + "/admin/v1/sessions").status_code == 401
        link = served.wait_for(r"(http://\S+/console/signin#token=\S+)").group(1)
        assert link.startswith(url + "/console/signin#token=")
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("listen", "problem"),
    [
        ({"admin_host": "0.0.0.0"}, "key 'listen.admin_host': expected listen.admin_port as well"),
        ({"port": 8080, "admin_port": 8080}, "key 'listen.admin_port': expected a port other than listen.port (8080)"),
        ({"admin_port": 70000}, "key 'listen.admin_port': expected a port number"),
        ({"admin_port": "nine"}, "key 'listen.admin_port': expected an integer or nothing (null)"),
    ],
)
def test_admin_listener_settings_are_checked(listen: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"listen": listen})
    assert problem in str(caught.value)


def test_admin_listener_settings_that_are_fine() -> None:
    assert parse_config({"listen": {"admin_port": None}}).listen.admin_port is None  # null: unset
    both = parse_config({"listen": {"host": "0.0.0.0", "admin_host": "127.0.0.1", "admin_port": 9090}})
    assert (both.listen.admin_host, both.listen.admin_port) == ("127.0.0.1", 9090)
    # the same port on another address is another listener
    assert parse_config({"listen": {"admin_host": "127.0.0.2", "admin_port": 8080}}).listen.port == 8080


def test_the_store_as_the_log_names_it() -> None:
    assert store_text("postgresql://cp:s3cret-pw@db.internal:5432/context_proxy?sslmode=require") == (
        "PostgreSQL db.internal:5432/context_proxy"
    )
    assert store_text("postgres://cp@db/cp") == "PostgreSQL db/cp"
    assert store_text("sqlite:////var/lib/cp/context-proxy.db") == "SQLite /var/lib/cp/context-proxy.db"
