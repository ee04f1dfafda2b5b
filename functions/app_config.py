"""What the app module configures for the process: its event registry and graph runtime.

`duly dev`, `duly drain` and the Lambda runtime import the app module
(DULY_APP), then call these: the registry its outbox routes with, and the
graph runtime its HTTP routes and timers use.
"""

from __future__ import annotations

import sys
from typing import Any

from engine import (
    DatabaseEventRegistry,
    EventRegistry,
    configure_event_registry,
    get_event_registry,
)
from engine.events.routing import Routes
from engine.graphs.configure import configure_graph_runtime
from engine.graphs.moves.runtime import GraphRuntime

APP_REGISTRY = "event_registry"  # the app module's registry, when it configures none itself
APP_GRAPH_RUNTIME = "graph_runtime"  # the app module's graph runtime


def configure_app_events(
    app_module: str, before: EventRegistry, outbox: type[Any] | None
) -> EventRegistry:
    """Configure the registry the app's outbox routes with, unless the app configured one.

    `before` is what `get_event_registry()` answered before the app was
    imported. The app's own `event_registry` (a DatabaseEventRegistry) comes
    next; else, with an outbox, a DatabaseEventRegistry for it that keeps the
    routes registered on the import-time default. Returns the registry.
    """
    registry = get_event_registry()
    if registry is not before:
        return registry
    module = sys.modules.get(app_module)
    chosen = getattr(module, APP_REGISTRY, None)
    if not isinstance(chosen, DatabaseEventRegistry):
        if outbox is None:
            return registry
        chosen = DatabaseEventRegistry(outbox=outbox)
        routes = getattr(before, "routes", None)
        if isinstance(routes, Routes):
            chosen.routes = routes
    configure_event_registry(chosen)
    return chosen


def configure_app_graphs(app_module: str) -> GraphRuntime | None:
    """Configure the app module's `graph_runtime`, if it has one; that runtime."""
    module = sys.modules.get(app_module)
    runtime = getattr(module, APP_GRAPH_RUNTIME, None)
    if not isinstance(runtime, GraphRuntime):
        return None
    return configure_graph_runtime(runtime)
