"""No module of `engine/` keeps mutable state at module level: state belongs to an application.

Parsed with `ast`: a module-level assignment whose value is a list, dict or set
display or a call that makes a container, and any `global` statement, fail,
outside the allow-list of pure caches and process-wide hooks below, each with
its reason (docs/architecture.md, "The application object").
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine"
CONTAINERS = {
    "list",
    "dict",
    "set",
    "defaultdict",
    "OrderedDict",
    "deque",
    "WeakKeyDictionary",
    "WeakValueDictionary",
    "WeakSet",
    "Counter",
}
ALLOWED = {
    # A class -> what it computes to, once: a cache of its input. A plain dict where the
    # lookup is on the step's path (a weak key makes a weakref per lookup).
    ("engine/model/registry.py", "_registry"): "a mapped class's WorkflowInfo, by class",
    ("engine/tables.py", "_declared"): "a base's engine tables, keyed weakly by the base",
    ("engine/events/records.py", "_tables"): "an outbox class's sibling tables, by class",
    ("engine/events/deliveries.py", "_logs"): "a database engine's delivery logs, keyed weakly",
    ("engine/runs/waiting.py", "_watches"): "a database engine's one LISTEN for ends, keyed weakly",
    # Immutable reads: a template version never changes once saved, and its id is a UUID.
    ("engine/graphs/design/model.py", "_graphs"): "bounded cache of never-changing versions",
    # Process-wide by nature.
    ("engine/model/telemetry.py", "_children"): "prometheus' metrics are the process's registry",
    ("engine/model/telemetry.py", "_emitters"): "a platform's metric sinks (Lambda's EMF)",
    ("engine/events/bridge.py", "_warned"): "a warning logged once per process",
    ("engine/worker/heap.py", "_settled"): "the garbage collector, settled once per process",
    ("engine/graphs/moves/notifications.py", "_publishing"): "tasks kept referenced until done",
}


def _container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in CONTAINERS
    return False


def _constant(name: str) -> bool:
    """An UPPER_CASE constant, or a dunder the module protocol reads (`__all__`)."""
    dunder = name.startswith("__") and name.endswith("__")
    return dunder or name.lstrip("_").isupper()


def module_state(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every mutable module-level assignment and `global` in `path`."""
    tree = ast.parse(path.read_text())
    module = path.relative_to(ENGINE.parent).as_posix()
    found: list[tuple[str, str]] = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else ast.unparse(target)
            if _container(value) and not (_constant(name) and not isinstance(value, ast.Call)):
                found.append((module, name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.extend((module, f"global {name}") for name in node.names)
    return found


def test_no_engine_module_keeps_mutable_state() -> None:
    found = [
        hit
        for path in sorted(ENGINE.rglob("*.py"))
        for hit in module_state(path)
        if hit not in ALLOWED
    ]
    assert found == [], f"module-level state in engine/ (give it to the application): {found}"


def test_the_allow_list_names_only_what_is_there() -> None:
    present = {hit for path in ENGINE.rglob("*.py") for hit in module_state(path)}
    assert set(ALLOWED) <= present, set(ALLOWED) - present
