"""The console and the admin API out of the box (proxy/console/first_signin.py, proxy/config/settings.py):

* ``serve`` with no policy file, on a terminal (a real pty): one line with a one-time sign-in
  link; the link signs a real browser in (the token leaves the address bar, reaches no log), works
  once, and is never an admin token for the admin API;
* stderr not a terminal (a log stream): no token is made, one line says how to set one;
* ``CONTEXT_PROXY_ADMIN_TOKEN`` / ``CONTEXT_PROXY_ADMIN_TOKEN_SHA256``: a lasting admin token for
  the passthrough tenant (the admin API, the console), no link; a bad value stops the start
  without showing it; ``auth.mode: keys`` ignores them and says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml
from playwright.sync_api import expect

from proxy.config.environment import admin_tokens_from_env
from proxy.config.schema import ConfigError
from proxy.config.settings import AuthConfig
from proxy.console.first_signin import OneTimeSignIn, signin_link, tenant_without_admin_token
from proxy.tenancy.policies import load_tenancy
from tests.console.browser import open_watched, screenshot
from tests.harness import OnTerminal, proxy_config
from tests.test_cli import ServeProcess

ENV_TOKEN = "cpa-env-admin-token-7f3a9c1e5b"
_LINK = re.compile(r"(http://[\d.]+:\d+/console/signin#token=([A-Za-z0-9_-]+))")
_ENV_NAMES = ("CONTEXT_PROXY_ADMIN_TOKEN", "CONTEXT_PROXY_ADMIN_TOKEN_SHA256", "CONTEXT_PROXY_CONFIG")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- the pieces -----------------------------------------------------------------------------------


def test_a_one_time_token_works_once_and_only_its_hash_is_kept() -> None:
    first = OneTimeSignIn()
    assert first.redeem("anything") is None and not first.pending
    token = first.issue("default")
    assert len(token) >= 43 and first.pending
    assert token not in repr(vars(first)) and token.encode() not in repr(vars(first)).encode()
    assert first.redeem(token + "x") is None and first.pending
    assert first.redeem(token) == "default"
    assert first.redeem(token) is None and not first.pending
    again = first.issue("default")
    assert again != token and first.redeem(token) is None


@pytest.mark.parametrize(
    ("host", "link"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080/console/signin#token=T"),
        ("0.0.0.0", "http://127.0.0.1:8080/console/signin#token=T"),
        ("::", "http://[::1]:8080/console/signin#token=T"),
        ("::1", "http://[::1]:8080/console/signin#token=T"),
        ("10.1.2.3", "http://10.1.2.3:8080/console/signin#token=T"),
        ("proxy.local", "http://proxy.local:8080/console/signin#token=T"),
    ],
)
def test_the_link_names_where_the_proxy_listens(host: str, link: str) -> None:
    assert signin_link(host, 8080, "T") == link


def test_admin_tokens_from_the_environment() -> None:
    sha = hashlib.sha256(ENV_TOKEN.encode()).digest()
    other = hashlib.sha256(b"another-admin-token-0123").digest()
    assert admin_tokens_from_env({}) == ()
    assert admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN": ""}) == ()
    assert admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN": ENV_TOKEN}) == (sha,)
    assert admin_tokens_from_env({"CONTEXT_PROXY_ADMIN_TOKEN_SHA256": other.hex().upper()}) == (other,)
    both = {"CONTEXT_PROXY_ADMIN_TOKEN": ENV_TOKEN, "CONTEXT_PROXY_ADMIN_TOKEN_SHA256": other.hex()}
    assert admin_tokens_from_env(both) == (sha, other)
    same = {"CONTEXT_PROXY_ADMIN_TOKEN": ENV_TOKEN, "CONTEXT_PROXY_ADMIN_TOKEN_SHA256": sha.hex()}
    assert admin_tokens_from_env(same) == (sha,)
    for env, expected in (
        ({"CONTEXT_PROXY_ADMIN_TOKEN": "short-secret"}, "at least 16 printable ASCII characters"),
        ({"CONTEXT_PROXY_ADMIN_TOKEN": "a secret with spaces in it"}, "without spaces"),
        ({"CONTEXT_PROXY_ADMIN_TOKEN_SHA256": "not-a-hash-but-a-secret"}, "expected 64 hex digits"),
    ):
        with pytest.raises(ConfigError) as caught:
            admin_tokens_from_env(env)
        text = str(caught.value)
        assert expected in text and "(not shown)" in text
        assert next(iter(env.values())) not in text


def test_which_tenant_gets_a_link(tmp_path: Path) -> None:
    config = proxy_config("http://127.0.0.1:9", str(tmp_path))
    builtin = tenant_without_admin_token(load_tenancy(config))
    assert builtin is not None and builtin.name == "default"
    with_env = load_tenancy(config.with_admin_tokens((bytes(32),)))
    assert tenant_without_admin_token(with_env) is None
    assert with_env.default is not None and with_env.default.admin_token_hashes == (bytes(32),)
    policies = tmp_path / "policies"
    policies.mkdir()
    policy: dict[str, Any] = {"name": "acme", "provider": {"mode": "passthrough"}}
    (policies / "acme.yaml").write_text(yaml.safe_dump(policy))
    one_file = dataclasses.replace(config, policies_dir=str(policies))
    tenant = tenant_without_admin_token(load_tenancy(one_file))
    assert tenant is not None and tenant.name == "acme"  # a policy without admin tokens
    policy["admin_tokens_sha256"] = [_sha("acme-admin-token-000111")]
    (policies / "acme.yaml").write_text(yaml.safe_dump(policy))
    assert tenant_without_admin_token(load_tenancy(one_file)) is None
    policy["api_keys_sha256"] = [_sha("acme-key-000111222333")]
    (policies / "acme.yaml").write_text(yaml.safe_dump(policy))
    keys = dataclasses.replace(one_file, auth=AuthConfig(mode="keys"), admin_token_hashes=(bytes(32),))
    tenancy = load_tenancy(keys)
    assert tenant_without_admin_token(tenancy) is None
    assert tenancy.admin(ENV_TOKEN) is None and tenancy.tenants[0].admin_token_hashes == (
        bytes.fromhex(_sha("acme-admin-token-000111")),
    )


# -- serve on a terminal --------------------------------------------------------------------------


def serve_on_terminal(config: Path, env: dict[str, str] | None = None) -> OnTerminal:
    """``context-proxy serve --port 0 --config <config>`` on a terminal, without the admin token
    variables of this shell."""
    return OnTerminal(["--port", "0", "--config", str(config)], env, drop=_ENV_NAMES)


@pytest.fixture
def bare_config(tmp_path: Path) -> Path:
    """No policy file, nothing about admin tokens: the quick start's first start."""
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "upstream": {"base_url": "http://127.0.0.1:9"}}))
    return config


