"""The error tree: the engine raises its own classes, so `except DulyError` catches them.

- no module of engine/ raises a bare ValueError, TypeError, KeyError or
  RuntimeError outside ALLOWED: test_the_engine_raises_no_bare_builtin_error
- where the documented contract is a builtin, the class is both:
  test_each_class_is_a_duly_error_and_keeps_its_builtin
- a class docstring is the message when none is given:
  test_a_class_docstring_is_the_default_message
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import engine
from engine.base import errors

ENGINE = Path(engine.__file__).parent
BUILTINS = frozenset({"ValueError", "TypeError", "KeyError", "RuntimeError"})

# Bare builtin raises that are meant: (module path under engine/, builtin). Keep it empty
# unless a raise must be exactly the builtin (and say why on its line).
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def bare_raises() -> list[tuple[str, int, str]]:
    """Every `raise ValueError(...)` (and the other builtins) in engine/: path, line, name."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id in BUILTINS:
                relative = path.relative_to(ENGINE).as_posix()
                if (relative, raised.id) not in ALLOWED:
                    found.append((relative, node.lineno, raised.id))
    return found


def test_the_engine_raises_no_bare_builtin_error() -> None:
    found = bare_raises()
    assert not found, "bare builtin raises:\n" + "\n".join(
        f"  engine/{path}:{line}: raise {name}" for path, line, name in found
    )


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.ConfigurationError, ValueError),
        (errors.InvalidArgumentError, ValueError),
        (errors.StepError, TypeError),
        (errors.UnsupportedTypeError, TypeError),
        (errors.NotAWorkflowError, TypeError),
        (errors.NotInStepError, RuntimeError),
        (errors.InternalError, RuntimeError),
        (errors.NotFoundError, LookupError),
    ],
)
def test_each_class_is_a_duly_error_and_keeps_its_builtin(
    cls: type[errors.DulyError], builtin: type[Exception]
) -> None:
    assert issubclass(cls, errors.DulyError) and issubclass(cls, builtin)
    with pytest.raises(errors.DulyError):
        raise cls("refused")


def test_the_tree_drawn_in_the_architecture_names_every_class() -> None:
    """docs/architecture.md's "Errors" section draws every class of the module."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    drawn = page.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    classes = [
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.DulyError)
    ]
    assert [name for name in classes if name not in drawn] == []
    assert set(classes) <= set(engine.__all__)


def test_a_class_docstring_is_the_default_message() -> None:
    assert str(errors.NotInStepError()) == (
        "No step attempt is running: this call is for a step body."
    )
    assert str(errors.InvalidArgumentError("every() needs a positive interval.")) == (
        "every() needs a positive interval."
    )
