"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``, and a
broken link, a broken anchor or a page left out of the navigation fails that build; the generated
reference pages show what the code has (metrics, commands, admin routes); the headers page names
exactly the headers the proxy reads and writes; the README stays a landing page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.docs_hook import load_hook

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return load_hook()


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.timeout(300)
def test_the_site_builds_strict_with_the_generated_reference(tmp_path: Path) -> None:
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert "<code>compaction.summary.input_budget</code>" in page
    assert "<code>quota.per_key.budget_usd</code>" in page  # the policy part too
    assert "generated:" not in page  # every marker replaced
    metrics = (tmp_path / "site" / "reference" / "metrics" / "index.html").read_text()
    assert "<code>context_proxy_requests_total</code>" in metrics
    # offline: the theme fetches no fonts (theme.font: false)
    assert "fonts.googleapis.com" not in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.timeout(300)
def test_a_broken_link_anchor_or_a_page_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(DOCS, root / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    index = root / "docs" / "index.md"
    index.write_text(
        index.read_text()
        + "\n[gone](guides/no-such-page.md) and [no anchor](guides/compaction.md#no-such-heading)\n"
    )
    (root / "docs" / "orphan.md").write_text("# A page nobody put in the nav\n")
    built = _build(root, tmp_path / "site")
    assert built.returncode != 0
    log = built.stdout + built.stderr
    assert "contains a link 'guides/no-such-page.md', but the target is not found" in log
    assert "does not contain an anchor '#no-such-heading'" in log
    assert re.search(r"not included in the \"nav\" configuration:\s+- orphan\.md", log), log[-2000:]


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(items: list[object]) -> list[str]:
        out: list[str] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(value) if isinstance(value, list) else [str(value)]
        return out

    nav = pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
    assert sorted(nav) == on_disk
    assert config["theme"]["font"] is False


def test_the_metrics_page_lists_every_metric_the_code_registers(hook: ModuleType) -> None:
    shown = {m.name.removesuffix("_total") for m in hook.metric_rows()}
    declared: set[str] = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        declared |= set(re.findall(r"(?:Counter|Gauge|Histogram)(?:MetricFamily)?\(\s*\"(context_proxy_\w+)\"", path.read_text()))
    assert declared and shown == declared
    rows = {m.name: m for m in hook.metric_rows()}
    assert rows["context_proxy_usage_tokens_total"].labels == ("tenant", "model", "type")
    assert rows["context_proxy_upstream_latency_seconds"].type == "histogram"
    assert rows["context_proxy_cache_evictions_total"].labels == ("cache",)


def test_the_cli_page_shows_every_command_and_option(hook: ModuleType) -> None:
    import argparse

    from proxy.cli.main import build_parser

    text = hook.cli()

    def walk(parser: argparse.ArgumentParser) -> None:
        assert f"`{parser.prog}`" in text, parser.prog
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text, (parser.prog, option)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    assert "### `context-proxy admin`" in text and "#### `context-proxy admin add-fact`" in text


def test_the_admin_api_page_lists_every_operation_of_the_openapi_file(hook: ModuleType) -> None:
    spec = yaml.safe_load((DOCS / "admin-openapi.yaml").read_text())
    text = hook.admin_api()
    operations = [(m.upper(), p) for p, item in spec["paths"].items() for m in item if m in hook.METHODS]
    assert len(operations) > 15
    for method, path in operations:
        assert f"| {method} | `{path}` |" in text, (method, path)
    assert "| GET | `/usage` | Usage ledger rows" in text and "`since`, `until`" in text


# --- headers --------------------------------------------------------------------------------------

# The proxy's own header families: every one the code names must be on the headers page, and
# every one the page names must be in the code.
OWN = re.compile(r"^x-(?:compaction|durable|upstream|context-proxy|session|agent|parent-agent|claude-code)[a-z0-9-]*$")


def _source_headers() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        found |= {h for h in re.findall(r"[\"'](x-[a-z0-9-]+)[\"']", path.read_text()) if OWN.match(h)}
    from proxy.core.quota import HEADER_PREFIX

    for scope in ("requests", "input-tokens", "output-tokens"):  # built from parts
        for field in ("limit", "remaining", "reset"):
            found.add(f"{HEADER_PREFIX}ratelimit-{scope}-{field}")
    found |= {f"{HEADER_PREFIX}budget-limit-usd", f"{HEADER_PREFIX}budget-remaining-usd",
              f"{HEADER_PREFIX}budget-reset"}
    return found - {"x-context-proxy-"}


def _page_headers() -> set[str]:
    text = (DOCS / "reference" / "headers.md").read_text()
    names = set(re.findall(r"`(x-[a-z0-9-]+)(?::[^`]*)?`", text))
    for base, tails in re.findall(r"`(x-context-proxy-ratelimit-[a-z-]+?)-limit`, `(-remaining`, `-reset)", text):
        del tails
        names |= {f"{base}-limit", f"{base}-remaining", f"{base}-reset"}
    return {n for n in names if OWN.match(n)}


def test_the_headers_page_names_exactly_the_headers_the_proxy_reads_and_writes() -> None:
    source, page = _source_headers(), _page_headers()
    assert source - page == set(), "headers the code uses that the page does not describe"
    assert page - source == set(), "headers the page describes that the code does not use"


# --- the README -----------------------------------------------------------------------------------


def test_the_readme_is_a_landing_page_with_the_ci_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 200
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install -e '.[test]' && python -m pytest"
    assert command in ci.splitlines() and command in lines
    first_screen = "\n".join(lines[:40])
    for needle in ("Python 3.11", "git clone", "python3 -m venv", "context-proxy serve"):
        assert needle in first_screen, needle
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target
