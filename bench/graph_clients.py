"""A process of graph clients for the transitions figure: `python -m bench.graph_clients URL ...`.

Each client owns some instances of the ping-pong graph (two states, each
leading to the other) and moves them in turn, one `transition_branch` (one
transaction) at a time, timing each. With `--updates` the same clients,
through the same SQLAlchemy engine, commit plain single-row UPDATEs instead
(BEGIN, UPDATE, COMMIT: one transaction each, each client on a row of its
own): the rate a transition is read beside. The process prints `ready`,
waits for a line on stdin (so every process starts together), runs for the
given seconds, and prints one JSON line: its transactions and their latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.models import Base, BenchOutbox
from engine import DatabaseEventRegistry, EventSettings, GraphRuntime, graph_tables

USER = "bench-user"
UPDATE_ROW = text("UPDATE bench_counter SET v = v + 1 WHERE id = :id")


async def updates(engine: AsyncEngine, clients: int, seconds: float, rows: list[int]) -> None:
    """Plain single-row UPDATE transactions from `clients` clients, one row each."""
    latencies: list[float] = []
    count = [0]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    deadline = time.perf_counter() + seconds

    async def client(row: int) -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            async with engine.begin() as conn:
                await conn.execute(UPDATE_ROW, {"id": row})
            latencies.append((time.perf_counter() - began) * 1000)
            count[0] += 1

    began = time.perf_counter()
    await asyncio.gather(*(client(row) for row in rows[:clients]))
    elapsed = time.perf_counter() - began
    await engine.dispose()
    print(json.dumps({"transactions": count[0], "seconds": elapsed, "latencies_ms": latencies}))


async def run(url: str, clients: int, seconds: float, instances: list[list[str]]) -> None:
    """Move `instances` (per client: instance, branch, state a, state b) for `seconds`."""
    engine = create_async_engine(url, pool_size=clients, max_overflow=0)
    # Notifications are written to the outbox in each transition's transaction, as deployed.
    events = DatabaseEventRegistry(
        outbox=BenchOutbox, settings=EventSettings(mode="production", async_delivery=True)
    )
    runtime = GraphRuntime(graph_tables(Base), events=events, engine=engine)
    per_client = [instances[i::clients] for i in range(clients)]
    latencies: list[float] = []
    count = [0]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    deadline = time.perf_counter() + seconds

    async def client(owned: list[list[str]]) -> None:
        # Each instance: its id, its branch, and the state it moves to next.
        state = [(uuid.UUID(i), uuid.UUID(b), uuid.UUID(x), uuid.UUID(y)) for i, b, x, y in owned]
        turn = 0
        while time.perf_counter() < deadline:
            instance, branch, to, back = state[turn % len(state)]
            began = time.perf_counter()
            outcome = await runtime.transition_branch(instance, branch, to, USER)
            latencies.append((time.perf_counter() - began) * 1000)
            if not outcome.moved:
                raise RuntimeError(f"instance {instance} did not move")
            state[turn % len(state)] = (instance, branch, back, to)
            count[0] += 1
            turn += 1

    began = time.perf_counter()
    await asyncio.gather(*(client(owned) for owned in per_client if owned))
    elapsed = time.perf_counter() - began
    await engine.dispose()
    print(json.dumps({"transactions": count[0], "seconds": elapsed, "latencies_ms": latencies}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--updates", action="store_true", help="plain UPDATEs, not transitions")
    args = parser.parse_args()
    work = json.loads(sys.stdin.readline())
    if args.updates:
        engine = create_async_engine(args.url, pool_size=args.clients, max_overflow=0)
        asyncio.run(updates(engine, args.clients, args.seconds, work))
    else:
        asyncio.run(run(args.url, args.clients, args.seconds, work))


if __name__ == "__main__":
    main()
