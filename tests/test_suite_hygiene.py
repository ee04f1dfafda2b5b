"""The suite's own rules, read from its source with `ast`.

- no module imports from a test module: what two modules share lives in
  tests/helpers.py, the other helper modules or a conftest fixture;
- no sleep of a literal 0.2 s or more, outside `LONG_SLEEPS` (each entry says why
  that sleep is the thing under test): a test waits on a condition instead;
- every test function checks something: an `assert`, `pytest.raises` (or warns,
  fail) or a call of a helper named in `ASSERTING_HELPERS` or starting `assert_`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LONGEST_SLEEP = 0.2  # seconds: a literal sleep this long or longer must be allowlisted

# (module, function) -> why its literal sleep is the thing under test. An absence over
# time (no query, no run, few looks) can only be seen by letting the time pass.
LONG_SLEEPS = {
    ("apps/serverless_app.py", "grind"): "Stuck's step outlasts every Lambda invocation",
    ("test_deploys.py", "test_a_handed_back_row_keeps_its_age_and_is_not_claimed_again"): (
        "how often a worker looks in a second at a row it cannot run"
    ),
    ("test_idle.py", "test_a_worker_rederives_its_wait_from_the_wall_clock_after_a_suspend"): (
        "a quiet spell with no look begun is what shows none is on its way"
    ),
    ("test_lanes.py", "test_a_default_worker_never_runs_a_media_step"): (
        "few looks in half a second, none of them a run of the other lane's step"
    ),
    ("test_worker.py", "test_an_idle_worker_makes_no_query_between_wake_ups"): (
        "no statement reaches the server in two seconds of sleep"
    ),
    ("test_worker.py", "test_connect_workflows_runs_nothing"): (
        "without a worker, a due step stays unrun while time passes"
    ),
}

# Helpers whose call is the test's check (each raises when what it checks is not so).
ASSERTING_HELPERS = {
    "expect",  # playwright's assertions: expect(locator).to_...
    "accessible",  # tests/browser/conftest.py: axe-core finds nothing serious
    "play",  # test_wait_properties: every action's result asserted against the rules
}
PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}


def modules(pattern: str = "*.py") -> Iterator[Path]:
    yield from sorted(path for path in TESTS.rglob(pattern) if "__pycache__" not in path.parts)


def each_test_module() -> Iterator[Path]:
    yield from (path for path in modules("test_*.py"))


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS)}:{getattr(node, 'lineno', 0)}"


def imported_test_module(node: ast.AST) -> str | None:
    """The test module that `node` imports from, if it imports from one."""
    names: list[str] = []
    if isinstance(node, ast.ImportFrom):
        if node.module is None:  # `from . import test_x`
            names = [alias.name for alias in node.names]
        else:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    for name in names:
        if any(part.startswith("test_") for part in name.split(".")):
            return name
    return None


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def constant_seconds(node: ast.expr) -> float | None:
    """The value of a numeric literal, or of arithmetic on literals; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp):
        left, right = constant_seconds(node.left), constant_seconds(node.right)
        if left is None or right is None:
            return None
        operators = {
            ast.Add: left + right,
            ast.Sub: left - right,
            ast.Mult: left * right,
            ast.Div: left / right if right else None,
        }
        return operators.get(type(node.op))
    return None


def sleeps(tree: ast.Module) -> Iterator[tuple[str, ast.Call, float]]:
    """Every sleep of a literal length: the function it is in, the call, the seconds."""

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, ast.Call, float]]:
        for child in ast.iter_child_nodes(node):
            inside = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inside = child.name
            if isinstance(child, ast.Call) and called_name(child) == "sleep" and child.args:
                seconds = constant_seconds(child.args[0])
                if seconds is not None:
                    yield function, child, seconds
            yield from visit(child, inside)

    yield from visit(tree, "<module>")


def each_test_function(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test_"
        ):
            yield node


def checks_something(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = called_name(node)
            if name is None:
                continue
            if name in PYTEST_CHECKS or name in ASSERTING_HELPERS or name.startswith("assert_"):
                return True
    return False


# -- the rules ------------------------------------------------------------------------------


def test_no_test_module_imports_from_another() -> None:
    found = [
        f"{where(path, node)} imports {name}"
        for path in modules()  # helper modules too: they import no test module either
        for node in ast.walk(parsed(path))
        if (name := imported_test_module(node)) is not None
    ]
    assert found == [], "shared helpers belong in a helper module or a fixture:\n" + "\n".join(
        found
    )


def test_no_long_sleep_outside_the_allowlist() -> None:
    found = []
    allowed_seen = set()
    for path in modules():
        module = str(path.relative_to(TESTS))
        for function, call, seconds in sleeps(parsed(path)):
            if seconds < LONGEST_SLEEP:
                continue
            if (module, function) in LONG_SLEEPS:
                allowed_seen.add((module, function))
                continue
            found.append(f"{where(path, call)} in {function}: sleep({seconds:g})")
    assert found == [], "wait on a condition, not for a time:\n" + "\n".join(found)
    assert allowed_seen == set(LONG_SLEEPS), "an allowlisted sleep is gone: drop its entry"


def test_every_test_checks_something() -> None:
    found = [
        f"{where(path, function)} {function.name}"
        for path in each_test_module()
        for function in each_test_function(parsed(path))
        if not checks_something(function)
    ]
    assert found == [], "a test with nothing that can fail:\n" + "\n".join(found)


def test_the_rules_see_what_they_look_for() -> None:
    """Each rule finds its fault in a made-up module (so an empty report means something)."""
    sample = ast.parse(
        "from tests.test_other import helper\n"
        "import tests.processes.test_more\n"
        "from tests.helpers import wait_until\n"
        "async def test_nothing():\n"
        "    await asyncio.sleep(0.1 * 3)\n"
        "    time.sleep(0.05)\n"
        "def test_raises():\n"
        "    with pytest.raises(ValueError):\n"
        "        pass\n"
        "def test_helper():\n"
        "    assert_quiet()\n"
    )
    imports = [imported_test_module(node) for node in ast.walk(sample)]
    assert [name for name in imports if name] == [
        "tests.test_other",
        "tests.processes.test_more",
    ]
    assert [(function, round(seconds, 3)) for function, _, seconds in sleeps(sample)] == [
        ("test_nothing", 0.3),
        ("test_nothing", 0.05),
    ]
    checked = {function.name: checks_something(function) for function in each_test_function(sample)}
    assert checked == {"test_nothing": False, "test_raises": True, "test_helper": True}
