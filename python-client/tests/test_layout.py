"""The package's module graph: no module imports, directly or through others, a module that
imports it (a circle makes the import order matter and a partly built module visible). Read from
the source with ``ast``, imports under ``TYPE_CHECKING`` included: a type-only circle is still
the two modules knowing each other, which the layout keeps to one direction."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import corral

PACKAGE = Path(corral.__file__).parent


def imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (``corral`` itself, the
    ``__init__`` that gathers the public names, is left out: every module is below it)."""
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                # Relative: `from . import _worker`, `from ._worker import Worker`.
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "corral":
                    found |= {alias.name for alias in node.names}
                elif node.module.startswith("corral."):
                    found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("corral.")}
        graph[name] = found & modules
    return graph


def circles(graph: dict[str, set[str]]) -> set[str]:
    """The modules that reach themselves through their imports."""
    found = set()
    for module in graph:
        reached: set[str] = set()
        waiting = list(graph[module])
        while waiting:
            step = waiting.pop()
            if step not in reached:
                reached.add(step)
                waiting.extend(graph[step])
        if module in reached:
            found.add(module)
    return found


def test_the_package_has_no_import_circles():
    graph = imports()
    assert {"_worker", "_plain", "_streaming", "_batch", "_serve"} <= set(graph)
    assert circles(graph) == set()


def test_relative_imports_are_read_too(tmp_path, monkeypatch):
    # A circle made with `from . import x` would otherwise pass unseen.
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("from . import _b\n")
    (tmp_path / "_b.py").write_text("from ._a import thing\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert imports() == {"_a": {"_b"}, "_b": {"_a"}}


def test_a_circle_is_found():
    # The check itself: a graph with a circle through three modules is caught.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {"a", "b", "c"}
    assert circles({"a": {"b"}, "b": set()}) == set()
