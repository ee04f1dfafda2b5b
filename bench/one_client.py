"""deliver() beside start() from one client: each call one statement, one commit.

A webhook handler calls one or the other per request, so the figure that
matters is calls/s from one client, each awaited before the next. The two
are timed in alternating blocks of BLOCK calls on the same connection pool,
so a slow patch of a shared machine slows both alike, and the ratio holds
where the absolute rates wander.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.harness import BenchDatabase, WorkerProcess, insert_due_runs, wait_until_done
from bench.models import NoOp, Waiter
from engine import connect_workflows
from infra.embedded import EmbeddedPostgres

BLOCK = 100  # calls of one kind before switching to the other
WARMUP = 50  # calls of each kind left out before the clock starts


async def measure_deliver_beside_start(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> dict[str, Any]:
    """Park `runs` Waiter runs, then deliver to each and start as many NoOp runs, alternating."""
    calls = runs - WARMUP
    async with BenchDatabase(server, "bench_one_client") as db:
        async with WorkerProcess(db, ["Waiter"], pool_size) as worker:
            await insert_due_runs(db, Waiter, "park", runs, announce=True)
            await wait_until_done(db, "bench_waiter", worker)
        engine = create_async_engine(db.url, pool_size=1, max_overflow=0)
        deliver_s = start_s = deliver_cpu = start_cpu = 0.0
        try:
            async with connect_workflows(async_sessionmaker(engine), workflows=[Waiter, NoOp]):
                for run_id in range(1, WARMUP + 1):
                    await _deliver(run_id)
                    await NoOp(id=run_id).start(NoOp.run)
                for first in range(WARMUP + 1, runs + 1, BLOCK):
                    ids = range(first, min(first + BLOCK, runs + 1))
                    wall, cpu = time.perf_counter(), time.process_time()
                    for run_id in ids:
                        await _deliver(run_id)
                    deliver_s += time.perf_counter() - wall
                    deliver_cpu += time.process_time() - cpu
                    wall, cpu = time.perf_counter(), time.process_time()
                    for run_id in ids:
                        if not await NoOp(id=run_id).start(NoOp.run):
                            raise RuntimeError(f"start() of NoOp {run_id} found a run already")
                    start_s += time.perf_counter() - wall
                    start_cpu += time.process_time() - cpu
        finally:
            await engine.dispose()
    return {
        "calls_each": calls,
        "deliver_per_s": calls / deliver_s,
        "start_per_s": calls / start_s,
        "deliver_over_start": start_s / deliver_s,
        # The client's CPU per call: near the wall time per call means the client is the bound.
        "deliver_client_cpu_us": deliver_cpu / calls * 1e6,
        "start_client_cpu_us": start_cpu / calls * 1e6,
    }


async def _deliver(run_id: int) -> None:
    if await Waiter.by(Waiter.id == run_id).deliver(Waiter.answer(run_id)) != 1:
        raise RuntimeError(f"Waiter {run_id} refused its event")
