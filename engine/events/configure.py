"""The application's event registry: which one `get_event_registry()` answers.

The registry belongs to the current application (`engine.model.application`):
until something is configured it is an `InMemoryEventRegistry` made for it.
`configure_event_registry(registry)` sets it (None goes back to a fresh
default); `configure_event_registry_from_settings()` chooses it from
`DULY_EVENT_REGISTRY` (an instance, dotted path, class, factory or
`{"class", "options"}` JSON, as `engine.base.resolve` reads them) or, when that
is unset, by `DULY_MODE`: a `DatabaseEventRegistry` in production, an
`InMemoryEventRegistry` otherwise. The outbox's step routes with whatever
registry this answers for the worker's application.
"""

from __future__ import annotations

from typing import Any

from engine.base.errors import UnsupportedTypeError
from engine.base.resolve import resolve_object
from engine.events.database import DatabaseEventRegistry
from engine.events.routing import EventRegistry, InMemoryEventRegistry, Routes
from engine.events.settings import EventSettings
from engine.model.application import ambient_application


def get_event_registry() -> EventRegistry:
    """The current application's registry (an in-memory one until one is configured)."""
    app = ambient_application()
    registry: EventRegistry | None = app.event_registry
    if registry is None:
        registry = app.event_registry = InMemoryEventRegistry()
    return registry


def configure_event_registry(registry: EventRegistry | None) -> None:
    """Make `registry` the current application's registry; None puts a fresh default back.

    The registry is trusted to be one (the type hint is not checked at runtime).
    """
    ambient_application().event_registry = registry


def configure_event_registry_from_settings(settings: EventSettings | None = None) -> EventRegistry:
    """Choose the registry from DULY_EVENT_REGISTRY, or by DULY_MODE when it is unset."""
    settings = settings if settings is not None else EventSettings.from_env()
    registry = resolve_event_registry(settings.event_registry, settings)
    configure_event_registry(registry)
    return registry


def resolve_event_registry(value: Any, settings: EventSettings) -> EventRegistry:
    """The registry `value` names; None means the mode's default."""
    if value is None:
        if settings.production:
            return DatabaseEventRegistry(settings=settings)
        return InMemoryEventRegistry()
    chosen: EventRegistry = resolve_object(value, accepts=is_event_registry, what="event registry")
    return chosen


def is_event_registry(value: Any) -> bool:
    """Whether `value` is a registry instance: it can register and publish (a class cannot)."""
    if isinstance(value, type):
        return False
    return callable(getattr(value, "register", None)) and callable(getattr(value, "publish", None))


def routing_of(registry: EventRegistry) -> tuple[Routes, EventSettings]:
    """The routes a drain takes from `registry`, and the settings it drains with.

    A registry without settings of its own (the in-memory one) drains with
    the environment's, read once.
    """
    routes = getattr(registry, "routes", None)
    if not isinstance(routes, Routes):
        raise UnsupportedTypeError(
            f"The configured event registry {type(registry).__name__} has no routes a drain "
            "can use: configure a DatabaseEventRegistry (or an InMemoryEventRegistry)."
        )
    settings = getattr(registry, "settings", None)
    if not isinstance(settings, EventSettings):
        app = ambient_application()
        if app.event_settings is None:
            app.event_settings = EventSettings.from_env()
        settings = app.event_settings
    return routes, settings
