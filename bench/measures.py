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
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.harness import (
    POLL_EVERY,
    READY_TIMEOUT,
    WORKER_CONCURRENCY,
    BenchDatabase,
    WorkerProcess,
    check_no_failures,
    cpu_since,
    insert_due_runs,
    server_cpu,
    wait_until_done,
    wait_until_none,
)
from bench.models import FanChild, FanParent, Latency, NoOp, Timer, Waiter
from bench.server_cost import cost_between, one_row, per_unit, read_server, settled_reading
from engine import Workflow, connect_workflows, run_workflows, wake
from infra.embedded.server import PG_CTL, EmbeddedPostgres

START_EVERY = 0.010  # seconds between two start() calls in the latency run: 100 steps/s
# Two steps a run, so the timer run offers the worker the same 100 steps/s; at twice that,
# a slow or busy machine saturates the worker and the figure measures its queue instead.
TIMER_START_EVERY = 0.020  # seconds
WARMUP_RUNS = 20  # runs started, and left out, before the latency and timer runs
TIMER_MIN_MS = 50  # shortest wake_in delay, milliseconds
TIMER_MAX_MS = 500  # longest wake_in delay, milliseconds
TIMER_SEED = 20261130  # the delays are shuffled the same way on every run
PARK_CHUNK = 64  # runs inserted at a time for the worker to park; see measure_deliveries
DELIVER_TASKS = 8  # concurrent delivering tasks in the bench process, on a pool of as many
WAKE_TIMEOUT = timedelta(seconds=10)  # each wake() of the idle measurement must return in time
COUNTER_TABLE = "CREATE TABLE bench_counter (id int PRIMARY KEY, v bigint NOT NULL)"
UPDATE_ROW = "UPDATE bench_counter SET v = v + 1 WHERE id = %s"
FILL_COUNTER = (
    "INSERT INTO bench_counter (id, v) SELECT g, 0 FROM generate_series(1, %s) AS g "
    "ON CONFLICT (id) DO NOTHING"
)
PGBENCH_SCRIPT = "\\set row :client_id + 1\nUPDATE bench_counter SET v = v + 1 WHERE id = :row;\n"


async def measure_updates(db: BenchDatabase, clients: int, seconds: float) -> float:
    """Single-row UPDATE commits/s: psycopg 3 async autocommit, each client on a row of its own."""
    await db.scalar(FILL_COUNTER, clients)
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
) -> dict[str, Any]:
    """UPDATE commits/s at each client count, through psycopg and through pgbench; and under
    "cost", what the server spent a commit in each (WAL bytes, writes, flushes, CPU)."""
    found: dict[str, Any] = {"psycopg": {}, "pgbench": {}, "cost": {"psycopg": {}, "pgbench": {}}}
    async with (
        BenchDatabase(server, "bench_reference") as db,
        await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn,
    ):
        await db.scalar(COUNTER_TABLE)
        for client in ("psycopg", "pgbench"):
            for n in clients:
                await db.scalar(FILL_COUNTER, n)
                before, commits_before = await read_server(server, conn), await counted(conn)
                if client == "psycopg":
                    found[client][n] = await measure_updates(db, n, seconds)
                else:
                    found[client][n] = await asyncio.to_thread(
                        measure_pgbench, server, db, n, seconds
                    )
                lsn_after = (await read_server(server, conn)).lsn
                after = await settled_reading(server, conn)
                cost = await cost_between(conn, before, after, lsn_after)
                commits = await counted(conn) - commits_before
                found["cost"][client][n] = {**per_unit(cost, commits, "commit"), **cost}
    return found


async def counted(conn: psycopg.AsyncConnection[Any]) -> int:
    """The UPDATEs committed on bench_counter so far: each adds one to its row."""
    (total,) = await one_row(conn, "SELECT coalesce(sum(v), 0) FROM bench_counter")
    return int(total)


