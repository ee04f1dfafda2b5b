"""A waiting workflow for the property and multi-process tests of deliver.

`Waiter` records on its own row everything the tests check: the values it
received, how many answers and timeouts ended its waits, and which wait each
ended. Run as `python -m tests.apps.waits URL RUN_ID VALUE...` it is a
delivering process: it prints "ready", waits for "go" on stdin, delivers
`Waiter.answer(value)` with key `k<value>` for every value at once, each on a
connection of its own, and prints the results as one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

from sqlalchemy import JSON, String, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    Step,
    Workflow,
    connect_workflows,
    declare_engine_tables,
    every,
    step,
    wait_for,
)

TIMEOUT = timedelta(hours=1)  # how long each wait lasts before Waiter.expire runs
SCHEDULE = timedelta(hours=2)  # the interval of `after_answer == "schedule"`
AFTER_ANSWER = ("wait", "stop", "other", "schedule")  # what Waiter.answer does next


class Base(DeclarativeBase):
    """The wait tests' own base."""


class Waiter(Base, Workflow):
    """Waits for answers; `after_answer` (set by the test) says what an answer leads to."""

    __tablename__ = "wait_run"

    id: Mapped[int] = mapped_column(primary_key=True)
    after_answer: Mapped[str] = mapped_column(String, default="wait")
    received: Mapped[list[int]] = mapped_column(JSON, default=list)
    answers: Mapped[int] = mapped_column(default=0)
    timeouts: Mapped[int] = mapped_column(default=0)
    begins: Mapped[int] = mapped_column(default=0)
    waits: Mapped[int] = mapped_column(default=0)  # waits armed so far, numbered from 1
    # [wait number, "answer" | "timeout"] for every wait an answer or a timeout ended.
    endings: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)

    @step
    async def begin(self) -> object:
        """Start (or start again): wait for an answer."""
        self.begins += 1
        return self._wait(Waiter.answer)

    @step
    async def answer(self, value: int) -> object:
        """Take an answer, which ends the wait; then what `after_answer` says."""
        # JSON columns are reassigned, never changed in place, so the change is seen.
        self.received = [*self.received, value]
        self.answers += 1
        self.endings = [*self.endings, [self.waits, "answer"]]
        if self.after_answer == "stop":
            return None
        if self.after_answer == "schedule":
            return every(Waiter.begin, SCHEDULE)
        return self._wait(Waiter.other if self.after_answer == "other" else Waiter.answer)

    @step
    async def other(self) -> None:
        """A step no test delivers to: waiting for it is waiting for something else."""

    @step
    async def expire(self) -> None:
        """The wait's timeout: nobody answered in time, and the run stops."""
        self.timeouts += 1
        self.endings = [*self.endings, [self.waits, "timeout"]]

    def _wait(self, target: Step[Waiter, Any]) -> object:
        self.waits += 1
        return wait_for(target, timeout=TIMEOUT, on_timeout=Waiter.expire)


WaitAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "wait_attempt"}
).attempt_log


async def deliver_all(url: str, run_id: int, values: list[int]) -> dict[str, int]:
    """Deliver every value to run `run_id` at once, one connection each, after "go"."""
    engine = create_async_engine(url, pool_size=len(values), max_overflow=0)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    try:
        async with connect_workflows(Session, workflows=[Waiter]):
            await _open_connections(Session, len(values))
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            handle = Waiter.by(Waiter.id == run_id)
            results = await asyncio.gather(
                *(handle.deliver(Waiter.answer(value), key=f"k{value}") for value in values)
            )
    finally:
        await engine.dispose()
    return {str(value): result for value, result in zip(values, results, strict=True)}


async def _open_connections(Session: async_sessionmaker[Any], count: int) -> None:
    """Fill the pool before "go", so the deliveries race rather than queue for connecting."""
    opened = asyncio.Barrier(count)

    async def hold() -> None:
        async with Session() as session:
            await session.execute(select(1))
            await opened.wait()

    await asyncio.gather(*(hold() for _ in range(count)))


def main() -> None:
    """`python -m tests.apps.waits URL RUN_ID VALUE...`: see the module docstring."""
    url, run_id, *values = sys.argv[1:]
    results = asyncio.run(deliver_all(url, int(run_id), [int(v) for v in values]))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
