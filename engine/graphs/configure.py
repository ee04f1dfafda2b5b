"""The process's graph runtime: what the HTTP app and the timers' escalations use.

An application builds its `GraphRuntime` (its tables, directory and
condition predicates) and configures it once; `duly dev`, the Lambda
runtime and the app find it as the app module's `graph_runtime` attribute.
"""

from __future__ import annotations

from engine.base.errors import NotFoundError
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.timers import register_escalation

_configured: list[GraphRuntime] = []


def configure_graph_runtime(runtime: GraphRuntime) -> GraphRuntime:
    """Make `runtime` the process's graph runtime (replacing any earlier one).

    Its deadlines escalate through it too, whichever runtime was built last.
    """
    _configured[:] = [runtime]
    if runtime.tables.timer is not None:
        register_escalation(runtime.tables.timer.__table__.name, runtime.escalate)
    return runtime


def get_graph_runtime() -> GraphRuntime:
    """The process's graph runtime; NotFoundError when this app runs no graph workflows."""
    if not _configured:
        raise NotFoundError(
            "This app runs no graph workflows: build a GraphRuntime on its graph tables and "
            "configure it (configure_graph_runtime, or a `graph_runtime` in the app module)."
        )
    return _configured[0]


def forget_graph_runtime() -> None:
    """Configure no graph runtime (tests)."""
    _configured.clear()
