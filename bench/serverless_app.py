"""The serverless path bench's app (DULY_APP=bench.serverless_app): a timer and a chain.

Steps note the instant they start in this process's memory (the emulation runs them on
its firer's thread, in the bench's process), so reading the figures sends no query.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

from sqlalchemy import Float, Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step, wake_in

# run id -> the instant it was due (time.time(), noted just before the arming step's commit)
DUE: dict[int, float] = {}
# run id -> the instant its timed step started
FIRED: dict[int, float] = {}
# chain id -> the instant each of its steps started, in order
HOPS: defaultdict[int, list[float]] = defaultdict(list)


class Base(DeclarativeBase):
    """The serverless path bench's own base: its tables alone."""


class PathTimer(Base, Workflow):
    """Arms a wake_in of `delay_ms`, then fires: the wake lateness on the serverless path."""

    __tablename__ = "bench_path_timer"

    id: Mapped[int] = mapped_column(primary_key=True)
    delay_ms: Mapped[int] = mapped_column(Integer)
    due_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def arm(self) -> object:  # a wake_in(...) directive
        self.due_at = DUE[self.id] = time.time() + self.delay_ms / 1000
        return wake_in(PathTimer.fire, timedelta(milliseconds=self.delay_ms))

    @step
    async def fire(self) -> None:
        FIRED[self.id] = time.time()


class PathChain(Base, Workflow):
    """`hops` steps, each returning the next: step-to-step latency in one wake invocation."""

    __tablename__ = "bench_path_chain"

    id: Mapped[int] = mapped_column(primary_key=True)
    hops: Mapped[int] = mapped_column(Integer)

    @step
    async def hop(self) -> object:  # the next bare step, or None at the end
        HOPS[self.id].append(time.time())
        self.hops -= 1
        return PathChain.hop if self.hops > 0 else None
