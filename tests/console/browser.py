"""Playwright for Python driving Debian's chromium (never a downloaded browser).

The ``browser`` fixture (here; ``conftest.py`` and the quick-start test import it) skips, with the reason, only when no chromium is installed; CI installs it
(``.ci/run``). ``Watched`` is a page whose every console error, page error, dialog and request
to another origin is recorded, so that every test asserts none happened.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CONTEXT_PROXY_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


@dataclass
class Watched:
    origin: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    off_origin: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def on_request(self, url: str) -> None:
        self.requests.append(url)
        parts = urlsplit(url)
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            self.off_origin.append(url)

    def assert_clean(self) -> None:
        assert self.dialogs == [], self.dialogs
        assert self.page_errors == [], self.page_errors
        assert self.console_errors == [], self.console_errors
        assert self.off_origin == [], self.off_origin


def open_watched(browser: Any, origin: str, **options: Any) -> tuple[Any, Any, Watched]:
    """A new context and page on ``origin`` whose console errors, page errors, dialogs (dismissed)
    and requests are recorded: ``(context, page, watch)``; ``watch.assert_clean()`` at the end."""
    context = browser.new_context(base_url=origin, **options)
    page = context.new_page()
    watch = Watched(origin=origin)
    page.on("console", lambda m: watch.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: watch.page_errors.append(str(e)))
    page.on("dialog", lambda d: (watch.dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: watch.on_request(r.url))
    return context, page, watch


def screenshot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium through Playwright (skipped, with the reason, when none is installed).
    Module scope: the sync API runs an event loop in this thread while it is open, and later
    tests call asyncio.run()."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()
