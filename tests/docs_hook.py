"""The docs site's MkDocs hook (docs/hooks/reference.py), loaded as MkDocs loads it: the tests of
the generated reference pages call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

HOOK = Path(__file__).resolve().parent.parent / "docs" / "hooks" / "reference.py"


def load_hook() -> ModuleType:
    return load_script(HOOK, "docs_reference_hook")


def load_script(path: Path, name: str) -> ModuleType:
    """A script of docs/ (not a package) loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
