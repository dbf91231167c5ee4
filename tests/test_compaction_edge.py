"""Compaction on the wire: what the upstream receives, what the client is told, through the SDK."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2 as httpx
import orjson
import pytest

from proxy.core.protocol import validate_messages
from proxy.core.tokens import TokenCounter
from tests.harness import ProxyServer
from tests.shared_data import CC_TRANSCRIPT
from tests.upstream import FakeUpstream, RecordedRequest, Reply, message_json

KEY = "sk-ant-compaction-test-000111"
TRANSCRIPT = CC_TRANSCRIPT
SUMMARY_MODEL = "claude-summary-test"
SMALL = {"threshold": 20_000, "hard_limit": 60_000, "summary": {"model": SUMMARY_MODEL}}



def _user_turn_ends(messages: list[dict[str, Any]]) -> list[int]:
    return [k for k in range(1, len(messages) + 1) if messages[k - 1]["role"] == "user"]


def _turn_at_least(transcript: dict[str, Any], n: int) -> int:
    """The first request (messages[:k] ending on a user turn) with k >= n: over SMALL's threshold."""
    return next(k for k in _user_turn_ends(transcript["messages"]) if k >= n)


def _client(proxy: ProxyServer, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, default_headers=headers)


def _main_requests(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") != SUMMARY_MODEL]


def _summary_requests(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/messages" and r.json().get("model") == SUMMARY_MODEL]


def _create(client: anthropic.Anthropic, transcript: dict[str, Any], k: int, **kw: Any) -> Any:
    return client.messages.with_raw_response.create(
        model="claude-fake-1", max_tokens=100, messages=transcript["messages"][:k], tools=transcript["tools"], **kw
    )


def test_small_requests_are_forwarded_untouched_with_headers(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy()
    body = b'{"model":"m","max_tokens":5,  "messages":[{"role":"user","content":"hi"}]}'
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert upstream.requests[-1].body == body
    assert r.headers["x-compaction-layers"] == "none"
    assert r.headers["x-compaction-plan"] == "none"
    assert r.headers["x-compaction-summary"] == "skipped"
    assert int(r.headers["x-compaction-tokens-before"]) == int(r.headers["x-compaction-tokens-after"]) > 0
    assert "x-compaction-id" not in r.headers


def test_long_conversation_is_compacted_then_the_plan_is_reused(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    proxy = make_proxy(compaction=SMALL)
    client = _client(proxy)
    ends = [k for k in _user_turn_ends(transcript["messages"]) if k >= 90]
    k1, k2 = ends[0], ends[1]
    upstream.script(lambda req: Reply(message_json("SUMMARY: goal was X; files a.py") if req.json()["model"] == SUMMARY_MODEL else message_json("ok")))
    first = _create(client, transcript, k1)
    assert first.headers["x-compaction-plan"] == "new"
    assert first.headers["x-compaction-summary"] == "ok"
    assert "summarize" in first.headers["x-compaction-layers"]
    assert first.headers["x-compaction-id"]
    before, after = int(first.headers["x-compaction-tokens-before"]), int(first.headers["x-compaction-tokens-after"])
    assert after < before and after <= 20_000

    # The summary call went to the upstream with the request's own credentials.
    (summary_call,) = _summary_requests(upstream)
    assert summary_call.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in summary_call.headers

    sent = _main_requests(upstream)[-1].json()
    original = transcript["messages"][:k1]
    view = sent["messages"]
    assert validate_messages(view) is None
    assert view[0] == original[0]  # the original intent
    assert view[-1] == original[-1]  # the last message, untouched
    assert len(view) < len(original)
    assert any("SUMMARY: goal was X" in orjson.dumps(m).decode() for m in view)
    assert sent["tools"] == transcript["tools"]

    # Next turn: the same replacement, byte for byte, with the new messages appended unchanged.
    second = _create(client, transcript, k2)
    assert second.headers["x-compaction-plan"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(_summary_requests(upstream)) == 1
    sent2 = _main_requests(upstream)[-1]
    view2 = sent2.json()["messages"]
    assert view2[: len(view) - 1] == view[:-1]
    assert view2[len(view) - 1 :] == transcript["messages"][k1 - 1 : k2]
    # Byte-level: the shared prefix serialises identically (the provider's cache key).
    prefix = orjson.dumps(view[:-1])[:-1]
    assert orjson.dumps(view2).startswith(prefix)


def test_streaming_answers_carry_the_headers(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    proxy = make_proxy(compaction=SMALL)
    k = _turn_at_least(transcript, 90)
    with _client(proxy).messages.with_streaming_response.create(
        model="claude-fake-1", max_tokens=100, messages=transcript["messages"][:k], stream=True
    ) as response:
        assert response.headers["x-compaction-plan"] == "new"
        assert b"message_stop" in response.read()


def test_summary_failure_keeps_history_and_is_reported(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    proxy = make_proxy(compaction={**SMALL, "summary": {"model": SUMMARY_MODEL, "max_retries": 0}})
    upstream.script(Reply({"type": "error", "error": {"type": "api_error", "message": "boom"}}, status=500))
    k = _turn_at_least(transcript, 90)
    r = _create(_client(proxy), transcript, k)
    assert r.status_code == 200
    assert r.headers["x-compaction-summary"] == "failed"
    assert "summarize" not in r.headers["x-compaction-layers"]
    view = _main_requests(upstream)[-1].json()["messages"]
    assert validate_messages(view) is None
    text = orjson.dumps(view).decode()
    assert "boom" not in text and "api_error" not in text
    assert view[-1] == transcript["messages"][k - 1]


def test_opt_out_header_forwards_untouched(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    proxy = make_proxy(compaction=SMALL)
    k = _turn_at_least(transcript, 90)
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": transcript["messages"][:k]})
    r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY, "x-compaction": "off"}, timeout=30)
    assert upstream.requests[-1].body == body
    assert "x-compaction" not in upstream.requests[-1].headers
    assert r.headers["x-compaction-layers"] == "none"
    assert r.headers["x-compaction-plan"] == "none"


@pytest.mark.parametrize(
    ("enabled", "header", "runs"),
    [(True, None, True), (True, "on", True), (True, " OFF ", False), (True, "off", False), (False, None, False)],
)
def test_whether_compaction_runs_is_one_decision(enabled: bool, header: str | None, runs: bool) -> None:
    """The edge (whether the nesting check makes canonical JSON for compaction) and the service
    (whether it compacts) ask the same question."""
    from proxy.config.settings import CompactionConfig
    from proxy.server.compaction.service import compaction_runs

    headers = {} if header is None else {"x-compaction": header}
    assert compaction_runs(headers, CompactionConfig(enabled=enabled)) is runs


@pytest.mark.parametrize(
    ("edits", "deferred"),
    [
        ([{"type": "clear_tool_uses_20250919"}], True),
        ([{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}], True),
        ([{"type": "clear_thinking_20251015", "keep": "all"}], False),
    ],
)
def test_server_side_context_management_defers(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any], edits: list[Any], deferred: bool) -> None:
    proxy = make_proxy(compaction=SMALL)
    k = _turn_at_least(transcript, 90)
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": transcript["messages"][:k], "context_management": {"edits": edits}})
    r = httpx.post(proxy.url + "/v1/messages?beta=true", content=body, headers={"x-api-key": KEY}, timeout=30)
    if deferred:
        assert r.headers["x-compaction-layers"] == "deferred"
        assert _main_requests(upstream)[-1].body == body
    else:
        assert r.headers["x-compaction-layers"] not in ("deferred", "none")
        assert _main_requests(upstream)[-1].body != body


def test_over_the_hard_limit_is_refused_without_calling_the_provider(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(compaction={"threshold": 1000, "hard_limit": 2000, "summary": {"model": SUMMARY_MODEL}})
    huge = "word " * 5000  # the last message alone is over the hard limit: nothing can save it
    messages = [{"role": "user", "content": "start"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": huge}]
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(proxy).messages.create(model="claude-fake-1", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    message = info.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("prompt is too long: ")
    assert "> 2000 maximum" in message
    assert "word" not in message
    assert _main_requests(upstream) == []
    assert info.value.response.headers["x-compaction-tokens-before"]


def test_count_tokens_forwards_the_compacted_view(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    proxy = make_proxy(compaction=SMALL)
    client = _client(proxy)
    k = _turn_at_least(transcript, 90)
    created = _create(client, transcript, k)
    upstream.script(Reply({"input_tokens": 12345}))
    counted = client.messages.with_raw_response.count_tokens(model="claude-fake-1", messages=transcript["messages"][:k], tools=transcript["tools"])
    assert counted.parse().input_tokens == 12345
    assert counted.headers["x-compaction-plan"] == "reused"
    assert counted.headers["x-compaction-id"] == created.headers["x-compaction-id"]
    forwarded = upstream.requests[-1]
    assert forwarded.path == "/v1/messages/count_tokens"
    assert forwarded.json()["messages"] == _main_requests(upstream)[-1].json()["messages"]


def test_calibration_uses_the_providers_real_input_size(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy()
    messages = [{"role": "user", "content": "calibrate " * 200}]
    body = orjson.dumps({"model": "cal-model", "max_tokens": 5, "messages": messages})
    estimate = TokenCounter().count_request(None, None, messages).total
    # The provider says the real input was twice our estimate (input + cache read + cache creation).
    answer = message_json("ok", input_tokens=estimate // 2)
    answer["usage"]["cache_read_input_tokens"] = estimate
    answer["usage"]["cache_creation_input_tokens"] = estimate - estimate // 2
    upstream.script(Reply(answer))
    first = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(first.headers["x-compaction-tokens-before"]) == estimate
    second = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(second.headers["x-compaction-tokens-before"]) == 2 * estimate
    # Another model is not affected.
    other = httpx.post(proxy.url + "/v1/messages", content=body.replace(b"cal-model", b"other"), headers={"x-api-key": KEY})
    assert int(other.headers["x-compaction-tokens-before"]) == estimate


def test_an_implausible_usage_figure_is_discarded_and_counted(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = make_proxy()
    messages = [{"role": "user", "content": "calibrate " * 2000}]
    body = orjson.dumps({"model": "cal-model", "max_tokens": 5, "messages": messages})
    estimate = TokenCounter().count_request(None, None, messages).total
    # real/estimate ~ 0.0002: the figure is not about this request; it used to become the ratio
    # (clamped to 0.5) and halve every later estimate.
    upstream.script(
        Reply(message_json("ok", input_tokens=1)),
        Reply(message_json("ok", input_tokens=round(estimate * 1.25))),
    )
    first = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(first.headers["x-compaction-tokens-before"]) == estimate
    second = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(second.headers["x-compaction-tokens-before"]) == estimate
    # a plausible figure is still learnt from
    third = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY})
    assert int(third.headers["x-compaction-tokens-before"]) == round(estimate * 1.25)
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'context_proxy_calibration_samples_total{outcome="discarded"} 1.0' in metrics
    assert 'context_proxy_calibration_samples_total{outcome="used"} 1.0' in metrics


def test_large_requests_are_compacted_off_the_loop_with_the_same_result(upstream: FakeUpstream, make_proxy: Any, transcript: dict[str, Any]) -> None:
    k = _turn_at_least(transcript, 90)
    bodies = []
    for offload in (1, 10**9):
        proxy = make_proxy(compaction={**SMALL, "offload_bytes": offload})
        _create(_client(proxy), transcript, k)
        bodies.append(_main_requests(upstream)[-1].body)
    assert bodies[0] == bodies[1]
