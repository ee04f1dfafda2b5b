"""The application's graph runtime: what the HTTP app and the timers' escalations use.

An application builds its `GraphRuntime` (its tables, directory and
condition predicates) and is given it (`Duly(..., graph_runtime=)`, or
`configure_graph_runtime` on the current application); `duly dev`, the
Lambda runtime and the pytest plugin find it as the app module's
`graph_runtime` attribute.
"""

from __future__ import annotations

from engine.base.errors import NotFoundError
from engine.graphs.moves.runtime import GraphRuntime
from engine.model.application import ambient_application, current_application


def configure_graph_runtime(runtime: GraphRuntime) -> GraphRuntime:
    """Make `runtime` the current application's graph runtime (replacing any earlier one);
    its deadlines escalate through it too."""
    result: GraphRuntime = ambient_application().use_graph_runtime(runtime)
    return result


def get_graph_runtime() -> GraphRuntime:
    """The current application's graph runtime; NotFoundError when it runs no graph workflows."""
    app = current_application()
    runtime: GraphRuntime | None = app.graph_runtime if app is not None else None
    if runtime is None:
        raise NotFoundError(
            "This app runs no graph workflows: build a GraphRuntime on its graph tables and "
            "give it to the application (Duly(..., graph_runtime=), configure_graph_runtime, "
            "or a `graph_runtime` in the app module)."
        )
    return runtime


def forget_graph_runtime() -> None:
    """The current application runs no graph runtime (tests)."""
    app = current_application()
    if app is not None:
        app.graph_runtime = None
