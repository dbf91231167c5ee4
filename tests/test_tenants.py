"""Tenant policies: the file format, its validation, authentication and what goes upstream."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.config.schema import ConfigError
from proxy.config.settings import Config, load_config, parse_config
from proxy.tenancy.policies import PolicyError, load_tenancy
from proxy.tenancy.tenants import ProviderAuth, Tenancy, Tenant

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-ant-provider-canary-0123456789"
SECRET_B = "sk-ant-provider-canary-globex-987"
KEY_A = "cpk-test-acme-aaaaaaaaaaaaaaaa"
KEY_B = "cpk-test-globex-bbbbbbbbbbbbbbbb"
ADMIN_A = "cpa-test-acme-admin-cccccccccccc"
ENV = {"ACME_KEY": SECRET, "GLOBEX_KEY": SECRET_B}
PROVIDER_ENV = "provider: {mode: env, api_key_env: ACME_KEY}\n"


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def make_config(tmp_path: Path, mode: str = "keys", **extra: Any) -> Config:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    data: dict[str, Any] = {
        "policies_dir": str(policies),
        "state_dir": str(tmp_path / "state"),
        "auth": {"mode": mode},
        **extra,
    }
    return parse_config(data, "<test>")


def write_policy(tmp_path: Path, file_name: str, text: str) -> str:
    path = tmp_path / "policies" / file_name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


def acme(**lines: str) -> str:
    """A valid keys-mode policy; keyword arguments replace (or, with "", drop) top-level keys."""
    parts = {
        "name": "name: acme\n",
        "api_keys_sha256": f"api_keys_sha256: [{sha(KEY_A)}]\n",
        "provider": PROVIDER_ENV,
        "admin_tokens_sha256": f"admin_tokens_sha256: [{sha(ADMIN_A)}]\n",
    }
    parts.update(lines)
    return "".join(parts.values())


def load_error(config: Config, environ: dict[str, str] | None = None) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_tenancy(config, environ=ENV if environ is None else environ, source="proxy.yaml")
    return info.value


def two_tenants(tmp_path: Path) -> Tenancy:
    write_policy(tmp_path, "acme.yaml", acme())
    write_policy(
        tmp_path,
        "globex.yml",
        f"name: globex\napi_keys_sha256: [{sha(KEY_B)}, {sha('cpk-second')}]\n"
        "provider: {mode: env, api_key_env: GLOBEX_KEY}\n",
    )
    return load_tenancy(make_config(tmp_path), environ=ENV)


# --- the committed examples --------------------------------------------------------------------


def test_committed_example_policies_are_valid(tmp_path: Path) -> None:
    config = parse_config(
        {
            "policies_dir": str(ROOT / "policies"),
            "auth": {"mode": "keys"},
            "state_dir": str(tmp_path),
        }
    )
    tenancy = load_tenancy(
        config, environ={"ACME_ANTHROPIC_KEY": SECRET, "GLOBEX_ANTHROPIC_KEY": SECRET_B}
    )
    assert [t.name for t in tenancy.tenants] == ["acme", "globex"]
    acme_t, globex_t = tenancy.tenants
    assert acme_t.provider == ProviderAuth("env", "ACME_ANTHROPIC_KEY", SECRET)
    assert (acme_t.compaction.threshold, acme_t.compaction.keep_recent) == (60000, 8)
    assert acme_t.compaction.hard_limit == config.compaction.hard_limit
    assert globex_t.sources.allowed_kinds == frozenset({"transcript"})
    assert globex_t.sources.transcript_root == str(tmp_path / "tenants" / "globex" / "transcripts")
    assert globex_t.compaction.summary.model == "claude-sonnet-4-5"
    assert globex_t.compaction.summary.max_tokens == config.compaction.summary.max_tokens


def test_the_dummy_keys_named_in_the_examples_are_the_ones_hashed(tmp_path: Path) -> None:
    config = parse_config({"policies_dir": str(ROOT / "policies"), "auth": {"mode": "keys"}})
    tenancy = load_tenancy(config, environ={"ACME_ANTHROPIC_KEY": "a", "GLOBEX_ANTHROPIC_KEY": "b"})
    documented = 0
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        name = path.stem
        for digest, key in re.findall(r"- ([0-9a-f]{64})\s+# (\S+)", path.read_text()):
            assert sha(key) == digest, f"{path}: the comment names the wrong key"
            found = (
                tenancy.admin(key)
                if key.startswith("cpa-")
                else tenancy.authenticate({"x-api-key": key})
            )
            assert found is not None and found.name == name
            documented += 1
    assert documented >= 4


# --- invalid files -----------------------------------------------------------------------------

INVALID: list[tuple[str, str]] = [
    (acme(name="name: 'bad name'\n"), "key 'name': expected a tenant name"),
    (acme(name="name: 'a.'\n"), "key 'name': expected a tenant name"),
    (acme(name="name: " + "a" * 65 + "\n"), "key 'name': expected a tenant name"),
    (acme(name="name: CON\n"), "key 'name': expected a tenant name"),
    (
        acme(name=""),
        "key 'name': expected a tenant name: [A-Za-z0-9][A-Za-z0-9._-]{0,63}, not ending in '.', not a Windows device name, missing",
    ),
    (
        acme(provider=""),
        "key 'provider': expected a mapping with mode: env or passthrough, missing",
    ),
    (
        acme(provider="provider: {}\n"),
        "key 'provider.mode': expected one of env, passthrough, missing",
    ),
    (
        acme(provider="provider:\n"),
        "key 'provider.mode': expected one of env, passthrough, missing",
    ),
    (
        acme(provider="provider: {mode: magic}\n"),
        "key 'provider.mode': expected one of env, passthrough, got 'magic'",
    ),
    (acme(provider="provider: env\n"), "key 'provider': expected a mapping, got 'env'"),
    (
        acme(provider="provider: {mode: env}\n"),
        "key 'provider.api_key_env': expected the name of the environment variable",
    ),
    (
        acme(provider="provider: {mode: env, api_key_env: 'MY-KEY'}\n"),
        "key 'provider.api_key_env': expected an environment variable name",
    ),
    (
        acme(provider="provider: {mode: env, api_key_env: NOT_SET}\n"),
        "key 'provider.api_key_env': expected environment variable NOT_SET to be set, it is not",
    ),
    (
        acme(provider="provider: {mode: env, api_key_env: EMPTY}\n"),
        "key 'provider.api_key_env': expected environment variable EMPTY to be non-empty",
    ),
    (
        acme(provider="provider: {mode: env, api_key_env: NEWLINE}\n"),
        "key 'provider.api_key_env': expected environment variable NEWLINE to hold printable ASCII without whitespace",
    ),
    (
        acme(provider="provider: {mode: passthrough, api_key_env: ACME_KEY}\n"),
        "key 'provider.api_key_env': expected no variable with provider.mode 'passthrough'",
    ),
    (
        acme(provider="provider: {mode: env, api_key_env: ACME_KEY, key: x}\n"),
        "key 'provider.key': unknown key (expected one of: api_key_env, mode)",
    ),
    (
        acme(api_keys_sha256="api_keys_sha256: [xyz]\n"),
        "key 'api_keys_sha256[0]': expected 64 hex digits, the SHA-256 of the secret",
    ),
    (
        acme(api_keys_sha256=f"api_keys_sha256: [{sha(KEY_A)[:-1]}]\n"),
        "key 'api_keys_sha256[0]': expected 64 hex digits",
    ),
    (
        acme(api_keys_sha256=f"api_keys_sha256: ['{sha(KEY_A)} ']\n"),
        "key 'api_keys_sha256[0]': expected 64 hex digits",
    ),
    (
        acme(api_keys_sha256=f"api_keys_sha256: [{sha(KEY_A)}, '{'g' * 64}']\n"),
        "key 'api_keys_sha256[1]': expected 64 hex digits",
    ),
    (
        acme(api_keys_sha256=f"api_keys_sha256: {sha(KEY_A)}\n"),
        "key 'api_keys_sha256': expected a list, got str",
    ),
    (
        acme(api_keys_sha256="api_keys_sha256: [12]\n"),
        "key 'api_keys_sha256[0]': expected a string, got a value of type int (not shown",
    ),
    (
        acme(api_keys_sha256=f"api_keys_sha256: [{sha(KEY_A)}, {sha(KEY_A).upper()}]\n"),
        "key 'api_keys_sha256[1]': expected each hash once, got a repeat of api_keys_sha256[0]",
    ),
    (
        acme(admin_tokens_sha256="admin_tokens_sha256: [nothex]\n"),
        "key 'admin_tokens_sha256[0]': expected 64 hex digits",
    ),
    (
        acme(admin_tokens_sha256=f"admin_tokens_sha256: [{sha(KEY_A)}]\n"),
        "key 'admin_tokens_sha256[0]': expected a hash used once across every key and admin token of every policy file, got one also in",
    ),
    (
        acme(sources="sources: {transcript_root: relative/transcripts}\n"),
        "key 'sources.transcript_root': expected an absolute path, got 'relative/transcripts'",
    ),
    (
        acme(sources="sources: {artifact_root: ./artifacts}\n"),
        "key 'sources.artifact_root': expected an absolute path, got './artifacts'",
    ),
    (
        acme(sources="sources: {kinds: [transcript, store]}\n"),
        "key 'sources.kinds': expected a list of: artifact, transcript",
    ),
    (
        acme(sources="sources: {kinds: transcript}\n"),
        "key 'sources.kinds': expected a list, got str",
    ),
    (
        acme(sources="sources: {session_patterns: ['a b']}\n"),
        "key 'sources.session_patterns': expected a list of non-empty glob patterns",
    ),
    (
        acme(sources="sources: {session_patterns: ['']}\n"),
        "key 'sources.session_patterns': expected a list of non-empty glob patterns",
    ),
    (
        acme(sources="sources: {roots: /x}\n"),
        "key 'sources.roots': unknown key (expected one of: artifact_root, kinds, object_store, session_patterns, signing, transcript_root)",
    ),
    (
        acme(compaction="compaction: {threshold: -1}\n"),
        "key 'compaction.threshold': expected a positive number of tokens, got -1",
    ),
    (
        acme(compaction="compaction: {threshold: 200000, hard_limit: 120000}\n"),
        "key 'compaction.hard_limit': expected a value >= compaction.threshold (200000), got 120000",
    ),
    (acme(compaction="compaction: {thresold: 1}\n"), "key 'compaction.thresold': unknown key"),
    (
        acme(compaction="compaction: {summary: {model: 3}}\n"),
        "key 'compaction.summary.model': expected a string, got 3",
    ),
    (
        acme(extra="admin_tokens: []\n"),
        "key 'admin_tokens': unknown key (expected one of: admin_tokens_sha256, api_keys_sha256, compaction, name, provider, quota, retention, sources, upstream)",
    ),
    ("- name: acme\n", "key '<top level>': expected a mapping"),
    ("name: [acme\n", "line 2, column 1: not valid YAML"),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_invalid_policies_name_the_file_the_key_and_the_expectation(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write_policy(tmp_path, "t.yaml", text)
    env = {**ENV, "EMPTY": "", "NEWLINE": SECRET + "\n"}
    error = load_error(make_config(tmp_path), env)
    assert isinstance(error, ConfigError)
    assert f"{path}: {expected}" in str(error), str(error)
    assert all(line.startswith(path + ": ") for line in error.errors), error.errors


def test_every_problem_in_every_file_is_listed_at_once(tmp_path: Path) -> None:
    a = write_policy(
        tmp_path, "a.yaml", "name: 'x y'\nprovider: {mode: env}\nsources: {transcript_root: r}\n"
    )
    b = write_policy(tmp_path, "b.yaml", acme(api_keys_sha256="api_keys_sha256: [a1, zz]\n"))
    error = load_error(make_config(tmp_path))
    assert [line.split(": key ")[0] for line in error.errors] == [a, a, a, b, b]


def test_the_policy_files_are_the_yaml_files_directly_in_the_folder(tmp_path: Path) -> None:
    write_policy(tmp_path, "acme.yaml", acme())
    write_policy(tmp_path, ".acme.yaml.swp", "garbage: [")
    write_policy(tmp_path, ".hidden.yaml", "garbage: [")
    write_policy(tmp_path, "README.md", "# notes")
    (tmp_path / "policies" / "old").mkdir()
    write_policy(tmp_path, "old/acme.yaml", "garbage: [")
    tenancy = load_tenancy(make_config(tmp_path), environ=ENV)
    assert [t.name for t in tenancy.tenants] == ["acme"]


def test_duplicate_names_across_files_name_both_files(tmp_path: Path) -> None:
    a = write_policy(tmp_path, "a.yaml", acme())
    b = write_policy(
        tmp_path, "b.yaml", acme(name="name: ACME\n", api_keys_sha256="", admin_tokens_sha256="")
    )
    error = load_error(make_config(tmp_path))
    assert error.errors == [
        f"{b}: key 'name': expected a name no other policy file uses (compared ignoring case),"
        f" got 'ACME', also in {a}"
    ]


def test_a_key_in_two_tenants_names_both_files(tmp_path: Path) -> None:
    a = write_policy(tmp_path, "a.yaml", acme())
    b = write_policy(
        tmp_path,
        "b.yaml",
        acme(
            name="name: globex\n",
            api_keys_sha256=f"api_keys_sha256: [{sha(KEY_B)}, {sha(KEY_A)}]\n",
            admin_tokens_sha256="",
        ),
    )
    error = load_error(make_config(tmp_path))
    assert error.errors == [
        f"{b}: key 'api_keys_sha256[1]': expected a hash used once across every key and admin"
        f" token of every policy file, got one also in {a} key 'api_keys_sha256[0]'"
    ]


def test_an_admin_token_of_one_tenant_cannot_be_another_tenants_key(tmp_path: Path) -> None:
    write_policy(tmp_path, "a.yaml", acme())
    b = write_policy(
        tmp_path,
        "b.yaml",
        acme(
            name="name: globex\n",
            api_keys_sha256=f"api_keys_sha256: [{sha(ADMIN_A)}]\n",
            admin_tokens_sha256="",
        ),
    )
    error = load_error(make_config(tmp_path))
    assert len(error.errors) == 1 and error.errors[0].startswith(f"{b}: key 'api_keys_sha256[0]'")
    assert "admin_tokens_sha256[0]" in error.errors[0]


@pytest.mark.parametrize(
    ("acme_root", "globex_root", "overlap"),
    [
        ("/srv/t/acme", "/srv/t/globex", False),
        ("/srv/t/acme", "/srv/t/acme", True),
        ("/srv/t/acme", "/srv/t/acme/", True),
        ("/srv/t", "/srv/t/globex", True),
        ("/srv/t/acme/x", "/srv/t/acme", True),
        ("/srv/t/acme", "/srv/t/acme-2", False),
        ("/", "/srv/t/globex", True),
        ("/srv/t/a/../globex", "/srv/t/globex", True),
    ],
)
def test_no_two_tenants_share_a_root(
    tmp_path: Path, acme_root: str, globex_root: str, overlap: bool
) -> None:
    write_policy(tmp_path, "a.yaml", acme(sources=f"sources: {{artifact_root: '{acme_root}'}}\n"))
    b = write_policy(
        tmp_path,
        "b.yaml",
        acme(
            name="name: globex\n",
            api_keys_sha256="",
            admin_tokens_sha256="",
            sources=f"sources: {{transcript_root: '{globex_root}'}}\n",
        ),
    )
    config = make_config(tmp_path)
    if not overlap:
        load_tenancy(config, environ=ENV)
        return
    error = load_error(config)
    assert error.errors[0].startswith(
        f"{b}: key 'sources.transcript_root': expected a directory that no other tenant's root"
    )
    assert "key 'sources.artifact_root'" in error.errors[0] and "a.yaml" in error.errors[0]
    # ("/" also contains globex's default artifact root: reported on its own line.)
    assert len(error.errors) == (2 if acme_root == "/" else 1)
    assert all(line.startswith(f"{b}: key 'sources.") for line in error.errors)


def test_default_roots_are_per_tenant_under_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tenancy = two_tenants(tmp_path)
    config = parse_config(
        {"policies_dir": "policies", "state_dir": "./state", "auth": {"mode": "keys"}}
    )
    relative = load_tenancy(config, environ=ENV)
    for t in (*tenancy.tenants, *relative.tenants):
        assert t.sources.transcript_root == str(
            tmp_path / "state" / "tenants" / t.name / "transcripts"
        )
        assert t.sources.artifact_root == str(tmp_path / "state" / "tenants" / t.name / "artifacts")
        assert t.sources.allowed_kinds == frozenset({"transcript", "artifact"})
        assert t.sources.session_patterns == ("*",)


# --- modes -------------------------------------------------------------------------------------


def test_passthrough_without_policies_is_the_builtin_default_tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for config in (Config(), parse_config({"policies_dir": str(tmp_path)})):
        tenancy = load_tenancy(config, environ={})
        assert tenancy.mode == "passthrough"
        assert tenancy.tenants == (tenancy.default,)
        default = tenancy.default
        assert default is not None and default.name == "default"
        assert default.provider == ProviderAuth("passthrough")
        assert default.sources.transcript_root == str(
            tmp_path / "state" / "sources" / "transcripts"
        )
        assert default.sources.artifact_root == str(tmp_path / "state" / "sources" / "artifacts")
        assert default.sources.allowed_kinds == frozenset({"transcript", "artifact"})
        assert default.sources.session_patterns == ("*",)
        assert default.compaction == config.compaction
        assert default.admin_token_hashes == () and default.api_key_hashes == ()
        for headers in ({}, {"x-api-key": "anything"}, {"authorization": "Bearer x"}):
            assert tenancy.authenticate(headers) is default
            assert tenancy.upstream_auth_headers(default, headers) == {}
        assert tenancy.admin("anything") is None


def test_passthrough_with_one_policy_file_is_that_tenant(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        "solo.yaml",
        f"name: solo\nprovider: {{mode: passthrough}}\nadmin_tokens_sha256: [{sha(ADMIN_A)}]\n"
        "compaction: {keep_recent: 3}\n",
    )
    tenancy = load_tenancy(make_config(tmp_path, "passthrough"), environ={})
    assert tenancy.default is not None and tenancy.tenants == (tenancy.default,)
    solo = tenancy.default
    assert (solo.name, solo.policy_file, solo.compaction.keep_recent) == ("solo", path, 3)
    # Omitted roots are the built-in tenant's: adding a policy file does not move the data.
    assert solo.sources.transcript_root == str(tmp_path / "state" / "sources" / "transcripts")
    assert tenancy.authenticate({"x-api-key": "whatever"}) is solo
    assert tenancy.admin(ADMIN_A) is solo
    assert tenancy.admin("wrong") is None


def test_passthrough_refuses_keys_and_an_env_provider(tmp_path: Path) -> None:
    path = write_policy(tmp_path, "solo.yaml", acme(admin_tokens_sha256=""))
    error = load_error(make_config(tmp_path, "passthrough"))
    assert error.errors == [
        f"{path}: key 'api_keys_sha256': expected no keys with auth.mode 'passthrough' (every client"
        " is this tenant; set auth.mode: keys to require keys), got 1",
        f"{path}: key 'provider.mode': expected 'passthrough' with auth.mode 'passthrough' (an env"
        " provider key would serve every client that reaches the proxy; use auth.mode: keys), got 'env'",
    ]


def test_passthrough_with_several_policy_files_names_the_mode(tmp_path: Path) -> None:
    write_policy(tmp_path, "a.yaml", "name: a\nprovider: {mode: passthrough}\n")
    write_policy(tmp_path, "b.yaml", "name: b\nprovider: {mode: passthrough}\n")
    error = load_error(make_config(tmp_path, "passthrough"))
    assert error.errors == [
        "proxy.yaml: key 'auth.mode': expected 'keys' when policies_dir holds more than one policy"
        " file (2: a.yaml, b.yaml), got 'passthrough'"
    ]


def test_keys_mode_needs_a_policy_file(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    error = load_error(config)
    assert error.errors == [
        "proxy.yaml: key 'policies_dir': expected a directory holding at least one policy file"
        f" (*.yaml) with auth.mode 'keys', got '{config.policies_dir}'"
    ]
    error = load_error(parse_config({"auth": {"mode": "keys"}}))
    assert "key 'policies_dir'" in str(error) and "got ''" in str(error)


def test_a_missing_policies_dir_is_an_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    error = load_error(parse_config({"policies_dir": missing}))
    assert error.errors == [
        f"proxy.yaml: key 'policies_dir': expected a readable directory, got '{missing}' (No such file or directory)"
    ]


def test_auth_mode_is_validated_in_the_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("auth: {mode: open}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: key 'auth.mode': expected one of passthrough, keys, got 'open'" in str(
        info.value
    )
    path.write_text("auth: {mode: keys}\n")
    assert load_config(path).auth.mode == "keys"
    assert Config().auth.mode == "passthrough"


# --- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-api-key": KEY_A}, "acme"),
        ({"X-Api-Key": KEY_B}, "globex"),
        ({"x-api-key": "cpk-second"}, "globex"),
        ({"authorization": f"Bearer {KEY_A}"}, "acme"),
        ({"Authorization": f"bearer  {KEY_B} "}, "globex"),
        ({"x-api-key": "", "authorization": f"Bearer {KEY_A}"}, "acme"),
        ({"x-api-key": "unknown", "authorization": f"Bearer {KEY_A}"}, None),  # x-api-key wins
        ({"x-api-key": KEY_A + " "}, None),
        ({"x-api-key": KEY_A.upper()}, None),
        ({"x-api-key": sha(KEY_A)}, None),  # the stored hash is not a key
        ({"authorization": f"Basic {KEY_A}"}, None),
        ({"authorization": KEY_A}, None),
        ({"authorization": "Bearer "}, None),
        ({"x-api-key": "clé-ünïcode\udcff"}, None),
        ({}, None),
    ],
)
def test_authenticate(tmp_path: Path, headers: dict[str, str], expected: str | None) -> None:
    tenancy = two_tenants(tmp_path)
    found = tenancy.authenticate(headers)
    assert (found.name if found else None) == expected


def test_authenticate_takes_aiohttp_headers(tmp_path: Path) -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    tenancy = two_tenants(tmp_path)
    headers = CIMultiDictProxy(
        CIMultiDict({"X-API-KEY": KEY_B, "Content-Type": "application/json"})
    )
    found = tenancy.authenticate(headers)
    assert found is not None and found.name == "globex"


def counting_compare_digest(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    compared: list[bytes] = []
    real: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    return compared


def test_authentication_compares_every_stored_hash_wherever_the_match_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenancy = two_tenants(tmp_path)
    stored = [h for t in tenancy.tenants for h in t.api_key_hashes]
    assert len(stored) == 3
    compared = counting_compare_digest(monkeypatch)
    for key, expected in (
        (KEY_A, "acme"),
        ("cpk-second", "globex"),
        (KEY_B, "globex"),
        ("nope", None),
    ):
        compared.clear()
        found = tenancy.authenticate({"x-api-key": key})
        assert (found.name if found else None) == expected
        assert sorted(compared) == sorted(stored)  # every hash, once, first match or last or none


def test_admin_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tenancy = two_tenants(tmp_path)
    compared = counting_compare_digest(monkeypatch)
    acme_t = tenancy.admin(ADMIN_A)
    assert acme_t is not None and acme_t.name == "acme"
    assert compared == [hashlib.sha256(ADMIN_A.encode()).digest()]
    assert tenancy.admin(KEY_A) is None  # an API key is not an admin token
    assert tenancy.admin("") is None
    assert tenancy.authenticate({"x-api-key": ADMIN_A}) is None  # nor the other way round


# --- what goes upstream ------------------------------------------------------------------------


def test_env_provider_replaces_the_client_credentials(tmp_path: Path) -> None:
    tenancy = two_tenants(tmp_path)
    acme_t, globex_t = tenancy.tenants
    headers = {"x-api-key": KEY_A, "authorization": "Bearer other"}
    assert tenancy.upstream_auth_headers(acme_t, headers) == {
        "x-api-key": SECRET,
        "authorization": None,
        "api-key": None,
    }
    assert tenancy.upstream_auth_headers(globex_t, {}) == {
        "x-api-key": SECRET_B,
        "authorization": None,
        "api-key": None,
    }


def test_passthrough_provider_in_keys_mode_drops_only_the_proxy_key(tmp_path: Path) -> None:
    write_policy(tmp_path, "a.yaml", acme(provider="provider: {mode: passthrough}\n"))
    tenancy = load_tenancy(make_config(tmp_path), environ={})
    (tenant,) = tenancy.tenants
    assert tenant.provider == ProviderAuth("passthrough")
    both = {"x-api-key": KEY_A, "authorization": "Bearer provider-oauth-token"}
    assert tenancy.authenticate(both) is tenant
    assert tenancy.upstream_auth_headers(tenant, both) == {"x-api-key": None, "api-key": None}
    bearer = {"Authorization": f"Bearer {KEY_A}"}
    assert tenancy.authenticate(bearer) is tenant
    assert tenancy.upstream_auth_headers(tenant, bearer) == {"authorization": None, "api-key": None}
    # Foundry's key header: a Foundry client's key (the SDK sends it in x-api-key and api-key;
    # Microsoft's REST examples in api-key alone); it never goes upstream
    foundry = {"api-key": KEY_A, "authorization": "Bearer provider-oauth-token"}
    assert tenancy.authenticate(foundry) is tenant
    assert tenancy.upstream_auth_headers(tenant, foundry) == {"api-key": None}
    assert tenancy.authenticate({"api-key": "not-a-key"}) is None


# --- secrets -----------------------------------------------------------------------------------


def test_the_provider_key_is_never_shown(tmp_path: Path) -> None:
    tenancy = two_tenants(tmp_path)
    provider = tenancy.tenants[0].provider
    assert provider.api_key == SECRET
    for text in (
        repr(tenancy),
        str(tenancy),
        repr(tenancy.tenants),
        repr(provider),
        str(provider),
        f"{provider}",
    ):
        assert SECRET not in text and SECRET_B not in text
    assert "api_key=<hidden>" in repr(provider)


FAILING: list[tuple[str, dict[str, str]]] = [
    # A valid env provider next to problems elsewhere in the same file.
    (acme(api_keys_sha256="api_keys_sha256: [bad]\n"), ENV),
    (acme(compaction="compaction: {threshold: 999999, hard_limit: 1000}\n"), ENV),
    (acme(extra="bogus: 1\n"), ENV),
    # The key pasted where a hash or a variable name belongs.
    (acme(api_keys_sha256=f"api_keys_sha256: ['{SECRET}']\n"), ENV),
    (acme(admin_tokens_sha256=f"admin_tokens_sha256: ['{SECRET}']\n"), ENV),
    (acme(provider=f"provider: {{mode: env, api_key_env: '{SECRET}'}}\n"), ENV),
    (acme(provider=f"provider: {{mode: passthrough, api_key_env: '{SECRET}'}}\n"), ENV),
    # The variable's value is unusable.
    (acme(), {"ACME_KEY": SECRET + "\n"}),
    (acme(), {"ACME_KEY": SECRET.replace("-", " ")}),
    # The key is fine, but passthrough mode refuses an env provider.
    (acme(api_keys_sha256="", admin_tokens_sha256=""), ENV),
]


@pytest.mark.parametrize(("text", "environ"), FAILING)
def test_no_error_shows_the_provider_key(
    tmp_path: Path, text: str, environ: dict[str, str]
) -> None:
    write_policy(tmp_path, "a.yaml", text)
    mode = "passthrough" if "api_keys_sha256" not in text else "keys"
    with pytest.raises(Exception) as info:
        load_tenancy(make_config(tmp_path, mode), environ=environ)
    assert isinstance(info.value, PolicyError)
    rendered = (
        "".join(traceback.format_exception(info.value)) + repr(info.value) + repr(info.value.errors)
    )
    for secret in (SECRET, SECRET.replace("-", " "), SECRET[:12]):
        assert secret not in rendered


def test_the_key_cannot_leak_through_upstream_auth_headers_errors(tmp_path: Path) -> None:
    """Neither the tenant's own provider key nor another tenant's, in any form of the error."""
    tenancy = two_tenants(tmp_path)
    assert [t.provider.api_key for t in tenancy.tenants] == [SECRET, SECRET_B]
    for tenant in tenancy.tenants:
        broken = dataclasses.replace(tenant, provider=dataclasses.replace(tenant.provider, api_key=None))
        with pytest.raises(ValueError) as info:
            tenancy.upstream_auth_headers(broken, {"x-api-key": KEY_A, "authorization": "Bearer " + KEY_B})
        rendered = "".join(traceback.format_exception(info.value)) + repr(info.value.args)
        assert "an env provider without a key" in rendered
        for secret in (SECRET, SECRET_B, SECRET[:12], SECRET_B[-12:], KEY_A, KEY_B):
            assert secret not in rendered, (tenant.name, secret)


# --- values, overrides, reload -----------------------------------------------------------------


def test_compaction_overrides_apply_over_the_configs_section(tmp_path: Path) -> None:
    write_policy(
        tmp_path,
        "a.yaml",
        acme(compaction="compaction: {keep_recent: 9, summary: {max_tokens: 500}}\n"),
    )
    config = make_config(
        tmp_path, compaction={"threshold": 50000, "hard_limit": 90000, "summary": {"model": "m-1"}}
    )
    (tenant,) = load_tenancy(config, environ=ENV).tenants
    assert tenant.compaction == dataclasses.replace(
        config.compaction,
        keep_recent=9,
        summary=dataclasses.replace(config.compaction.summary, max_tokens=500),
    )
    assert tenant.compaction.summary.model == "m-1"
    write_policy(tmp_path, "a.yaml", acme(compaction="compaction: {threshold: 95000}\n"))
    error = load_error(config)
    assert (
        "key 'compaction.hard_limit': expected a value >= compaction.threshold (95000), got 90000"
        in str(error)
    )


def test_a_tenancy_is_an_immutable_value_and_reload_is_load_again(tmp_path: Path) -> None:
    first = two_tenants(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.mode = "passthrough"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.tenants[0].name = "x"  # type: ignore[misc]
    assert isinstance(first.tenants, tuple)
    assert isinstance(first.tenants[0].api_key_hashes, tuple)
    hash(first)  # immutable all the way down
    config = make_config(tmp_path)
    assert load_tenancy(config, environ=ENV) == first
    write_policy(
        tmp_path,
        "initech.yaml",
        "name: initech\nprovider: {mode: passthrough}\napi_keys_sha256: [" + sha("k3") + "]\n",
    )
    second = load_tenancy(config, environ=ENV)
    assert [t.name for t in second.tenants] == ["acme", "globex", "initech"]
    assert first.authenticate({"x-api-key": "k3"}) is None  # the old value is untouched
    found = second.authenticate({"x-api-key": "k3"})
    assert found is not None and found.name == "initech"
    assert isinstance(found, Tenant) and second.by_name("initech") is found


# --- check-config ------------------------------------------------------------------------------


def _check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ACME_KEY", "GLOBEX_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env},
        cwd=ROOT,
    )


def test_check_config_validates_the_policies(tmp_path: Path) -> None:
    write_policy(tmp_path, "acme.yaml", acme())
    write_policy(
        tmp_path, "globex.yaml", "name: globex\nprovider: {mode: env, api_key_env: GLOBEX_KEY}\n"
    )
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"policies_dir: {tmp_path / 'policies'}\nauth: {{mode: keys}}\nstate_dir: {tmp_path}\n"
    )
    ok = _check_config(config, ENV)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"{config}: ok (auth.mode keys, 2 tenants)"

    failed = _check_config(config, {"ACME_KEY": SECRET})
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        f"{tmp_path / 'policies' / 'globex.yaml'}: key 'provider.api_key_env': expected environment"
        " variable GLOBEX_KEY to be set, it is not"
    )
    assert SECRET not in failed.stderr + failed.stdout

    config.write_text(f"policies_dir: {tmp_path / 'policies'}\n")
    passthrough = _check_config(config, ENV)
    assert passthrough.returncode == 1
    assert f"{config}: key 'auth.mode': expected 'keys'" in passthrough.stderr

    config.write_text("listen: {port: 9001}\n")
    default = _check_config(config, {})
    assert (
        default.returncode == 0
        and default.stdout.strip() == f"{config}: ok (auth.mode passthrough, 1 tenant)"
    )


def test_check_config_lists_config_and_policy_problems_together(tmp_path: Path) -> None:
    """A wrong config key does not hide the policies' problems: both, in one run."""
    write_policy(tmp_path, "acme.yaml", acme(provider="provider: {mode: sometimes}\n"))
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"policies_dir: {tmp_path / 'policies'}\nauth: {{mode: keys}}\nstate_dir: {tmp_path}\n"
        "listen: {port: nine}\ncompaction: {keep_recent: 0}\n"
    )
    both = _check_config(config, ENV)
    assert both.returncode == 1 and both.stdout == ""
    lines = both.stderr.strip().splitlines()
    assert lines[0] == f"{config}: key 'listen.port': expected an integer, got 'nine'"
    assert lines[1].startswith(f"{config}: key 'compaction.keep_recent': expected a positive number")
    assert lines[2].startswith(f"{tmp_path / 'policies' / 'acme.yaml'}: key 'provider.mode'")
    assert lines[3] == f"{config}: 2 problem(s) in the file, 1 in the tenant policies"
    assert len(lines) == 4

    # a key the policies are read with is wrong: they are not checked, and it says so
    config.write_text(f"policies_dir: {tmp_path / 'policies'}\nauth: {{mode: sometimes}}\n")
    unread = _check_config(config, ENV)
    assert unread.returncode == 1
    assert unread.stderr.strip().splitlines() == [
        f"{config}: key 'auth.mode': expected one of passthrough, keys, got 'sometimes'",
        f"{config}: tenant policies not checked: fix the keys above first",
    ]


def test_check_config_with_the_committed_examples(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("policies_dir: policies\nauth: {mode: keys}\n")  # relative to the working dir
    ok = _check_config(config, {"ACME_ANTHROPIC_KEY": SECRET, "GLOBEX_ANTHROPIC_KEY": SECRET_B})
    assert ok.returncode == 0, ok.stderr
    assert "ok (auth.mode keys, 2 tenants)" in ok.stdout
