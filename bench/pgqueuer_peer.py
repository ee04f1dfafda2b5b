"""The peer duly is measured against: pgqueuer's own QueueManager on the same no-op load.

    python -m bench.pgqueuer_peer DATABASE_URL JOBS [--concurrency 8]

One process, as pgqueuer's README sets it up: an asyncpg connection behind
`AsyncpgDriver`, its schema installed by `Queries.install()`, the jobs enqueued
in one call, then `QueueManager.run(mode=drain)` with one no-op entrypoint.
"Concurrency 8" is `max_concurrent_tasks=8`, this worker's own cap (pgqueuer
asks for a batch size of at most half of it: 4). The entrypoint's
`concurrency_limit=8` is not used: it is enforced in SQL across workers and
makes this worker poll every 0.1 s (79 jobs/s here), which would flatter duly.
It prints `jobs_per_s <rate>` and `seconds <s>` (from the run's start to the
drain's end, the way the no-op line times duly from its worker's "ready" to
the last run) and `cpu <s>`.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import asyncpg
from pgqueuer import (
    AsyncpgDriver,
    Job,
    Queries,
    QueueManager,
    __version__ as pgqueuer_version,  # re-exported for the report
)
from pgqueuer.types import QueueExecutionMode

if TYPE_CHECKING:
    from bench.harness import BenchDatabase

__all__ = ["measure_pgqueuer", "pgqueuer_version"]

ENTRYPOINT = "noop"
PEER_TIMEOUT = 600.0


async def measure(dsn: str, jobs: int, concurrency: int) -> dict[str, float]:
    connection = await asyncpg.connect(dsn)
    try:
        driver = AsyncpgDriver(connection)
        queries = Queries(driver)
        await queries.install()
        await queries.enqueue([ENTRYPOINT] * jobs, [None] * jobs, [0] * jobs)
        manager = QueueManager(queries)
        done = 0

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        started = time.perf_counter()
        await manager.run(
            dequeue_timeout=timedelta(seconds=1),
            batch_size=max(1, concurrency // 2),
            max_concurrent_tasks=concurrency,
            mode=QueueExecutionMode.drain,
        )
        seconds = time.perf_counter() - started
        left = await connection.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await connection.close()
    if done != jobs or left:
        raise RuntimeError(f"pgqueuer ran {done} of {jobs} jobs and left {left} queued")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    return {"seconds": seconds, "jobs_per_s": jobs / seconds, "cpu": cpu}


async def measure_pgqueuer(db: BenchDatabase, jobs: int, concurrency: int) -> dict[str, float]:
    """Run this module as a subprocess on `db` (empty of pgqueuer's tables); what it printed."""
    dsn = db.url.replace("postgresql+psycopg://", "postgresql://", 1)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.pgqueuer_peer",
        dsn,
        str(jobs),
        "--concurrency",
        str(concurrency),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), PEER_TIMEOUT)
    if process.returncode != 0:
        raise RuntimeError(f"pgqueuer's run exited with {process.returncode}; stderr is above")
    found: dict[str, float] = {}
    for line in out.decode().splitlines():
        word, _, value = line.partition(" ")
        found[word] = float(value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", help="a libpq URL (postgresql://...) of an empty database")
    parser.add_argument("jobs", type=int)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    found = asyncio.run(measure(args.dsn, args.jobs, args.concurrency))
    for word, value in found.items():
        print(word, value, flush=True)


if __name__ == "__main__":
    main()
