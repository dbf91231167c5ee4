"""Claude Code's gateway contract, row by row: one test (or one parametrised family) per row.

The contract is Claude Code's "Gateway protocol reference"
(code.claude.com/docs/en/llm-gateway-protocol; found with the ``search`` tool as
code.claude.com/docs/en/llm-gateway-protocol.md: "The API contract between Claude Code and an LLM
gateway: endpoints, headers and body fields to forward, feature degradation when fields are
stripped, attribution headers for cost tracking, and model discovery", where "Forward unchanged"
means "pass it upstream byte for byte"), as the project's protocol brief summarises it
(anthropic-protocol.md, section 11.1). Its companion page "Roll out an LLM gateway"
(code.claude.com/docs/en/llm-gateway-rollout, "Gateway requirements") asks the same of every
gateway: stream responses ("pass server-sent events through as they arrive instead of buffering
the whole response") and forward headers and body unchanged ("pass anthropic-beta,
anthropic-version, and the request body through in both directions").

Rows:

1. ``anthropic-*`` headers and body fields are open lists: unknown ones reach the upstream as sent,
   when the proxy changes nothing (the exact bytes) and when it injects durable context or compacts
   (re-serialised, every field kept); a beta and its body field are never separated.
2. Streams are never buffered: the client has an event before the upstream sends the next one.
3. Upstream error bodies are forwarded unmodified (Claude Code's retry matches on their wording).
4. ``HEAD /`` (Claude Code's start-up probe) is answered without contacting the upstream.
5. ``GET /v1/models?limit=1000`` (opt-in model discovery: no redirect, exactly one credential).
6. ``anthropic-workspace-id`` is forwarded (needed when the upstream is Claude Platform on AWS),
   also on the summary call the proxy makes for a compaction.
7. The system prompt's attribution block (``x-anthropic-billing-header: cc_version=...``) is
   forwarded byte-identical; the proxy's durable block goes last; compaction never touches system.

The last test runs Claude Code itself through the proxy and checks rows 1, 4, 6 and 7 on its own
traffic.

Not supported: a base URL with a path for clients. Claude Code 2.1.197 with
``ANTHROPIC_BASE_URL=http://proxy/gw`` sends ``HEAD /gw`` and ``POST /gw/v1/messages?beta=true``
(checked against this proxy); the proxy serves the API at its root only, so both are 404 and the
session fails (:func:`test_a_client_base_url_path_is_not_served`). A path prefix on the *upstream*
base URL is honoured (tests/test_forwarding.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from proxy.core.durable import Create, Fact
from proxy.server.appkeys import STORE, TENANCY
from proxy.sources.artifact_files import write_artifact
from tests.harness import LoopThread, ProxyServer
from tests.test_claude_code import (
    FINAL_TEXT,
    FIXTURES,
    PROMPT,
    RUN_TIMEOUT,
    Tap,
    TappedRequest,
    _clean_env,
    _describe,
    find_claude,
    make_model,
)
from tests.upstream import (
    RATE_LIMIT_HEADERS,
    FakeUpstream,
    RecordedRequest,
    Reply,
    Stream,
    frame,
    message_json,
    text_stream_events,
)

KEY = "sk-ant-contract-test-0123456789abcdef"
WORKSPACE = "wrkspc_01ContractTestWorkspace"
SUMMARY_MODEL = "claude-summary-contract"
T0 = "2026-12-01T10:00:00+00:00"
DURABLE_FACT = "persistence uses PostgreSQL 15"
MARK = "x_client_mark"  # a block field no SDK knows: every client block carries its own value

# Betas as Claude Code 2.1.197 sends them, plus ones no proxy can know.
BETAS = (
    "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14,"
    "context-management-2025-06-27,made-up-beta-2099-01-01"
)
SECOND_BETA_LINE = "another-made-up-beta-2099-02-02"

# Claude Code 2.1.197's system list (captured from its first request): the attribution block, then
# two blocks with cache_control.
ATTRIBUTION = "x-anthropic-billing-header: cc_version=2.1.197.5b8; cc_entrypoint=sdk-cli;"
CC_SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": ATTRIBUTION},
    {
        "type": "text",
        "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
        "cache_control": {"type": "ephemeral"},
    },
    {
        "type": "text",
        "text": (
            "\nYou are an interactive agent that helps users with software engineering tasks.\n\n"
            "# Harness\n - Tools run behind a user-selected permission mode; a denied call means the"
            " user declined it \u2014 adjust, don't retry verbatim.\n - `<system-reminder>` tags in"
            " messages and tool results are injected by the harness, not the user.\n"
        ),
        "cache_control": {"type": "ephemeral"},
    },
]
READ_TOOL = {
    "name": "Read",
    "description": "Reads a file from the local filesystem.",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
    "x_tool_note": "a tool field no SDK knows",
}

# Compaction settings: "truncate" cuts one large tool result and is done; "summarize" also
# replaces the old turns by a summary (a summary call to the upstream first).
TRUNCATE = {
    "threshold": 30_000,
    "hard_limit": 200_000,
    "keep_recent": 2,
    "tool_result_cap": 1_000,
    "summary": {"model": SUMMARY_MODEL},
}
SUMMARIZE = {**TRUNCATE, "threshold": 4_000}


# --- helpers ---------------------------------------------------------------------------------


def _conversation(turns: int = 10, big_at: int = 3) -> list[dict[str, Any]]:
    """A Read-tool conversation (about 34k tokens, one tool result about 10k) whose every block
    carries :data:`MARK`, its value naming the block."""
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Port the parser to the new API.", MARK: "m0"}],
        }
    ]
    for i in range(turns):
        tool_id = f"toolu_{i:024d}"
        size = 40_000 if i == big_at else 3_000
        text = "".join(
            f"{k}\tdef f_{i}_{k}(x): return x * {k}  # part {i}\n" for k in range(size // 40)
        )
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading part {i}.", MARK: f"a{i}-text"},
                    {
                        "type": "tool_use",
                        "id": tool_id,
                        "name": "Read",
                        "input": {"file_path": f"/src/p{i}.py"},
                        MARK: f"a{i}-tool",
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_id,
                        "content": text,
                        MARK: f"u{i}-result",
                    },
                ],
            }
        )
    messages[-1]["content"].append({"type": "text", "text": "Go on.", MARK: "last"})
    return messages


def _body(messages: list[dict[str, Any]] | None = None, *, stream: bool = False) -> dict[str, Any]:
    """A request shaped like Claude Code's, with top-level fields no SDK knows; the made-up beta's
    own field (``made_up_beta_field``) travels with its ``anthropic-beta`` value."""
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": '{"device_id":"d-1","session_id":"s-1"}'},
        "system": CC_SYSTEM,
        "tools": [READ_TOOL],
        "messages": messages
        if messages is not None
        else [{"role": "user", "content": [{"type": "text", "text": "Say hello.", MARK: "hello"}]}],
        "made_up_top_level": {"nested": [1, "two", None, 3.5], "flag": True},
        "made_up_beta_field": {"mode": "strict"},
        "stream": stream,
    }


def _headers(**extra: str) -> dict[str, str]:
    """Claude Code's request headers, with an ``anthropic-*`` header no proxy can know."""
    return {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": BETAS,
        "anthropic-dangerous-direct-browser-access": "true",
        "anthropic-foo": "bar; baz=1",
        "content-type": "application/json",
        "x-app": "cli",
        "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
        **extra,
    }


