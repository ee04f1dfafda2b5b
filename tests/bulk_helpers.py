"""What the bulk actions' tests share: failed runs written straight in, the audit trail read
back, and dead letters made by a handler that always fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
)
from engine.testing import drain, move_clock
from tests.apps import outbox
from tests.apps.chores import Chore
from tests.conftest import Database

BACKOFF = timedelta(seconds=30)  # past DULY_RETRY_BACKOFF_SECONDS x the attempts so far
CHARGE = "tests.bulk_helpers.charge"  # the failing handler, as a delivery names it


async def add_failed(Session: async_sessionmaker[AsyncSession], count: int) -> None:
    """`count` chore runs that gave up, as a failed step leaves them."""
    rows = [{"label": f"f{n}", "last_error": "RuntimeError: boom"} for n in range(count)]
    async with Session.begin() as session:
        await session.execute(insert(Chore), rows)


async def audit(db: Database) -> list[tuple[Any, ...]]:
    """The audit trail, oldest first: actor, via, action, workflow, count, detail."""
    return db.sql("SELECT actor, via, action, workflow, count, detail FROM duly_audit ORDER BY id")


async def charge(event: WorkflowEvent) -> None:
    """A handler whose provider is always down."""
    raise ConnectionError("the payment provider is down")


async def ship(event: WorkflowEvent) -> None:
    """A handler that always succeeds."""


def configure_failing_registry() -> DatabaseEventRegistry:
    """The process's registry: two drains before a dead letter, `charge` for order.charged."""
    registry = DatabaseEventRegistry(outbox=outbox.Outbox, settings=EventSettings(max_retries=2))
    registry.register("order.placed", ship)
    registry.register("order.charged", charge)
    configure_event_registry(registry)
    return registry


def event(event_type: str, event_id: str) -> WorkflowEvent:
    """An event whose name is its type with `_` for `.`."""
    return WorkflowEvent(event_type, event_type.replace(".", "_"), {}, event_id=event_id)


async def publish(Session: async_sessionmaker[AsyncSession], *events: WorkflowEvent) -> None:
    """Publish `events` into the outbox, one statement each."""
    async with connect_workflows(Session, workflows=[outbox.Outbox]):
        registry = DatabaseEventRegistry(outbox=outbox.Outbox, settings=EventSettings())
        for one in events:
            assert await registry.publish_many([one]) == [one.event_id]


async def dead_letters(Session: async_sessionmaker[AsyncSession], *ids: str) -> None:
    """Publish order.charged events and drain them twice: dead-lettered."""
    await publish(Session, *(event("order.charged", i) for i in ids))
    await drain(Session, [outbox.Outbox])
    await move_clock(Session, BACKOFF)
    await drain(Session, [outbox.Outbox])
