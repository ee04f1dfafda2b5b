"""The event layer's tables, as mixins the application maps on its own base.

    class Event(Base, WorkflowEventRecord):       __tablename__ = "duly_events"
    class Outbox(Base, WorkflowOutbox):           __tablename__ = "duly_outbox"
    class Delivery(Base, WorkflowDeliveryAttempt): __tablename__ = "duly_deliveries"

An event record is the event as published, never changed; its outbox row is its routing
state, a workflow run of the engine's own (`engine.events.outbox`); a delivery attempt is
one row per route and event, and a route that succeeded is never routed that event again.
`tables_for` finds the three classes mapped on one outbox's metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Index, Integer, MetaData, String, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from engine.base.clock import DATABASE_TIME
from engine.base.errors import ConfigurationError
from engine.base.subclasses import mapped_subclasses
from engine.events.statuses import (
    PENDING,
    STATUS_LENGTH,
)


def _mapped_table(cls: type[Any]) -> Table | None:
    table = cls.__dict__.get("__table__")
    return table if isinstance(table, Table) else None


class WorkflowEventRecord:
    """Map onto your base to keep every published event, as published."""

    event_id: Mapped[str] = mapped_column(Text, primary_key=True)
    event_type: Mapped[str] = mapped_column(Text)
    event_name: Mapped[str] = mapped_column(Text)
    source: Mapped[str | None] = mapped_column(Text, default=None)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # `metadata` is the declarative base's own attribute, so the column of that name maps here.
    event_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)


class OutboxColumns:
    """The outbox's own columns; `WorkflowOutbox` adds the engine's and the routing step."""

    event_id: Mapped[str] = mapped_column(Text, primary_key=True)
    event_type: Mapped[str] = mapped_column(Text)
    event_name: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH), default=PENDING)
    route_attempts: Mapped[int] = mapped_column(Integer, default=0)  # failed drains so far
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set by each drain; its commit writes the database's time (see engine.base.clock).
    settled_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None, info={DATABASE_TIME: True}
    )

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        table = _mapped_table(cls)
        if table is not None:
            # The views count by status; failed and dead rows are the ones people look for.
            Index(f"ix_{table.name}_status"[:63], table.c.status, table.c.created_at)


class WorkflowDeliveryAttempt:
    """Map onto your base to keep one row per route and event: the idempotency record."""

    event_id: Mapped[str] = mapped_column(Text, primary_key=True)
    route: Mapped[str] = mapped_column(String(64), primary_key=True)  # the route's digest
    event_key: Mapped[str] = mapped_column(Text)
    handler: Mapped[str] = mapped_column(Text)  # module.qualname, to read
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH))
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # handler calls, every drain
    error: Mapped[str | None] = mapped_column(Text, default=None)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        table = _mapped_table(cls)
        if table is not None:
            Index(f"ix_{table.name}_status"[:63], table.c.status, table.c.handler)


@dataclass(frozen=True)
class EventTables:
    """The three tables of one application's event layer."""

    record: type[Any]
    outbox: type[Any]
    delivery: type[Any]

    @property
    def record_table(self) -> Table:
        """The event records' table."""
        return self.record.__table__  # type: ignore[no-any-return]

    @property
    def outbox_table(self) -> Table:
        """The outbox's table."""
        return self.outbox.__table__  # type: ignore[no-any-return]

    @property
    def delivery_table(self) -> Table:
        """The delivery attempts' table."""
        return self.delivery.__table__  # type: ignore[no-any-return]


def outbox_classes_on(metadatas: Iterable[MetaData]) -> list[type[Any]]:
    """The outbox classes mapped on these metadata (an app's), in the order they were mapped."""
    wanted = list(metadatas)
    return [
        cls for cls in mapped_subclasses(OutboxColumns) if any(cls.metadata is m for m in wanted)
    ]


def outbox_tables_of(classes: Iterable[type[Any]]) -> EventTables | None:
    """The event tables of the last outbox among `classes` (mapped workflow classes), or None."""
    found = [cls for cls in classes if issubclass(cls, OutboxColumns)]
    return tables_for(found[-1]) if found else None


def tables_for(outbox: type[Any]) -> EventTables:
    """The event record and delivery classes mapped on the same metadata as `outbox`."""
    found = _tables.get(outbox)
    if found is None:
        found = _tables[outbox] = _find_tables(outbox)
    return found


_tables: dict[type[Any], EventTables] = {}


def _find_tables(outbox: type[Any]) -> EventTables:
    metadata = outbox.__table__.metadata

    def sibling(classes: list[type[Any]], mixin: str) -> type[Any]:
        found = [cls for cls in classes if cls.__table__.metadata is metadata]
        if not found:
            raise ConfigurationError(
                f"{outbox.__name__} has no {mixin} mapped beside it: map one on the same base "
                f"(class Event(Base, {mixin}): ...)."
            )
        return found[-1]

    return EventTables(
        record=sibling(mapped_subclasses(WorkflowEventRecord), "WorkflowEventRecord"),
        outbox=outbox,
        delivery=sibling(mapped_subclasses(WorkflowDeliveryAttempt), "WorkflowDeliveryAttempt"),
    )
