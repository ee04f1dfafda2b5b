"""The measurements: each takes a server, does one thing many times, and returns raw figures.

Turning them into the report's lines is run.py's job; bench/README.md says
what each figure means.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
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
from bench.models import Latency, Timer
from engine import Workflow, connect_workflows
from infra.embedded import PG_CTL, EmbeddedPostgres

START_EVERY = 0.010  # seconds between two start() calls in the latency run: 100 steps/s
# Two steps a run, so the timer run offers the worker the same 100 steps/s; at twice that,
# a slow or busy machine saturates the worker and the figure measures its queue instead.
TIMER_START_EVERY = 0.020  # seconds
WARMUP_RUNS = 20  # runs started, and left out, before the latency and timer runs
TIMER_MIN_MS = 50  # shortest wake_in delay, milliseconds
TIMER_MAX_MS = 500  # longest wake_in delay, milliseconds
TIMER_SEED = 20261130  # the delays are shuffled the same way on every run
COUNTER_TABLE = "CREATE TABLE bench_counter (id int PRIMARY KEY, v bigint NOT NULL)"
UPDATE_ROW = "UPDATE bench_counter SET v = v + 1 WHERE id = %s"
PGBENCH_SCRIPT = "\\set row :client_id + 1\nUPDATE bench_counter SET v = v + 1 WHERE id = :row;\n"


async def measure_updates(db: BenchDatabase, clients: int, seconds: float) -> float:
    """Single-row UPDATE commits/s: psycopg 3 async autocommit, each client on a row of its own."""
    await db.scalar(
        "INSERT INTO bench_counter (id, v) SELECT g, 0 FROM generate_series(1, %s) AS g "
        "ON CONFLICT (id) DO NOTHING",
        clients,
    )
    connections = [
        await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) for _ in range(clients)
    ]
    counts = [0] * clients
    deadline = time.monotonic() + seconds

    async def hammer(i: int) -> None:
        while time.monotonic() < deadline:
            await connections[i].execute(UPDATE_ROW, (i + 1,))
            counts[i] += 1

    try:
        started = time.monotonic()
        await asyncio.gather(*(hammer(i) for i in range(clients)))
        elapsed = time.monotonic() - started
    finally:
        for conn in connections:
            await conn.close()
    return sum(counts) / elapsed


def measure_pgbench(
    server: EmbeddedPostgres, db: BenchDatabase, clients: int, seconds: float
) -> float | None:
    """The same UPDATE through pgbench (C, prepared statements), as TOOLCHAIN.md's were taken.

    Only says how much of the psycopg figure is the Python client; None when
    the embedded server ships no pgbench or it fails.
    """
    pgbench = PG_CTL.with_name("pgbench")
    if not pgbench.exists():
        return None
    script = server.data_dir.parent / f"duly-bench-update-{os.getpid()}.sql"
    script.write_text(PGBENCH_SCRIPT)
    command = [
        str(pgbench),
        *("-n", "-M", "prepared", "-c", str(clients)),
        *("-j", str(min(clients, os.cpu_count() or 1))),
        *("-T", str(max(1, round(seconds))), "-f", str(script)),
        *("-h", str(server.socket_dir), "-U", "postgres", db.name),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        script.unlink(missing_ok=True)
    found = re.search(r"tps = ([\d.]+)", done.stdout)
    return float(found.group(1)) if done.returncode == 0 and found else None


async def measure_reference(
    server: EmbeddedPostgres, clients: Sequence[int], seconds: float
) -> dict[str, dict[int, float | None]]:
    """UPDATE commits/s at each client count, through psycopg and through pgbench."""
    found: dict[str, dict[int, float | None]] = {"psycopg": {}, "pgbench": {}}
    async with BenchDatabase(server, "bench_reference") as db:
        await db.scalar(COUNTER_TABLE)
        for n in clients:
            found["psycopg"][n] = await measure_updates(db, n, seconds)
        for n in clients:
            found["pgbench"][n] = await asyncio.to_thread(measure_pgbench, server, db, n, seconds)
    return found


async def measure_throughput(
    server: EmbeddedPostgres,
    model: type[Workflow],
    first_step: str,
    runs: int,
    pool_size: int | None,
) -> dict[str, Any]:
    """Bulk-insert `runs` due runs, start one worker, time it from "ready" to the last run."""
    table: str = model.__table__.name  # type: ignore[attr-defined]
    async with BenchDatabase(server, f"bench_{table}") as db:
        await insert_due_runs(db, model, first_step, runs)
        async with WorkerProcess(db, [model.__name__], pool_size) as worker:
            done_at = await wait_until_done(db, table, worker)
        await check_no_failures(db, table)
    seconds = done_at - worker.ready_at
    return {
        "runs": runs,
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "passes": worker.passes,
        # Includes its imports and start-up (~1 s here): an upper bound per run.
        "worker_cpu_seconds": worker.cpu_seconds,
        # By its SQLAlchemy pool: far more than max_concurrency means the pool churns.
        "worker_connections_opened": worker.connections,
    }


async def start_spaced(
    db: BenchDatabase,
    worker: WorkerProcess,
    model: type[Workflow],
    make: Callable[[int], Any],
    first_step: str,
    runs: int,
    every: float,
) -> int:
    """Start runs one at a time, one per `every` seconds, and wait for them to finish.

    WARMUP_RUNS go first and are left out of the figures, which are then the
    steady state's, not the cost of the worker's first connections and
    statement caches. Returns the id of the first measured run.
    """
    step = getattr(model, first_step)
    table: str = model.__table__.name  # type: ignore[attr-defined]
    first_measured = 0
    async with connect_workflows(db.sessionmaker(), workflows=[model]):
        for count in (WARMUP_RUNS, runs):
            cadence = time.monotonic()
            for i in range(count):
                row = make(i)
                await row.start(step)
                if i == 0:
                    first_measured = row.id
                cadence += every
                await asyncio.sleep(max(0.0, cadence - time.monotonic()))
            await wait_until_done(db, table, worker)
    return first_measured


async def measure_latency(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> list[float]:
    """Milliseconds from just before start() to the first line of the step, in start order."""

    def make(i: int) -> Latency:
        # started_at is read as the row is built, i.e. just before its start().
        return Latency(started_at=time.time())

    async with BenchDatabase(server, "bench_latency") as db:
        async with WorkerProcess(db, ["Latency"], pool_size) as worker:
            first = await start_spaced(db, worker, Latency, make, "run", runs, START_EVERY)
        await check_no_failures(db, "bench_latency")
        query = select(Latency.started_at, Latency.ran_at).where(Latency.id >= first)
        async with db.engine.connect() as conn:
            rows = (await conn.execute(query.order_by(Latency.id))).all()
    return elapsed_ms(rows, "bench_latency")


def elapsed_ms(pairs: Sequence[Any], table: str) -> list[float]:
    """Milliseconds from each pair's first time to its second; a missing time is an error."""
    if any(begin is None or end is None for begin, end in pairs):
        raise RuntimeError(f"Some runs of {table} finished without recording their times.")
    return [(end - begin) * 1000 for begin, end in pairs]