@pytest.fixture
def on_terminal(bare_config: Path) -> Iterator[OnTerminal]:
    served = serve_on_terminal(bare_config)
    yield served
    served.stop()


def test_a_first_start_prints_a_one_time_link_that_signs_in_once(browser: Any, on_terminal: OnTerminal) -> None:
    served = on_terminal
    link, token = served.wait_for(_LINK.pattern).groups()
    lines = [line for line in served.text.splitlines() if "#token=" in line]
    assert len(lines) == 1 and lines[0].startswith("Console sign-in for tenant default, a one-time link")
    assert link.startswith(served.url + "/console/signin#token=")

    # Not an admin token: the admin API refuses it, and refusing it does not spend it.
    r = httpx.get(served.url + "/admin/v1/sessions", headers={"Authorization": f"Bearer {token}"}, trust_env=False)
    assert r.status_code == 401

    context, page, watch = open_watched(browser, served.url)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(f"{r.url} {r.headers.get('referer', '')} {r.post_data or ''}"))
    try:
        page.goto(link)
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.get_by_label("Tenant")).to_have_text("Tenant: default")
        assert "token" not in page.url and page.evaluate("location.hash") == ""
        # The console session reads the admin API as with a configured token.
        assert page.request.get("/admin/v1/sessions").json() == {"sessions": []}
        page.get_by_role("navigation", name="Console").get_by_role("link", name="Health").click()
        expect(page.get_by_role("heading", name="Health")).to_be_visible()
        screenshot(page, "first-signin")
        # The token went to the proxy once, as the form's body; never in a URL or a Referer.
        carrying = [s for s in sent if token in s]
        assert len(carrying) == 1 and carrying[0].startswith(served.url + "/console/signin ")
        assert f"token={token}" in carrying[0].split(" ", 2)[2]
        visited = []  # every history entry, back to the start: none holds the token
        while page.url != "about:blank" and len(visited) < 6:
            page.go_back()
            visited.append(page.url)
        assert visited[-1] == "about:blank" and not [u for u in visited if "token" in u], visited
    finally:
        context.close()
    watch.assert_clean()

    # Spent: the same link again signs nobody in, and says why.
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(link)
        expect(page.get_by_role("alert")).to_have_text(re.compile("This sign-in link is not valid: it works once"))
        assert context.cookies() == [] and "token" not in page.url
    finally:
        context.close()
    served.wait_for(r"signed in with the one-time link")
    log_lines = [line for line in served.text.splitlines() if line[:4].isdigit()]
    assert log_lines and not [line for line in log_lines if token in line]


