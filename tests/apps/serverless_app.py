"""The app the Lambda handler tests deploy (DULY_APP): an outbox, a handler, three workflows.

- `signup.received` events start a `Signup` run through the handler this
  module registers on its own `event_registry` (a DatabaseEventRegistry the
  runtime configures, as `duly drain` does): the handler is the only way in.
- `Signup.welcome` logs a line (as an app's step would) and returns
  `wake_in(Signup.nudge, LATER)`; `nudge` then
  waits for `Signup.confirm` until `CONFIRM_WITHIN` (else `expire`): so the
  next instant moves from the nudge to the wait's deadline, and a delivery
  ends the run (nothing left to schedule).
- `Chunk` is a backlog of short steps, `Stuck` a step that outlives any
  deadline (the bound and hand-back tests).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    Workflow,
    WorkflowEvent,
    declare_engine_tables,
    step,
    wait_for,
    wake_in,
)

LATER = timedelta(hours=2)  # from welcome to nudge
CONFIRM_WITHIN = timedelta(days=1)  # how long nudge waits for a confirmation
CHUNK_SECONDS = 0.02  # how long one Chunk step takes
SIGNUP = "signup.received"

log = logging.getLogger("tests.signup")

# Chunk steps running now, across every wake in the process, and the most at once.
running_lock = threading.Lock()
running = {"now": 0, "most": 0}


class Base(DeclarativeBase):
    """The Lambda tests' own base."""


Outbox = declare_engine_tables(Base, prefix="lambda_").outbox  # and lambda_attempts


class Signup(Base, Workflow):
    """Welcomes, nudges two hours later, then waits a day for a confirmation."""

    __tablename__ = "lambda_signup"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String, unique=True)
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def welcome(self) -> object:
        log.info("welcoming a new signup")
        self.status = "welcomed"
        return wake_in(Signup.nudge, LATER)

    @step
    async def nudge(self) -> object:
        self.status = "nudged"
        return wait_for(Signup.confirm, timeout=CONFIRM_WITHIN, on_timeout=Signup.expire)

    @step
    async def confirm(self, code: str) -> None:
        self.status = f"confirmed {code}"

    @step
    async def expire(self) -> None:
        self.status = "expired"


class Chunk(Base, Workflow):
    """One piece of a backlog: a short step."""

    __tablename__ = "lambda_chunk"

    id: Mapped[int] = mapped_column(primary_key=True)
    done: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self) -> None:
        with running_lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        try:
            await asyncio.sleep(CHUNK_SECONDS)
        finally:
            with running_lock:
                running["now"] -= 1
        self.done += 1


class Stuck(Base, Workflow):
    """A step longer than any invocation: a wake must hand it back."""

    __tablename__ = "lambda_stuck"

    id: Mapped[int] = mapped_column(primary_key=True)
    finished: Mapped[bool] = mapped_column(default=False)

    @step
    async def grind(self) -> None:
        await asyncio.sleep(600)
        self.finished = True


async def on_signup(event: WorkflowEvent) -> None:
    """Start the signup's run; a second event for the same email starts nothing."""
    await Signup(email=str(event.payload["email"])).start(Signup.welcome)


event_registry = DatabaseEventRegistry(
    outbox=Outbox, settings=EventSettings(mode="production", async_delivery=True)
)
event_registry.register(SIGNUP, on_signup)
