"""The chaos soak's application: a mixed load whose every effect can be counted afterwards.

Each workflow leaves what the soak's invariants are counted from: the attempt
log (one `ok` per run and step), its own columns (the event a waiter took,
when a timer was due and when it fired) and the outbox's delivery attempts.
The handlers of `chaos.order` start a Journey and deliver to a Waiter, so
outbox events turn into runs and deliveries as they drain.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Float, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    Limit,
    Workflow,
    WorkflowEvent,
    child,
    declare_engine_tables,
    fan_out,
    step,
    wait_for,
    wake_in,
)

ORDER_EVENT = "chaos.order"
CHILDREN = 4  # children of each fan-out
TENANTS = 4  # groups of the limited workflow
AT_MOST = 2  # its limit per tenant
WAKE_MS = (100, 600)  # wake_in delays of a Journey, milliseconds
LEASE_SECONDS = 3  # a killed worker's leases (steps and outbox rows) end this soon


class Base(DeclarativeBase):
    """The soak's own tables."""


# chaos_attempts, chaos_events, chaos_outbox, chaos_deliveries: what the invariants count.
Outbox = declare_engine_tables(Base, prefix="chaos_").outbox


class Journey(Base, Workflow):
    """Three steps with a wake_in between the first two: steps, timers, a chain."""

    __tablename__ = "chaos_journey"

    id: Mapped[int] = mapped_column(primary_key=True)
    delay_ms: Mapped[int] = mapped_column(Integer, default=300)
    due_at: Mapped[float | None] = mapped_column(Float, default=None)
    fired_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def begin(self) -> object:
        # Read just before the commit that sets wake_at, so due_at is never later than it.
        self.due_at = time.time() + self.delay_ms / 1000
        return wake_in(Journey.fire, timedelta(milliseconds=self.delay_ms))

    @step
    async def fire(self) -> object:
        self.fired_at = time.time()
        return Journey.finish

    @step
    async def finish(self) -> None:
        await asyncio.sleep(random.random() / 100)  # a body a kill can land in


class Waiter(Base, Workflow):
    """Parks on an event; the one it took is stored. Fed by the driver or by a handler."""

    __tablename__ = "chaos_waiter"

    id: Mapped[int] = mapped_column(primary_key=True)
    via: Mapped[str] = mapped_column(String(10), default="driver")
    received: Mapped[int | None] = mapped_column(Integer, default=None)

    @step
    async def park(self) -> object:
        return wait_for(Waiter.answer)

    @step
    async def answer(self, value: int) -> None:
        self.received = value


class Fan(Base, Workflow):
    """Fans out CHILDREN children, then ends: a fan-out under kills."""

    __tablename__ = "chaos_fan"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def split(self) -> object:
        return fan_out((child(FanChild(), FanChild.run) for _ in range(CHILDREN)), then=Fan.join)

    @step
    async def join(self) -> None:
        return None


class FanChild(Base, Workflow):
    __tablename__ = "chaos_fan_child"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def run(self) -> None:
        await asyncio.sleep(random.random() / 200)


class Limited(Base, Workflow):
    """At most AT_MOST running per tenant: a limited workflow under kills."""

    __tablename__ = "chaos_limited"
    __workflow_limit__ = Limit(by="tenant", at_most=AT_MOST)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(20))

    @step
    async def work(self) -> None:
        await asyncio.sleep(random.random() / 50)


WORKFLOWS: list[type[Any]] = [Journey, Waiter, Fan, FanChild, Limited, Outbox]
RUN_TABLES = [Journey, Waiter, Fan, FanChild, Limited]
# The steps each run of a workflow commits, once each: what the soak's invariants expect.
STEPS_PER_RUN = {
    "chaos_journey": ("begin", "fire", "finish"),
    "chaos_waiter": ("park", "answer"),
    "chaos_fan": ("split", "join"),
    "chaos_fan_child": ("run",),
    "chaos_limited": ("work",),
}


async def start_journey(event: WorkflowEvent) -> None:
    """Start the Journey the event names (a second start of the same id is refused)."""
    await Journey(id=event.payload["journey"], delay_ms=event.payload["delay_ms"]).start(
        Journey.begin
    )


async def answer_waiter(event: WorkflowEvent) -> None:
    """Deliver the event's value to its Waiter, keyed by the event: never applied twice."""
    waiter = event.payload["waiter"]
    await Waiter.by(Waiter.id == waiter).deliver(Waiter.answer(waiter), key=event.event_id)


HANDLERS = (start_journey, answer_waiter)  # both routes of every ORDER_EVENT


def registry() -> DatabaseEventRegistry:
    """What every worker process drains with, and the driver publishes with."""
    # Short claims and backoffs: a killed worker's outbox rows come back within seconds.
    settings = EventSettings(
        mode="production",
        async_delivery=True,
        max_retries=50,
        retry_backoff_seconds=1,
        outbox_claim_ttl_seconds=LEASE_SECONDS,
        delivery_running_timeout_seconds=LEASE_SECONDS,
    )
    events = DatabaseEventRegistry(settings=settings)
    for handler in HANDLERS:
        events.register(ORDER_EVENT, handler)
    return events


def order_event(journey: int, waiter: int) -> WorkflowEvent:
    return WorkflowEvent(
        ORDER_EVENT,
        "order",
        {"journey": journey, "waiter": waiter, "delay_ms": random.randint(*WAKE_MS)},
    )
