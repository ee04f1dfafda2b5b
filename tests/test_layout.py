"""The tree's shape: no import circle, short modules, and a map and prose that match it.

`lint-imports` checks the layers the contracts name; this walks the whole import
graph of `engine` and `functions` (imports under `TYPE_CHECKING` aside, lazy
ones included), so a circle between modules of one layer is found too. The
module tables of docs/architecture.md are checked against the files.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("engine", "functions", "infra")
MAX_LINES = 500
MAX_DOCSTRING_LINES = 15
READ_SUFFIXES = {".py", ".md", ".html", ".js", ".css", ".toml", ".yaml"}
PLANNING_REFERENCE = re.compile(r"\bseeds?\b|\bseed's\b|\bissues?\s+#?\d+", re.IGNORECASE)
# Alembic revisions are data Alembic loads by path, not modules of ours.
NOT_MODULES = ("infra/schema/migrations/",)


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


def build() -> grimp.ImportGraph:
    return grimp.build_graph(
        "engine", "functions", "infra", exclude_type_checking_imports=True, cache_dir=None
    )


def test_no_import_circle_in_the_engine_or_the_functions() -> None:
    graph = build()
    assert circles(graph, "engine") == []
    assert circles(graph, "functions") == []


def package_of(module: str) -> str:
    """The package a module of `functions` belongs to; a module at the top is its own."""
    path = ROOT / module.replace(".", "/")
    if path.is_dir() or module.count(".") == 1:
        return module
    return module.rpartition(".")[0]


def package_graph(graph: grimp.ImportGraph, package: str) -> grimp.ImportGraph:
    """The import graph of `package`'s modules collapsed to their packages."""
    packages = grimp.ImportGraph()
    for module in graph.modules:
        if module.startswith(package + "."):
            packages.add_module(package_of(module))
            for imported in graph.find_modules_directly_imported_by(module):
                if imported.startswith(package + ".") and (
                    package_of(imported) != package_of(module)
                ):
                    packages.add_import(importer=package_of(module), imported=package_of(imported))
    return packages


def test_no_package_of_the_functions_imports_another_in_a_circle() -> None:
    """`http` and `console` (or any two packages of `functions`) never import each other,
    however indirectly: the app factory that includes both sits above them."""
    assert circles(package_graph(build(), "functions"), "functions") == []


def test_the_package_walk_finds_a_circle_between_packages() -> None:
    """The check above sees a circle that no module-level walk would: `a.x -> b.y -> a.z`."""
    graph = grimp.ImportGraph()
    for importer, imported in (
        ("functions.http.app", "functions.console.routes"),
        ("functions.console.routes", "functions.http.errors"),
    ):
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph, "functions") == []
    assert circles(package_graph(graph, "functions"), "functions") == [
        ["functions.console", "functions.http"]
    ]


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


def test_module_docstrings_say_what_the_module_is_for_in_a_few_lines() -> None:
    """The why goes in docs/architecture.md; a module opens with at most 15 lines."""
    long = {}
    for path in source_modules():
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if docstring and len(docstring.splitlines()) > MAX_DOCSTRING_LINES:
            long[path.relative_to(ROOT).as_posix()] = len(docstring.splitlines())
    assert long == {}


def test_the_code_and_docs_read_on_their_own() -> None:
    """No reference to planning documents or tickets a reader of the repository cannot follow."""
    found = []
    for folder in (*SOURCE_FOLDERS, "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in READ_SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PLANNING_REFERENCE.search(line):
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{number}: {line.strip()}")
    assert found == []
