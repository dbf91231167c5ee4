"""The console in a real browser (Debian's chromium through Playwright), against a real proxy,
a real SQLite store and the fake upstream. Role-based selectors, Playwright's auto-waiting
``expect`` (no sleeps). Every test also checks: no console error, no page error, no dialog, no
request to another origin. Screenshots of the main pages go to ``test-artifacts/console/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from proxy.cli import figures
from tests.console.browser import Watched, open_watched, screenshot
from tests.console.conftest import (
    A_ERRORS,
    A_LONG,
    A_SESSION,
    A_TOKEN,
    B_SESSION,
    B_TOKEN,
    PAYLOAD,
    S_SESSION,
    S_TOKEN,
    Summarised,
    World,
)


@pytest.fixture
def watched(browser: Any, world: World) -> Iterator[tuple[Page, Watched]]:
    context, page, watch = open_watched(browser, world.url)
    yield page, watch
    context.close()
    watch.assert_clean()


def sign_in(page: Page, token: str = A_TOKEN) -> None:
    page.goto("/console/")
    expect(page.get_by_role("heading", name="context-proxy console")).to_be_visible()
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def test_sign_in_and_sign_out(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    page.goto("/console/sessions")
    expect(page).to_have_url(re.compile(r"/console/signin$"))
    screenshot(page, "signin")
    page.get_by_label("Admin token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Invalid admin token.")
    assert page.context.cookies() == []

    page.get_by_label("Admin token").fill(A_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_label("Tenant")).to_have_text("Tenant: acme")
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["secure"] is False  # plain http here; Secure + __Host- over TLS
    assert A_TOKEN not in cookie["value"] and len(cookie["value"]) >= 40
    assert cookie["path"] == "/" and cookie["expires"] > 0
    # The page's scripts cannot read it.
    assert page.evaluate("document.cookie") == ""

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/console/signin$"))
    assert page.context.cookies() == []
    # The old cookie is dead on the server too, not only forgotten by the browser.
    page.context.add_cookies(
        [{"name": cookie["name"], "value": cookie["value"], "url": page.url.split("/console")[0] + "/"}]
    )
    response = page.request.get("/admin/v1/sessions")
    assert response.status == 401
    page.goto("/console/")
    expect(page).to_have_url(re.compile(r"/console/signin$"))


def test_tenant_sees_only_its_sessions(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Sessions").click()
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
    table = page.get_by_role("table", name="Sessions")
    expect(table.get_by_role("link", name=A_SESSION)).to_be_visible()
    expect(page.get_by_text(B_SESSION)).to_have_count(0)
    screenshot(page, "sessions")

    # Another tenant's session answers exactly like one that does not exist.
    page.goto(f"/console/sessions/{B_SESSION}")
    expect(page.get_by_role("heading", name="Session not found")).to_be_visible()
    other = page.locator("main").inner_text()
    page.goto("/console/sessions/no-such-session")
    expect(page.get_by_role("heading", name="Session not found")).to_be_visible()
    assert page.locator("main").inner_text() == other
    for path in (f"/admin/v1/sessions/{B_SESSION}/state", "/admin/v1/sessions/no-such-session/state"):
        response = page.request.get(path)
        assert response.status == 404
        assert response.json()["error"] == {"type": "not_found_error", "message": "session not found"}

    # And globex's own token sees globex's session and not acme's.
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, B_TOKEN)
    page.goto("/console/sessions")
    expect(page.get_by_role("table", name="Sessions").get_by_role("link", name=B_SESSION)).to_be_visible()
    expect(page.get_by_text(A_SESSION)).to_have_count(0)


def test_untrusted_text_never_executes(watched: tuple[Page, Watched], world: World) -> None:
    page, watch = watched
    sign_in(page)
    page.goto(f"/console/sessions/{A_SESSION}")
    expect(page.get_by_role("heading", name=f"Session {A_SESSION}")).to_be_visible()

    transcript = page.get_by_role("region", name="Transcript")
    # The user's text, the model's answer and the tool result are shown as text, markup and all.
    expect(transcript.get_by_role("article", name="Event 1")).to_contain_text(f"Build it. {PAYLOAD}")
    expect(transcript.get_by_role("article", name="Event 2")).to_contain_text(f"Answer with markup: {PAYLOAD}")
    expect(transcript.get_by_role("article", name="Event 5")).to_contain_text(f"line 0: {PAYLOAD}")

    durable = page.get_by_role("region", name="Durable state")
    facts = durable.get_by_role("table", name="Facts")
    expect(facts).to_contain_text(f"The payload {PAYLOAD} is only text.")
    expect(facts.get_by_text("available")).to_be_visible()
    screenshot(page, "session")

    source = page.get_by_role("region", name="Source")
    facts.get_by_role("button", name="Show source").click()
    expect(source.get_by_label("Source content")).to_contain_text(f"Build it. {PAYLOAD}")
    expect(source).to_contain_text(world.fact_source)

    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main script, main iframe, main svg[onload]").count() == 0
    assert watch.dialogs == []


def test_security_headers_and_assets(watched: tuple[Page, Watched]) -> None:
    page, watch = watched
    response = page.goto("/console/signin")
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    sign_in(page)
    # Every request the pages made stayed on this origin (checked again at teardown).
    assert watch.requests and all(u.startswith(watch.origin + "/") for u in watch.requests)
    assert any(u.endswith("/console/static/app.js") for u in watch.requests)


def _points(page: Page, chart: str, series: str) -> list[float]:
    locator = page.get_by_role("img", name=chart).locator(f'[data-series="{series}"][data-index]')
    return [float(v) for v in locator.evaluate_all("els => els.map(e => e.dataset.value)")]


def test_overview_figures_and_chart_equal_the_ledger(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.get_by_label("Time range").select_option("1h")
    expect(page).to_have_url(re.compile(r"/console/\?range=1h$"))
    chart = page.get_by_role("img", name="Input tokens over time")
    expect(chart).to_be_visible()
    window = page.locator("main .charts")
    since, until, bucket = (window.get_attribute(a) for a in ("data-since", "data-until", "data-bucket"))
    # The same numbers straight from the API, and from the ledger's rows.
    summary = page.request.get(
        "/admin/v1/usage/summary", params={"since": since, "until": until, "bucket": bucket}
    ).json()
    rows = page.request.get("/admin/v1/usage", params={"limit": 1000}).json()["rows"]
    totals = summary["totals"]
    # 4 answered, a 529 and a reset; a summary and a retrieval call
    assert totals["calls"] == len(rows) == 8
    assert (totals["client_calls"], totals["summary_calls"], totals["retrieval_calls"]) == (6, 1, 1)
    assert totals["cache_read_input_tokens"] == sum(r["cache_read_input_tokens"] or 0 for r in rows) == 2048
    assert totals["cache_creation_input_tokens"] == 2048 + 512
    cards = {
        "Requests": f"{totals['client_calls']:,}",
        "Tokens saved": f"{totals['tokens_saved']:,}",
        "Cache hit ratio": f"{totals['cache_hit_ratio'] * 100:.1f}%",
        "Compaction events": f"{totals['compaction_events']:,}",
        "Summary failures": f"{totals['summary_failures']:,}",
        "Errors": f"{totals['errors']:,}",
    }
    for name, text in cards.items():
        expect(page.get_by_role("region", name=name).locator(".figure")).to_have_text(text)
    assert totals["errors"] == 2 and totals["compaction_events"] == 2
    series = summary["series"]
    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "tokens_saved"):
        assert _points(page, "Input tokens over time", key) == [b[key] for b in series], key
    assert sum(_points(page, "Input tokens over time", "cache_read_input_tokens")) == 2048
    assert _points(page, "Requests, compactions and errors over time", "errors") == [
        b["errors"] for b in series
    ]
    costs = _points(page, "Cost and savings over time", "cost_total")
    assert costs == [b["cost_usd"]["total"] for b in series] and sum(costs) > 0
    screenshot(page, "overview")


def test_session_page_timeline_turns_and_manifest(watched: tuple[Page, Watched], world: World) -> None:
    page, _watch = watched
    sign_in(page)
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Sessions").click()
    page.get_by_role("table", name="Sessions").get_by_role("link", name=A_SESSION).click()
    expect(page.get_by_role("heading", name=f"Session {A_SESSION}")).to_be_visible()
    rows = page.request.get(
        "/admin/v1/usage", params={"session": A_SESSION, "kind": "client"}
    ).json()["rows"]
    assert len(rows) == 2
    chart = "Tokens before and after compaction per turn"
    expect(page.get_by_role("img", name=chart)).to_be_visible()
    assert _points(page, chart, "tokens_before") == [r["tokens_before"] for r in rows]
    assert _points(page, chart, "tokens_after") == [r["tokens_after"] for r in rows]
    cache = "Prompt cache reads and writes per turn"
    assert _points(page, cache, "cache_read_input_tokens") == [
        r["usage"]["cache_read_input_tokens"] for r in rows
    ] == [0, 2048]
    assert _points(page, cache, "cache_creation_input_tokens") == [
        r["usage"]["cache_creation_input_tokens"] for r in rows
    ] == [2048, 512]
    assert _points(page, cache, "input_tokens") == [120, 310]
    for name in (chart, cache):  # the compaction event, at turn 2
        marker = page.get_by_role("img", name=name).locator("[data-marker-index]")
        expect(marker).to_have_attribute("data-marker-index", "1")
    assert rows[1]["tokens_after"] < rows[1]["tokens_before"]

    turns = page.get_by_role("table", name="Turns")
    expect(turns.get_by_role("row")).to_have_count(3)
    second = turns.get_by_role("row").nth(2)
    expect(second).to_contain_text("truncate")
    expect(second).to_contain_text("new")
    expect(second.locator("[data-compaction-id]")).to_have_attribute("data-compaction-id", world.compaction_id)
    saved = rows[1]["tokens_before"] - rows[1]["tokens_after"]
    expect(second.locator("[data-saved]")).to_have_text(f"{saved:,}")
    expect(second.locator("td.savings")).to_have_text(figures.usd(rows[1]["savings_usd"]))

    compaction = page.get_by_role("article", name=f"Compaction {world.compaction_id}")
    expect(compaction).to_contain_text("Tool result toolu_log1")
    compaction.get_by_text("Turn 2 ·").click()  # collapsed: one line, opened on demand
    compaction.get_by_role("button", name="Show artifact").click()
    source = page.get_by_role("region", name="Source")
    expect(source).to_contain_text(world.artifact_pointer)
    expect(source.get_by_text("available", exact=True)).to_be_visible()
    expect(source.get_by_label("Source content")).to_contain_text(f"line 399: {PAYLOAD}")
    assert page.evaluate("window.__xss") is None
    screenshot(page, "session-manifest")


def test_sessions_filter_and_sort(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.goto("/console/sessions")
    table = page.get_by_role("table", name="Sessions")
    expect(table.get_by_role("link")).to_have_count(3)
    listed = {e["session"]: e for e in page.request.get("/admin/v1/usage/sessions").json()["sessions"]}
    row = table.get_by_role("row").filter(has=page.get_by_role("link", name=A_SESSION))
    build = listed[A_SESSION]
    assert build["calls"] == 2 and build["compaction_events"] == 1
    cells = [f"{build['calls']:,}", f"{build['errors']:,}", f"{build['compaction_events']:,}",
             f"{build['total_input_tokens']:,}", f"{build['cache_hit_ratio'] * 100:.1f}%"]
    for text in cells:
        expect(row).to_contain_text(text)
    cost = row.locator("[data-usd]")
    assert float(cost.get_attribute("data-usd") or "nan") == build["cost_usd"]["total"] > 0
    expect(cost).to_have_text(figures.usd(build["cost_usd"]["total"]))  # rounded as the CLI rounds
    screenshot(page, "sessions-ledger")
    page.get_by_label("Status").select_option("error")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"status=error"))
    expect(table.get_by_role("link")).to_have_count(1)
    expect(table.get_by_role("link", name=A_ERRORS)).to_be_visible()
    page.get_by_label("Status").select_option("")
    page.get_by_label("Model").fill("claude-sonnet-4-5")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"model=claude-sonnet-4-5"))
    expect(table.get_by_role("link")).to_have_count(1)
    expect(table.get_by_role("link", name=A_SESSION)).to_be_visible()
    page.get_by_label("Model").fill("")
    page.get_by_label("Sort by").select_option("cost")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"sort=cost"))
    expect(table.get_by_role("link")).to_have_count(3)
    # The costlier session first (the failed calls cost nothing).
    expect(table.get_by_role("link").first).to_have_text(A_SESSION)
    page.get_by_label("Model").fill("no-such-model")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_text("No session matches.")).to_be_visible()


def test_health_panel(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Health").click()
    expect(page.get_by_role("heading", name="Health")).to_be_visible()
    expect(page.get_by_role("region", name="Readiness").locator(".figure")).to_have_text("ready")
    expect(page.get_by_role("region", name="Store").locator(".figure")).to_have_text("ok")
    for kind in ("session reads", "reads", "writes"):  # what the store's own operations found
        expect(page.locator(f'[data-store="{kind}"]')).to_have_text(f"{kind}: working")
    errors = page.get_by_role("table", name=re.compile("Upstream errors by kind"))
    expect(errors.get_by_role("row", name="reset")).to_contain_text("1")
    expect(errors.get_by_role("row", name="timeout")).to_contain_text("0")
    screenshot(page, "health")


def test_limits_page(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Limits").click()
    expect(page.get_by_role("heading", name="Limits")).to_be_visible()
    table = page.get_by_role("table", name="Budgets and rate limits")
    expect(table.get_by_role("row", name=re.compile("^Tenant: Budget \\(USD\\) per month"))).to_contain_text("$50.00")
    expect(table.get_by_role("row", name=re.compile("^Tenant: Requests per minute"))).to_contain_text("1,000")
    # the figures are the admin API's (the same counters), shown as text
    api = page.request.get("/admin/v1/quota").json()
    spend = next(e for e in api["limits"] if e["scope"] == "tenant" and e["metric"] == "spend_usd")
    cell = page.locator('tr[data-scope="tenant"][data-metric="spend_usd"] td').nth(1)
    expect(cell).to_have_attribute("data-value", re.compile(r"^[0-9.e-]+$"))
    assert float(cell.get_attribute("data-value") or "nan") == pytest.approx(spend["used"], abs=1e-9)
    expect(page.get_by_role("meter", name="Tenant: Budget (USD) used")).to_be_visible()
    screenshot(page, "limits")
    # globex has no limits, and sees none of acme's
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, B_TOKEN)
    page.goto("/console/limits")
    expect(page.get_by_text("No budget or rate limit applies to this tenant.")).to_be_visible()
    expect(page.get_by_role("table")).to_have_count(0)


def test_removed_messages_and_transcript_pages(watched: tuple[Page, Watched]) -> None:
    page, _watch = watched
    sign_in(page)
    page.goto(f"/console/sessions/{A_LONG}")
    expect(page.get_by_role("heading", name=f"Session {A_LONG}")).to_be_visible()
    (compaction,) = [
        r["compaction_id"]
        for r in page.request.get("/admin/v1/usage", params={"session": A_LONG}).json()["rows"]
        if r["compaction_id"] and r["plan"] == "new"
    ]
    article = page.get_by_role("article", name=f"Compaction {compaction}")
    expect(article).to_contain_text("Superseded file read removed: 2 messages")
    source = page.get_by_role("region", name="Source")
    article.locator("summary").click()
    # Message i of the conversation is transcript event i + 1, checked by the resolver.
    article.get_by_role("button", name="Show message 1", exact=True).click()
    expect(source).to_contain_text(f"transcript:{A_LONG}:2")
    expect(source.get_by_label("Source content")).to_contain_text("tool_use Read (toolu_r1)")
    expect(source.get_by_label("Source content")).to_contain_text("/src/app.py")
    article.get_by_role("button", name="Show message 2", exact=True).click()
    expect(source.get_by_label("Source content")).to_contain_text("tool_result for toolu_r1")
    expect(source.get_by_label("Source content")).to_contain_text("first read code")

    # The proxy's own calls count on the turn they served.
    turns = page.get_by_role("table", name="Turns").get_by_role("row")
    expect(turns).to_have_count(3)
    headers = page.get_by_role("table", name="Turns").get_by_role("columnheader").all_inner_texts()
    columns = (headers.index("Summary"), headers.index("Retrievals"))
    for n, expected in ((1, ["skipped", "0"]), (2, ["skipped · 1 call", "1"])):  # the header said skipped; the ledger has the call
        cells = turns.nth(n).locator("th, td").all_inner_texts()
        assert [cells[c] for c in columns] == expected, cells

    transcript = page.get_by_role("region", name="Transcript")
    events = transcript.get_by_role("article")
    expect(events).to_have_count(20)
    expect(events.first).to_have_attribute("data-seq", "1")
    transcript.get_by_role("button", name="Next events").click()
    expect(events.first).to_have_attribute("data-seq", "21")
    expect(events).to_have_count(10)  # 28 events, then "ok" is the answer, and "one more turn"
    expect(events.last).to_contain_text("assistant · answer")
    expect(transcript.get_by_role("button", name="Next events")).to_have_count(0)
    transcript.get_by_role("button", name="Previous events").click()
    expect(events.first).to_have_attribute("data-seq", "1")
    expect(events).to_have_count(20)



def _record_text(record: dict[str, Any]) -> str:
    """What the session page says of one manifest record, from the record's own figures."""
    n = len(record.get("message_indices", []))
    messages = f"{n:,} message" + ("" if n == 1 else "s")
    if record["kind"] == "summarized":
        calls = f"{record['calls']:,} summariser call" + ("" if record["calls"] == 1 else "s")
        return (
            f"Old turns summarised: {messages} of {record['tokens_before']:,} tokens replaced by a"
            f" summary of {record['summary_tokens']:,} tokens written in {calls}"
        )
    if record["kind"] == "removed" and record["reason"] == "dedup":
        return f"Superseded file read removed: {messages}, {record['tokens']:,} tokens"
    if record["kind"] == "removed":
        return f"Old turns removed: {messages}, {record['tokens']:,} tokens"
    return (
        f"Tool result {record['tool_use_id']} (message {record['message_index']}) cut from"
        f" {record['tokens_before']:,} to {record['tokens_after']:,} tokens"
    )