async def measure_throughput(
    server: EmbeddedPostgres,
    model: type[Workflow],
    first_step: str,
    runs: int,
    pool_size: int | None,
) -> dict[str, Any]:
    """Insert `runs` due runs at once, start one worker, time it from "ready" to the last run."""
    table: str = model.__table__.name  # type: ignore[attr-defined]
    async with BenchDatabase(server, f"bench_{table}") as db:
        await insert_due_runs(db, model, first_step, runs)
        async with WorkerProcess(db, [model.__name__], pool_size) as worker:
            before, worker_before = server_cpu(server), worker.cpu_now()
            done_at = await wait_until_done(db, table, worker)
            server_seconds = cpu_since(server, before)
            worker_seconds = worker.cpu_now() - worker_before
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
        # Every statement its engine sent (start-up included): runs per statement shows batching.
        "worker_statements": worker.statements,
        # The worker's and the server's CPU from the bench seeing "ready" to the last run.
        "worker_cpu_in_window_seconds": worker_seconds,
        "server_cpu_seconds": server_seconds,
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


async def measure_deliveries(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> dict[str, Any]:
    """Deliver one event to each of `runs` parked runs, DELIVER_TASKS at a time.

    The runs are inserted due at `park`, PARK_CHUNK at a time, and the
    worker parks each chunk (every run returns wait_for) before the next goes
    in, and all of them before the clock starts; it keeps running while the
    bench delivers. In one insert, the worker's backlog of parked-but-uncommitted
    runs grows into commit statements that take longer and longer to build, and
    it stalls (bench/README.md). Times both the deliver() calls and the events
    applied.
    """
    async with BenchDatabase(server, "bench_waiter") as db:
        async with WorkerProcess(db, ["Waiter"], pool_size) as worker:
            for first in range(0, runs, PARK_CHUNK):
                chunk = min(PARK_CHUNK, runs - first)
                await insert_due_runs(db, Waiter, "park", chunk, announce=True)
                parked_at = await wait_until_done(db, "bench_waiter", worker)
            parked = await db.scalar(
                "SELECT count(*) FROM bench_waiter "
                "WHERE waiting_for = 'answer' AND next_step IS NULL AND pending_event IS NULL"
            )
            if parked != runs:
                raise RuntimeError(f"Only {parked} of {runs} runs were parked on their wait.")
            found = await deliver_to_each(db, runs)
            applied_at = await wait_until_none(
                db,
                sql.SQL("SELECT count(*) FROM bench_waiter WHERE answer_value IS NULL"),
                worker,
                "runs of bench_waiter without their event applied",
            )
        await check_no_failures(db, "bench_waiter")
        wrong = await db.scalar(
            "SELECT count(*) FROM bench_waiter WHERE answer_value IS DISTINCT FROM id "
            "OR next_step IS NOT NULL OR waiting_for IS NOT NULL OR pending_event IS NOT NULL"
        )
    if found["refused"]:
        raise RuntimeError(
            f"{found['refused']} of {runs} deliveries to waiting runs were refused (returned 0)."
        )
    if wrong:
        raise RuntimeError(f"{wrong} runs of bench_waiter did not end with their own event.")
    applied_seconds = applied_at - found["started_at"]
    return {
        "runs": runs,
        "delivery_tasks": DELIVER_TASKS,
        "deliver_seconds": found["seconds"],
        "accepted": found["accepted"],
        "accepted_per_s": found["accepted"] / found["seconds"],
        "applied_seconds": applied_seconds,
        "applied_per_s": runs / applied_seconds,
        # The bench process's CPU time while it delivered: near deliver_seconds means the
        # deliveries were bound by the Python client, not the database.
        "bench_cpu_seconds": found["cpu_seconds"],
        # From the worker entering run_workflows until every run was parked, chunk by chunk.
        "park_seconds": parked_at - worker.ready_at,
        "passes": worker.passes,  # parking and applying both
        "worker_cpu_seconds": worker.cpu_seconds,
        "worker_connections_opened": worker.connections,
    }


async def deliver_to_each(db: BenchDatabase, runs: int) -> dict[str, Any]:
    """One deliver() to each run in id order, from DELIVER_TASKS tasks sharing the list.

    A pool of DELIVER_TASKS connections under connect_workflows, as an
    application that serves webhooks would hold; its connections are opened
    before the clock starts.
    """
    engine = create_async_engine(db.url, pool_size=DELIVER_TASKS, max_overflow=0)
    ids = iter(range(1, runs + 1))  # insert_due_runs numbers a fresh table's runs from 1
    accepted = refused = 0

    async def deliverer() -> None:
        nonlocal accepted, refused
        for run_id in ids:
            taken = await Waiter.by(Waiter.id == run_id).deliver(Waiter.answer(run_id))
            if taken == 1:
                accepted += 1
            else:
                refused += 1

    try:
        async with connect_workflows(async_sessionmaker(engine), workflows=[Waiter]):
            opened = [await engine.connect() for _ in range(DELIVER_TASKS)]
            for conn in opened:
                await conn.close()  # back to the pool, open
            cpu = time.process_time()
            started_at = time.time()
            await asyncio.gather(*(deliverer() for _ in range(DELIVER_TASKS)))
            seconds = time.time() - started_at
            cpu = time.process_time() - cpu
    finally:
        await engine.dispose()
    return {
        "started_at": started_at,
        "seconds": seconds,
        "accepted": accepted,
        "refused": refused,
        "cpu_seconds": cpu,
    }


async def measure_fanout(
    server: EmbeddedPostgres, children: int, pool_size: int | None
) -> dict[str, Any]:
    """Seconds from start() of a parent that fans out `children` no-op runs to its `then`.

    A fan-out of WARMUP_RUNS children goes first and is left out, as the
    latency runs' warm-up is. The bench polls for the measured parent's
    children to appear, which shows how much of the time its own commit took.
    """
    async with (
        BenchDatabase(server, "bench_fanout") as db,
        WorkerProcess(db, ["FanParent", "FanChild"], pool_size) as worker,
        connect_workflows(db.sessionmaker(), workflows=[FanParent, FanChild]),
    ):
        await fan_out_once(db, worker, WARMUP_RUNS)
        parent_id, seen = await fan_out_once(db, worker, children)
        await worker.stop()  # for its counts
        for table in ("bench_fan_parent", "bench_fan_child"):
            await check_no_failures(db, table)
        query = select(
            FanParent.started_at, FanParent.split_at, FanParent.done_at, FanParent.children_left
        ).where(FanParent.id == parent_id)
        async with db.engine.connect() as conn:
            started_at, split_at, done_at, left = (await conn.execute(query)).one()
        started = await db.scalar(
            f"SELECT count(*) FROM bench_fan_child WHERE {CHILD_OF}", f"[{parent_id}]"
        )
    if started != children or left != 0:
        raise RuntimeError(
            f"The parent started {started} of {children} children and counts {left} left."
        )
    if split_at is None or done_at is None:
        raise RuntimeError("The fan-out's parent finished without recording its times.")
    return {
        "children": children,
        "seconds": done_at - started_at,
        # The parent's fan-out step began: its start-to-run latency.
        "split_began_after_s": split_at - started_at,
        # Its commit, with every child in it, was visible (to within the bench's poll).
        "children_visible_after_s": None if seen is None else seen - started_at,
        "children_per_s": children / (done_at - started_at),
        "passes": worker.passes,  # the warm-up's included
        "worker_cpu_seconds": worker.cpu_seconds,
        "worker_connections_opened": worker.connections,
    }


CHILD_OF = "(parent::jsonb -> 'key') = %s::jsonb"  # a child of the parent whose key is given
FANOUT_PENDING = sql.SQL(
    "SELECT (SELECT count(*) FROM bench_fan_parent WHERE next_step IS NOT NULL)"
    " + (SELECT count(*) FROM bench_fan_child WHERE next_step IS NOT NULL)"
)


async def fan_out_once(
    db: BenchDatabase, worker: WorkerProcess, children: int
) -> tuple[int, float | None]:
    """Start one parent and wait until it and its children are done.

    Returns its id, and time.time() when its first child was seen (None if
    all was done before the bench's poll saw any).
    """
    # started_at is read as the row is built, i.e. just before its start().
    parent = FanParent(child_count=children, started_at=time.time())
    await parent.start(FanParent.split)
    watcher = asyncio.create_task(first_child_seen(db, parent.id))
    try:
        await wait_until_none(db, FANOUT_PENDING, worker, "runs of the fan-out unfinished")
    finally:
        watcher.cancel()
    (seen,) = await asyncio.gather(watcher, return_exceptions=True)
    return parent.id, seen if isinstance(seen, float) else None


async def first_child_seen(db: BenchDatabase, parent_id: int) -> float:
    """time.time() when the first child of `parent_id` is visible, polled every POLL_EVERY."""
    query = f"SELECT EXISTS (SELECT 1 FROM bench_fan_child WHERE {CHILD_OF})"
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(query, (f"[{parent_id}]",))).fetchone()
            if row and row[0]:
                return time.time()
            await asyncio.sleep(POLL_EVERY)


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


