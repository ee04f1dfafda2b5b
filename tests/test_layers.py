"""The engine's shape: every import at the top of its module, and a public surface kept sorted.

`lint-imports` (in CI) checks the layers between modules; this checks what
it cannot see: an import hidden inside a function, which is how an import
circle hides. Only optional extras may be imported inside a guard, and those
at module level too (`engine/telemetry.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import engine

ENGINE = Path(engine.__file__).parent


def test_no_engine_module_imports_inside_a_function() -> None:
    hidden = []
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        where = path.relative_to(ENGINE)
                        hidden.append(f"{where}:{inner.lineno} in {node.name}()")
    assert hidden == []


def test_the_public_names_are_sorted_and_all_importable() -> None:
    assert engine.__all__ == sorted(engine.__all__)
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
