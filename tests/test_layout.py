"""The tree's shape: no import circle, no module past 500 lines, and a map that matches it.

`lint-imports` checks the layers the contracts name; this walks the whole import
graph of `engine` and `functions` (imports under `TYPE_CHECKING` aside, lazy
ones included), so a circle between modules of one layer is found too. The
module tables of docs/architecture.md are checked against the files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("engine", "functions", "infra")
MAX_LINES = 500
# Alembic revisions are data Alembic loads by path, not modules of ours.
NOT_MODULES = ("infra/migrations/",)


def source_modules() -> Iterator[Path]:
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(NOT_MODULES):
                yield path


def circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith(package):
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_in_the_engine_or_the_functions() -> None:
    graph = grimp.build_graph(
        "engine", "functions", "infra", exclude_type_checking_imports=True, cache_dir=None
    )
    assert circles(graph, "engine") == []
    assert circles(graph, "functions") == []


def test_no_module_is_over_500_lines() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): lines
        for path in source_modules()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_architecture_names_every_module_and_only_modules_that_exist() -> None:
    """Every `.py` path in a table row of docs/architecture.md exists; every module is named
    in one (a package's `__init__.py` is named by its folder's row)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    # A module's path, or a folder's (`engine/` and `engine/base/` alike).
    path = r"`((?:engine|functions|infra)/(?:[\w/]*\.py|(?:\w+/)*))`"
    named = set(re.findall(path, "\n".join(rows)))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == []
    unnamed = []
    for path in source_modules():
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py":
            relative = relative.removesuffix("__init__.py")
        if relative not in named:
            unnamed.append(relative)
    assert unnamed == []
