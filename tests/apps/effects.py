"""A step whose effects (an event, a started run, a row written through its session) commit
with it: the effects tests run it in-process and in worker subprocesses.

`Charge.settle` publishes `charge.settled`, starts a `Parcel` and adds a `Receipt`, then
does what its row's `mode` says: "ok" (commit), "raise" (fail every attempt), "move" (an
operator cancels it meanwhile, so its commit is fenced), "kill" (its first attempt kills its own
process before the commit), "slow" (its first attempt outlives its lease).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import ClassVar

from sqlalchemy import BigInteger, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    Workflow,
    WorkflowEvent,
    declare_engine_tables,
    step,
    step_session,
)
from tests.apps.chain import mark, marks, marks_folder


class Base(DeclarativeBase):
    """The effects tests' base."""


engine_tables = declare_engine_tables(Base, names={"attempt_log": "effects_attempt_log"})
Event, Outbox = engine_tables.event, engine_tables.outbox
registry = DatabaseEventRegistry(outbox=Outbox, settings=EventSettings(async_delivery=True))


class Receipt(Base):
    """A business row the step writes through its session."""

    __tablename__ = "receipts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    charge: Mapped[str] = mapped_column(Text)


class Parcel(Base, Workflow):
    """The run the step starts, one per charge (its reference is unique)."""

    __tablename__ = "parcels"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String, unique=True)

    @step
    async def pack(self) -> None:
        """Nothing to do: the tests count the runs started."""


class Charge(Base, Workflow):
    """Settles a charge, publishing, starting and writing as it goes."""

    __tablename__ = "charges"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String, unique=True)
    mode: Mapped[str] = mapped_column(String, default="ok")
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def settle(self) -> None:
        self.status = "settled"
        await registry.publish(
            WorkflowEvent("charge.settled", payload={"reference": self.reference})
        )
        assert await Parcel(reference=self.reference).start(Parcel.pack)
        async with step_session() as session:
            session.add(Receipt(charge=self.reference))
        await self._then()

    async def _then(self) -> None:
        first = self.mode in ("kill", "slow") and not marks(marks_folder(), self.reference)
        if first:
            mark(self.reference)
        if self.mode == "raise":
            raise RuntimeError("the card was declined after the effects")
        if self.mode == "move":
            assert await Charge.by_key(self.id).cancel() == 1  # an operator, meanwhile
        if first and self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if first and self.mode == "slow":
            await asyncio.sleep(SLOW_FIRST_ATTEMPT)


SLOW_FIRST_ATTEMPT = 1.5  # seconds: past the lease the concurrency test gives its workers


class Refused(Base, Workflow):
    """Publishes, starts and writes a receipt, then a second receipt the database refuses."""

    __tablename__ = "refused"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def go(self) -> None:
        await registry.publish(WorkflowEvent("refused.tried"))
        assert await Parcel(reference=f"r{self.id}").start(Parcel.pack)
        async with step_session() as session:
            session.add(Receipt(charge="first"))
        async with step_session() as session:
            session.add(Receipt(id=1, charge="the id is taken"))


class Gathered(Base, Workflow):
    """Publishes and starts several at once (asyncio.gather), all in its one transaction."""

    __tablename__ = "gathered"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def go(self) -> None:
        started = await asyncio.gather(
            *(registry.publish(WorkflowEvent("gathered", event_id=f"g{i}")) for i in range(5)),
            *(Parcel(reference=f"g{i}").start(Parcel.pack) for i in range(5)),
        )
        assert started == [False] * 5 + [True] * 5


class Lingering(Base, Workflow):
    """Starts a parcel, then works on (until the test lets it go) before its commit."""

    __tablename__ = "lingering"

    id: Mapped[int] = mapped_column(primary_key=True)
    started: ClassVar[asyncio.Event]
    go_on: ClassVar[asyncio.Event]

    @step
    async def go(self) -> None:
        assert await Parcel(reference=f"l{self.id}").start(Parcel.pack)
        Lingering.started.set()
        await Lingering.go_on.wait()
