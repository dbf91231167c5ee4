"""A Microsoft Foundry upstream, end to end: the official SDK -> the proxy -> FakeFoundry.

Two kinds of credentials, as the platform takes them (tests/foundry_fake.py): the resource's key
from the variable ``upstream.api_key_env`` names (or its ``_FILE``), sent as ``x-api-key`` and
``api-key``; or a Microsoft Entra ID token from azure-identity's ``DefaultAzureCredential``
chain, here its managed identity in App Service's form (``IDENTITY_ENDPOINT`` and
``IDENTITY_HEADER`` pointing at the fake's own token endpoint, on loopback: no internet). The
fake accepts only its key or the tokens it issued and has not expired, and only its deployments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from aiohttp import web

from proxy.server.upstream.credentials import AzureToken
from tests.conftest import ProxyFactory, no_azure_identity
from tests.foundry_fake import (
    AZURE_KEY_REFUSED,
    AZURE_TOKEN_REFUSED,
    DEPLOYMENT_NOT_FOUND,
    FOUNDRY_KEY,
    FakeFoundry,
)
from tests.harness import LoopThread, ProxyServer
from tests.upstream import message_json

MODEL = "claude-sonnet-4-5-20250929"
DEPLOYMENT = "claude-sonnet-4-5"  # the catalogue's Foundry id: the default deployment name
CLIENT_KEY = "sk-ant-client-key-never-sent-to-azure"
KEY_VARIABLE = "TEST_FOUNDRY_KEY"
HI = [{"role": "user", "content": "Hi"}]


def foundry_proxy(
    make_proxy: ProxyFactory,
    fake: FakeFoundry,
    *,
    key: bool = True,
    sections: dict[str, Any] | None = None,
    **upstream: Any,
) -> ProxyServer:
    """A proxy whose upstream is ``fake``: its key from ``TEST_FOUNDRY_KEY`` (set by the
    ``foundry_key`` fixture), or, with ``key=False``, Entra ID (the ``azure_env`` fixture)."""
    section: dict[str, Any] = {"format": "foundry", "endpoint_url": fake.endpoint, **upstream}
    if key:
        section.setdefault("api_key_env", KEY_VARIABLE)
    return make_proxy(upstream=section, **(sections or {}))


@pytest.fixture
def foundry_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_VARIABLE, FOUNDRY_KEY)
    monkeypatch.delenv(KEY_VARIABLE + "_FILE", raising=False)
    return FOUNDRY_KEY


def client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)


def ask(proxy: ProxyServer, **extra: Any) -> Any:
    return client(proxy).messages.create(model=MODEL, max_tokens=10, messages=HI, **extra)


# --- with the resource's key --------------------------------------------------------------------


def test_a_message_reaches_the_deployment_with_the_resources_key(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    proxy = foundry_proxy(make_proxy, foundry)
    message = ask(proxy)
    assert message.content[0].text == f"Hello from fake Foundry ({DEPLOYMENT})."
    [seen] = foundry.seen
    assert seen.path == "/anthropic/v1/messages"
    assert seen.body == {"model": DEPLOYMENT, "max_tokens": 10, "messages": HI}
    headers = {k.lower(): v for k, v in seen.headers.items()}
    assert headers["x-api-key"] == headers["api-key"] == FOUNDRY_KEY
    assert headers["anthropic-version"] == anthropic.Anthropic(api_key="x").default_headers[
        "anthropic-version"
    ]  # the client's own
    assert "authorization" not in headers
    assert CLIENT_KEY not in json.dumps(seen.headers)


def test_a_stream_and_the_clients_anthropic_version_pass_through(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    proxy = foundry_proxy(make_proxy, foundry)
    sdk = client(proxy).with_options(default_headers={"anthropic-version": "2023-06-01"})
    with sdk.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
        assert "".join(stream.text_stream) == f"Hello from fake Foundry ({DEPLOYMENT})."
    [seen] = foundry.seen
    assert seen.body["stream"] is True
    assert seen.headers["anthropic-version"] == "2023-06-01"


def test_a_configured_deployment_name_is_what_foundry_gets(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    foundry.deployments = frozenset({"team-sonnet"})
    proxy = foundry_proxy(
        make_proxy, foundry, sections={"models": [{"match": "claude-sonnet-4-5", "foundry": "team-sonnet"}]}
    )
    assert ask(proxy).content[0].text == "Hello from fake Foundry (team-sonnet)."
    assert foundry.seen[-1].body["model"] == "team-sonnet"


def test_a_deployment_foundry_does_not_have_is_its_404_naming_the_entry_to_add(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    foundry.deployments = frozenset({DEPLOYMENT})
    proxy = foundry_proxy(make_proxy, foundry)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client(proxy).messages.create(model="claude-opus-9", max_tokens=10, messages=HI)
    assert foundry.seen[-1].body["model"] == "claude-opus-9"  # a model the catalogue lacks: its id
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"  # Foundry's own type, kept
    assert error["message"].startswith(DEPLOYMENT_NOT_FOUND)
    assert "add a models: entry {match: claude-opus-9, foundry: <its id>}" in error["message"]
    assert caught.value.response.headers["request-id"] == "apim-req-404"


def test_a_refused_key_is_read_again_once_a_rotated_secret_file_is_picked_up(
    foundry: FakeFoundry, make_proxy: ProxyFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "foundry-key"
    secret.write_text(FOUNDRY_KEY + "\n")
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.setenv(KEY_VARIABLE + "_FILE", str(secret))
    proxy = foundry_proxy(make_proxy, foundry)
    ask(proxy)
    foundry.keys = {"rotated-key-0123456789"}  # the resource's key regenerated ...
    secret.write_text("rotated-key-0123456789\n")  # ... and the mounted secret updated
    assert ask(proxy).content[0].text.startswith("Hello from fake Foundry")
    assert [s.headers["x-api-key"] for s in foundry.seen] == [
        FOUNDRY_KEY, FOUNDRY_KEY, "rotated-key-0123456789"
    ]


def test_a_key_still_refused_after_reading_it_again_is_azures_401_with_a_note(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    foundry.keys = {"another-key"}
    proxy = foundry_proxy(make_proxy, foundry)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        ask(proxy)
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "authentication_error",
        "message": f"{AZURE_KEY_REFUSED} (the proxy read its Foundry key again once; still refused)",
    }
    assert len(foundry.seen) == 2


def test_no_key_in_the_named_variable_is_a_502_naming_it_never_a_value(
    foundry: FakeFoundry, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv(KEY_VARIABLE + "_FILE", raising=False)
    _refused_before_sending(
        foundry_proxy(make_proxy, foundry), foundry,
        "the proxy has no Foundry key: neither TEST_FOUNDRY_KEY nor TEST_FOUNDRY_KEY_FILE is set"
        " (upstream.api_key_env)",
    )  # fmt: skip


def _refused_before_sending(proxy: ProxyServer, foundry: FakeFoundry, message: str) -> None:
    """A 502 ``api_error`` saying ``message``, and nothing sent to Foundry."""
    with pytest.raises(anthropic.APIStatusError) as caught:
        ask(proxy)
    assert caught.value.status_code == 502
    assert caught.value.body["error"] == {"type": "api_error", "message": message}  # type: ignore[index]
    assert foundry.seen == []


def test_betas_foundry_does_not_take_are_dropped_with_their_fields(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    """What Claude Code sends in Foundry mode reaches Foundry (its own beta, effort with
    ``output_config.effort``); a beta Foundry does not take (LiteLLM's azure_ai table: the
    thinking-binding controls) goes, with the field it enables."""
    proxy = foundry_proxy(make_proxy, foundry)
    response = client(proxy).messages.with_raw_response.create(
        model=MODEL, max_tokens=10, messages=HI,
        extra_headers={"anthropic-beta": "claude-code-20250219,effort-2025-11-24,"
                       "thinking-binding-controls-2026-08-01"},
        extra_body={"output_config": {"effort": "high"},
                    "thinking": {"type": "adaptive", "block_binding": "strict"}},
    )  # fmt: skip
    assert response.status_code == 200
    seen = foundry.seen[0]
    assert seen.headers["anthropic-beta"] == "claude-code-20250219,effort-2025-11-24"
    assert seen.body["output_config"] == {"effort": "high"}
    assert seen.body["thinking"] == {"type": "adaptive"}
    assert response.headers["x-upstream-betas-dropped"] == "thinking-binding-controls-2026-08-01"
    assert response.headers["x-upstream-fields-dropped"] == "thinking.block_binding"


def test_count_tokens_goes_to_foundrys_count_tokens(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    proxy = foundry_proxy(make_proxy, foundry)
    assert client(proxy).messages.count_tokens(model=MODEL, messages=HI).input_tokens == 11
    [seen] = foundry.seen
    assert seen.path == "/anthropic/v1/messages/count_tokens"
    assert seen.body == {"model": DEPLOYMENT, "messages": HI}


def test_foundrys_errors_keep_their_status_type_and_wording(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    """A model-service error is the Anthropic one as Foundry relays it (Claude Code in Foundry
    mode strips a feature a deployment refuses by the 400's words, so they must arrive as sent);
    an Azure gateway error keeps its message, its status's type and its retry-after."""
    proxy = foundry_proxy(make_proxy, foundry)
    workspace = "tool_search not supported in your workspace"
    foundry.responder = lambda path, body: web.json_response(
        {"type": "error", "error": {"type": "invalid_request_error", "message": workspace}}, status=400
    )
    with pytest.raises(anthropic.BadRequestError) as bad:
        ask(proxy)
    assert bad.value.body["error"] == {"type": "invalid_request_error", "message": workspace}  # type: ignore[index]
    limited = "Requests to the Claude Messages API have exceeded call rate limit."
    foundry.responder = lambda path, body: web.json_response(
        {"error": {"code": "429", "message": limited}}, status=429, headers={"retry-after": "7"}
    )
    with pytest.raises(anthropic.RateLimitError) as throttled:
        ask(proxy)
    assert throttled.value.body["error"] == {"type": "rate_limit_error", "message": limited}  # type: ignore[index]
    assert throttled.value.response.headers["retry-after"] == "7"


def test_models_come_from_the_catalogue_and_other_routes_are_a_clear_404(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory
) -> None:
    proxy = foundry_proxy(make_proxy, foundry)
    ids = [model.id for model in client(proxy).models.list()]
    assert MODEL in ids and "claude-opus-4-8" in ids and "claude-fable-5-2" in ids
    assert "claude-demo-1" not in ids and "claude-mythos-5" not in ids  # no Foundry id known
    with pytest.raises(anthropic.NotFoundError) as caught:
        client(proxy).messages.batches.list()
    assert "foundry upstream" in caught.value.message
    assert foundry.seen == []


# --- with Microsoft Entra ID ----------------------------------------------------------------------


def test_an_entra_token_from_the_default_chain_is_sent_and_reused(
    azure_env: FakeFoundry, make_proxy: ProxyFactory
) -> None:
    foundry = azure_env
    proxy = foundry_proxy(make_proxy, foundry, key=False)
    for _ in range(3):
        assert ask(proxy).content[0].text == f"Hello from fake Foundry ({DEPLOYMENT})."
    assert foundry.token_grants == 1
    headers = [{k.lower(): v for k, v in s.headers.items()} for s in foundry.seen]
    assert {h["authorization"] for h in headers} == {"Bearer eyJ0eXAiOiJKV1QifQ.fake-entra-1"}
    assert not any("x-api-key" in h or "api-key" in h for h in headers)


def test_an_entra_token_is_refreshed_before_it_expires(
    azure_env: FakeFoundry, make_proxy: ProxyFactory
) -> None:
    # 4 min 40 s: inside the proxy's 5-minute margin, so each call asks the chain again
    azure_env.token_lifetime = 280
    proxy = foundry_proxy(make_proxy, azure_env, key=False)
    for _ in range(3):
        ask(proxy)
    assert azure_env.token_grants == 3
    assert [s.headers["Authorization"][-1] for s in azure_env.seen] == ["1", "2", "3"]


def test_a_refused_entra_token_is_renewed_once_and_the_call_made_again(
    azure_env: FakeFoundry, make_proxy: ProxyFactory
) -> None:
    proxy = foundry_proxy(make_proxy, azure_env, key=False)
    ask(proxy)
    azure_env.expire_all()  # revoked before its expiry
    assert ask(proxy).content[0].text.startswith("Hello from fake Foundry")
    assert azure_env.token_grants == 2
    assert [s.headers["Authorization"][-1] for s in azure_env.seen] == ["1", "1", "2"]


def test_an_entra_token_refused_after_one_renewal_is_a_clear_401(
    azure_env: FakeFoundry, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = foundry_proxy(make_proxy, azure_env, key=False)
    monkeypatch.setattr(azure_env, "tokens", _NeverValid())
    with pytest.raises(anthropic.AuthenticationError) as caught:
        ask(proxy)
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "authentication_error",
        "message": f"{AZURE_TOKEN_REFUSED} (the proxy renewed its Microsoft Entra ID token once;"
        " still refused)",
    }
    assert len(azure_env.seen) == 2 and azure_env.token_grants == 2


class _NeverValid(dict[str, float]):
    def __setitem__(self, key: str, value: float) -> None:
        pass  # issued, then never valid


def test_no_entra_credentials_anywhere_is_a_502_naming_the_chain(
    foundry: FakeFoundry, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_azure_identity(monkeypatch)
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")  # nothing to find
    _refused_before_sending(
        foundry_proxy(make_proxy, foundry, key=False), foundry,
        "the proxy has no usable Microsoft Entra ID credentials for the foundry upstream"
        " (ClientAuthenticationError; azure-identity's DefaultAzureCredential chain)",
    )  # fmt: skip


def test_the_token_is_asked_for_off_the_event_loop(
    azure_env: FakeFoundry, loop_thread: LoopThread
) -> None:
    """azure-identity's calls block (HTTP to the identity endpoint): they run in a thread, so the
    loop goes on serving while a token is fetched."""
    import threading

    calls: list[bool] = []

    async def fetch() -> str:
        token = AzureToken("https://cognitiveservices.azure.com/.default")
        original = token._fetch

        def spy(fresh: bool) -> Any:
            calls.append(threading.current_thread() is threading.main_thread() or _on_loop())
            return original(fresh)

        token._fetch = spy  # type: ignore[method-assign]
        try:
            return await token.token()
        finally:
            await token.close()

    assert loop_thread.run(fetch()).startswith("eyJ0eXAiOiJKV1QifQ.fake-entra-")
    assert calls == [False]


def _on_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True




def test_a_resource_names_its_public_endpoint(foundry_key: str, make_proxy: ProxyFactory) -> None:
    from proxy.server.appkeys import PLATFORMS
    from proxy.server.upstream.platforms import FoundryUpstream

    proxy = make_proxy(upstream={"format": "foundry", "resource": "my-res", "api_key_env": KEY_VARIABLE})
    target = proxy.app[PLATFORMS]
    made = target.get(proxy.config.upstream)
    assert isinstance(made, FoundryUpstream)
    assert made.endpoint == "https://my-res.services.ai.azure.com/anthropic"
    assert target.get(proxy.config.upstream) is made  # one per target


# --- the rest of the proxy on a Foundry upstream ---------------------------------------------------


def test_a_foundry_tenants_calls_are_in_the_ledger_and_count_against_its_budget(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory, tmp_path: Path,
    loop_thread: LoopThread,
) -> None:
    """As for the other platforms: one ledger row per call, priced by the catalogue (the model's
    Anthropic id, not Foundry's deployment name), the spend counted against the tenant's budget."""
    from proxy.server.appkeys import STORE
    from proxy.server.ledger import LEDGER
    from proxy.store.usage import UsageQuery
    from tests.test_quota_edge import ACME_KEY, Clock, limited, quota_json, used

    proxy = limited(
        make_proxy, tmp_path, {"budget_usd": 3, "budget_period": "day"}, Clock("2026-12-04T10:21:15"),
        upstream={"format": "foundry", "endpoint_url": foundry.endpoint, "api_key_env": KEY_VARIABLE},
    )  # fmt: skip
    usage = {"input_tokens": 1000, "output_tokens": 100, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 2000}  # fmt: skip
    foundry.responder = lambda path, body: {**message_json("priced", model=body["model"]), "usage": usage}
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key=ACME_KEY, max_retries=0)
    raw = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=10, messages=HI)
    assert raw.headers["x-context-proxy-budget-remaining-usd"] == "3.000000"
    spent = 1000 * 3e-6 + 100 * 15e-6 + 2000 * 0.3e-6  # Sonnet 4.5: $3 in, $15 out, $0.30 reads
    assert used(quota_json(proxy, loop_thread), "spend_usd") == pytest.approx(spent, abs=1e-9)
    loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    rows = loop_thread.run(proxy.app[STORE].usage_rows("acme", UsageQuery()))
    assert [(r.entry.kind, r.entry.status, r.entry.model) for r in rows] == [("client", 200, MODEL)]
    assert foundry.seen[0].body["model"] == DEPLOYMENT