def test_each_manifest_record_kind_shows_its_own_figures(browser: Any, summarised: Summarised) -> None:
    context, page, watch = open_watched(browser, summarised.url)
    try:
        sign_in(page, S_TOKEN)
        page.goto(f"/console/sessions/{S_SESSION}")
        manifest = page.request.get(f"/admin/v1/manifests/{summarised.compaction_id}").json()["manifest"]
        records = manifest["records"]
        kinds = [r["kind"] if r["kind"] != "removed" else r["reason"] for r in records]
        assert "summarized" in kinds and "prune" not in kinds, kinds  # a real summarised compaction
        (summary,) = [r for r in records if r["kind"] == "summarized"]
        assert summary["tokens_before"] > summary["summary_tokens"] > 0 and summary["calls"] == 1
        assert len(summary["message_indices"]) >= 2
        article = page.get_by_role("article", name=f"Compaction {summarised.compaction_id}")
        article.locator("summary").click()
        shown = article.locator("li[data-record]")
        expect(shown).to_have_count(len(records))
        for n, record in enumerate(records):
            expect(shown.nth(n)).to_have_attribute("data-record", kinds[n])
            expect(shown.nth(n)).to_contain_text(_record_text(record))
        expect(article).not_to_contain_text("\u2013 tokens")  # fmtInt of a missing figure
        expect(article).not_to_contain_text("Old turns removed")  # summarised, not removed
        # Its removed messages are still there to read, by their transcript pointers.
        first = summary["message_indices"][0]
        article.locator('li[data-record="summarized"]').get_by_role(
            "button", name=f"Show message {first}", exact=True
        ).click()
        expect(page.get_by_role("region", name="Source")).to_contain_text(f"transcript:{S_SESSION}:{first + 1}")
        screenshot(page, "session-summarised")
    finally:
        context.close()
    watch.assert_clean()
