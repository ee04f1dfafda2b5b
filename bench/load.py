"""What more worker processes buy, what a long-running worker holds, and timers under load.

- Scaling: 1, 2 and 4 worker processes drain one table of no-op runs; the
  total steps/s, and the server's WAL bytes, WAL writes and flushes and CPU
  a step, are read beside the same run's pgbench 8-client UPDATE rate and
  cost. The workers start on an empty table and the runs go in, announced,
  in one insert: every worker starts with the clock.
- Memory: one worker's resident set after 10,000 no-op steps and after
  100,000 (a worker that keeps something per step grows by the difference).
- Timers under load: the wake_in lateness run of `measures.measure_lateness`
  while another worker process drains 5,000-run batches of no-op steps, one
  batch after another, for as long as the timers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg
from sqlalchemy import select

from bench.harness import (
    BenchDatabase,
    WorkerProcess,
    check_no_failures,
    insert_due_runs,
    wait_until_done,
)
from bench.measures import TIMER_START_EVERY, elapsed_ms, start_spaced, timer_delays
from bench.models import NoOp, Timer
from bench.server_cost import (
    cost_between,
    install_wal_reader,
    one_row,
    per_unit,
    read_server,
    settled_reading,
    wal_by_kind,
)
from infra.embedded import EmbeddedPostgres

PAGE_SIZE = 4096
LOAD_BATCH = 5000  # no-op runs per batch of the load beside the timers
FINISHED = "SELECT count(*) FROM bench_noop WHERE next_step IS NULL"
# Whether autovacuum visited the table during the drain (its WAL would count against the steps).
AUTOVACUUMS = "SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'bench_noop'"


async def measure_scaling(
    server: EmbeddedPostgres, runs: int, processes: int, pool_size: int | None
) -> dict[str, Any]:
    """`processes` workers drain `runs` no-op runs inserted at once; steps/s in total, and what
    the server spent a step (WAL bytes, writes and flushes, CPU) once the runs were in."""
    async with (
        BenchDatabase(server, f"bench_scaling_{processes}") as db,
        await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn,
    ):
        walinspect = await install_wal_reader(conn)
        async with contextlib.AsyncExitStack() as stack:
            workers = [
                await stack.enter_async_context(WorkerProcess(db, ["NoOp"], pool_size))
                for _ in range(processes)
            ]
            started = time.time()
            await insert_due_runs(db, NoOp, "run", runs, announce=True)
            # The insert's WAL is not a step's: the server is read once it is in, and the steps
            # already done by then are left out of the count.
            before = await read_server(server, conn)
            finished_before = int((await one_row(conn, FINISHED))[0])
            workers_cpu = sum(worker.cpu_now() for worker in workers)
            done_at = await wait_until_done(db, "bench_noop", workers[0], conn)
            at_done = await read_server(server, conn)
            workers_cpu = sum(worker.cpu_now() for worker in workers) - workers_cpu
        after = await settled_reading(server, conn)
        steps = runs - finished_before
        cost = await cost_between(conn, before, after, lsn_after=at_done.lsn)
        kinds = await wal_by_kind(conn, before.lsn, at_done.lsn, steps) if walinspect else None
        (autovacuums,) = await one_row(conn, AUTOVACUUMS)
        await check_no_failures(db, "bench_noop")
    seconds = done_at - started
    return {
        "processes": processes,
        "runs": runs,
        "seconds": seconds,
        "steps_per_s": runs / seconds,
        **per_unit(cost, steps, "step"),
        "workers_cpu_us_per_step": workers_cpu * 1e6 / steps if steps else None,
        "server_cost": cost,
        "wal_by_kind": kinds,
        "autovacuums_of_the_table": autovacuums,
    }


def resident_mb(pid: int) -> float:
    """A process's resident set now, from /proc, in MiB."""
    with open(f"/proc/{pid}/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * PAGE_SIZE / 2**20


async def measure_memory(
    server: EmbeddedPostgres, first: int, total: int, pool_size: int | None
) -> dict[str, Any]:
    """One worker's resident set after `first` no-op steps and after `total`."""
    async with BenchDatabase(server, "bench_memory") as db:
        async with WorkerProcess(db, ["NoOp"], pool_size) as worker:
            assert worker.process is not None
            await insert_due_runs(db, NoOp, "run", first, announce=True)
            await wait_until_done(db, "bench_noop", worker)
            after_first = resident_mb(worker.process.pid)
            done = first
            while done < total:
                batch = min(first, total - done)
                await insert_due_runs(db, NoOp, "run", batch, announce=True)
                await wait_until_done(db, "bench_noop", worker)
                done += batch
            after_total = resident_mb(worker.process.pid)
        await check_no_failures(db, "bench_noop")
    return {
        "steps_first": first,
        "steps_total": total,
        "rss_mb_after_first": after_first,
        "rss_mb_after_total": after_total,
        "growth": after_total / after_first - 1,
    }


async def measure_lateness_under_load(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> dict[str, Any]:
    """wake_in lateness (ms, in start order) while another process drains no-op batches."""
    delays = timer_delays(runs)

    def make(i: int) -> Timer:
        return Timer(delay_ms=delays[i % runs])

    async with BenchDatabase(server, "bench_timer_load") as db:
        async with (
            WorkerProcess(db, ["NoOp"], pool_size) as loaded,
            WorkerProcess(db, ["Timer"], pool_size) as timers,
        ):
            stop = asyncio.Event()
            batches = 0

            async def load() -> None:
                nonlocal batches
                while not stop.is_set():
                    await insert_due_runs(db, NoOp, "run", LOAD_BATCH, announce=True)
                    await wait_until_done(db, "bench_noop", loaded)
                    batches += 1

            loading = asyncio.create_task(load())
            try:
                first = await start_spaced(db, timers, Timer, make, "arm", runs, TIMER_START_EVERY)
            finally:
                stop.set()
                await loading
        await check_no_failures(db, "bench_timer")
        await check_no_failures(db, "bench_noop")
        query = select(Timer.due_at, Timer.fired_at).where(Timer.id >= first).order_by(Timer.id)
        async with db.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
    return {"lateness_ms": elapsed_ms(rows, "bench_timer"), "load_batches": batches}
