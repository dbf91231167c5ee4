"""A Bedrock Runtime upstream, end to end: the official SDK -> the proxy -> FakeBedrock.

The fake recomputes every SigV4 signature with botocore from the bytes it received, answers
streams in real event-stream frames, and enforces Bedrock's rules on betas and their body fields
(tests/platform_fakes.py).
"""

from __future__ import annotations

import gzip
import json
import stat
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conftest import ProxyFactory
from tests.harness import ProxyServer
from tests.platform_fakes import TEST_ACCESS_KEY, TEST_SECRET_KEY, Broken, FakeBedrock
from tests.upstream import message_json

MODEL = "claude-sonnet-4-5-20250929"
CLIENT_KEY = "sk-ant-client-key-never-sent-to-aws"


def bedrock_proxy(make_proxy: ProxyFactory, fake: FakeBedrock, **upstream: Any) -> ProxyServer:
    section = {"format": "bedrock", "region": "us-east-1", "endpoint_url": fake.url, **upstream}
    return make_proxy(upstream=section)


def client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0)


def test_a_message_goes_to_bedrock_signed_and_comes_back_as_the_sdk_expects(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    message = client(proxy).messages.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.content[0].text == "Hello from fake Bedrock."  # type: ignore[union-attr]
    [seen] = bedrock.seen
    # profile_geo "auto": the geography Claude Code uses for us-east-1 in front of the base id
    assert seen.path == "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    assert seen.body["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in seen.body and "stream" not in seen.body
    assert seen.body["messages"] == [{"role": "user", "content": "Hi"}]
    assert seen.headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={TEST_ACCESS_KEY}/")
    # the client's own key is never sent to AWS
    assert CLIENT_KEY not in json.dumps(seen.headers)


def test_the_inference_profile_geography_prefixes_the_model_id(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock, profile_geo="eu")
    client(proxy).messages.create(
        model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    )
    assert bedrock.seen[0].path == "/model/eu.anthropic.claude-haiku-4-5-20251001-v1%3A0/invoke"


def test_a_config_model_id_entry_comes_before_the_built_in_table(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url},
        model_ids=[{"anthropic": MODEL, "bedrock": "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc"}],
    )
    client(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert bedrock.seen[0].path == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fabc/invoke"
    )


def test_a_stream_arrives_as_anthropic_sse(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    bedrock.script.append(message_json("Streamed from fake Bedrock.", input_tokens=12, output_tokens=5))
    with client(proxy).messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streamed from fake Bedrock."
    assert final.usage.input_tokens == 12 and final.usage.output_tokens == 5
    assert bedrock.seen[0].path.endswith("/invoke-with-response-stream")
    assert bedrock.seen[0].headers["Accept"] == "application/vnd.amazon.eventstream"


def test_unsupported_betas_are_dropped_with_their_fields_and_reported(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    betas = (
        "claude-code-20250219,context-management-2025-06-27,prompt-caching-scope-2026-01-05,"
        "compact-2026-09-04,thinking-binding-controls-2026-08-01"
    )
    response = client(proxy).messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100,
        messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"anthropic-beta": betas},
        extra_body={
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "compaction": {"type": "summarize"},
            "thinking": {"type": "enabled", "budget_tokens": 1024, "block_binding": {"mismatch_behavior": "drop_block"}},
        },
    )
    assert response.status_code == 200
    body = bedrock.seen[0].body
    assert body["anthropic_beta"] == ["context-management-2025-06-27", "thinking-binding-controls-2026-08-01"]
    assert "compaction" not in body  # its beta was dropped: the field goes with it
    assert body["context_management"] == {"edits": [{"type": "clear_tool_uses_20250919"}]}
    assert body["thinking"]["block_binding"] == {"mismatch_behavior": "drop_block"}  # beta kept
    assert response.headers["x-upstream-betas-dropped"] == (
        "claude-code-20250219,prompt-caching-scope-2026-01-05,compact-2026-09-04"
    )
    assert response.headers["x-upstream-fields-dropped"] == "compaction"


