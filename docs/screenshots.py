"""Make the console screenshots the docs show, from the keyless demo:

    python docs/screenshots.py

runs ``context-proxy serve --demo`` in a temporary folder (any free port), signs in with the link
it prints, takes the Overview before any request, runs ``examples/demo_agent_loop.py`` for a
30-request session, then takes the Overview and the session page, in Debian's chromium through
Playwright (``apt-get install chromium``; no downloaded browser):

    docs/images/console-overview-empty.png
    docs/images/console-overview-demo.png
    docs/images/console-session.png    (the whole page: a 30-turn session, about three screens)

Rerun it after changing the console; the test of the session page's height is
tests/console/test_console_savings.py.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from tests.console.browser import CHROMIUM_ARGS, chromium_path  # noqa: E402
from tests.demo_process import DemoServe, run_agent, serve_demo  # noqa: E402

IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1440, "height": 1080}


def main() -> int:
    executable = chromium_path()
    if executable is None:
        print("screenshots: needs Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="screenshots-") as folder:
        cwd = Path(folder)
        served = DemoServe(serve_demo("--port", "0"), cwd)
        try:
            banner = served.banner()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
                page = browser.new_page(base_url=banner.url, viewport=VIEWPORT)
                page.goto(banner.console_link)
                settled = page.locator("main[aria-busy=false]")
                expect(page.get_by_role("region", name="Send the first request")).to_be_visible()
                page.screenshot(path=str(IMAGES / "console-overview-empty.png"))

                ran = run_agent(
                    sys.executable, cwd, "--url", banner.url, "--files", "25",
                    "--token-file", str(cwd / banner.token_file),
                )
                if ran.returncode != 0:
                    print(ran.stdout + ran.stderr, file=sys.stderr)
                    return 1
                print(ran.stdout.strip().splitlines()[-3])
                session = re.search(r"^Session (\S+):", ran.stdout, re.M)
                assert session is not None

                page.goto("/console/?range=1h")
                expect(page.get_by_role("img", name="Input tokens over time")).to_be_visible()
                expect(settled).to_have_count(1)
                page.screenshot(path=str(IMAGES / "console-overview-demo.png"), full_page=True)

                page.goto(f"/console/sessions/{session.group(1)}")
                expect(page.get_by_role("region", name="What this session saved")).to_be_visible()
                expect(settled).to_have_count(1)
                page.screenshot(path=str(IMAGES / "console-session.png"), full_page=True)
                height = page.evaluate("document.documentElement.scrollHeight")
                print(f"session page: {height} px tall at {VIEWPORT['width']}x{VIEWPORT['height']}")
                browser.close()
        finally:
            served.stop()
    for name in ("console-overview-empty", "console-overview-demo", "console-session"):
        print(IMAGES / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