def test_the_summary_call_goes_to_the_tenants_foundry_deployment(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory, transcript: dict[str, Any]
) -> None:
    from tests.test_upstream_bedrock import summarised_through

    summary_model = "claude-haiku-4-5"
    proxy = foundry_proxy(
        make_proxy, foundry,
        sections={"compaction": {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": summary_model}}},
    )  # fmt: skip
    foundry.responder = lambda path, body: message_json(
        "SUMMARY: goal was X" if body["model"] == summary_model else "ok"
    )
    summarised_through(proxy, transcript)
    first, last = foundry.seen[0], foundry.seen[-1]
    assert first.body["model"] == summary_model  # the catalogue's Foundry name for it
    assert first.headers["x-api-key"] == FOUNDRY_KEY
    assert first.headers["anthropic-version"] == "2023-06-01"  # the summary call's own
    assert last.body["model"] == DEPLOYMENT
    assert "SUMMARY: goal was X" in json.dumps(last.body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_retrieval_round_runs_against_foundry_as_one_answer(
    foundry: FakeFoundry, foundry_key: str, make_proxy: ProxyFactory, stream: bool
) -> None:
    from tests.test_retrieval import CUT, one_round_through, platform_rounds

    proxy = foundry_proxy(make_proxy, foundry, sections={"compaction": CUT})
    rounds = platform_rounds()
    foundry.responder = lambda path, body: rounds.pop(0)
    one_round_through(proxy, stream, lambda: [s.body for s in foundry.seen])
    assert all(s.body.get("stream", False) is stream for s in foundry.seen)