def test_a_beta_the_table_lets_through_meets_bedrocks_own_400_with_its_wording(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    # accepted_betas replaces the built-in list: this one lets claude-code-20250219 through
    proxy = bedrock_proxy(
        make_proxy, bedrock, accepted_betas=["claude-code-20250219", "context-1m-2025-08-07"]
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
            extra_headers={"anthropic-beta": "claude-code-20250219"},
        )
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "invalid beta flag"},
        "request_id": "bedrock-req-refused",
    }


def test_a_field_kept_without_its_beta_is_bedrocks_400(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    # beta_fields replaces a pairing: compaction is no longer known to go with its beta
    proxy = bedrock_proxy(
        make_proxy, bedrock, beta_fields=[{"beta": "compact-2026-09-04", "fields": []}]
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
            extra_headers={"anthropic-beta": "compact-2026-09-04"},
            extra_body={"compaction": {"type": "summarize"}},
        )
    assert caught.value.body["error"]["message"] == "compaction: Extra inputs are not permitted"  # type: ignore[index]


def test_count_tokens_uses_bedrocks_count_tokens(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock, profile_geo="us")
    counted = client(proxy).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}]
    )
    assert counted.input_tokens == 43
    # a foundation model id: count-tokens takes no inference profile
    assert bedrock.seen[0].path == "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/count-tokens"


