"""The layers' import graphs have no circles (issue 15): every import counts, those
inside functions and under TYPE_CHECKING included, since a circle that only works
because an import is deferred is still one module that cannot be read without the
other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import minou

PACKAGE = Path(minou.__file__).parent


def imports_of(path: Path, package: str) -> set[str]:
    """The sibling modules of ``package`` that ``path`` imports, by module name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import a, b
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith(f"minou.{package}."):
            found.add(node.module.split(".")[2])
    return found


def cycle_in(package: str) -> list[str] | None:
    modules = {p.stem: p for p in (PACKAGE / package).glob("*.py")}
    graph = {name: imports_of(path, package) & modules.keys() for name, path in modules.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                return [*stack[stack.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


@pytest.mark.parametrize("package", ["core", "server", "storage", "protocol"])
def test_no_import_circle(package: str) -> None:
    assert cycle_in(package) is None, " -> ".join(cycle_in(package) or [])


def test_the_checker_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "loop" / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                            "if TYPE_CHECKING:\n    from .a import f\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert cycle_in("loop") == ["a", "b", "a"]
