"""A process of graph clients for the transitions figure: `python -m bench.graph_clients URL ...`.

Each client owns some instances of the ping-pong graph (two states, each
leading to the other) and moves them in turn, one `transition_branch` (one
transaction) at a time, timing each. With `--updates` the same clients,
through the same SQLAlchemy engine, commit plain single-row UPDATEs instead
(BEGIN, UPDATE, COMMIT: one transaction each, each client on a row of its
own): the rate a transition is read beside. The process prints `ready`,
waits for a line on stdin (so every process starts together), runs for the
given seconds, and prints one JSON line: its transactions, their latencies and the
process's CPU time meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.models import Base, BenchOutbox
from engine import DatabaseEventRegistry, EventSettings, GraphRuntime, graph_tables

USER = "bench-user"
UPDATE_ROW = text("UPDATE bench_counter SET v = v + 1 WHERE id = :id")


Transaction = Callable[[], Awaitable[None]]


async def timed(engine: AsyncEngine, seconds: float, clients: list[Transaction]) -> None:
    """Say `ready`, wait for the go, then have each client run its transaction over and over
    for `seconds`, timing each; print the count, the time taken and the latencies."""
    latencies: list[float] = []
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    deadline = time.perf_counter() + seconds

    async def client(once: Transaction) -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            await once()
            latencies.append((time.perf_counter() - began) * 1000)

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(once) for once in clients))
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    await engine.dispose()
    report = {
        "transactions": len(latencies),
        "seconds": elapsed,
        "cpu_seconds": cpu,  # this process's CPU while its clients ran
        "latencies_ms": latencies,
    }
    print(json.dumps(report))


def update_client(engine: AsyncEngine, row: int) -> Transaction:
    """One plain single-row UPDATE transaction on `row`."""

    async def once() -> None:
        async with engine.begin() as conn:
            await conn.execute(UPDATE_ROW, {"id": row})

    return once


def transition_client(runtime: GraphRuntime, owned: list[list[str]]) -> Transaction:
    """One move of the next of `owned` (each: instance, branch, the state it moves to next,
    the other state), in turn."""
    state = [(uuid.UUID(i), uuid.UUID(b), uuid.UUID(x), uuid.UUID(y)) for i, b, x, y in owned]
    turn = [0]

    async def once() -> None:
        at = turn[0] % len(state)
        instance, branch, to, back = state[at]
        outcome = await runtime.transition_branch(instance, branch, to, USER)
        if not outcome.moved:
            raise RuntimeError(f"instance {instance} did not move")
        state[at] = (instance, branch, back, to)
        turn[0] += 1

    return once


def transitions(engine: AsyncEngine, clients: int, work: list[list[str]]) -> list[Transaction]:
    """The clients moving `work`'s instances, notifications written to the outbox in each
    transition's transaction, as deployed."""
    events = DatabaseEventRegistry(
        outbox=BenchOutbox, settings=EventSettings(mode="production", async_delivery=True)
    )
    runtime = GraphRuntime(graph_tables(Base), events=events, engine=engine)
    owned = [work[i::clients] for i in range(clients)]
    return [transition_client(runtime, mine) for mine in owned if mine]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--updates", action="store_true", help="plain UPDATEs, not transitions")
    args = parser.parse_args()
    work = json.loads(sys.stdin.readline())
    engine = create_async_engine(args.url, pool_size=args.clients, max_overflow=0)
    if args.updates:
        clients = [update_client(engine, row) for row in work[: args.clients]]
    else:
        clients = transitions(engine, args.clients, work)
    asyncio.run(timed(engine, args.seconds, clients))


if __name__ == "__main__":
    main()