def timer_delays(n: int) -> list[int]:
    """`n` delays spread evenly over TIMER_MIN_MS..TIMER_MAX_MS, in a fixed shuffled order."""
    span = TIMER_MAX_MS - TIMER_MIN_MS
    delays = [TIMER_MIN_MS + round(span * i / max(1, n - 1)) for i in range(n)]
    random.Random(TIMER_SEED).shuffle(delays)
    return delays


async def measure_lateness(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> list[float]:
    """Milliseconds between when a wake_in step was due and when it began, in start order."""
    delays = timer_delays(runs)

    def make(i: int) -> Timer:
        return Timer(delay_ms=delays[i % runs])

    async with BenchDatabase(server, "bench_timer") as db:
        async with WorkerProcess(db, ["Timer"], pool_size) as worker:
            first = await start_spaced(db, worker, Timer, make, "arm", runs, TIMER_START_EVERY)
        await check_no_failures(db, "bench_timer")
        query = select(Timer.due_at, Timer.fired_at).where(Timer.id >= first)
        async with db.engine.connect() as conn:
            rows = (await conn.execute(query.order_by(Timer.id))).all()
    return elapsed_ms(rows, "bench_timer")


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 (interpolated between samples), min and max, and p50 early and late.

    `values` in start order: a p50 of the last third well above the first
    third's means the worker fell behind the offered rate and a queue grew.
    """
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    third = max(1, len(values) // 3)
    return {
        "p50": cuts[49],
        "p95": cuts[94],
        "p99": cuts[98],
        "min": min(values),
        "max": max(values),
        "p50_first_third": statistics.median(values[:third]),
        "p50_last_third": statistics.median(values[-third:]),
    }
