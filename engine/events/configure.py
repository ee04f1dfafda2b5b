"""The process's event registry: which one `get_event_registry()` answers.

Until something is configured it is an `InMemoryEventRegistry` made at
import. `configure_event_registry(registry)` sets it (None goes back to
that default); `configure_event_registry_from_settings()` chooses it from
`DULY_EVENT_REGISTRY` (an instance, dotted path, class, factory or
`{"class", "options"}` JSON, as `engine.base.resolve` reads them) or, when that
is unset, by `DULY_MODE`: a `DatabaseEventRegistry` in production, an
`InMemoryEventRegistry` otherwise. The outbox's step routes with whatever
registry this answers in the worker's process.
"""

from __future__ import annotations

import threading
from typing import Any

from engine.base.errors import UnsupportedTypeError
from engine.base.resolve import resolve_object
from engine.events.database import DatabaseEventRegistry
from engine.events.routing import EventRegistry, InMemoryEventRegistry, Routes
from engine.events.settings import EventSettings

_lock = threading.Lock()
_default: EventRegistry = InMemoryEventRegistry()
_configured: EventRegistry | None = None
_env_settings: list[EventSettings] = []  # read once, when a registry without settings drains


def get_event_registry() -> EventRegistry:
    """The registry configured for this process (the import-time in-memory one until then)."""
    return _configured if _configured is not None else _default


def default_event_registry() -> EventRegistry:
    """The import-time in-memory registry, which answers until something is configured."""
    return _default


def configure_event_registry(registry: EventRegistry | None) -> None:
    """Make `registry` the process's registry; None puts the import-time default back.

    The registry is trusted to be one (the type hint is not checked at runtime).
    """
    global _configured
    with _lock:
        _configured = registry


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
        if not _env_settings:
            _env_settings.append(EventSettings.from_env())
        settings = _env_settings[0]
    return routes, settings