async def measure_idle(
    server: EmbeddedPostgres, window: float, wakes: int, pool_size: int | None
) -> dict[str, Any]:
    """What an idle worker costs the database, listening and suspending; what a wake() takes.

    Two in-process workers in turn, serving the empty bench_noop with their
    default max_idle_interval; the second, under suspends_when_idle, also
    answers `wakes` wake() calls that find nothing due.
    """
    async with BenchDatabase(server, "bench_idle") as db:
        listening = await idle_worker(db, window, 0, False, pool_size)
        suspending = await idle_worker(db, window, wakes, True, pool_size)
    return {"listening": listening, "suspends_when_idle": suspending}


async def idle_worker(
    db: BenchDatabase, window: float, wakes: int, suspends: bool, pool_size: int | None
) -> dict[str, Any]:
    """Count the statements an idle worker sends over `window` seconds; time `wakes` wake()s.

    Every statement of the worker's SQLAlchemy engine passes its
    before_cursor_execute event, which counts it. The window opens right
    after a pass, so it holds no idle pass unless something wakes the worker
    early; one pass's statements are counted apart (`statements_per_pass`).
    The LISTEN connection is psycopg's own, outside the engine: it sends
    LISTEN once, and pg_stat_activity says whether it did anything since.
    """
    pool = {} if pool_size is None else {"pool_size": pool_size}
    engine = create_async_engine(db.url, **pool)
    counts = {"statements": 0, "connections": 0}

    def count(what: str) -> Callable[..., None]:
        def counter(*_: object) -> None:
            counts[what] += 1

        return counter

    event.listen(engine.sync_engine, "before_cursor_execute", count("statements"))
    event.listen(engine.sync_engine, "connect", count("connections"))
    try:
        async with run_workflows(
            async_sessionmaker(engine, expire_on_commit=False),
            max_concurrency=WORKER_CONCURRENCY,
            suspends_when_idle=suspends,
            workflows=[NoOp],
        ) as worker:
            if worker.listener is not None:
                await asyncio.wait_for(worker.listener.connected.wait(), READY_TIMEOUT)
            # The start-up passes, and the one the listener asks for once connected.
            await expect_wake()
            await asyncio.sleep(0.5)
            before, passes = counts["statements"], worker.passes
            await expect_wake()
            per_pass = (counts["statements"] - before) / (worker.passes - passes)
            before, passes, connections = counts["statements"], worker.passes, counts["connections"]
            opened_at = time.time()
            await asyncio.sleep(window)
            statements = counts["statements"] - before
            window_passes = worker.passes - passes
            window_connections = counts["connections"] - connections
            listener_active = await db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND application_name = 'duly-listener' AND state_change >= to_timestamp(%s)",
                db.name,
                opened_at,
            )
            wake_ms = [await timed_wake() for _ in range(wakes)]
            idle_interval = worker.options.max_idle_interval.total_seconds()
    finally:
        await engine.dispose()
    found: dict[str, Any] = {
        "max_idle_interval_s": idle_interval,
        "window_s": window,
        "statements": statements,
        "queries_per_min": statements * 60 / window,
        "passes": window_passes,
        "connections_opened": window_connections,
        "statements_per_pass": per_pass,
        # What the idle passes alone cost, one every max_idle_interval.
        "idle_pass_queries_per_min": per_pass * 60 / idle_interval,
        "listener_backends_active_in_window": None if suspends else listener_active,
    }
    if wake_ms:
        found["wake_ms"] = percentiles(wake_ms)
    return found


async def expect_wake() -> None:
    """One wake(), which must find the worker caught up within WAKE_TIMEOUT."""
    if not await wake(WAKE_TIMEOUT):
        raise RuntimeError(f"wake() returned False within {WAKE_TIMEOUT.total_seconds():.0f} s.")


async def timed_wake() -> float:
    """Milliseconds one wake() took; it must return True."""
    began = time.perf_counter()
    await expect_wake()
    return (time.perf_counter() - began) * 1000
