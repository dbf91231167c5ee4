"""``context-proxy admin usage``: the usage ledger's figures as tables for people, through the
real admin API (a real SQLite store, real HTTP), the command run as a user runs it (a child
process). Rows are written to the store as the ledger writes them, so every figure is known:
savings are the removed tokens at the input price (``proxy.core.ledger``: nothing cached).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import figures, usage_table
from proxy.core.ledger import LedgerEntry
from tests.test_admin import A_TOKEN, B_TOKEN, Admin, _cli, admin  # noqa: F401 (the fixture)

DAY = ("--since", "2026-12-01T00:00:00Z", "--until", "2026-12-02T00:00:00Z")


def _row(tenant: str, session: str, model: str, before: int, after: int, minute: int) -> LedgerEntry:
    at = datetime(2026, 12, 1, 10, minute, tzinfo=UTC)
    entry = LedgerEntry(
        at=at.isoformat(timespec="milliseconds"), at_ms=int(at.timestamp() * 1000),
        tenant=tenant, session=session, model=model, route="messages", kind="client",
        status=200, latency_ms=12.0, tokens_before=before, tokens_after=after,
        layers="truncate" if before > after else "none", plan="new" if before > after else "none",
        summary="skipped", compaction_id=f"cmp_{session}_{minute}" if before > after else None,
    )
    return entry.with_usage({
        "input_tokens": after, "output_tokens": 100,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    })


@pytest.fixture
def seeded(admin: Admin) -> Admin:  # noqa: F811 (the fixture, imported)
    admin.run(admin.store.record_usage([
        _row("acme", "demo-1", "claude-demo-1", 9_000, 3_000, 1),
        _row("acme", "demo-1", "claude-demo-1", 4_000, 4_000, 2),
        _row("acme", "mystery-1", "claude-x", 5_000, 1_000, 3),
        _row("globex", "globex-secret", "claude-demo-1", 50_000, 1_000, 4),
    ]))
    return admin


def _table(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The totals table: figure name -> its value column."""
    assert result.returncode == 0, result.stderr
    rows: dict[str, str] = {}
    for line in result.stdout.splitlines():
        found = re.match(r"  (\w[\w ]*?)\s{2,}(\S+)", line)
        if found and not line.startswith("    "):
            rows.setdefault(found.group(1), found.group(2))
    return rows


def test_totals_and_sessions_as_tables(seeded: Admin) -> None:
    result = _cli(seeded, "usage", *DAY)
    table = _table(result)
    assert result.stdout.startswith(
        "Usage of tenant acme, 2026-12-01 00:00Z to 2026-12-02 00:00Z\n"
    ), result.stdout
    assert table["requests"] == "3"
    assert table["tokens before"] == "18,000" and table["tokens after"] == "8,000"
    assert table["tokens saved"] == "10,000" and "55.6% of input" in result.stdout
    assert table["compactions"] == "2"
    # priced: claude-demo-1 (the demo's own price, $3 per million input tokens); claude-x is not
    saved_usd = 6_000 * 3 / 1e6
    assert table["savings"] == figures.usd(saved_usd) == "$0.018"
    assert table["cost"] == figures.usd((7_000 * 3 + 200 * 15) / 1e6) == "$0.024"
    assert (
        "  no price for claude-x: add it under prices: (its calls have no cost or savings)"
        in result.stdout.splitlines()
    )
    sessions = result.stdout[result.stdout.index("Sessions (all 2):"):].splitlines()
    assert sessions[1].split() == [
        "session", "last", "activity", "requests", "tokens", "saved", "saved", "compactions",
        "cost", "savings",
    ]
    mystery = next(line.split() for line in sessions if line.strip().startswith("mystery-1"))
    assert mystery[-4:] == ["no", "price", "no", "price"]  # unknown, not $0
    demo = next(line.split() for line in sessions if line.strip().startswith("demo-1"))
    assert demo[-2:] == ["$0.024", "$0.018"]
    assert "globex" not in result.stdout  # the token's tenant only


def test_one_unpriced_session_is_never_zero_dollars(seeded: Admin) -> None:
    result = _cli(seeded, "usage", *DAY, "--session", "mystery-1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage of session mystery-1 of tenant acme,")
    assert re.search(r"\n  cost\s+no price\n", result.stdout), result.stdout
    assert re.search(r"\n  savings\s+no price  ", result.stdout), result.stdout
    assert "no price for claude-x: add it under prices:" in result.stdout
    assert "$0.00" not in result.stdout
    assert "Sessions" not in result.stdout


