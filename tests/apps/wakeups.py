"""The no-lost-wake-up tests' app (DULY_APP), and the process that starts its runs.

- `Ping.ping` counts, then comes back for `Ping.pong` after the run's
  `delay` (at once when 0), which counts too: each run must show 1 and 1.
  A delay puts an instant in EventBridge Scheduler's hands; no delay leaves
  the next step ready at once, for whichever wake is about.
- `Piece` is one short step of a backlog; `running` counts them across
  every wake in the process, and the most at once, and how many wakes
  (threads) ran one at the same moment.

`python -m tests.apps.wakeups URL COUNT SEED` is a process that only
addresses runs, as a web app on AWS would: `connect_workflows`, and the
wake function kicked after each commit through `kick_wake_after_commits`
(debounced, `KICK_INTERVAL`). Its Lambda client writes each asynchronous
invoke as a JSON line `{"invoke": payload}` on stdout, which the test turns
into a wake invocation. It says "ready", starts COUNT runs at random
moments (bursts, and lulls in which wakes finish and leave), the last with
a delay so only the schedule can finish it, and ends with a JSON line of
what it started and kicked.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
from datetime import timedelta
from typing import Any

from sqlalchemy import Float
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, connect_workflows, step, wake_in
from infra.aws.kicks import aws_wake_invoke, kick_wake_after_commits

WAKE_ARN = "arn:aws:lambda:us-east-1:123456789012:function:duly-wakeups-wake"
KICK_INTERVAL = 0.15  # seconds: at most one invoke per this long from the starting process
PIECE_SECONDS = 0.02  # how long one Piece step takes
DELAYS = (0.0, 0.0, 0.0, 0.4, 1.0, 1.7, 2.5)  # seconds from ping to pong, drawn per run
LAST_DELAY = 2.0  # the last run's: nothing but the schedule is left to wake it
LULL = (0.8, 2.2)  # seconds of a pause between bursts
LULL_CHANCE = 0.06  # of a pause before any one start

running_lock = threading.Lock()
# Piece steps running now across the process and the most at once; the same by thread, each
# wake invocation's (a container's loop runs on a thread of its own), and the most threads.
running = {"now": 0, "most": 0, "wakes": 0}
running_by_thread: dict[int, int] = {}


class Base(DeclarativeBase):
    """The wake-up tests' own base."""


class Ping(Base, Workflow):
    """Ping now, pong after `delay` seconds; both counted."""

    __tablename__ = "wakeup_ping"

    id: Mapped[int] = mapped_column(primary_key=True)
    delay: Mapped[float] = mapped_column(Float, default=0.0)
    pinged: Mapped[int] = mapped_column(default=0)
    ponged: Mapped[int] = mapped_column(default=0)

    @step
    async def ping(self) -> object:
        self.pinged += 1
        if self.delay > 0:
            return wake_in(Ping.pong, timedelta(seconds=self.delay))
        return Ping.pong

    @step
    async def pong(self) -> None:
        self.ponged += 1


class Piece(Base, Workflow):
    """One piece of a backlog: a short step, counted."""

    __tablename__ = "wakeup_piece"

    id: Mapped[int] = mapped_column(primary_key=True)
    done: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self) -> None:
        thread = threading.get_ident()
        with running_lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            running_by_thread[thread] = running_by_thread.get(thread, 0) + 1
            running["wakes"] = max(running["wakes"], len(running_by_thread))
        try:
            await asyncio.sleep(PIECE_SECONDS)
        finally:
            with running_lock:
                running["now"] -= 1
                running_by_thread[thread] -= 1
                if not running_by_thread[thread]:
                    del running_by_thread[thread]
        self.done += 1


class StdoutLambda:
    """A boto3 `lambda` client whose asynchronous invoke is a line on stdout for the test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, Any]:
        assert (FunctionName, InvocationType) == (WAKE_ARN, "Event")
        with self.lock:
            sys.stdout.write(json.dumps({"invoke": json.loads(Payload)}) + "\n")
            sys.stdout.flush()
        return {"StatusCode": 202}


def pause(rng: random.Random) -> float:
    """Seconds before the next start: mostly a burst, sometimes a lull."""
    if rng.random() < LULL_CHANCE:
        return rng.uniform(*LULL)
    return rng.choice([0.0, 0.0, 0.002, 0.01, 0.03, 0.08])


async def start_runs(url: str, count: int, seed: int) -> dict[str, int]:
    """Start `count` Ping runs at random moments, kicking the wake function after each."""
    engine = create_async_engine(url, pool_size=2)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    rng = random.Random(seed)
    started = 0
    invoke = aws_wake_invoke(WAKE_ARN, StdoutLambda())
    try:
        async with (
            connect_workflows(Session, workflows=[Ping]) as connection,
            kick_wake_after_commits(connection, invoke, KICK_INTERVAL) as kicker,
        ):
            print("ready", flush=True)
            for n in range(count):
                await asyncio.sleep(pause(rng))
                delay = LAST_DELAY if n == count - 1 else rng.choice(DELAYS)
                started += await Ping(delay=delay).start(Ping.ping)
    finally:
        await engine.dispose()
    return {"started": started, "requested": kicker.requested, "sent": kicker.sent}


def main() -> None:
    """`python -m tests.apps.wakeups URL COUNT SEED`: see the module docstring."""
    url, count, seed = sys.argv[1:]
    report = asyncio.run(start_runs(url, int(count), int(seed)))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
