"""Limited workflows for the limit tests, in one process and in worker processes.

`Lookup` allows three running per customer and records on its row when its
step started and ended (wall clock, one machine), so a test can count how
many of one customer overlapped. `Charge` may start 60 steps a minute per
provider, counted in `WorkflowRate`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, mapped_column

from engine import Limit, Workflow, declare_engine_tables, step

AT_MOST = 3
RATE = 60  # starts per PERIOD, per provider
PERIOD = timedelta(minutes=1)


class Base(DeclarativeBase):
    """The limit tests' own base."""


class Lookup(Base, Workflow):
    __tablename__ = "lookup"
    __workflow_limit__ = Limit(by="customer", at_most=AT_MOST)

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(40))
    started: Mapped[float | None] = mapped_column(default=None)
    ended: Mapped[float | None] = mapped_column(default=None)

    @step
    async def work(self, seconds: float) -> None:
        self.started = time.time()
        await asyncio.sleep(seconds)
        self.ended = time.time()


class Charge(Base, Workflow):
    __tablename__ = "charge"
    __workflow_limit__ = Limit(by="provider", rate=RATE, per=PERIOD)

    id: Mapped[int] = mapped_column(primary_key=True)
    provider: Mapped[str] = mapped_column(String(40))
    charged: Mapped[int] = mapped_column(default=0)

    @step
    async def charge(self) -> None:
        self.charged += 1

    @step
    async def charge_twice(self) -> object:
        self.charged += 1
        return Charge.charge


class Burst(Base, Workflow):
    """A fast rate, for worker processes sharing one bucket in real time."""

    __tablename__ = "burst"
    __workflow_limit__ = Limit(by="provider", rate=20, per=timedelta(seconds=1))

    id: Mapped[int] = mapped_column(primary_key=True)
    provider: Mapped[str] = mapped_column(String(40))

    @step
    async def go(self) -> None:
        return None


engine_tables = declare_engine_tables(
    Base,
    events=False,
    rate_buckets=True,
    names={"rate_bucket": "workflow_rate", "attempt_log": "limit_attempt"},
)
WorkflowRate, LimitAttempt = engine_tables.rate_bucket, engine_tables.attempt_log


class DataBase(MappedAsDataclass, DeclarativeBase):
    """A dataclass base, for the RateBucket twin."""


DataRate = declare_engine_tables(
    DataBase, events=False, attempts=False, rate_buckets=True, names={"rate_bucket": "data_rate"}
).rate_bucket


class Render(Base, Workflow):
    """A limited workflow with a step in the `media` lane: one render per customer at a time."""

    __tablename__ = "render"
    __workflow_limit__ = Limit(by="customer", at_most=1)

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(40))
    prepared: Mapped[bool] = mapped_column(default=False)
    started: Mapped[float | None] = mapped_column(default=None)
    ended: Mapped[float | None] = mapped_column(default=None)

    @step
    async def prepare(self) -> object:
        self.prepared = True
        return Render.render

    @step(lane="media")
    async def render(self) -> None:
        self.started = time.time()
        await asyncio.sleep(0.05)
        self.ended = time.time()


class Shipment(Base, Workflow):
    """A limited workflow keyed by two columns, grouped by an integer."""

    __tablename__ = "shipment"
    __workflow_limit__ = Limit(by="warehouse", at_most=2, rate=5, per=timedelta(minutes=1))

    order_id: Mapped[int] = mapped_column(primary_key=True)
    line: Mapped[int] = mapped_column(primary_key=True)
    warehouse: Mapped[int] = mapped_column()
    shipped: Mapped[bool] = mapped_column(default=False)

    @step
    async def ship(self) -> None:
        self.shipped = True
