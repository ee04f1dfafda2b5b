"""Starting many runs: `start()` one at a time beside `start_many()` in batches, one client.

A producer that starts runs one `start()` at a time pays a statement and a
commit per run; `start_many` pays one per batch. Both start the same number
of fresh NoOp runs from one client on a pool of one connection, and no worker
runs meanwhile, so the figure is the starting alone.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.harness import BenchDatabase
from bench.models import NoOp
from engine import connect_workflows, start_many
from infra.embedded import EmbeddedPostgres

BATCH = 500  # rows per start_many() call


async def measure_batch_starts(server: EmbeddedPostgres, runs: int) -> dict[str, Any]:
    """Start `runs` NoOp runs one at a time, then as many again in batches of BATCH."""
    async with BenchDatabase(server, "bench_starts") as db:
        engine = create_async_engine(db.url, pool_size=1, max_overflow=0)
        try:
            async with connect_workflows(async_sessionmaker(engine), workflows=[NoOp]):
                began = time.perf_counter()
                for run_id in range(1, runs + 1):
                    if not await NoOp(id=run_id).start(NoOp.run):
                        raise RuntimeError(f"start() of NoOp {run_id} found a run already")
                one_s = time.perf_counter() - began
                began = time.perf_counter()
                for first in range(runs + 1, 2 * runs + 1, BATCH):
                    rows = [NoOp(id=n) for n in range(first, min(first + BATCH, 2 * runs + 1))]
                    if not all(await start_many(rows, NoOp.run)):
                        raise RuntimeError(f"start_many() from NoOp {first} found runs already")
                many_s = time.perf_counter() - began
            started = await db.scalar("SELECT count(*) FROM bench_noop WHERE next_step = 'run'")
        finally:
            await engine.dispose()
    if started != 2 * runs:
        raise RuntimeError(f"{started} runs are due, not {2 * runs}")
    return {
        "runs_each": runs,
        "batch": BATCH,
        "one_at_a_time_per_s": runs / one_s,
        "batched_per_s": runs / many_s,
        "batched_over_one": one_s / many_s,
    }
