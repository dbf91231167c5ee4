"""The catalogue at the edge: the ledger prices calls by it (a configured ``models:`` price first,
an unknown model unpriced), ``GET /admin/v1/usage/prices`` lists what is in force with each
price's origin, and a tenant on a platform upstream lists its models from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from tests.harness import LoopThread, ProxyServer
from tests.test_admin import A_API_KEY, A_TOKEN, _write_policies
from tests.upstream import FakeUpstream, Reply, message_json


@pytest.fixture
def priced(make_proxy: Any, tmp_path: Path) -> ProxyServer:
    server: ProxyServer = make_proxy(
        auth={"mode": "keys"},
        policies_dir=str(_write_policies(tmp_path)),
        ledger={"flush_seconds": 0.01},
        models=[
            {"match": "claude-opus-4-8", "price": {"input": 100, "output": 200}},
            {"match": "my-gateway-*", "price": {"input": 1, "output": 1, "cache_read": 0.5}},
        ],
        prices=[{"model": "claude-haiku-4-5", "input": 50, "output": 60}],
    )
    return server


def _admin(proxy: ProxyServer, loop: LoopThread, path: str) -> Any:
    from proxy.server.ledger import LEDGER

    loop.run(proxy.app[LEDGER].flush(), timeout=10)
    answer = httpx.get(proxy.url + "/admin/v1" + path, headers={"Authorization": f"Bearer {A_TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_prices_in_force_come_from_the_catalogue_with_their_origin(
    priced: ProxyServer, loop_thread: LoopThread
) -> None:
    prices = _admin(priced, loop_thread, "/usage/prices")
    assert prices["unit"] == "USD per million tokens"
    rows = {p["model"]: p for p in prices["prices"]}
    assert next(iter(rows)) == "my-gateway-*"  # a configured glob first
    assert rows["my-gateway-*"]["cache_read"] == 0.5 and rows["my-gateway-*"]["origin"] == "config models[1]"
    assert (rows["claude-opus-4-8"]["input"], rows["claude-opus-4-8"]["origin"]) == (100, "config models[0]")
    assert rows["claude-opus-4-8"]["cache_write_5m"] == 125  # the usual multiple of a configured input
    assert (rows["claude-haiku-4-5-20251001"]["input"], rows["claude-haiku-4-5-20251001"]["origin"]) == (
        50, "config prices[0]"
    )
    assert rows["claude-sonnet-4-5-20250929"] == {
        "model": "claude-sonnet-4-5-20250929", "input": 3, "cache_write_5m": 3.75,
        "cache_write_1h": 6, "cache_read": 0.3, "output": 15, "origin": "built-in",
    }
    assert rows["claude-demo-1"]["origin"] == "built-in"  # the keyless demo is priced too
    assert "claude-3-5-sonnet-20241022" not in rows  # unpriced: no published price read


def test_the_ledger_prices_each_call_by_the_catalogue(
    priced: ProxyServer, upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    upstream.script(lambda req: Reply(message_json("ok", input_tokens=1_000_000, output_tokens=0)))
    sdk = anthropic.Anthropic(base_url=priced.url, api_key=A_API_KEY, max_retries=0)
    for model in ("claude-opus-4-8", "claude-opus-9"):
        sdk.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    totals = _admin(priced, loop_thread, "/usage/summary?since=2000-01-01T00:00:00Z")["totals"]
    assert totals["cost_usd"]["input"] == pytest.approx(100)  # the configured price, not the built-in $5
    assert totals["unpriced_models"] == ["claude-opus-9"]
