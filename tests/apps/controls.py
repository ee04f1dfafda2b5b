"""Workflows for a step's controls: errors that stop a run, timeouts, plain `def` steps."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import StepFailed, Workflow, declare_engine_tables, step, step_session

QUICK = timedelta(milliseconds=50)  # a retry's backoff short enough to watch


class Base(DeclarativeBase):
    """The controls tests' base."""


class CardDeclined(Exception):
    """What a payment provider says no retry will change."""


class CardExpired(CardDeclined):
    """A kind of declined card: stops the run as its base does."""


gate = threading.Event()  # what a blocking plain step waits for; set at each test's end
late: list[str] = []  # plain steps whose thread returned after their attempt timed out
raise_next: list[Exception] = []  # what Plain.flaky raises, one per attempt
began: list[str] = []  # the attempts of Hanging.outlast_the_lease that began


class Charge(Base, Workflow):
    """A payment whose step raises what its argument says, counting its tries."""

    __tablename__ = "control_charge"

    id: Mapped[int] = mapped_column(primary_key=True)
    tries: Mapped[int] = mapped_column(default=0)

    @step(retries=5, backoff=QUICK, stop_on=(CardDeclined,))
    async def charge(self, outcome: str) -> None:
        self.tries += 1
        if outcome == "declined":
            raise CardDeclined("card 4242 declined")
        if outcome == "expired":
            raise CardExpired("card 4242 expired")
        if outcome == "failed":
            raise StepFailed("the shop closed the order")
        raise ConnectionError("gateway unreachable")  # not named: retried

    @step(retries=3, backoff=QUICK, stop_on=CardDeclined)
    def charge_plainly(self) -> None:
        self.tries += 1
        raise CardExpired("card 4242 expired")


class Receipt(Base):
    """A row a step writes through `step_session()`: there only if its attempt committed."""

    __tablename__ = "control_receipt"

    id: Mapped[int] = mapped_column(primary_key=True)


class Hanging(Base, Workflow):
    """Steps that never finish on their own, and one that raises its own TimeoutError."""

    __tablename__ = "control_hanging"

    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str] = mapped_column(String, default="")

    @step(retries=1, backoff=QUICK, timeout=0.2)
    async def hang(self) -> None:
        self.note = "hung"
        await asyncio.Event().wait()  # nobody sets it

    @step(timeout=timedelta(seconds=1.5))
    async def outlast_the_lease(self, label: str) -> None:
        began.append(label)
        await asyncio.Event().wait()

    @step(timeout=0.2)
    async def swallows_its_cancellation(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.note = "finished anyway"

    @step(timeout=0.2)
    async def write_then_hang(self) -> None:
        async with step_session() as session:
            session.add(Receipt(id=self.id))
        await asyncio.Event().wait()

    @step(timeout=5)
    async def provider_timeout(self) -> None:
        raise TimeoutError("provider answered nothing in 3 s")


class Plain(Base, Workflow):
    """Steps declared with a plain `def`: each runs in a worker thread."""

    __tablename__ = "control_plain"

    id: Mapped[int] = mapped_column(primary_key=True)
    count: Mapped[int] = mapped_column(default=0)
    thread: Mapped[str] = mapped_column(String, default="")
    note: Mapped[str] = mapped_column(String, default="")

    @step
    def tally(self, by: int) -> object:
        self.count += by
        self.thread = threading.current_thread().name
        return Plain.finish("tallied")

    @step
    async def finish(self, note: str) -> None:
        self.note = note

    @step(retries=1, backoff=QUICK)
    def flaky(self) -> None:
        self.count += 1  # a failed attempt's change is not committed
        if raise_next:
            raise raise_next.pop(0)

    @step(timeout=0.2)
    def blocks(self) -> None:
        self.note = "blocked"
        gate.wait(timeout=30)
        late.append("blocks")

    @step
    def waits_for_gate(self) -> None:
        gate.wait(timeout=30)
        self.note = "through the gate"

    @step
    async def quick(self) -> None:
        self.note = "quick"


Attempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "control_attempt"}
).attempt_log
