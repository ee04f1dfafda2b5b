"""The pressure bench's producer process: starts Probe runs at a steady rate, in small batches.

    python -m bench.pressure_producer URL [--start-many]

It reads commands from stdin, one a line: `offer RATE PHASE` (runs a second,
and the phase the runs are tagged with; it answers `offering PHASE <time>`),
`fill TARGET PHASE` (every tick, as many runs as bring the unfinished ones
back to TARGET: the load of a pipeline kept full, which the capacity is
read on; same answer) and `stop`. A batch goes in whenever at least one run
is owed by the rate (so about RATE x TICK rows a batch), each row stamped
with `time.time()` just before its batch is sent. It prints `ready` first,
and `failed <n>` (batches the database refused, retried) as it stops.

A batch is one announced INSERT … SELECT (`offer_probes`): the producer stands
for an app's web servers, which run on other machines, so on the bench's own
cores it costs what their starts cost the database and little more.
`--start-many` builds the rows in Python and starts them with `start_many`
instead, as an app would, at the price of the workers' CPU.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.pressure_app import Probe, offer_probes
from bench.pressure_figures import BACKLOG
from engine import connect_workflows, start_many

TICK = 0.02  # seconds between two looks at what is owed
MAX_BATCH = 200  # rows per start_many() when the producer has fallen behind
RETRY_DELAY = 0.2  # seconds before a refused batch is sent again
PRODUCER_APPLICATION = "duly-pressure-producer"


@dataclass
class Offer:
    """What is being offered now, and how much of it since it began."""

    rate: float = 0.0
    phase: str = "idle"
    target: int = 0  # `fill`: the unfinished runs kept; 0 while offering at `rate`
    since: float = 0.0  # time.monotonic() when this offer began
    offered: int = 0


async def read_commands(offer: Offer, stop: asyncio.Event) -> None:
    """Follow stdin's commands until `stop` or its end."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().split():
        if line[0] in ("offer", "fill"):
            offer.phase, offer.since, offer.offered = line[2], time.monotonic(), 0
            offer.rate = float(line[1]) if line[0] == "offer" else 0.0
            offer.target = int(line[1]) if line[0] == "fill" else 0
            print(f"offering {offer.phase} {time.time()}", flush=True)
        elif line[0] == "stop":
            break
    stop.set()


async def produce(url: str, with_start_many: bool) -> int:
    """Offer runs as told until stopped; the number of batches the database refused."""
    engine = create_async_engine(
        url,
        pool_size=2,
        pool_pre_ping=True,
        connect_args={"application_name": PRODUCER_APPLICATION},
    )
    offer, stop, failed = Offer(), asyncio.Event(), 0

    async def send(batch: int) -> None:
        offered_at = time.time()
        if with_start_many:
            rows = [Probe(phase=offer.phase, offered_at=offered_at) for _ in range(batch)]
            await start_many(rows, Probe.run)
            return
        async with engine.begin() as conn:
            for statement in offer_probes(offer.phase, batch, offered_at):
                await conn.execute(statement)

    async def owed() -> int:
        """Runs the offer owes now: by its rate, or what tops the unfinished up to its target."""
        if not offer.target:
            return int(offer.rate * (time.monotonic() - offer.since)) - offer.offered
        async with engine.connect() as conn:
            unfinished = (await conn.execute(text(BACKLOG))).scalar_one()
        return max(0, offer.target - unfinished)

    commands = asyncio.create_task(read_commands(offer, stop))
    try:
        async with connect_workflows(async_sessionmaker(engine), workflows=[Probe]):
            print("ready", flush=True)
            while not stop.is_set():
                due = await owed()
                batch = min(due, MAX_BATCH)
                if batch > 0:
                    try:
                        await send(batch)
                    except DBAPIError:
                        failed += 1  # not in the table, so not offered: counted, then sent again
                        await asyncio.sleep(RETRY_DELAY)
                        continue
                    offer.offered += batch
                if due <= MAX_BATCH:  # caught up: the next batch is what a tick owes
                    await asyncio.sleep(TICK)
    finally:
        commands.cancel()
        await engine.dispose()
    return failed


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    failed = asyncio.run(produce(sys.argv[1], "--start-many" in sys.argv[2:]))
    print(f"failed {failed}", flush=True)


if __name__ == "__main__":
    main()
