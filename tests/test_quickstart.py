"""The quick start (docs/quickstart.md), followed literally on a fresh install.

The commands are read from the page's ``bash`` blocks and run as written, in a shell with nothing
set up (no ``CONTEXT_PROXY_*`` or ``ANTHROPIC_*`` variable, no virtual environment on the path):
a copy of the repository stands for the clone (the files git has, committed or not), then the
install block creates its own ``.venv`` and installs the package into it; ``context-proxy serve
--demo`` runs from that venv, and ``python examples/demo_agent_loop.py`` from another shell in the
same folder. Asserted: the printed savings line, the console's Overview showing non-zero savings
for the demo model (Debian's chromium), and the page's ``context-proxy admin ... usage``.

When port 8080 is taken on this machine, the page's own "If port 8080 is taken" commands are
followed instead, with a free port in place of 8081.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.browser import browser, open_watched, screenshot  # noqa: F401 (the fixture)
from tests.demo_process import ROOT, SAVINGS_LINE, Banner, DemoServe, clean_env

DOC = ROOT / "docs" / "quickstart.md"
INSTALL_SECONDS = 600

pytestmark = pytest.mark.timeout(INSTALL_SECONDS + 300)


def bash_blocks(text: str) -> list[list[str]]:
    """Each ```bash block's command lines, in order."""
    return [
        [line.strip() for line in block.splitlines() if line.strip()]
        for block in re.findall(r"^ *```bash\n(.*?)^ *```", text, re.M | re.S)
    ]


def fresh_env() -> dict[str, str]:
    """A newcomer's shell: nothing of ours set, no virtual environment on the path."""
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p and sys.prefix not in p
    )
    return env


def copy_of_the_repository(into: Path) -> None:
    """What a clone holds: the files git knows (committed, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_venv(line: str) -> list[str]:
    """A documented line, run as typed in a shell where the venv was activated."""
    return ["bash", "-c", f". .venv/bin/activate && exec {line}"]


@dataclass
class Followed:
    clone: Path
    banner: Banner
    agent_output: str
    commands: dict[str, str]


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Followed]:
    blocks = bash_blocks(DOC.read_text())
    install, start, loop, usage, taken = blocks[0], blocks[1], blocks[2], blocks[3], blocks[4]
    assert install[:2] == ["git clone <this repository's URL> context-proxy", "cd context-proxy"]
    assert install[2:] == ["python3 -m venv .venv", ". .venv/bin/activate", "pip install -e ."]
    assert start == ["context-proxy serve --demo"]
    assert loop == [". .venv/bin/activate", "python examples/demo_agent_loop.py"]
    assert usage == [
        "context-proxy admin --url http://127.0.0.1:8080 --token-file state/demo/admin-token usage"
    ]
    assert taken == [
        "context-proxy serve --demo --port 8081",
        "python examples/demo_agent_loop.py --url http://127.0.0.1:8081",
    ]
    commands = {"serve": start[0], "agent": loop[1], "usage": usage[0]}
    if not _port_free(8080):  # the page's own way out, on a port free here
        port = str(_free_port())
        commands = {
            "serve": taken[0].replace("8081", port),
            "agent": taken[1].replace("8081", port),
            "usage": usage[0].replace("8080", port),
        }

    clone = tmp_path_factory.mktemp("quickstart") / "context-proxy"
    copy_of_the_repository(clone)
    installed = subprocess.run(
        ["bash", "-e", "-c", "\n".join(install[2:])], cwd=clone, env=fresh_env(),
        capture_output=True, text=True, timeout=INSTALL_SECONDS,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert (clone / ".venv" / "bin" / "context-proxy").exists()

    served = DemoServe(_in_venv(commands["serve"]), clone, env=fresh_env())
    try:
        banner = served.banner()
        # what the demo says to run next is what the page says
        assert banner.next_commands[0] == commands["agent"], banner.next_commands
        ran = subprocess.run(
            ["bash", "-c", f"{loop[0]}\n{commands['agent']}"], cwd=clone, env=fresh_env(),
            capture_output=True, text=True, timeout=300,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        yield Followed(clone, banner, ran.stdout, commands)
    finally:
        served.stop()


def test_the_agent_loop_prints_its_savings(followed: Followed) -> None:
    found = SAVINGS_LINE.search(followed.agent_output)
    assert found, followed.agent_output
    assert int(found["tokens"].replace(",", "")) > 0 and float(found["usd"].replace(",", "")) > 0
    assert 0 < float(found["share"]) < 100
    assert int(found["requests"]) == 25 and int(found["compactions"]) >= 1
    assert "It cost $" in followed.agent_output and "at claude-demo-1's (demo) price" in followed.agent_output
    assert (followed.clone / "state" / "demo" / "context-proxy.db").is_file()  # where the page says


def test_the_console_overview_shows_the_savings_of_the_demo_model(
    followed: Followed, browser: Any  # noqa: F811 (the fixture, imported)
) -> None:
    origin = followed.banner.url
    context, page, watch = open_watched(browser, origin, viewport={"width": 1440, "height": 1080})
    try:
        page.goto(followed.banner.console_link)  # the printed link: signed in, on the Overview
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.locator("main")).to_have_attribute("aria-busy", "false")
        savings = page.get_by_role("region", name="Compaction savings").locator(".figure")
        expect(savings).to_have_text(re.compile(r"^\$[\d,.]+$"))
        assert float(savings.get_attribute("data-value") or "0") > 0
        assert page.get_by_text("no price").count() == 0
        screenshot(page, "quickstart-overview")
        # the savings are the demo model's
        page.goto("/console/sessions")
        row = page.get_by_role("table", name="Sessions").locator("tbody tr").first
        expect(row).to_contain_text("claude-demo-1")
        expect(row.locator("td.savings")).to_have_text(re.compile(r"^\$[\d,.]+$"))
    finally:
        context.close()
    watch.assert_clean()


def test_admin_usage_as_the_page_shows_it(followed: Followed) -> None:
    shown = subprocess.run(
        _in_venv(followed.commands["usage"]), cwd=followed.clone, env=fresh_env(),
        capture_output=True, text=True, timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Usage of tenant default,")
    assert re.search(r"\n  savings +\$[\d,.]+ ", shown.stdout), shown.stdout
    assert re.search(r"\n  requests +25 ", shown.stdout), shown.stdout
    assert "no price" not in shown.stdout  # the demo model has its price
