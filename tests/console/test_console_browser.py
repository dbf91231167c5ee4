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

from tests.console.browser import Watched, browser, screenshot
from tests.console.conftest import A_SESSION, A_TOKEN, B_SESSION, B_TOKEN, PAYLOAD, World

__all__ = ["browser"]  # the fixture, re-exported for pytest


@pytest.fixture
def watched(browser: Any, world: World) -> Iterator[tuple[Page, Watched]]:
    context = browser.new_context(base_url=world.url)
    page = context.new_page()
    watch = Watched(origin=world.url)
    page.on("console", lambda m: watch.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: watch.page_errors.append(str(e)))
    page.on("dialog", lambda d: (watch.dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: watch.on_request(r.url))
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
