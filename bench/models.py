"""The benchmark's workflows: each does as little as its figure allows, so the engine is measured.

Steps that time themselves read `time.time()`: the bench process and the worker
run on the same machine, so their wall clocks are the same clock.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import DateTime, Float, Integer, Numeric, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    DatabaseEventRegistry,
    GraphSubject,
    Limit,
    Step,
    Workflow,
    WorkflowEvent,
    child,
    declare_engine_tables,
    fan_out,
    step,
    wait_for,
    wake_in,
)

BENCH_EVENT_TYPE = "bench.noop"  # the one event type the outbox figure publishes and routes


class Base(DeclarativeBase):
    """The benchmark's declarative base; every bench database gets all of its tables."""


class NoOp(Base, Workflow):
    """One step that does nothing: the cost of a claim plus one commit."""

    __tablename__ = "bench_noop"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def run(self) -> None:
        return None


class Chain(Base, Workflow):
    """Three steps in a row: shows what running the next step at once saves over a new claim."""

    __tablename__ = "bench_chain"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def a(self) -> Step[Chain, []]:
        return Chain.b

    @step
    async def b(self) -> Step[Chain, []]:
        return Chain.c

    @step
    async def c(self) -> None:
        return None


class Latency(Base, Workflow):
    """Records when its step began, against the start time the bench stored in the row."""

    __tablename__ = "bench_latency"

    id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[float] = mapped_column(Float)  # time.time() just before start()
    ran_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def run(self) -> None:
        self.ran_at = time.time()  # first line: nothing of the step's own cost is counted


class Timer(Base, Workflow):
    """Sleeps `delay_ms` with wake_in, then records how late the wake-up came."""

    __tablename__ = "bench_timer"

    id: Mapped[int] = mapped_column(primary_key=True)
    delay_ms: Mapped[int] = mapped_column(Integer)
    due_at: Mapped[float | None] = mapped_column(Float, default=None)
    fired_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def arm(self) -> object:  # a wake_in(...) directive
        # Taken just before the step's commit; the database stamps wake_at a fraction of
        # a millisecond later, so lateness counts that sliver against the engine.
        self.due_at = time.time() + self.delay_ms / 1000
        return wake_in(Timer.fire, timedelta(milliseconds=self.delay_ms))

    @step
    async def fire(self) -> None:
        self.fired_at = time.time()


class Sleeper(Base, Workflow):
    """Sleeps `delay_s` (hours) with wake_in, then ends: the scheduler calls per run's timer."""

    __tablename__ = "bench_sleeper"

    id: Mapped[int] = mapped_column(primary_key=True)
    delay_s: Mapped[int] = mapped_column(Integer)

    @step
    async def arm(self) -> object:  # a wake_in(...) directive
        return wake_in(Sleeper.finish, timedelta(seconds=self.delay_s))

    @step
    async def finish(self) -> None:
        return None


class Waiter(Base, Workflow):
    """Parks on an event; the event's step stores the value it carried."""

    __tablename__ = "bench_waiter"

    id: Mapped[int] = mapped_column(primary_key=True)
    answer_value: Mapped[int | None] = mapped_column(Integer, default=None)

    @step
    async def park(self) -> object:  # a wait_for(...) directive
        return wait_for(Waiter.answer)

    @step
    async def answer(self, value: int) -> None:
        self.answer_value = value


class FanParent(Base, Workflow):
    """Fans out `child_count` no-op runs, then records when its `then` step began."""

    __tablename__ = "bench_fan_parent"

    id: Mapped[int] = mapped_column(primary_key=True)
    child_count: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)  # time.time() just before start()
    split_at: Mapped[float | None] = mapped_column(Float, default=None)
    done_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def split(self) -> object:  # a fan_out(...) directive
        self.split_at = time.time()  # the step's body began; its commit starts the children
        return fan_out(
            (child(FanChild(), FanChild.run) for _ in range(self.child_count)), then=FanParent.done
        )

    @step
    async def done(self) -> None:
        self.done_at = time.time()


class FanChild(Base, Workflow):
    """One child of a fan-out: a step that does nothing."""

    __tablename__ = "bench_fan_child"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def run(self) -> None:
        return None


# The event layer's tables (bench_events, bench_outbox: its rows are runs of the engine's
# own `route` step, bench_deliveries, which the bench checks) and the graph tables but their
# timers (the transitions figure sets no deadline).
engine_tables = declare_engine_tables(
    Base, attempts=False, graphs=True, graph_timers=False, prefix="bench_"
)
BenchOutbox = engine_tables.outbox


class BenchOrder(Base):
    """A small plain business table: what a caller writes beside the events it publishes."""

    __tablename__ = "bench_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str] = mapped_column(Text)


def bench_event(i: int) -> WorkflowEvent:
    """The `i`th event of a run: small, as a domain event is."""
    return WorkflowEvent(event_type=BENCH_EVENT_TYPE, event_name="bench_noop", payload={"i": i})


def ignore_event(event: WorkflowEvent) -> None:
    """The outbox figure's one handler: does nothing, so the figure is the routing's cost."""


# Publishes into the bench outbox in its steps' own transaction (the drain is not measured).
step_registry = DatabaseEventRegistry(outbox=BenchOutbox)


class Publisher(Base, Workflow):
    """One step that publishes one event: the cost of an effect committed with its step."""

    __tablename__ = "bench_publisher"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def run(self) -> None:
        await step_registry.publish(bench_event(self.id))


WORKFLOWS: dict[str, type[Workflow]] = {
    cls.__name__: cls
    for cls in (NoOp, Chain, Latency, Timer, Waiter, FanParent, FanChild, Publisher)
}
OUTBOX_WORKFLOW = "BenchOutbox"  # the outbox's name on the worker process's command line
WORKFLOWS[OUTBOX_WORKFLOW] = BenchOutbox


class Backlog(Base, Workflow):
    """Rows waiting in a group column, claimed without a limit: the claim cost's baseline."""

    __tablename__ = "bench_backlog"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[int] = mapped_column(Integer)

    @step
    async def run(self) -> None:
        return None


class LimitedBacklog(Base, Workflow):
    """The same rows, at most three of a tenant running at once."""

    __tablename__ = "bench_limited_backlog"
    __workflow_limit__ = Limit(by="tenant", at_most=3)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[int] = mapped_column(Integer)

    @step
    async def run(self) -> None:
        return None


class BenchPayment(Base, Workflow):
    """Runs searched by their own indexed columns (an amount, a time) and the engine's."""

    __tablename__ = "bench_payment"

    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2), index=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )

    @step
    async def charge(self) -> None:
        return None

    @step
    async def refund(self) -> None:
        return None


# -- graph workflows: the subject the transitions figure moves --------------------------------


class BenchTicket(Base, GraphSubject):
    """What the transitions figure moves between two states and back."""

    __tablename__ = "bench_tickets"

    id: Mapped[int] = mapped_column(primary_key=True)
