"""The public API as docs/api.md lists it: the same names as `engine.__all__`, each importable.

The doors and infra import only these (`lint-imports` holds them to it); `mypy` cannot
see a name missing from `engine`, since its PEP 562 `__getattr__` answers any name, so
a door's `from engine import X` of a name the engine does not export is checked here.
"""

from __future__ import annotations

import ast
import re

import engine
from tests.helpers import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "api.md"
ENTRY = re.compile(r"^- `([A-Za-z_][A-Za-z0-9_]*)`: \S", re.MULTILINE)
PUBLIC_SUBMODULES = {"engine", "engine.testing", "engine.dataclass"}


def documented() -> list[str]:
    return ENTRY.findall(PAGE.read_text())


def engine_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every import from `engine` or below in functions/ and infra/,
    those for type checkers included."""
    found = []
    for root in ("functions", "infra"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            where = path.relative_to(REPO_ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=where)):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    if node.module.split(".")[0] == "engine":
                        found += [(where, node.module, alias.name) for alias in node.names]
                elif isinstance(node, ast.Import):
                    found += [
                        (where, alias.name, "")
                        for alias in node.names
                        if alias.name.split(".")[0] == "engine"
                    ]
    return found


def test_the_page_documents_every_public_name_once_and_nothing_else() -> None:
    names = documented()
    assert sorted(name for name in set(names) if names.count(name) > 1) == []
    assert sorted(set(engine.__all__) - set(names)) == []  # exported, not documented
    assert sorted(set(names) - set(engine.__all__)) == []  # documented, not exported


def test_every_public_name_resolves() -> None:
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert set(engine.__all__) <= set(dir(engine))


def test_the_doors_import_only_public_names() -> None:
    imports = engine_imports()
    assert any(module == "engine" for _, module, _ in imports)  # the walk found them
    private = [(where, module) for where, module, _ in imports if module not in PUBLIC_SUBMODULES]
    assert private == []
    unknown = [
        (where, name)
        for where, module, name in imports
        if module == "engine" and name not in engine.__all__
    ]
    assert unknown == []
