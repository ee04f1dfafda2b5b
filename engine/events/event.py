"""What happened: `WorkflowEvent`, and the events that say a mapped row was created,
updated or deleted.

An event is a frozen value. Its `payload` and `metadata` are the caller's
mappings, shallow-copied by the helpers: the dataclass cannot be reassigned,
but nested objects are shared with the caller.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

MODEL_CREATED = "duly.model.created"
MODEL_UPDATED = "duly.model.updated"
MODEL_DELETED = "duly.model.deleted"
EVENT_NAMES = {
    MODEL_CREATED: "model_created",
    MODEL_UPDATED: "model_updated",
    MODEL_DELETED: "model_deleted",
}


def new_event_id() -> str:
    """A fresh UUID4, as text: the default identity of an event."""
    return str(uuid.uuid4())


def utc_now() -> datetime:
    """The current time in UTC: the default moment an event occurred."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class WorkflowEvent:
    """Something that happened, routed to handlers by its type or its name.

    `event_type` is canonical and dotted (`duly.model.updated`); `event_name`
    is readable and dot-free (`model_updated`). Handlers registered on a key
    with a dot match the type, on a key without one the name.
    """

    event_type: str
    event_name: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    event_id: str = field(default_factory=new_event_id)
    occurred_at: datetime = field(default_factory=utc_now)
    source: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def model_created_event(
    model: str,
    values: Mapping[str, Any],
    *,
    identification: Any = None,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
    source: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> WorkflowEvent:
    """`model` (a class name) was created with `values`."""
    payload: dict[str, Any] = {"model": model, "values": dict(values)}
    return _model_event(
        MODEL_CREATED, payload, identification, event_id, occurred_at, source, metadata
    )


def model_updated_event(
    model: str,
    changes: Mapping[str, Any],
    *,
    old_values: Mapping[str, Any] | None = None,
    identification: Any = None,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
    source: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> WorkflowEvent:
    """`model` changed: each field as {"old": ..., "new": ...}; a missing old value is None."""
    old = old_values or {}
    diff = {name: {"old": old.get(name), "new": new} for name, new in changes.items()}
    payload: dict[str, Any] = {"model": model, "changes": diff}
    return _model_event(
        MODEL_UPDATED, payload, identification, event_id, occurred_at, source, metadata
    )


def model_deleted_event(
    model: str,
    *,
    identification: Any = None,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
    source: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> WorkflowEvent:
    """`model` (identified by `identification`) was deleted."""
    return _model_event(
        MODEL_DELETED, {"model": model}, identification, event_id, occurred_at, source, metadata
    )


def _model_event(
    event_type: str,
    payload: dict[str, Any],
    identification: Any,
    event_id: str | None,
    occurred_at: datetime | None,
    source: str | None,
    metadata: Mapping[str, Any] | None,
) -> WorkflowEvent:
    if identification is not None:
        payload["identification"] = identification
    return WorkflowEvent(
        event_type=event_type,
        event_name=EVENT_NAMES[event_type],
        payload=payload,
        event_id=event_id if event_id is not None else new_event_id(),
        occurred_at=occurred_at if occurred_at is not None else utc_now(),
        source=source,
        metadata=dict(metadata) if metadata is not None else {},
    )
