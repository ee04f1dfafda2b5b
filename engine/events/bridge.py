"""The model-change bridge: rows of opted-in models announce their inserts, updates and
deletes as `duly.model.*` events, written into the outbox by the flush that writes them.

    class Parcel(Base):
        __publish_changes__ = True       # opt in (inherited; a subclass may say False)

    connect_bridge()                     # or connect_bridge_from_settings(): DULY_SIGNAL_BRIDGE

A flush publishes in itself, on the connection its rows went through: a rollback publishes
nothing, and an error while publishing fails the caller's flush. Only unit-of-work changes
are seen (not bulk `update(Model)`, Core statements or `ON DELETE CASCADE`), public mapped
columns only (names without a leading `_`), and only into a `DatabaseEventRegistry`.
"""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, event, inspect
from sqlalchemy.orm import Mapper, Session, UOWTransaction

from engine.base.errors import EventError
from engine.events.configure import get_event_registry
from engine.events.database import DatabaseEventRegistry
from engine.events.event import (
    WorkflowEvent,
    model_created_event,
    model_deleted_event,
    model_updated_event,
)
from engine.events.routing import EventRegistry
from engine.events.settings import EventSettings

log = logging.getLogger("duly.events")

SOURCE = "duly.bridge"
OPT_IN = "__publish_changes__"
CREATED = "created"
UPDATED = "updated"
DELETED = "deleted"
ACTIONS = (CREATED, UPDATED, DELETED)
PENDING_KEY = "duly.bridge"  # Session.info: this flush's registry and the events it collected

_lock = threading.Lock()
_warned: set[str] = set()  # registry classes already warned about


class Pending:
    """What one flush has collected: the registry it publishes to, events by connection."""

    def __init__(self, registry: EventRegistry) -> None:
        self.registry = registry
        self.events: dict[Connection, list[WorkflowEvent]] = {}


def publishes_changes(cls: type[Any]) -> bool:
    """Whether `cls` opted in (`__publish_changes__ = True`, on it or a base)."""
    return getattr(cls, OPT_IN, False) is True


def model_change_event(action: str, instance: Any) -> WorkflowEvent | None:
    """The event for `action` on a mapped `instance`; None when there is nothing to say.

    None for an unknown action, and for a create or update that changed no
    public field. A create carries the fields the program set (a column default
    is not a change), an update each changed field as {"old", "new"} (old is
    None when it was never loaded), a delete only the identification. Reads the
    attribute history, so it answers during a flush (or before one), not after.
    """
    if action not in ACTIONS:
        return None
    state = inspect(instance)
    model = type(instance).__name__
    metadata = {"action": action}
    identification = identification_of(instance)
    if action == DELETED:
        return model_deleted_event(
            model, identification=identification, source=SOURCE, metadata=metadata
        )
    new: dict[str, Any] = {}
    old: dict[str, Any] = {}
    for attr in state.mapper.column_attrs:
        if attr.key.startswith("_"):
            continue
        history = state.attrs[attr.key].history
        if not history.added:
            continue
        new[attr.key] = json_value(history.added[0], model, attr.key)
        old[attr.key] = json_value(history.deleted[0], model, attr.key) if history.deleted else None
    if not new:
        return None
    if action == CREATED:
        return model_created_event(
            model, new, identification=identification, source=SOURCE, metadata=metadata
        )
    return model_updated_event(
        model,
        new,
        old_values=old,
        identification=identification,
        source=SOURCE,
        metadata=metadata,
    )


def identification_of(instance: Any) -> dict[str, Any]:
    """The primary key of `instance` as {attribute: value}, the form `session.get` takes."""
    mapper = inspect(instance).mapper
    model = type(instance).__name__
    values = mapper.primary_key_from_instance(instance)
    keys = [mapper.get_property_by_column(column).key for column in mapper.primary_key]
    return {key: json_value(value, model, key) for key, value in zip(keys, values, strict=True)}


def json_value(value: Any, model: str, field: str) -> Any:
    """`value` as JSON can hold it; EventError when it cannot be.

    Times by `isoformat()`, decimals and UUIDs as text (exact), an Enum by its
    value, lists, tuples and mappings item by item; anything else (bytes, say) fails.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return json_value(value.value, model, field)
    if isinstance(value, list | tuple):
        return [json_value(item, model, field) for item in value]
    if isinstance(value, Mapping):
        return {str(key): json_value(item, model, field) for key, item in value.items()}
    raise EventError(
        f"{model}.{field}: a {type(value).__name__} is not JSON, so the bridge cannot publish "
        "it; name the attribute with a leading _ to keep it out of the events."
    )


def _before_flush(session: Session, flush_context: UOWTransaction, instances: Any) -> None:
    """Start this flush's collection (anything a failed flush left is dropped)."""
    session.info[PENDING_KEY] = Pending(get_event_registry())


def _collect(action: str, connection: Connection, target: Any) -> None:
    if not publishes_changes(type(target)):
        return
    session = inspect(target).session
    pending = session.info.get(PENDING_KEY) if session is not None else None
    if not isinstance(pending, Pending):
        return  # the bridge was connected in the middle of this flush
    if not isinstance(pending.registry, DatabaseEventRegistry):
        _warn_once(pending.registry)
        return
    found = model_change_event(action, target)
    if found is not None:
        pending.events.setdefault(connection, []).append(found)


def _after_insert(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    _collect(CREATED, connection, target)


def _after_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    _collect(UPDATED, connection, target)


def _after_delete(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    _collect(DELETED, connection, target)


def _after_flush(session: Session, flush_context: UOWTransaction) -> None:
    """Write what this flush collected, each through the connection its rows went through."""
    pending = session.info.pop(PENDING_KEY, None)
    if not isinstance(pending, Pending) or not isinstance(pending.registry, DatabaseEventRegistry):
        return
    for connection, events in pending.events.items():
        pending.registry.publish_in(connection, events)


def _warn_once(registry: EventRegistry) -> None:
    name = type(registry).__name__
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    log.warning(
        "The model-change bridge publishes only into a DatabaseEventRegistry's outbox; "
        "the configured registry is a %s, so model changes are not published "
        "(warned once per registry class).",
        name,
    )


# (target, event, listener): module functions, so their identity is stable across calls.
LISTENERS: tuple[tuple[type[Any], str, Callable[..., None]], ...] = (
    (Session, "before_flush", _before_flush),
    (Mapper, "after_insert", _after_insert),
    (Mapper, "after_update", _after_update),
    (Mapper, "after_delete", _after_delete),
    (Session, "after_flush", _after_flush),
)


def connect_bridge() -> None:
    """Publish opted-in models' changes from every session's flushes; again is a no-op."""
    with _lock:
        for target, identifier, listener in LISTENERS:
            if not event.contains(target, identifier, listener):
                event.listen(target, identifier, listener)


def disconnect_bridge() -> None:
    """Stop publishing model changes; when not connected, a no-op."""
    with _lock:
        for target, identifier, listener in LISTENERS:
            if event.contains(target, identifier, listener):
                event.remove(target, identifier, listener)


def bridge_connected() -> bool:
    """Whether `connect_bridge()` is in effect."""
    return all(event.contains(target, name, listener) for target, name, listener in LISTENERS)


def connect_bridge_from_settings(settings: EventSettings | None = None) -> bool:
    """Connect the bridge when DULY_SIGNAL_BRIDGE is on; whether it did.

    When it is off this does nothing (a bridge connected by code stays connected).
    """
    settings = settings if settings is not None else EventSettings.from_env()
    if settings.signal_bridge:
        connect_bridge()
    return settings.signal_bridge
