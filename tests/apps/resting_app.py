"""The app the pausing-database tests deploy (DULY_APP): a run that ticks, then waits, N times.

`Cycle.tick` counts its executions per run and cycle in this process (`executions`),
so a test sees each step ran exactly once, and returns `wake_in(Cycle.tick, wait)`
until the run's `cycles` are done: between two ticks nothing is due for `wait_seconds`.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step, wake_in

# (run id, cycle) -> times its tick ran, across every container of the process.
executions: Counter[tuple[int, int]] = Counter()
executions_lock = threading.Lock()


class Base(DeclarativeBase):
    """The pausing-database tests' own base."""


class Cycle(Base, Workflow):
    """Ticks `cycles` times, `wait_seconds` apart."""

    __tablename__ = "resting_cycle"

    id: Mapped[int] = mapped_column(primary_key=True)
    cycles: Mapped[int] = mapped_column(default=3)
    wait_seconds: Mapped[float] = mapped_column(default=5.0)
    done: Mapped[int] = mapped_column(default=0)

    @step
    async def tick(self) -> object:
        with executions_lock:
            executions[(self.id, self.done + 1)] += 1
        self.done += 1
        if self.done < self.cycles:
            return wake_in(Cycle.tick, timedelta(seconds=self.wait_seconds))
        return None


def ticks() -> int:
    """Ticks run so far, in every run."""
    with executions_lock:
        return sum(executions.values())
