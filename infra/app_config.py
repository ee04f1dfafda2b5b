"""What the app module configures for the process: its event registry and graph runtime.

`duly dev`, `duly drain` and the Lambda runtime import the app module
(DULY_APP), then call these: the registry its outbox routes with, and the
graph runtime its HTTP routes and timers use. An app that never imports the
event layer or the graph layer maps no outbox and has no graph runtime, so
neither is imported for it here (a Lambda cold start pays for what it uses).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import MetaData

if TYPE_CHECKING:
    from engine import Application, EventRegistry, EventTables, GraphRuntime

APP_REGISTRY = "event_registry"  # the app module's registry, when it configures none itself
APP_GRAPH_RUNTIME = "graph_runtime"  # the app module's graph runtime
EVENT_RECORDS = "engine.events.records"  # where the outbox mixins are: mapping one imports it
EVENT_CONFIGURE = "engine.events.configure"  # where the process's registry is kept
GRAPH_RUNTIME = "engine.graphs.moves.runtime"  # a graph runtime's class


def registry_before_app() -> EventRegistry | None:
    """`get_event_registry()` before the app is imported; None while nothing imported the
    event layer (so nothing configured a registry)."""
    if EVENT_CONFIGURE not in sys.modules:
        return None
    from engine import get_event_registry

    return get_event_registry()


def mapped_event_tables(metadatas: Sequence[MetaData]) -> EventTables | None:
    """The event tables an app maps on its bases, or None when it maps no outbox."""
    if EVENT_RECORDS not in sys.modules:  # no outbox mixin was ever imported, so none mapped
        return None
    from engine import outbox_classes_on, tables_for

    mapped = outbox_classes_on(metadatas)
    return tables_for(mapped[-1]) if mapped else None


@overload
def configure_app_events(
    app_module: str, before: EventRegistry | None, outbox: type[Any]
) -> EventRegistry: ...
@overload
def configure_app_events(
    app_module: str, before: EventRegistry | None, outbox: None
) -> EventRegistry | None: ...
@overload
def configure_app_events(
    app_module: str, before: EventRegistry | None, outbox: type[Any] | None
) -> EventRegistry | None: ...
def configure_app_events(
    app_module: str, before: EventRegistry | None, outbox: type[Any] | None
) -> EventRegistry | None:
    """Configure the registry the app's outbox routes with, unless the app configured one.

    `before` is what `registry_before_app()` answered before the app was
    imported. The app's own `event_registry` (a DatabaseEventRegistry) comes
    next; else, with an outbox, a DatabaseEventRegistry for it that keeps the
    routes registered on the import-time default. Returns the registry: None
    for an app that imports no event layer and maps no outbox.
    """
    if outbox is None and EVENT_CONFIGURE not in sys.modules:
        return None
    from engine import (
        DatabaseEventRegistry,
        InMemoryEventRegistry,
        Routes,
        configure_event_registry,
        get_event_registry,
    )

    registry = get_event_registry()
    if registry is not before and (
        before is not None or type(registry) is not InMemoryEventRegistry
    ):
        return registry  # the app configured its own
    before = registry
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
    if GRAPH_RUNTIME not in sys.modules:  # no graph runtime was ever made in this process
        return None
    from engine import GraphRuntime, configure_graph_runtime

    module = sys.modules.get(app_module)
    runtime = getattr(module, APP_GRAPH_RUNTIME, None)
    if not isinstance(runtime, GraphRuntime):
        return None
    return configure_graph_runtime(runtime)


def app_application(
    app_module: str,
    metadatas: Sequence[MetaData],
    Session: Any,
    before: EventRegistry | None,
    kind: type[Application] | None = None,
) -> Application:
    """The application (a `kind`: the model's plain one unless told, which imports no views)
    of the app module on `Session`: its event registry (for its outbox) and graph runtime
    configured as `duly dev`, the Lambda runtime and the pytest plugin configure them (one
    path). `before` is `registry_before_app()` before the import."""
    from engine import Application, current_application

    current = current_application()
    chosen = kind or Application
    made = current.parts_for(Session, chosen) if current is not None else chosen(Session)
    with made.current():  # what is configured goes to the new application, nowhere else
        tables = mapped_event_tables(metadatas)
        configure_app_events(app_module, before, tables.outbox if tables else None)
        configure_app_graphs(app_module)
    return made
