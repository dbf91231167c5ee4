"""The savings in the console, in Debian's chromium: a session page that opens with what the
session saved and fits in about three screens (a 30-request session of the keyless demo, made by
``examples/demo_agent_loop.py`` through ``context-proxy serve --demo``, both real processes);
the empty Overview telling how to send the first request; count axes in whole numbers; a model
without a price flagged on every page, never shown as $0.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pytest
from playwright.sync_api import Page, expect

from proxy.cli import figures
from proxy.server.ledger import LEDGER
from tests.console.browser import Watched, open_watched, screenshot
from tests.demo_process import DemoServe, run_agent, serve_demo
from tests.harness import LoopThread, ProxyServer, proxy_config
from tests.upstream import FakeUpstream

SCREEN = 1080  # one screen's height
VIEWPORT = {"width": 1440, "height": SCREEN}
TOKEN = "cpa-console-savings-token-0001"


@dataclass
class Demo:
    url: str
    token: str
    session: str


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    """The keyless demo with a 30-request agent session (25 files, 4 read twice, the report)."""
    with tempfile.TemporaryDirectory(prefix="console-demo-") as folder:
        cwd = Path(folder)
        served = DemoServe(serve_demo("--port", "0"), cwd)
        try:
            banner = served.banner()
            token_file = cwd / banner.token_file
            ran = run_agent(
                sys.executable, cwd, "--url", banner.url, "--files", "25",
                "--token-file", str(token_file),
            )
            assert ran.returncode == 0, ran.stdout + ran.stderr
            session = re.search(r"^Session (\S+):", ran.stdout, re.M)
            assert session and "over 30 requests" in ran.stdout, ran.stdout
            yield Demo(banner.url, token_file.read_text().strip(), session.group(1))
        finally:
            served.stop()


SignIn = Callable[[str, str], Page]


@pytest.fixture
def sign_in(browser: Any) -> Iterator[SignIn]:
    """A fresh browser context per call, signed in with an admin token; every page checked for
    console errors, page errors and requests to another origin."""
    opened: list[tuple[Any, Watched]] = []

    def open_page(origin: str, token: str) -> Page:
        context, page, watch = open_watched(browser, origin, viewport=VIEWPORT)
        opened.append((context, watch))
        page.goto("/console/signin")
        page.get_by_label("Admin token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        return page

    yield open_page
    for context, watch in opened:
        context.close()
        watch.assert_clean()


def _api(page: Page, path: str, **params: Any) -> Any:
    answer = page.request.get("/admin/v1" + path, params=params)
    assert answer.status == 200, answer.text()
    return answer.json()


def _loaded(page: Page) -> None:
    expect(page.locator("main")).to_have_attribute("aria-busy", "false")


# -- the session page -------------------------------------------------------------------------


def test_a_30_turn_session_opens_with_its_savings_and_fits_three_screens(
    sign_in: SignIn, demo: Demo
) -> None:
    page = sign_in(demo.url, demo.token)
    page.goto(f"/console/sessions/{demo.session}")
    _loaded(page)
    rows = _api(page, "/usage", session=demo.session, kind="client", limit=100)["rows"]
    assert len(rows) == 30
    first = min(r["at"] for r in rows)
    totals = _api(
        page, "/usage/summary", session=demo.session,
        since=first[:19] + "Z", until="2100-01-01T00:00:00Z", bucket=10**9,
    )["totals"]
    assert totals["client_calls"] == 30 and totals["savings_usd"] > 0

    # the headline: on the first screen as the page opens, the ledger's figures, rounded
    headline = page.get_by_role("region", name="What this session saved")
    expect(headline).to_be_visible()
    box = headline.bounding_box()
    assert box is not None and box["y"] + box["height"] <= SCREEN, box
    figure = lambda name: headline.get_by_role("region", name=name).locator(".figure")  # noqa: E731
    expect(figure("Tokens saved")).to_have_text(f"{totals['tokens_saved']:,}")
    expect(figure("Dollars saved")).to_have_text(figures.usd(totals["savings_usd"]))
    expect(figure("Share of input saved")).to_have_text(figures.percent(totals["tokens_saved_ratio"]))
    expect(figure("Compactions")).to_have_text(str(totals["compaction_events"]))
    cost = totals["cost_usd"]["total"]
    expect(headline).to_contain_text(
        f"it cost {figures.usd(cost)} instead of {figures.usd(cost + totals['savings_usd'])}"
    )

    # a savings column per turn, the ledger's row figures rounded
    turns = page.get_by_role("table", name="Turns").locator("tbody tr")
    expect(turns).to_have_count(30)
    shown = turns.locator("td.savings").all_inner_texts()
    assert shown == [figures.usd(r["savings_usd"]) for r in rows]
    assert sum(r["savings_usd"] for r in rows) == pytest.approx(totals["savings_usd"])

    # about three screens, with every compaction collapsed to a line
    compactions = page.get_by_role("region", name="Compactions").get_by_role("article")
    expect(compactions).to_have_count(totals["compaction_events"])
    assert page.locator("article.compaction details[open]").count() == 0
    height = page.evaluate("document.documentElement.scrollHeight")
    screenshot(page, "session-demo-30-turns")
    assert not re.search(r"\b(null|undefined|NaN)\b", page.locator("main").inner_text())
    assert height <= 3 * SCREEN, height

    # opened, each compaction lists only the cuts no earlier one made: every record once
    manifests = [
        _api(page, f"/manifests/{r['compaction_id']}")["manifest"]
        for r in rows if r["plan"] == "new" and r["compaction_id"]
    ]
    distinct = {json.dumps(rec, sort_keys=True) for m in manifests for rec in m["records"]}
    assert sum(len(m["records"]) for m in manifests) > len(distinct)  # the plans repeat cuts
    for summary in page.locator("article.compaction summary").all():
        summary.click()
    expect(page.locator("article.compaction li[data-record]")).to_have_count(len(distinct))
    expect(compactions.nth(1)).to_contain_text("earlier not repeated")


# -- the Overview ------------------------------------------------------------------------------


def test_the_overview_after_the_demo(sign_in: SignIn, demo: Demo) -> None:
    page = sign_in(demo.url, demo.token)
    page.get_by_label("Time range").select_option("1h")
    _loaded(page)
    savings = page.get_by_role("region", name="Compaction savings").locator(".figure")
    expect(savings).to_have_text(re.compile(r"^\$\d"))
    assert float(savings.get_attribute("data-value") or "0") > 0
    assert page.get_by_text("no price").count() == 0  # the demo model has its price
    for chart in ("Requests, compactions and errors over time", "Input tokens over time"):
        ticks = page.get_by_role("img", name=chart).locator("text.tick[data-tick]")
        values = [float(v) for v in ticks.evaluate_all("els => els.map(e => e.dataset.tick)")]
        assert values and all(v == int(v) for v in values), (chart, values)
    screenshot(page, "overview-demo")
    assert not re.search(r"\b(null|undefined|NaN)\b", page.locator("main").inner_text())


@dataclass
class Quiet:
    proxy: ProxyServer
    upstream: FakeUpstream


@pytest.fixture
def quiet(loop_thread: LoopThread, upstream: FakeUpstream, tmp_path: Path) -> Iterator[Quiet]:
    """A proxy nobody has sent a request yet (its admin token from the environment)."""
    config = proxy_config(upstream.url, str(tmp_path / "state"), ledger={"flush_seconds": 0.01})
    config = config.with_admin_tokens((hashlib.sha256(TOKEN.encode()).digest(),))
    proxy = ProxyServer(config)
    loop_thread.run(proxy.start())
    try:
        yield Quiet(proxy, upstream)
    finally:
        loop_thread.run(proxy.stop())


def test_empty_then_one_request_of_a_model_without_a_price(
    sign_in: SignIn, quiet: Quiet, loop_thread: LoopThread
) -> None:
    page = sign_in(quiet.proxy.url, TOKEN)
    _loaded(page)
    empty = page.get_by_role("region", name="Send the first request")
    expect(empty).to_contain_text(f"ANTHROPIC_BASE_URL={quiet.proxy.url} claude")
    expect(empty).to_contain_text(f'anthropic.Anthropic(base_url="{quiet.proxy.url}")')
    expect(empty).to_contain_text("context-proxy serve --demo")
    expect(page.get_by_role("img")).to_have_count(0)  # no chart of nothing
    screenshot(page, "overview-empty")
    assert not re.search(r"\b(null|undefined|NaN)\b", page.locator("main").inner_text())

    # one request, of a model the price table does not know
    with anthropic.Anthropic(
        base_url=quiet.proxy.url, api_key="sk-ant-quiet-0001", max_retries=0,
        default_headers={"x-session-id": "quiet-1"},
    ) as client:
        client.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    loop_thread.run(quiet.proxy.app[LEDGER].flush())
    note = "no price for claude-x: add it under prices: (its calls have no cost or savings)"

    page.get_by_label("Time range").select_option("1h")
    _loaded(page)
    expect(page.get_by_role("region", name="Send the first request")).to_have_count(0)
    for card in ("Compaction savings", "Cost"):
        expect(page.get_by_role("region", name=card).locator(".figure")).to_have_text("no price")
    expect(page.get_by_text(note)).to_be_visible()
    # one request: the count axis reads 0 1 2 3 4, never 0 0 1 1 1
    ticks = page.get_by_role("img", name="Requests, compactions and errors over time").locator("text.tick[data-tick]")
    expect(ticks).to_have_text(["0", "1", "2", "3", "4"])

    page.goto("/console/sessions")
    _loaded(page)
    row = page.get_by_role("table", name="Sessions").get_by_role("row").filter(
        has=page.get_by_role("link", name="quiet-1")
    )
    expect(row.locator("td.savings")).to_have_text("no price")
    expect(page.get_by_text(note)).to_be_visible()

    page.goto("/console/sessions/quiet-1")
    _loaded(page)
    headline = page.get_by_role("region", name="What this session saved")
    expect(headline.get_by_role("region", name="Dollars saved").locator(".figure")).to_have_text("no price")
    expect(headline).to_contain_text(note)
    expect(page.get_by_role("table", name="Turns").locator("td.savings")).to_have_text("no price")
    shown = page.locator("main").inner_text()
    assert "$0.00" not in shown and not re.search(r"\b(null|undefined|NaN)\b", shown)
