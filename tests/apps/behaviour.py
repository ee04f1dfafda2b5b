"""Workflows for in-process tests of the engine's rules, steered by module globals."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, mapped_column

import engine.dataclass
from engine import Workflow, declare_engine_tables, every, step, wake_in


class Base(DeclarativeBase):
    """The behaviour tests' base."""


release = asyncio.Event()  # lets a held step finish
holding: list[str] = []  # which worker label is holding a step right now
raise_in_step: list[Exception] = []  # errors Flaky raises, one per attempt


class Held(Base, Workflow):
    """Its first attempt waits for `release`; later attempts go straight through."""

    __tablename__ = "held"

    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[str] = mapped_column(String, default="")
    runs: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self, label: str = "") -> None:
        holding.append(label)
        if len(holding) == 1:
            await release.wait()
        self.value = f"run {len(holding)}"


class Pausing(Base, Workflow):
    """Like Held, but its step changes no column of its own: only what comes next."""

    __tablename__ = "pausing"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def pause(self, label: str = "") -> object:
        holding.append(label)
        position = len(holding)
        if position == 1:
            await release.wait()
        return wake_in(Pausing.pause(f"after run {position}"), timedelta(days=1))


class Flaky(Base, Workflow):
    __tablename__ = "flaky"

    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str] = mapped_column(String(5), default="")

    @step(retries=2, backoff=timedelta(seconds=10), max_backoff=timedelta(seconds=15))
    async def work(self) -> None:
        self.note = "dirty"
        if raise_in_step:
            raise raise_in_step.pop(0)

    @step(retries=1, backoff=timedelta(seconds=1))
    async def too_long(self) -> None:
        self.note = "far too long for five characters"

    @step
    async def returns(self, what: str) -> Any:
        return {"number": 42, "text": "hello", "step": Flaky.work(), "list": [1]}[what]

    @step
    async def needs(self, count: int) -> None:
        self.note = str(count)

    @step
    async def returns_bare_needing_args(self) -> Any:
        return Flaky.needs


class Timer(Base, Workflow):
    __tablename__ = "timer"

    id: Mapped[int] = mapped_column(primary_key=True)
    fired: Mapped[int] = mapped_column(default=0)
    key: Mapped[str | None] = mapped_column(String, unique=True, default=None)

    @step
    async def arm(self) -> object:
        return wake_in(Timer.fire, timedelta(days=1))

    @step
    async def fire(self) -> None:
        self.fired += 1


class Other(Base, Workflow):
    __tablename__ = "other"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def elsewhere(self) -> None:
        return None

    @step
    async def jump(self) -> object:
        return Timer.fire


Attempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "workflow_attempt"}
).attempt_log


class DataBase(MappedAsDataclass, DeclarativeBase, kw_only=True):
    """A dataclass base, as the seed's second spelling."""


class Signup(DataBase, engine.dataclass.Workflow):
    __tablename__ = "signup"

    id: Mapped[int] = mapped_column(primary_key=True, init=False)
    email: Mapped[str]
    nudges: Mapped[int] = mapped_column(default=0)

    @step
    async def nudge(self) -> None:
        self.nudges += 1


SignupAttempt = declare_engine_tables(
    DataBase, events=False, names={"attempt_log": "signup_attempt"}
).attempt_log


class Lasting(Base, Workflow):
    """A step that outlives its lease several times over; renewals must keep it."""

    __tablename__ = "lasting"

    id: Mapped[int] = mapped_column(primary_key=True)
    runs: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self, seconds: float) -> None:
        holding.append("lasting")
        await asyncio.sleep(seconds)
        self.runs += 1


class Alarm(Base, Workflow):
    """Rings `wake_in` after it is armed, on the real clock."""

    __tablename__ = "alarm"

    id: Mapped[int] = mapped_column(primary_key=True)
    rang_at: Mapped[float | None] = mapped_column(default=None)

    @step
    async def arm(self, milliseconds: int) -> object:
        return wake_in(Alarm.ring, timedelta(milliseconds=milliseconds))

    @step
    async def ring(self) -> None:
        import time

        self.rang_at = time.time()


ticks: list[str] = []  # Ticker's runs, by name
schedule_of: dict[str, Any] = {}  # Ticker's schedule, by name


class Ticker(Base, Workflow):
    """Runs on whatever schedule the test put under its name."""

    __tablename__ = "ticker"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    count: Mapped[int] = mapped_column(default=0)

    @step
    async def tick(self) -> object:
        ticks.append(self.name)
        self.count += 1
        return every(Ticker.tick, schedule_of[self.name])


ran_in_lane: list[str] = []  # (step) each Upload step appends where it ran


class Upload(Base, Workflow):
    """The seed's lanes example: heavy work on media workers, the rest anywhere."""

    __tablename__ = "upload"

    id: Mapped[int] = mapped_column(primary_key=True)
    done: Mapped[str] = mapped_column(String, default="")

    @step(lane="media")
    async def transcode(self) -> object:
        ran_in_lane.append("transcode")
        self.done += "t"
        return Upload.notify

    @step
    async def notify(self) -> None:
        ran_in_lane.append("notify")
        self.done += "n"