def test_json_is_the_api_figures_unrounded(seeded: Admin) -> None:
    result = _cli(seeded, "usage", *DAY, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    api = seeded.call(
        "GET", "/admin/v1/usage/summary",
        params={"since": DAY[1], "until": DAY[3], "bucket": 86400},
    ).json()
    assert data["tenant"] == "acme" and data["totals"] == api["totals"]
    assert data["totals"]["savings_usd"] == pytest.approx(6_000 * 3 / 1e6)
    assert [s["session"] for s in data["sessions"]["sessions"]] == ["mystery-1", "demo-1"]


def test_the_tenant_check(seeded: Admin) -> None:
    assert _cli(seeded, "usage", *DAY, "--tenant", "acme").returncode == 0
    other = _cli(seeded, "usage", *DAY, "--tenant", "globex")
    assert other.returncode == 2 and other.stdout == ""
    assert "--tenant globex: the admin token is tenant acme's" in other.stderr
    globex = _cli(seeded, "usage", *DAY, "--tenant", "globex", token=B_TOKEN)
    assert globex.returncode == 0 and "globex-secret" in globex.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "yesterday"), "--since: expected an ISO 8601 time"),
        (("--since", "2026-12-01T10:00:00"), "(no offset: add Z)"),
        (("--until", "soon"), "--until: expected an ISO 8601 time"),
        (("--since", "2026-12-02", "--until", "2026-12-01"), "--since: expected a time before --until"),
        (("--sessions", "501"), "--sessions: expected 0 to 500"),
        (("--sessions", "-1"), "--sessions: expected 0 to 500"),
    ],
)
def test_usage_errors_exit_2(seeded: Admin, args: tuple[str, ...], message: str) -> None:
    result = _cli(seeded, "usage", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr


def test_an_api_error_exits_1_with_its_body(seeded: Admin) -> None:
    result = _cli(seeded, "usage", *DAY, "--model", "m" * 201)
    assert result.returncode == 1 and result.stdout == ""
    assert json.loads(result.stderr)["error"]["message"].startswith("model: expected a model id")


def test_the_token_from_a_file(seeded: Admin, tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text(A_TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXT_PROXY_", "CP_TEST"))}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "proxy", "admin", "--url", seeded.url, *args, "usage", *DAY],
            capture_output=True, text=True, timeout=60, env=env,
        )

    assert run("--token-file", str(token)).returncode == 0
    missing = run("--token-file", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "--token-file: cannot read" in missing.stderr
    token.write_text("\n")
    empty = run("--token-file", str(token))
    assert empty.returncode == 2 and "is empty" in empty.stderr


@pytest.mark.parametrize(
    ("value", "shown"),
    [(5.9006546578888015, "$5.90"), (1234.5678, "$1,234.57"), (0.0523, "$0.052"), (0.5, "$0.50"),
     (0.00012, "$0.00012"), (0, "$0.00"), (1e-9, "<$0.000001"), (-0.25, "-$0.25"), (None, "\u2013")],
)
def test_money_is_rounded_for_people(value: float | None, shown: str) -> None:
    assert figures.usd(value) == shown


def test_when_forms() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert usage_table.parse_when("24h", now) == datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    assert usage_table.parse_when("2w", now) == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert usage_table.parse_when("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert usage_table.parse_when("2026-12-01T10:00:00+02:00", now) == datetime(2026, 12, 1, 8, tzinfo=UTC)
    for bad in ("24", "h", "1y", "2026-12-01T10:00"):
        with pytest.raises(ValueError):
            usage_table.parse_when(bad, now)


def _render_of(totals: dict[str, Any]) -> str:
    return usage_table.render({"tenant": "t", "since": None, "until": None, "totals": totals}, None)


def test_a_partly_priced_total_is_shown_with_its_note() -> None:
    text = _render_of({"cost_usd": {"total": 1.5, "input": 1.5}, "savings_usd": 0.25,
                       "unpriced_models": ["claude-x"], "unpriced_note": "no price for claude-x: ..."})
    assert re.search(r"cost\s+\$1\.50", text) and re.search(r"savings\s+\$0\.25", text)
    assert text.rstrip().endswith("no price for claude-x: ...")
