"""docs/reference/models.md is what docs/render_models.py renders from the catalogue's rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs_hook import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "render_models.py"


def _renderer() -> ModuleType:
    return load_script(SCRIPT, "render_models")


def test_the_committed_reference_page_is_the_rendered_catalogue() -> None:
    render = _renderer().render  # type: ignore[attr-defined]
    page = (ROOT / "docs" / "reference" / "models.md").read_text()
    assert page == render(), "docs/reference/models.md is stale: run python docs/render_models.py"
    assert page.startswith("# Model catalogue\n")
    assert "| Claude Opus 4.8 | `claude-opus-4-8` | `anthropic.claude-opus-4-8` |" in page
    assert "- `effort-2025-11-24`: bedrock: " in page


def test_the_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _renderer()
    stale = tmp_path / "models.md"
    stale.write_text("# Model catalogue\n\nold\n")
    monkeypatch.setattr(module, "PAGE", stale)
    assert module.main(["--check"]) == 1  # type: ignore[attr-defined]
    assert module.main([]) == 0  # type: ignore[attr-defined]
    assert module.main(["--check"]) == 0  # type: ignore[attr-defined]
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
