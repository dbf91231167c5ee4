"""Hypothesis-generated bodies on ``/v1/messages`` and ``/v1/messages/count_tokens`` (issue 11 #7).

Valid conversations (``tests.strategies``), conversations with one thing broken, arbitrary JSON
(odd Unicode, huge and non-finite numbers, deep nesting), and bytes that are not JSON at all go to
the real app in front of the fake upstream, with a low compaction threshold so the compaction
layers see them too. Whatever comes in: never a 5xx from the proxy, never a hung request (every
call has a 10 s bound), and every error is Anthropic-shaped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import FuzzProxy
from tests.strategies import conversations
from tests.test_admin import A_API_KEY

ROUTES = ["/v1/messages", "/v1/messages/count_tokens"]
TIMEOUT = httpx.Timeout(10.0)
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# Strings a parser or a tokenizer may trip on: controls, NUL, lone surrogates (as JSON escapes),
# combining marks, right-to-left marks, astral characters, very long runs.
ODD_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Mn", "So", "Zl", "Zp"]), max_size=40),
    st.sampled_from(
        ["\x00", "\u202e\u2066", "\U0001f600" * 50, "e\u0301" * 30, "\ufeff", "a" * 20_000, ""]
    ),
)
HUGE_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**70),
    st.integers(min_value=-(2**70), max_value=-(2**63) + 2),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([10**30, -(10**30), 1e308, -1e308, 5e-324, 0, -0.0]),
)
JSON = st.recursive(
    st.none() | st.booleans() | HUGE_NUMBERS | ODD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_TEXT, inner, max_size=4),
    max_leaves=20,
)
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "", "USER", None, 1])
BLOCK_TYPES = st.sampled_from(
    ["text", "image", "tool_use", "tool_result", "thinking", "document", "compaction", "?", None]
)
BLOCKS = st.fixed_dictionaries(
    {"type": BLOCK_TYPES},
    optional={
        "text": JSON,
        "id": JSON,
        "tool_use_id": JSON,
        "name": JSON,
        "input": JSON,
        "content": JSON,
        "source": JSON,
        "cache_control": JSON,
    },
)
MESSAGES = st.fixed_dictionaries(
    {"role": ROLES, "content": st.one_of(ODD_TEXT, st.lists(BLOCKS, max_size=4), JSON)}
)
# A Messages request that is plausible in shape, with any field able to be wrong.
REQUESTS = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(MESSAGES, max_size=6), JSON)},
    optional={
        "model": st.one_of(st.just("claude-fake-1"), JSON),
        "max_tokens": HUGE_NUMBERS,
        "system": st.one_of(ODD_TEXT, st.lists(BLOCKS, max_size=3), JSON),
        "tools": st.one_of(st.lists(JSON, max_size=3), JSON),
        "stream": st.one_of(st.booleans(), JSON),
        "context_management": JSON,
        "metadata": JSON,
    },
)


@st.composite
def valid_requests(draw: Any) -> dict[str, Any]:
    conversation = draw(conversations(max_turns=6))
    body: dict[str, Any] = {
        "model": "claude-fake-1",
        "max_tokens": 64,
        "messages": conversation.messages,
        "tools": conversation.tools,
    }
    if conversation.system is not None:
        body["system"] = conversation.system
    if draw(st.booleans()):
        body["stream"] = True
    return body


@st.composite
def broken_requests(draw: Any) -> dict[str, Any]:
    """A valid conversation with one message replaced by a generated one."""
    body = draw(valid_requests())
    messages = list(body["messages"])
    messages[draw(st.integers(0, len(messages) - 1))] = draw(MESSAGES)
    return {**body, "messages": messages}


def _nested(depth: int, kind: str) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


# orjson writes at most 254 levels; the edge answers nesting deeper than 128 levels anywhere in a
# body with a clear 400 (see test_deep_nesting_in_a_session_is_never_a_5xx).
SERIALISABLE_DEPTH = 200


def _deep_body(depth: int, kind: str = "list", where: str = "input") -> dict[str, Any]:
    deep = _nested(depth, kind)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    body: dict[str, Any] = {"model": "claude-fake-1", "max_tokens": 16, "messages": messages}
    if where == "input":
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"d": deep}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ]
    elif where == "content":
        messages[0] = {"role": "user", "content": [{"type": "text", "text": "hi", "extra": deep}]}
    else:
        body[where] = deep
    return body


@st.composite
def deeply_nested(draw: Any) -> dict[str, Any]:
    return _deep_body(
        draw(st.integers(1, SERIALISABLE_DEPTH)),
        draw(st.sampled_from(["list", "dict"])),
        draw(st.sampled_from(["input", "content", "system", "metadata"])),
    )


def _encode(value: Any) -> bytes:
    # json, not orjson: integers beyond 64 bits and lone surrogates must reach the proxy as sent.
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"{",
            b"[" * 5000 + b"]" * 5000,
            b'{"messages": [' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"]}",
            b'{"messages": "\\ud800"}',
            b'{"messages": [{"role": "user", "content": "\\udfff\\ud800"}], "max_tokens": 1}',
            b'{"messages": [], "max_tokens": 1e999}',
            b'{"messages": [], "max_tokens": 123456789012345678901234567890}',
            b'\xef\xbb\xbf{"messages": []}',
            b'{"messages": []}\x00',
            b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        ]
    ),
)
BODIES = st.one_of(
    valid_requests().map(_encode),
    broken_requests().map(_encode),
    REQUESTS.map(_encode),
    JSON.map(_encode),
    deeply_nested().map(_encode),
    RAW_BODIES,
)


@pytest.fixture(scope="module")
def http(fuzz_proxy: FuzzProxy) -> Iterator[httpx.Client]:
    headers = {
        "x-api-key": A_API_KEY,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    with httpx.Client(base_url=fuzz_proxy.url, headers=headers, timeout=TIMEOUT, trust_env=False) as client:
        yield client


def _check(response: httpx.Response, body: bytes) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500], body[:300])
    if response.status_code >= 400:
        error = response.json()
        assert error["type"] == "error" and isinstance(error["error"]["message"], str), error


@pytest.mark.parametrize("route", ROUTES)
@FUZZ
@given(body=BODIES, session=st.sampled_from([None, "s1", "fuzz-2"]))
def test_no_body_gets_a_5xx_or_hangs(
    route: str, body: bytes, session: str | None, http: httpx.Client
) -> None:
    headers = {"x-session-id": session} if session else {}
    response = http.post(route, content=body, headers=headers)
    _check(response, body)


@pytest.mark.parametrize("depth", [260, 1000])
def test_deep_nesting_in_a_session_is_never_a_5xx(depth: int, http: httpx.Client) -> None:
    # written as text: json.dumps itself recurses too deep for 1,000 levels
    deep = b"[" * depth + b'"x"' + b"]" * depth
    body = _encode(_deep_body(0)).replace(b'"x"', deep, 1)
    assert body.count(b"[" * depth) == 1
    response = http.post("/v1/messages", content=body, headers={"x-session-id": "s1"})
    _check(response, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "deep" in error["message"]


@pytest.mark.parametrize("route", ROUTES)
@settings(FUZZ, max_examples=15)
@given(body=valid_requests())
def test_valid_generated_requests_are_answered_200(
    route: str, body: dict[str, Any], http: httpx.Client, fuzz_proxy: FuzzProxy
) -> None:
    before = len(fuzz_proxy.upstream.requests)
    response = http.post(route, content=_encode(body))
    assert response.status_code == 200, response.text[:500]
    assert len(fuzz_proxy.upstream.requests) > before  # forwarded, not answered by the proxy