def test_a_wrong_secret_is_bedrocks_signature_error_with_its_wording(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    proxy = bedrock_proxy(make_proxy, bedrock)
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        client(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["error"]["message"].startswith(  # type: ignore[index]
        "The request signature we calculated does not match the signature you provided."
    )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("how", "kind", "wording"),
    [
        ("crc", "api_error", "upstream sent a corrupt event-stream frame (message CRC mismatch)"),
        ("garbage", "api_error", "upstream sent a corrupt event-stream frame"),
        ("cut", "api_error", "upstream event stream cut off (stream ended inside a frame"),
        ("exception", "rate_limit_error", "Too many requests, please wait before trying again."),
    ],
)
def test_a_broken_event_stream_ends_in_an_anthropic_error_event_never_a_hang(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, how: str, kind: str, wording: str
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    bedrock.script.append(Broken(how, good=2))
    body = {"model": MODEL, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    request = urllib.request.Request(
        f"{proxy.url}/v1/messages", data=json.dumps(body).encode(), method="POST",
        headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01",
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    events = [e for e in text.split("\n\n") if e]
    assert [e.split("\n")[0] for e in events] == [
        "event: message_start", "event: content_block_start", "event: error"
    ]
    error = json.loads(events[-1].split("data: ", 1)[1])
    assert error["error"]["type"] == kind
    assert error["error"]["message"].startswith(wording)
    # and the SDK raises it instead of waiting
    bedrock.script.append(Broken(how, good=2))
    with pytest.raises(anthropic.APIStatusError), client(proxy).messages.stream(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        stream.get_final_message()


def _credential_process(tmp_path: Path, keys: list[str]) -> Path:
    """An AWS profile whose ``credential_process`` hands out ``keys`` in turn (one per run)."""
    script = tmp_path / "creds.py"
    counter = tmp_path / "count"
    counter.write_text("0")
    script.write_text(
        "import json, pathlib\n"
        f"counter = pathlib.Path({str(counter)!r})\n"
        "n = int(counter.read_text())\n"
        "counter.write_text(str(n + 1))\n"
        f"keys = {keys!r}\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': keys[min(n, len(keys) - 1)],"
        f" 'SecretAccessKey': {TEST_SECRET_KEY!r}}}))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "aws-config").write_text(
        f"[profile ctxproxy]\ncredential_process = {sys.executable} {script}\n"
    )
    return counter


def test_an_expired_credential_is_renewed_once_and_the_call_made_again(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    bedrock.secrets["ASIAOLDKEY0000000001"] = TEST_SECRET_KEY
    bedrock.expired.add("ASIAOLDKEY0000000001")
    counter = _credential_process(aws_env, ["ASIAOLDKEY0000000001", TEST_ACCESS_KEY])
    proxy = bedrock_proxy(make_proxy, bedrock, aws_profile="ctxproxy")
    message = client(proxy).messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.content[0].text == "Hello from fake Bedrock."  # type: ignore[union-attr]
    assert counter.read_text() == "2"  # the chain ran twice
    assert [s.headers["Authorization"].split("/")[0][-20:] for s in bedrock.seen] == [
        "ASIAOLDKEY0000000001", TEST_ACCESS_KEY
    ]


def test_a_credential_still_expired_after_one_renewal_is_a_clear_error(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    bedrock.secrets["ASIAOLDKEY0000000001"] = TEST_SECRET_KEY
    bedrock.expired.add("ASIAOLDKEY0000000001")
    _credential_process(aws_env, ["ASIAOLDKEY0000000001"])
    proxy = bedrock_proxy(make_proxy, bedrock, aws_profile="ctxproxy")
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        client(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["error"]["message"] == (  # type: ignore[index]
        "The security token included in the request is expired"
        " (the proxy renewed its AWS credentials once; still refused)"
    )
    assert len(bedrock.seen) == 2  # once, then once more: no loop


def test_no_aws_credentials_at_all_is_a_502_naming_the_chain(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    proxy = bedrock_proxy(make_proxy, bedrock)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(proxy).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.status_code == 502
    assert "no AWS credentials" in caught.value.message
    assert bedrock.seen == []


def test_models_come_from_the_table_and_other_routes_are_a_clear_404(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    sdk = client(proxy)
    listed = list(sdk.models.list())
    ids = [model.id for model in listed]
    assert MODEL in ids and "claude-opus-4-6" in ids and "claude-opus-4-8" in ids
    assert "claude-demo-1" not in ids and "claude-mythos-5" not in ids  # no Bedrock id known
    assert {m.id: m.display_name for m in listed}["claude-opus-4-8"] == "Claude Opus 4.8"
    assert sdk.models.retrieve("claude-haiku-4-5").id == "claude-haiku-4-5-20251001"
    with pytest.raises(anthropic.NotFoundError) as caught:
        sdk.messages.batches.list()
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "bedrock upstream" in caught.value.message
    assert bedrock.seen == []


def test_an_anthropic_tenant_and_a_bedrock_tenant_each_reach_their_own_upstream(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, tmp_path: Path, upstream: Any
) -> None:
    import hashlib

    policies = tmp_path / "policies"
    policies.mkdir()
    keys = {"direct": "cp-direct-key-0000000000000001", "cloud": "cp-cloud-key-00000000000000001"}
    for name, key in keys.items():
        digest = hashlib.sha256(key.encode()).hexdigest()
        text = f"name: {name}\napi_keys_sha256: [{digest}]\nprovider: {{mode: passthrough}}\n"
        if name == "cloud":
            text += f"upstream: {{format: bedrock, region: us-east-1, endpoint_url: '{bedrock.url}'}}\n"
        (policies / f"{name}.yaml").write_text(text)
    proxy = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))
    for name, key in keys.items():
        sdk = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
        sdk.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": name}])
    assert [s.body["messages"][0]["content"] for s in bedrock.seen] == ["cloud"]
    assert [r.json()["messages"][0]["content"] for r in upstream.requests] == ["direct"]


def test_the_summary_call_goes_to_the_tenants_bedrock_upstream(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, transcript: dict[str, Any]
) -> None:
    summary_model = "claude-summary-test"
    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url},
        compaction={"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": summary_model}},
    )
    bedrock.responder = lambda path, body: message_json(
        "SUMMARY: goal was X" if summary_model in path else "ok"
    )
    summarised_through(proxy, transcript)
    paths = [s.path for s in bedrock.seen]
    # signed, to Bedrock; a model the catalogue does not know gets the published rule's id
    assert paths[0] == "/model/us.anthropic.claude-summary-test/invoke"
    assert paths[-1] == "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    forwarded = json.dumps(bedrock.seen[-1].body)
    assert "SUMMARY: goal was X" in forwarded


def summarised_through(proxy: ProxyServer, transcript: dict[str, Any]) -> None:
    """A long Claude Code conversation sent once: compacted with a summary made by the platform."""
    k = next(
        k for k in range(90, len(transcript["messages"]) + 1)
        if transcript["messages"][k - 1]["role"] == "user"
    )
    response = client(proxy).messages.with_raw_response.create(
        model=MODEL, max_tokens=100, messages=transcript["messages"][:k], tools=transcript["tools"]
    )
    assert response.headers["x-compaction-summary"] == "ok"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_retrieval_round_runs_against_bedrock_as_one_answer(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, stream: bool
) -> None:
    from tests.test_retrieval import CUT, one_round_through, platform_rounds

    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url},
        compaction=CUT,
    )
    bedrock.script += platform_rounds()
    one_round_through(proxy, stream, lambda: [s.body for s in bedrock.seen])
    assert all(s.path.endswith("/invoke-with-response-stream" if stream else "/invoke") for s in bedrock.seen)


def _post_gzipped(proxy: ProxyServer, text: str) -> int:
    """A one-message request sent gzipped (as a client may), outside the SDK; its status."""
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        f"{proxy.url}/v1/messages", data=gzip.compress(json.dumps(body).encode()), method="POST",
        headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01",
                 "content-type": "application/json", "content-encoding": "gzip"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status  # type: ignore[no-any-return]


def test_a_gzipped_request_body_reaches_bedrock_as_json(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    assert _post_gzipped(proxy, "zipped") == 200
    assert bedrock.seen[0].body["messages"] == [{"role": "user", "content": "zipped"}]
    assert "Content-Encoding" not in bedrock.seen[0].headers


def test_an_unreadable_count_tokens_answer_is_a_502(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    bedrock.count_tokens_reply = b'{"tokens": "many"}'
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(proxy).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 502
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "api_error", "message": "the upstream's count-tokens answer was unreadable"
    }


def test_a_request_without_a_model_or_for_an_unknown_model_entry(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(
            max_tokens=10, messages=[{"role": "user", "content": "Hi"}], model=""
        )
    assert caught.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error", "message": "model: Field required"
    }
    with pytest.raises(anthropic.NotFoundError) as missing:
        client(proxy).models.retrieve("claude-none-1")
    assert missing.value.body["error"]["message"] == (  # type: ignore[index]
        "model: claude-none-1 is not in the proxy's model catalogue"
    )
    assert bedrock.seen == []


def test_the_threshold_compaction_beta_is_carried_to_bedrock_with_its_edit(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    """LiteLLM dropped it (BerriAI/litellm#27532): Bedrock documents compaction, so it goes."""
    proxy = bedrock_proxy(make_proxy, bedrock)
    edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}]}
    response = client(proxy).messages.with_raw_response.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"anthropic-beta": "context-management-2025-06-27,compact-2026-01-12"},
        extra_body={"context_management": edits},
    )
    assert response.status_code == 200
    body = bedrock.seen[0].body
    assert body["anthropic_beta"] == ["context-management-2025-06-27", "compact-2026-01-12"]
    assert body["context_management"] == edits
    assert "x-upstream-betas-dropped" not in response.headers


