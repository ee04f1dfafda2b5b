"""The engine's shape: every import at the top of its module, and a public surface kept sorted.

`lint-imports` (in CI) checks the layers between modules; this checks what
it cannot see: an import hidden inside a function, which is how an import
circle hides. Only optional extras may be imported inside a guard, and those
at module level too (`engine/model/telemetry.py`); a library named in
DEFERRED is imported where it is first needed, so a process that never
needs it never loads it. The graph layer's public names
are imported by `engine` when first asked for (a Lambda wake runs no graph).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import engine

ENGINE = Path(engine.__file__).parent
ROOT = ENGINE.parent
# Libraries (never engine modules) an engine module may import inside a function, and why.
DEFERRED = {
    "pydantic": "a step's parameters are checked with it: a wake of steps that take none "
    "(tests/test_lambda_cold_start.py) never loads it",
}


def test_no_engine_module_imports_inside_a_function() -> None:
    hidden = []
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        names = (
                            [a.name for a in inner.names]
                            if isinstance(inner, ast.Import)
                            else [inner.module or ""]
                        )
                        if all(name.split(".")[0] in DEFERRED for name in names):
                            continue
                        where = path.relative_to(ENGINE)
                        hidden.append(f"{where}:{inner.lineno} in {node.name}()")
    assert hidden == []


def test_the_public_names_are_sorted_and_all_importable() -> None:
    assert engine.__all__ == sorted(engine.__all__)
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name


def test_the_graph_layer_is_imported_when_first_asked_for() -> None:
    """A process that runs no graph (a Lambda wake) does not import the graph layer; a graph
    name imported from `engine` brings it, as any other name."""
    probe = (
        "import sys, engine\n"
        "before = any(m.startswith('engine.graphs') for m in sys.modules)\n"
        "from engine import GraphRuntime, graph_tables\n"
        "print(before, GraphRuntime.__module__, 'engine.graphs.tables' in sys.modules)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert ran.stdout.split() == ["False", "engine.graphs.moves.runtime", "True"]