def test_a_link_from_another_start_is_not_valid(browser: Any, bare_config: Path) -> None:
    served = serve_on_terminal(bare_config)
    try:
        link, _token = served.wait_for(_LINK.pattern).groups()
    finally:
        served.stop()
    again = serve_on_terminal(bare_config)  # a restart: a new token, the old one forgotten
    try:
        new_link, _ = again.wait_for(_LINK.pattern).groups()
        port = again.url.rsplit(":", 1)[1]
        stale = re.sub(r":\d+/", f":{port}/", link)
        assert stale != new_link
        context = browser.new_context()
        page = context.new_page()
        page.goto(stale)
        expect(page.get_by_role("alert")).to_have_text(re.compile("This sign-in link is not valid"))
        context.close()
    finally:
        again.stop()


# -- not a terminal, or a token from the environment -----------------------------------------------


def test_without_a_terminal_no_token_is_made(bare_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_NAMES[:2]:
        monkeypatch.delenv(name, raising=False)
    served = ServeProcess(bare_config)
    try:
        deadline = time.monotonic() + 10
        while not any("no admin token" in line for line in served.lines) and time.monotonic() < deadline:
            time.sleep(0.02)
        log = "".join(served.lines)
        assert "#token=" not in log and "one-time console sign-in link was printed" not in log
        (hint,) = [line for line in served.lines if "no admin token" in line]
        assert "CONTEXT_PROXY_ADMIN_TOKEN" in hint and "only when stderr is a terminal" in hint
        r = httpx.get(served.url + "/admin/v1/sessions", trust_env=False)
        assert r.status_code == 401
    finally:
        served.stop()


@pytest.mark.parametrize("variable", ["CONTEXT_PROXY_ADMIN_TOKEN", "CONTEXT_PROXY_ADMIN_TOKEN_SHA256"])
def test_an_admin_token_from_the_environment(bare_config: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    for name in _ENV_NAMES[:2]:
        monkeypatch.delenv(name, raising=False)
    value = ENV_TOKEN if variable == "CONTEXT_PROXY_ADMIN_TOKEN" else _sha(ENV_TOKEN)
    served = serve_on_terminal(bare_config, env={variable: value})
    try:
        bearer = {"Authorization": f"Bearer {ENV_TOKEN}"}
        r = httpx.get(served.url + "/admin/v1/sessions", headers=bearer, trust_env=False)
        assert (r.status_code, r.json()) == (200, {"sessions": []})
        assert httpx.get(served.url + "/admin/v1/sessions", headers={"Authorization": "Bearer nope"}, trust_env=False).status_code == 401
        with httpx.Client(base_url=served.url, trust_env=False) as http:
            signed = http.post("/console/signin", data={"token": ENV_TOKEN}, headers={"Origin": served.url})
            assert signed.status_code == 303
            assert http.get("/console/api/me").json()["tenant"] == "default"
        time.sleep(0.3)  # anything printed at start is in by now
        assert "#token=" not in served.text and "no admin token" not in served.text
        assert ENV_TOKEN not in served.text and _sha(ENV_TOKEN) not in served.text
    finally:
        served.stop()


def test_a_bad_environment_token_stops_the_start_without_showing_it(bare_config: Path) -> None:
    secret = "tooshort-secret"
    env = {k: v for k, v in os.environ.items() if k not in _ENV_NAMES}
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--config", str(bare_config)],
        env={**env, "CONTEXT_PROXY_ADMIN_TOKEN": secret},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "variable CONTEXT_PROXY_ADMIN_TOKEN: expected at least 16" in done.stderr
    assert secret not in done.stderr + done.stdout


def test_keys_mode_ignores_the_environment_token_and_says_so(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = {
        "name": "acme",
        "api_keys_sha256": [_sha("acme-key-000111222333")],
        "provider": {"mode": "passthrough"},
        "admin_tokens_sha256": [_sha("acme-admin-token-000111")],
    }
    (policies / "acme.yaml").write_text(yaml.safe_dump(policy))
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "auth": {"mode": "keys"}, "policies_dir": str(policies)}))
    served = serve_on_terminal(config, env={"CONTEXT_PROXY_ADMIN_TOKEN": ENV_TOKEN})
    try:
        served.wait_for(r"CONTEXT_PROXY_ADMIN_TOKEN\(_SHA256\) ignored: with auth.mode keys")
        for token, status in ((ENV_TOKEN, 401), ("acme-admin-token-000111", 200)):
            r = httpx.get(served.url + "/admin/v1/sessions", headers={"Authorization": f"Bearer {token}"}, trust_env=False)
            assert r.status_code == status
        assert "#token=" not in served.text
    finally:
        served.stop()