def _anthropic_headers(headers: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Every ``anthropic-*`` header of ``headers`` (name, value pairs), each name with all its
    values in order."""
    out: dict[str, list[str]] = {}
    for name, value in headers:
        if name.lower().startswith("anthropic-"):
            out.setdefault(name.lower(), []).append(value)
    return out


def _credentials(request: RecordedRequest) -> list[tuple[str, str]]:
    return [
        (k.lower(), v)
        for k, v in request.headers.items()
        if k.lower() in ("x-api-key", "authorization")
    ]


def _main(upstream: FakeUpstream) -> RecordedRequest:
    """The last forwarded client request (not a summary call)."""
    return [
        r
        for r in upstream.requests
        if r.path.startswith("/v1/messages") and r.json().get("model") != SUMMARY_MODEL
    ][-1]


def _summary_calls(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [
        r
        for r in upstream.requests
        if r.path == "/v1/messages" and r.json().get("model") == SUMMARY_MODEL
    ]


def _model(request: RecordedRequest) -> Reply | Stream:
    """The fake provider: a summary for the summary model, the default answer otherwise."""
    body = request.json()
    if body.get("model") == SUMMARY_MODEL:
        return Reply(message_json("SUMMARY: porting the parser; parts 0-8 read."))
    return Stream() if body.get("stream") else Reply(message_json("ok"))


def _seed(loop_thread: LoopThread, proxy: ProxyServer, session: str) -> None:
    """Durable state for ``session``: the proxy then injects its block into ``system``."""
    default = proxy.app[TENANCY].current.default
    assert default is not None and default.sources.artifact_root is not None
    pointer = write_artifact(
        default.sources.artifact_root, session, "decision.md", b"Use PostgreSQL 15.\n"
    )
    loop_thread.run(
        proxy.app[STORE].write_changes(
            "default", session, [Create(Fact("f-db", DURABLE_FACT, pointer, T0))]
        )
    )


def _post(
    proxy: ProxyServer,
    body: bytes,
    headers: dict[str, str] | list[tuple[str, str]],
    path: str = "/v1/messages?beta=true",
) -> httpx.Response:
    return httpx.post(proxy.url + path, content=body, headers=headers, timeout=30)


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# --- row 1: anthropic-* headers and body fields are open lists --------------------------------


@pytest.mark.parametrize("path", ["/v1/messages?beta=true", "/v1/messages/count_tokens?beta=true"])
def test_unknown_headers_and_fields_reach_the_upstream_as_sent(
    upstream: FakeUpstream, proxy: ProxyServer, path: str
) -> None:
    body = _body()
    if "count_tokens" in path:
        body = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
    raw = json.dumps(body, indent=1).encode()  # an odd layout: re-serialising would show
    headers = [*_headers().items(), ("anthropic-beta", SECOND_BETA_LINE)]
    r = _post(proxy, raw, headers, path)
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1]
    assert sent.raw_path == path
    assert sent.body == raw
    assert _anthropic_headers(sent.headers.items()) == _anthropic_headers(headers)
    assert sent.headers.getall("anthropic-beta") == [BETAS, SECOND_BETA_LINE]


def test_unknown_fields_survive_the_durable_block(
    upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread
) -> None:
    _seed(loop_thread, proxy, "sess-open-1")
    body = _body()
    r = _post(proxy, orjson.dumps(body), _headers(**{"x-session-id": "sess-open-1"}))
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1]
    forwarded = sent.json()
    durable = forwarded["system"][-1]
    assert DURABLE_FACT in durable["text"]
    assert forwarded == {**body, "system": [*CC_SYSTEM, durable]}  # every other field as sent
    assert _anthropic_headers(sent.headers.items()) == _anthropic_headers(_headers().items())


@pytest.mark.parametrize(("settings", "layer"), [(TRUNCATE, "truncate"), (SUMMARIZE, "summarize")])
def test_unknown_fields_survive_compaction(
    upstream: FakeUpstream, make_proxy: Any, settings: dict[str, Any], layer: str
) -> None:
    proxy = make_proxy(compaction=settings)
    upstream.script(*[_model] * 4)
    body = _body(_conversation())
    originals = {b[MARK]: b for m in body["messages"] for b in m["content"]}
    r = _post(proxy, orjson.dumps(body), _headers(**{"x-session-id": f"sess-open-{layer}"}))
    assert r.status_code == 200, r.text
    assert layer in r.headers["x-compaction-layers"].split(",")
    sent = _main(upstream)
    forwarded = sent.json()
    assert len(orjson.dumps(forwarded["messages"])) < len(orjson.dumps(body["messages"]))

    # Top level: every field as sent (tools may end with the proxy's retrieval tool).
    assert {k: v for k, v in forwarded.items() if k not in ("messages", "tools")} == {
        k: v for k, v in body.items() if k not in ("messages", "tools")
    }
    assert forwarded["tools"][: len(body["tools"])] == body["tools"]
    # Blocks: each client block still in the view keeps every field; a cut one's content differs.
    kept = [
        b for m in forwarded["messages"] for b in m["content"] if isinstance(b, dict) and MARK in b
    ]
    changed = []
    for block in kept:
        original = originals[block[MARK]]
        assert set(block) == set(original), block[MARK]
        assert {k: v for k, v in block.items() if k not in ("text", "content")} == {
            k: v for k, v in original.items() if k not in ("text", "content")
        }
        if block != original:
            changed.append(block[MARK])
    assert forwarded["messages"][-2:] == body["messages"][-2:]
    if layer == "truncate":
        assert "u3-result" in changed  # the cut block kept its unknown field
        assert len(kept) == len(originals)
    # The beta and its field, together; the headers as sent.
    assert forwarded["made_up_beta_field"] == {"mode": "strict"}
    assert forwarded["context_management"] == body["context_management"]
    assert _anthropic_headers(sent.headers.items()) == _anthropic_headers(_headers().items())


# --- row 2: streams are never buffered --------------------------------------------------------


def _stream_case(
    case: str, make_proxy: Any, loop_thread: LoopThread
) -> tuple[ProxyServer, dict[str, Any], dict[str, str]]:
    if case == "plain":
        return make_proxy(), _body(stream=True), _headers()
    if case == "durable":
        proxy = make_proxy()
        _seed(loop_thread, proxy, "sess-stream")
        return proxy, _body(stream=True), _headers(**{"x-session-id": "sess-stream"})
    proxy = make_proxy(compaction=TRUNCATE)  # with a session: cut results are offered for retrieval
    _seed(loop_thread, proxy, "sess-stream")
    return proxy, _body(_conversation(), stream=True), _headers(**{"x-session-id": "sess-stream"})


@pytest.mark.parametrize("case", ["plain", "durable", "compacted"])
def test_a_stream_reaches_the_client_event_by_event(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread, case: str
) -> None:
    """The upstream sends events up to a gate and waits there: the client must have them all
    before the test opens the gate. (When the proxy offers its retrieval tool, a round's blocks
    from the first ``tool_use`` on are held until the round ends, by design: docs/guides/compaction.md, "Streaming is
    spliced"; text, as here, streams.)"""
    proxy, body, headers = _stream_case(case, make_proxy, loop_thread)
    events = text_stream_events("The parser is ported.", deltas=3)
    gates = {1: asyncio.Event(), 4: asyncio.Event()}  # the upstream stops before events 1 and 4
    upstream.script(Stream(events, hold=gates))
    received = b""
    with httpx.stream(
        "POST",
        proxy.url + "/v1/messages?beta=true",
        content=orjson.dumps(body),
        headers=headers,
        timeout=httpx.Timeout(15),
    ) as r:
        assert r.status_code == 200
        if case == "compacted":
            assert r.headers["x-compaction-layers"] != "none"
        chunks = r.iter_raw()
        for i, gate in sorted(gates.items()):
            expected = b"".join(events[:i])
            while len(received) < len(expected):  # a buffering proxy never gets here: read timeout
                received += next(chunks)
            assert received == expected
            assert upstream.stream_bytes_written == len(expected)  # the upstream is still waiting
            loop_thread.loop.call_soon_threadsafe(gate.set)
        for chunk in chunks:
            received += chunk
    assert received == b"".join(events)
    if case == "compacted":  # relayed by the retrieval splice (the tool was offered)
        assert _main(upstream).json()["tools"][-1]["name"] == "context_proxy_retrieve"


# --- row 3: upstream error bodies are forwarded unmodified -------------------------------------


def _error(kind: str, message: str, request_id: str, **details: str) -> bytes:
    error: dict[str, Any] = {"type": kind, "message": message}
    if details:
        error["details"] = details
    # an odd layout and non-ASCII text: the client must get these bytes, not a re-serialisation
    return json.dumps(
        {"type": "error", "error": error, "request_id": request_id}, indent=2, ensure_ascii=False
    ).encode()


ERRORS = [
    pytest.param(
        400,
        _error(
            "invalid_request_error",
            "messages.3.content.0: Invalid `signature` in `thinking` block. The block is bound to a different conversation.",
            "req_011CThinkingSignature",
        ),
        {"x-should-retry": "false", "request-id": "req_011CThinkingSignature"},
        id="400-thinking-signature",
    ),
    pytest.param(
        429,
        _error(
            "rate_limit_error",
            "This request would exceed your organization\u2019s rate limit of 40,000 input tokens per minute.",
            "req_011CRateLimited",
        ),
        {
            "retry-after": "17",
            "x-should-retry": "true",
            "request-id": "req_011CRateLimited",
            "anthropic-ratelimit-input-tokens-remaining": "0",
        },
        id="429-retry-after",
    ),
    pytest.param(
        500,
        _error("api_error", "Internal server error", "req_011CInternal"),
        {"x-should-retry": "true", "request-id": "req_011CInternal"},
        id="500",
    ),
    pytest.param(
        529,
        _error("overloaded_error", "Overloaded", "req_011COverloaded"),
        {"x-should-retry": "false", "retry-after": "3", "request-id": "req_011COverloaded"},
        id="529-overloaded",
    ),
    pytest.param(
        400,
        _error(
            "invalid_request_error",
            "messages.1.content.0: a compaction block must open its message",
            "req_011CErrorCode",
            error_code="compaction_block_misplaced",
        ),
        {"request-id": "req_011CErrorCode"},
        id="400-error-code",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("shape", ["as-sent", "durable-block", "compacted"])
@pytest.mark.parametrize(("status", "error", "error_headers"), ERRORS)
def test_upstream_errors_reach_the_client_unmodified(
    upstream: FakeUpstream,
    make_proxy: Any,
    loop_thread: LoopThread,
    status: int,
    error: bytes,
    error_headers: dict[str, str],
    shape: str,
    stream: bool,
) -> None:
    """Whatever the proxy did to the request (nothing, its durable block, a compaction that
    offers the retrieval tool), the provider's error reaches the client as the provider sent it."""
    headers = _headers()
    body = _body(stream=stream)
    if shape == "as-sent":
        proxy = make_proxy()
    else:
        proxy = make_proxy(compaction=TRUNCATE) if shape == "compacted" else make_proxy()
        _seed(loop_thread, proxy, "sess-errors")
        headers["x-session-id"] = "sess-errors"
        if shape == "compacted":
            body = _body(_conversation(), stream=stream)
    upstream.script(Reply(error, status=status, headers=error_headers))
    r = _post(proxy, orjson.dumps(body), headers)
    assert r.status_code == status
    assert r.content == error
    for name, value in {
        **RATE_LIMIT_HEADERS,
        "content-type": "application/json",
        **error_headers,
    }.items():
        assert r.headers.get_list(name) == [value], name
    forwarded = upstream.requests[-1].json()
    if shape != "as-sent":
        assert DURABLE_FACT in forwarded["system"][-1]["text"]
    if shape == "compacted":
        assert r.headers["x-compaction-layers"] == "truncate"
        assert forwarded["tools"][-1]["name"] == "context_proxy_retrieve"


def test_a_mid_stream_error_event_reaches_the_client_unmodified(
    upstream: FakeUpstream, proxy: ProxyServer
) -> None:
    events = [
        *text_stream_events("half an answer", deltas=2)[:4],
        frame(
            "error",
            orjson.loads(
                b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CMidStream"}'
            ),
        ),
    ]
    upstream.script(Stream(events))
    r = _post(proxy, orjson.dumps(_body(stream=True)), _headers())
    assert r.status_code == 200
    assert r.content == b"".join(events)


# --- row 4: HEAD / ------------------------------------------------------------------------------

# Claude Code's probe, as it arrives (no credentials).
HEAD_HEADERS = {
    "user-agent": "Bun/1.4.0",
    "accept": "*/*",
    "accept-encoding": "gzip, deflate, br, zstd",
}


@pytest.fixture
def keys_proxy(tmp_path: Path, make_proxy: Any, monkeypatch: pytest.MonkeyPatch) -> ProxyServer:
    """``auth.mode: keys``: tenant acme's proxy key ``cpk-acme-contract``, its provider key from
    the environment; tenant globex's provider is ``passthrough`` (the client brings it)."""
    monkeypatch.setenv("ACME_CONTRACT_PROVIDER_KEY", "sk-ant-acme-provider-contract")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "acme.yaml").write_text(
        f"name: acme\napi_keys_sha256: ['{_sha('cpk-acme-contract')}']\n"
        "provider: {mode: env, api_key_env: ACME_CONTRACT_PROVIDER_KEY}\n"
    )
    (policies / "globex.yaml").write_text(
        f"name: globex\napi_keys_sha256: ['{_sha('cpk-globex-contract')}']\nprovider: {{mode: passthrough}}\n"
    )
    proxy: ProxyServer = make_proxy(auth={"mode": "keys"}, policies_dir=str(policies))
    return proxy


def test_head_root_is_answered_without_the_upstream(
    upstream: FakeUpstream, make_proxy: Any, keys_proxy: ProxyServer
) -> None:
    for proxy in (make_proxy(), make_proxy(upstream.url + "/some/prefix"), keys_proxy):
        r = httpx.head(proxy.url + "/", headers=HEAD_HEADERS)
        assert r.status_code == 200
        assert r.content == b""
        assert not r.is_redirect
    assert upstream.requests == []


def test_a_client_base_url_path_is_not_served(upstream: FakeUpstream, proxy: ProxyServer) -> None:
    """Claude Code with ``ANTHROPIC_BASE_URL=http://proxy/gw``: ``HEAD /gw`` (it ignores the 404),
    then ``POST /gw/v1/messages?beta=true`` (it fails). Both are the proxy's own 404; nothing is
    forwarded. Serve the proxy at the root of its address."""
    head = httpx.head(proxy.url + "/gw", headers=HEAD_HEADERS)
    post = _post(proxy, orjson.dumps(_body()), _headers(), "/gw/v1/messages?beta=true")
    assert head.status_code == post.status_code == 404
    assert post.json()["error"]["type"] == "not_found_error"
    assert upstream.requests == []


# --- row 5: GET /v1/models?limit=1000 -----------------------------------------------------------

LISTING = (
    b'{"data": [{"type": "model", "id": "claude-opus-4-8", "display_name": "Claude Opus 4.8",'
    b' "created_at": "2026-09-01T00:00:00Z"}],  "has_more": false, "first_id": "claude-opus-4-8",'
    b' "last_id": "claude-opus-4-8"}'
)


def _discover(
    proxy: ProxyServer, upstream: FakeUpstream, headers: dict[str, str]
) -> RecordedRequest:
    upstream.script(Reply(LISTING, headers={"x-listing": "1"}))
    r = httpx.get(
        proxy.url + "/v1/models?limit=1000",
        headers={"anthropic-version": "2023-06-01", **headers},
        follow_redirects=False,
    )
    assert r.status_code == 200
    assert r.content == LISTING
    assert r.headers["x-listing"] == "1"
    sent = upstream.requests[-1]
    assert (sent.method, sent.raw_path, sent.body) == ("GET", "/v1/models?limit=1000", b"")
    return sent


@pytest.mark.parametrize(
    ("name", "value"), [("x-api-key", KEY), ("authorization", f"Bearer {KEY}")]
)
def test_model_discovery_with_the_client_key(
    upstream: FakeUpstream, proxy: ProxyServer, name: str, value: str
) -> None:
    sent = _discover(proxy, upstream, {name: value})
    assert _credentials(sent) == [(name, value)]


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-api-key", "cpk-acme-contract"), ("authorization", "Bearer cpk-acme-contract")],
)
def test_model_discovery_with_a_proxy_key(
    upstream: FakeUpstream, keys_proxy: ProxyServer, name: str, value: str
) -> None:
    sent = _discover(keys_proxy, upstream, {name: value})
    assert _credentials(sent) == [("x-api-key", "sk-ant-acme-provider-contract")]


def test_model_discovery_with_a_proxy_key_and_the_clients_provider_key(
    upstream: FakeUpstream, keys_proxy: ProxyServer
) -> None:
    sent = _discover(
        keys_proxy, upstream, {"x-api-key": "cpk-globex-contract", "authorization": f"Bearer {KEY}"}
    )
    assert _credentials(sent) == [("authorization", f"Bearer {KEY}")]


# --- row 6: anthropic-workspace-id --------------------------------------------------------------


def test_the_workspace_id_is_forwarded_on_every_route(
    upstream: FakeUpstream, make_proxy: Any, loop_thread: LoopThread
) -> None:
    proxy = make_proxy(compaction=SUMMARIZE)
    headers = _headers(**{"anthropic-workspace-id": WORKSPACE})
    small = orjson.dumps(_body())
    seen: list[RecordedRequest] = []

    def forwarded() -> RecordedRequest:
        sent = upstream.requests[-1]
        seen.append(sent)
        return sent

    # /v1/messages as sent, and count_tokens
    assert _post(proxy, small, headers).status_code == 200
    assert forwarded().body == small
    counted = orjson.dumps({k: v for k, v in _body().items() if k not in ("max_tokens", "stream")})
    assert _post(proxy, counted, headers, "/v1/messages/count_tokens?beta=true").status_code == 200
    assert forwarded().body == counted
    # with the durable block
    _seed(loop_thread, proxy, "sess-ws")
    assert _post(proxy, small, {**headers, "x-session-id": "sess-ws"}).status_code == 200
    assert DURABLE_FACT in forwarded().json()["system"][-1]["text"]
    # compacted, with the summary call made for it
    upstream.script(*[_model] * 2)
    r = _post(proxy, orjson.dumps(_body(_conversation())), headers)
    assert "summarize" in r.headers["x-compaction-layers"]
    seen.append(_main(upstream))
    (summary,) = _summary_calls(upstream)
    seen.append(summary)
    # passthrough routes
    assert httpx.get(proxy.url + "/v1/models?limit=1000", headers=headers).status_code == 200
    forwarded()
    batch = b'{"requests": [{"custom_id": "a", "params": {"model": "m", "max_tokens": 5, "messages": []}}]}'
    upstream.script(Reply({"id": "msgbatch_01", "type": "message_batch"}))
    assert _post(proxy, batch, headers, "/v1/messages/batches").status_code == 200
    assert forwarded().body == batch

    assert len(seen) == 7
    for sent in seen:
        assert sent.headers.getall("anthropic-workspace-id", []) == [WORKSPACE], (
            sent.raw_path,
            sent.json().get("model") if sent.body else "",
        )


# --- row 7: the attribution block ----------------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True], ids=["no-durable", "durable-block"])
@pytest.mark.parametrize(
    "compaction", [None, TRUNCATE, SUMMARIZE], ids=["as-sent", "truncate", "summarize"]
)
def test_the_attribution_block_reaches_the_upstream_byte_identical(
    upstream: FakeUpstream,
    make_proxy: Any,
    loop_thread: LoopThread,
    durable: bool,
    compaction: dict[str, Any] | None,
) -> None:
    proxy = make_proxy(compaction=compaction) if compaction else make_proxy()
    headers = _headers()
    if durable:
        _seed(loop_thread, proxy, "sess-attr")
        headers["x-session-id"] = "sess-attr"
    upstream.script(*[_model] * 4)
    raw = orjson.dumps(_body(_conversation() if compaction else None))
    r = _post(proxy, raw, headers)
    assert r.status_code == 200, r.text
    if compaction:
        assert r.headers["x-compaction-layers"] != "none"
    sent = _main(upstream)
    system = sent.json()["system"]
    # Claude Code's three blocks, first and in order, to the byte (the list's own bytes, less "]").
    assert orjson.dumps(CC_SYSTEM)[:-1] in sent.body
    assert system[:3] == CC_SYSTEM
    if durable:
        assert len(system) == 4
        assert set(system[3]) == {"type", "text"} and DURABLE_FACT in system[3]["text"]
    else:
        assert system == CC_SYSTEM
    if not durable and not compaction:
        assert sent.body == raw
    # the summary call's prompt is the proxy's own: Claude Code's blocks are not copied into it
    for summary in _summary_calls(upstream):
        assert ATTRIBUTION not in orjson.dumps(summary.json().get("system", "")).decode()


# --- end to end: Claude Code itself -------------------------------------------------------------

CC_SESSION = "5f0c3a52-6f3e-4a4c-9d55-0b9a1c2d3e4f"


def _without_system(body: bytes) -> Any:
    data = orjson.loads(body)
    return {k: v for k, v in data.items() if k != "system"} if isinstance(data, dict) else data


def _root_answers(proxy: ProxyServer) -> dict[str, float]:
    """``HEAD /`` answers by status, from the proxy's /metrics."""
    with urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith('context_proxy_requests_total{route="root"'):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = float(line.rsplit(" ", 1)[1])
    return out


def _pairs(
    tapped: list[TappedRequest], upstream: FakeUpstream
) -> Iterator[tuple[TappedRequest, RecordedRequest]]:
    """Each API request Claude Code sent with the one the upstream received (same method, target,
    and body but for ``system``, where the proxy's durable block may end)."""
    unmatched = list(upstream.requests)
    for sent in tapped:
        if not sent.path.startswith("/v1/"):
            continue
        key = (sent.method, sent.target, _without_system(sent.body) if sent.body else None)
        match = next(
            (
                u
                for u in unmatched
                if (u.method, u.raw_path, _without_system(u.body) if u.body else None) == key
            ),
            None,
        )
        assert match is not None, f"{sent.method} {sent.target} did not reach the upstream"
        unmatched.remove(match)
        yield sent, match
    assert unmatched == [], [u.raw_path for u in unmatched]


@pytest.mark.claude_code
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_claude_code_traffic_keeps_the_contract(
    upstream: FakeUpstream, proxy: ProxyServer, loop_thread: LoopThread, tmp_path: Path
) -> None:
    claude = find_claude()
    if claude is None:
        pytest.skip(
            "Claude Code CLI not found: set CLAUDE_BIN, or run "
            "`npm install --prefix .ci/node @anthropic-ai/claude-code`, or put `claude` on PATH"
        )
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    notes = work / "notes.txt"
    shutil.copyfile(FIXTURES / "notes.txt", notes)
    _seed(loop_thread, proxy, CC_SESSION)  # the proxy injects its durable block into every turn
    tap = Tap(proxy.url)
    loop_thread.run(tap.start())
    upstream.script(*[make_model(str(notes))] * 500)
    env = _clean_env(home, tap.url)
    # Claude Code adds these to every API request (an unknown anthropic-* header and the workspace)
    env["ANTHROPIC_CUSTOM_HEADERS"] = f"anthropic-foo: bar baz\nanthropic-workspace-id: {WORKSPACE}"
    try:
        proc = subprocess.run(
            [
                claude,
                "-p",
                PROMPT,
                "--allowedTools",
                "Read",
                "--output-format",
                "json",
                "--session-id",
                CC_SESSION,
            ],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    finally:
        loop_thread.run(tap.stop())
    tapped = tap.requests()
    context = _describe(proc, tapped, upstream)
    assert proc.returncode == 0, context
    assert FINAL_TEXT in json.loads(proc.stdout).get("result", ""), context

    # Row 4: the start-up probe, answered by the proxy.
    assert [r.target for r in tapped if r.method == "HEAD"] == ["/"], context
    assert _root_answers(proxy) == {"200": 1.0}, context
    assert all(u.method != "HEAD" for u in upstream.requests), context

    pairs = list(_pairs(tapped, upstream))
    messages = [(s, u) for s, u in pairs if s.path == "/v1/messages"]
    assert len(messages) >= 2, context
    for sent, received in pairs:
        # Row 1 (and 6): every anthropic-* header, each value, in order.
        assert _anthropic_headers(received.headers.items()) == _anthropic_headers(
            sent.headers.items()
        ), sent.target
        assert received.headers.get("anthropic-workspace-id") == WORKSPACE
        assert received.headers.get("anthropic-foo") == "bar baz"
    for sent, received in messages:
        betas = sent.headers["anthropic-beta"].split(",")
        assert "claude-code-20250219" in betas
        assert received.headers["anthropic-beta"].split(",") == betas
        # Row 7: Claude Code's system blocks to the byte, the attribution block first, ours last.
        original = orjson.loads(sent.body)["system"]
        forwarded = orjson.loads(received.body)["system"]
        assert original[0]["text"].startswith("x-anthropic-billing-header: cc_version=2.1."), (
            original[0]
        )
        assert "cc_entrypoint=" in original[0]["text"]
        assert forwarded[:-1] == original
        assert DURABLE_FACT in forwarded[-1]["text"]
        as_sent = orjson.dumps(original)[:-1]  # the list's bytes, less its "]"
        assert as_sent in sent.body and as_sent in received.body
        # Row 1: every body field Claude Code sent, as sent.
        assert _without_system(received.body) == _without_system(sent.body)
