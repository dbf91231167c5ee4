"""The package's shape, kept by tests: no import circles anywhere in ``proxy/``, and ``proxy/``
itself holds only packages and the entry point (issue 27, items 3 and 4).

Every import of a ``proxy`` module counts: at module level, under ``if TYPE_CHECKING:``, inside a
function, absolute or relative, and ``from proxy.a import b`` where ``b`` is a module. A type-only
or function-level import still ties two modules together: the types a protocol names must live
below it, not above.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "proxy"


def module_names(root: Path) -> dict[str, Path]:
    """Each module's dotted name (a package is its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolved against the importing module's package
            base = module.split(".")
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        yield target
        for alias in node.names:
            yield f"{target}.{alias.name}"


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its text)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for target in _imported(node, name, is_package):
                # ``import a.b.c`` runs a, a.b and a.b.c; the package root itself is no edge
                while target and target != root.name:
                    if target in modules and target != name:
                        graph[name].add(target)
                        break
                    target = target.rpartition(".")[0]
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_there_is_no_import_circle_in_the_package() -> None:
    found = circles(import_graph(PACKAGE))
    assert found == [], "import circles (modules that import each other):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found
    )


def test_the_checker_finds_every_kind_of_circle(tmp_path: Path) -> None:
    """A planted circle of each kind is found: the test above can fail."""
    pkg = tmp_path / "proxy"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "free.py").write_text("import json\nfrom proxy import a\n")  # the root and a package: no circle
    # type-only
    (pkg / "a" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from proxy.a.health import Health\n"
    )
    (pkg / "a" / "health.py").write_text("from proxy.a.base import Store\n")
    # function-level, and a submodule named in a from-import
    (pkg / "x.py").write_text("def f():\n    from proxy import y\n")
    (pkg / "y.py").write_text("import proxy.x\n")
    # relative, three long
    (pkg / "a" / "p.py").write_text("from . import q\n")
    (pkg / "a" / "q.py").write_text("from .r import thing\n")
    (pkg / "a" / "r.py").write_text("from ..a.p import other\n")
    assert sorted(circles(import_graph(pkg))) == [
        ["proxy.a.base", "proxy.a.health"],
        ["proxy.a.p", "proxy.a.q", "proxy.a.r"],
        ["proxy.x", "proxy.y"],
    ]


def test_the_top_of_the_package_holds_only_packages_and_the_entry_point() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"modules at the top of proxy/ (put each in the package of its part): {loose}"