# -- the request path hands the platform what it already has (issue 27 review) -----------------


def test_the_platform_encodes_the_parsed_body_and_never_parses_the_forwarded_bytes(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain parsed the body (and may have changed it): the platform encodes that value for
    Bedrock; it never parses the bytes it is handed again (nor inflates a gzipped body)."""
    from proxy.server.upstream import platforms

    parsed: list[bytes] = []
    original = platforms._json_of

    def counting(raw: bytes, encoding: str | None) -> Any:
        parsed.append(raw)
        return original(raw, encoding)

    monkeypatch.setattr(platforms, "_json_of", counting)
    proxy = bedrock_proxy(make_proxy, bedrock)
    client(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "plain"}])
    assert _post_gzipped(proxy, "zipped") == 200
    assert [s.body["messages"][0]["content"] for s in bedrock.seen] == ["plain", "zipped"]
    assert parsed == []


def test_the_tenants_platform_is_looked_up_once_per_request(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.server.appkeys import PLATFORMS

    proxy = bedrock_proxy(make_proxy, bedrock)
    table = proxy.app[PLATFORMS]
    looked_up: list[Any] = []
    original = table.get

    def counting(target: Any) -> Any:
        looked_up.append(target)
        return original(target)

    monkeypatch.setattr(table, "get", counting)
    client(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert len(looked_up) == 1 and len(bedrock.seen) == 1


def test_a_body_the_platform_refuses_before_sending_is_no_upstream_call_in_the_ledger(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory, loop_thread: Any
) -> None:
    """Bedrock needs a model: without one, the platform refuses the request before sending it
    (a 400 of the proxy's own). Nothing reached the provider, so the ledger has no row for it
    (the next, sent request has its row)."""
    from proxy.server.appkeys import STORE
    from proxy.server.ledger import LEDGER
    from proxy.store.usage import UsageQuery

    proxy = bedrock_proxy(make_proxy, bedrock)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(max_tokens=10, messages=[{"role": "user", "content": "Hi"}], model="")
    assert caught.value.body["error"]["message"] == "model: Field required"  # type: ignore[index]
    client(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    loop_thread.run(proxy.app[LEDGER].flush(), timeout=10)
    rows = loop_thread.run(proxy.app[STORE].usage_rows("default", UsageQuery()))
    assert [(r.entry.kind, r.entry.status, r.entry.model) for r in rows] == [("client", 200, MODEL)]
    assert len(bedrock.seen) == 1


ARN = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"
ARN_PATH = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fabc123/invoke"


@pytest.mark.parametrize("key", ["models", "model_ids"])
def test_an_application_profile_arn_reaches_bedrock_as_given_with_profile_geo_set(
    key: str, aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    """profile_geo goes in front of bare ids only: never ``us.arn:aws:bedrock:...`` (both the
    models: key and the older model_ids: key)."""
    entry = {"match": MODEL, "bedrock": ARN} if key == "models" else {"anthropic": MODEL, "bedrock": ARN}
    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url, "profile_geo": "us"},
        **{key: [entry]},
    )
    client(proxy).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    client(proxy).messages.create(model=ARN, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert [s.path for s in bedrock.seen] == [ARN_PATH, ARN_PATH]


def test_an_id_that_carries_a_geography_is_sent_as_given(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    proxy = bedrock_proxy(make_proxy, bedrock, profile_geo="us")
    for model in ("eu.anthropic.claude-haiku-4-5-20251001-v1:0", "anthropic.claude-haiku-4-5-20251001-v1:0"):
        client(proxy).messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert [s.path for s in bedrock.seen] == [
        "/model/eu.anthropic.claude-haiku-4-5-20251001-v1%3A0/invoke",  # as given
        "/model/us.anthropic.claude-haiku-4-5-20251001-v1%3A0/invoke",  # a bare id: profile_geo
    ]


def test_a_model_the_catalogue_does_not_know_goes_by_the_rule_and_a_refusal_names_the_entry(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    bedrock.models = frozenset({"anthropic.claude-opus-4-8", "anthropic.claude-opus-9-v2:0"})
    proxy = bedrock_proxy(make_proxy, bedrock)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(model="claude-opus-9", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert bedrock.seen[-1].path == "/model/us.anthropic.claude-opus-9/invoke"  # no invented -v1:0
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith(
        "The provided model identifier is invalid. (the proxy's model catalogue does not know"
        " 'claude-opus-9'; it sent 'us.anthropic.claude-opus-9' by the published id rule."
    )
    assert "add a models: entry {match: claude-opus-9, bedrock: <its id>}" in message
    # a known model refused for another reason keeps Bedrock's words alone
    client(proxy).messages.create(model="claude-opus-4-8", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    # the entry the note names makes it work
    proxy = make_proxy(
        upstream={"format": "bedrock", "region": "us-east-1", "endpoint_url": bedrock.url},
        models=[{"match": "claude-opus-9", "bedrock": "anthropic.claude-opus-9-v2:0"}],
    )
    client(proxy).messages.create(model="claude-opus-9", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert bedrock.seen[-1].path == "/model/us.anthropic.claude-opus-9-v2%3A0/invoke"


def test_bedrock_refuses_a_bare_id_of_a_model_served_by_profiles_with_its_own_words(
    aws_env: Path, bedrock: FakeBedrock, make_proxy: ProxyFactory
) -> None:
    """profile_geo "" sends the base id, which Bedrock runs on-demand for no newer model."""
    bedrock.models = frozenset({"anthropic.claude-opus-4-8"})
    proxy = bedrock_proxy(make_proxy, bedrock, profile_geo="")
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(proxy).messages.create(model="claude-opus-4-8", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert "with on-demand throughput isn't supported" in caught.value.body["error"]["message"]  # type: ignore[index]
    assert "catalogue" not in caught.value.body["error"]["message"]  # type: ignore[index]
