"""The event layer's tables and workflows its handlers start or wake, for the outbox tests."""

from __future__ import annotations

import asyncio

from sqlalchemy import BigInteger, String, Text, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    Workflow,
    WorkflowEvent,
    declare_engine_tables,
    step,
    wait_for,
)
from engine.model.connection import current_connection


class Base(DeclarativeBase):
    """The outbox tests' base."""


engine_tables = declare_engine_tables(Base, names={"attempt_log": "outbox_attempt_log"})
Event, Outbox, Delivery = engine_tables.event, engine_tables.outbox, engine_tables.delivery
Log = engine_tables.attempt_log


class HandlerRun(Base):
    """One row per handler call that got as far as its side effect (no unique key: a
    handler run twice shows twice)."""

    __tablename__ = "handler_runs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(Text)
    handler: Mapped[str] = mapped_column(Text)


class Shipment(Base):
    """A business row an event is published beside."""

    __tablename__ = "shipments"

    id: Mapped[int] = mapped_column(primary_key=True)
    address: Mapped[str] = mapped_column(String)


class Order(Base, Workflow):
    """Started by a handler of `order.placed`; waits for `payment.received`, delivered by
    another handler."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String, unique=True)
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def place(self) -> object:
        self.status = "placed"
        return wait_for(Order.paid)

    @step
    async def paid(self, amount: int) -> None:
        self.status = f"paid {amount}"


async def record_run(event: WorkflowEvent, handler: str) -> None:
    """The side effect the process tests count: a row per handler call."""
    async with current_connection().autocommit.connect() as conn:
        await conn.execute(insert(HandlerRun).values(event_id=event.event_id, handler=handler))


async def first_handler(event: WorkflowEvent) -> None:
    """A quick handler whose every call leaves a row (the kill -9 test counts them)."""
    await record_run(event, "first")


async def second_handler(event: WorkflowEvent) -> None:
    """A slower one, so a kill lands between an event's two routes."""
    await asyncio.sleep(0.02)
    await record_run(event, "second")


def process_registry() -> DatabaseEventRegistry:
    """The registry a worker process drains with: both handlers on `bulk.created`."""
    registry = DatabaseEventRegistry(
        settings=EventSettings(mode="production", async_delivery=True, max_retries=10)
    )
    registry.register("bulk.created", first_handler)
    registry.register("bulk.created", second_handler)
    return registry
