"""duly's benchmark: what one worker process does per second, and how soon and how late it runs.

    python bench/run.py [--quick] [--json PATH]

It starts its own embedded PostgreSQL (fsync on: every figure pays for real
commits) and measures, each in a fresh database so no run inherits another's
dead rows: plain UPDATE commits/s (the ceiling), no-op steps/s, three-step
chains/s, start-to-run latency and wake_in lateness. bench/README.md says how
each is taken. The table goes to stdout, then the same figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # Run as a script, Python puts bench/ on the path, not the repo root.
    sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402
import sqlalchemy  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy import Table, func, insert, literal, select  # noqa: E402
from sqlalchemy.dialects.postgresql import JSONB  # noqa: E402
from sqlalchemy.ext.asyncio import (  # noqa: E402
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from bench.models import Base, Chain, Latency, NoOp, Timer  # noqa: E402
from engine import Workflow, connect_workflows  # noqa: E402
from infra.embedded import PG_CTL, EmbeddedPostgres, start_embedded  # noqa: E402

WORKER_CONCURRENCY = 8  # steps at a time in the one worker process, as the peers were run
POLL_EVERY = 0.020  # seconds between the bench's "is everything done?" counts
START_EVERY = 0.010  # seconds between two start() calls in the latency and timer runs
TIMER_MIN_MS = 50  # shortest wake_in delay, milliseconds
TIMER_MAX_MS = 500  # longest wake_in delay, milliseconds
TIMER_SEED = 20261130  # the delays are shuffled the same way every run
READY_TIMEOUT = 60.0  # seconds for a worker process to import and enter run_workflows
DRAIN_TIMEOUT = 600.0  # seconds before a run that stopped making progress fails the bench
STOP_TIMEOUT = 15.0  # seconds a worker gets to stop on SIGTERM before it is killed
REFERENCE_CLIENTS = (1, 8)  # UPDATE clients, each on a row of its own
EMPTY_ARGS = {"args": [], "kwargs": {}}  # next_args of a step called without arguments


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does; --quick shrinks every one about fivefold."""

    update_seconds: float
    noop_runs: int
    chain_runs: int
    latency_runs: int
    timer_runs: int


FULL = Sizes(update_seconds=3.0, noop_runs=5000, chain_runs=2000, latency_runs=300, timer_runs=300)
QUICK = Sizes(update_seconds=0.6, noop_runs=1000, chain_runs=400, latency_runs=60, timer_runs=60)


@dataclass(frozen=True)
class Figure:
    """One line of the report."""

    key: str
    metric: str
    value: float | None
    unit: str
    reference: str


@dataclass
class Report:
    """Everything one bench run found, in the shape the JSON output takes."""

    machine: dict[str, Any]
    sizes: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, metric: str, value: float | None, unit: str, reference: str) -> None:
        """Record one figure."""
        self.figures.append(Figure(key, metric, value, unit, reference))

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "machine": self.machine,
            "sizes": self.sizes,
            "figures": [asdict(f) for f in self.figures],
            "details": self.details,
        }


# -- databases -----------------------------------------------------------------------


class BenchDatabase:
    """A fresh database on the embedded server, with every bench table created empty."""

    def __init__(self, server: EmbeddedPostgres, name: str) -> None:
        self.name = name
        self.url = server.url_for(name)
        self.conninfo = server.conninfo_for(name)
        self._admin = server.conninfo_for("postgres")
        self.engine: AsyncEngine | None = None

    async def __aenter__(self) -> BenchDatabase:
        async with await psycopg.AsyncConnection.connect(self._admin, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.engine = create_async_engine(self.url)
        async with self.engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.engine is not None:
            await self.engine.dispose()

    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        """A session factory as an application would build one."""
        assert self.engine is not None
        return async_sessionmaker(self.engine, expire_on_commit=False)

    async def scalar(self, query: str | sql.Composable, *params: object) -> Any:
        """The first column of the first row of one query, on a connection of its own."""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            cursor = await conn.execute(query, params or None)
            row = await cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]


async def insert_due_runs(
    db: BenchDatabase, model: type[Workflow], first_step: str, n: int
) -> None:
    """Insert `n` runs of `model`, all due now at `first_step`, in one statement.

    A bulk insert rather than n start() calls: the figure is the worker's, and
    the rows must all be waiting before it starts. ANALYZE then gives the planner
    the statistics autovacuum would have gathered on a table in service.
    """
    table = model.__table__
    assert isinstance(table, Table) and db.engine is not None
    rows = select(
        literal(first_step),
        literal(EMPTY_ARGS, JSONB),
        func.now(),
    ).select_from(func.generate_series(1, n))
    statement = insert(table).from_select(["next_step", "next_args", "wake_at"], rows)
    async with db.engine.begin() as conn:
        await conn.execute(statement)
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn:
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table.name)))


def count_pending(table: str) -> sql.Composed:
    """Runs of `table` with a step still to do (served by the engine's partial index)."""
    return sql.SQL("SELECT count(*) FROM {} WHERE next_step IS NOT NULL").format(
        sql.Identifier(table)
    )


async def wait_until_done(db: BenchDatabase, table: str, expected: int) -> float:
    """Poll every POLL_EVERY until no run of `table` has a step left; return that time.time()."""
    query = count_pending(table)
    last_pending = expected
    last_progress = time.monotonic()
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(query)).fetchone()
            pending = row[0] if row else 0
            if pending == 0:
                return time.time()
            if pending != last_pending:
                last_pending, last_progress = pending, time.monotonic()
            elif time.monotonic() - last_progress > DRAIN_TIMEOUT:
                raise RuntimeError(
                    f"{pending} runs of {table} made no progress in {DRAIN_TIMEOUT:.0f} s."
                )
            await asyncio.sleep(POLL_EVERY)


async def count_failed(db: BenchDatabase, table: str) -> int:
    """Runs that failed an attempt: a benchmark of failures would measure the wrong thing."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE attempts > 0 OR last_error IS NOT NULL")
    return int(await db.scalar(query.format(sql.Identifier(table))))


# -- the worker process ----------------------------------------------------------------


class WorkerProcess:
    """One `bench.worker_process` subprocess, stopped (or killed) however the block ends."""

    def __init__(self, db: BenchDatabase, workflows: Sequence[str], pool_size: int | None) -> None:
        self.command = [
            sys.executable,
            "-m",
            "bench.worker_process",
            db.url,
            *workflows,
            "--concurrency",
            str(WORKER_CONCURRENCY),
        ]
        if pool_size is not None:
            self.command += ["--pool-size", str(pool_size)]
        self.process: asyncio.subprocess.Process | None = None
        self.ready_at = 0.0  # time.time() the worker printed on entering run_workflows
        self.listening_at = 0.0
        self.passes: int | None = None

    async def __aenter__(self) -> WorkerProcess:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=REPO_ROOT,
            # stdin stays open and unused: the worker exits when it closes (we died).
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # Its warnings and tracebacks go straight to our stderr.
        )
        try:
            self.ready_at = await self._expect("ready")
            self.listening_at = await self._expect("listening")
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _expect(self, word: str) -> float:
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT)
        parts = line.decode().split()
        if len(parts) != 2 or parts[0] != word:
            raise RuntimeError(
                f"The worker process said {line!r} where '{word} <time>' was expected; "
                "its stderr is above."
            )
        return float(parts[1])

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; read the pass count it printed."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            rest, _ = await asyncio.wait_for(process.communicate(), STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return
        for line in rest.decode().splitlines():
            word, _, value = line.partition(" ")
            if word == "passes":
                self.passes = int(value)


# -- measurements ----------------------------------------------------------------------


async def measure_updates(db: BenchDatabase, clients: int, seconds: float) -> float:
    """Single-row UPDATE commits/s, psycopg 3 async autocommit, each client on its own row."""
    await db.scalar(
        "INSERT INTO bench_counter (id, v) SELECT g, 0 FROM generate_series(1, %s) AS g "
        "ON CONFLICT (id) DO NOTHING",
        clients,
    )
    connections = [
        await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) for _ in range(clients)
    ]
    counts = [0] * clients
    deadline = 0.0

    async def hammer(i: int) -> None:
        conn = connections[i]
        while time.monotonic() < deadline:
            await conn.execute("UPDATE bench_counter SET v = v + 1 WHERE id = %s", (i + 1,))
            counts[i] += 1

    try:
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(*(hammer(i) for i in range(clients)))
        elapsed = time.monotonic() - started
    finally:
        for conn in connections:
            await conn.close()
    return sum(counts) / elapsed


PGBENCH_SCRIPT = "\\set row :client_id + 1\nUPDATE bench_counter SET v = v + 1 WHERE id = :row;\n"


def measure_pgbench(
    server: EmbeddedPostgres, db: BenchDatabase, clients: int, seconds: float
) -> float | None:
    """The same UPDATE through pgbench (C, prepared), as TOOLCHAIN.md's figures were taken.

    Returns None when the embedded server ships no pgbench or it fails: this
    line only tells how much of the psycopg figure is the Python client.
    """
    pgbench = PG_CTL.with_name("pgbench")
    if not pgbench.exists():
        return None
    script = server.data_dir.parent / f"bench-update-{os.getpid()}.sql"
    script.write_text(PGBENCH_SCRIPT)
    command = [
        str(pgbench),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, os.cpu_count() or 1)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
        "-h",
        str(server.socket_dir),
        "-U",
        "postgres",
        db.name,
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
    server: EmbeddedPostgres, sizes: Sizes, report: Report
) -> dict[int, float]:
    """Figure 1: the commit ceiling, at 1 and 8 clients."""
    measured: dict[int, float] = {}
    peers = {1: "pgbench, PG 15: 4,850/s", 8: "pgbench, PG 15: 10,400/s"}
    async with BenchDatabase(server, "bench_reference") as db:
        await db.scalar("CREATE TABLE bench_counter (id int PRIMARY KEY, v bigint NOT NULL)")
        for clients in REFERENCE_CLIENTS:
            rate = await measure_updates(db, clients, sizes.update_seconds)
            measured[clients] = rate
            report.add(
                f"update_commits_per_s_{clients}",
                f"UPDATE commits/s, {clients} client{'s' if clients > 1 else ''} (psycopg)",
                rate,
                "commits/s",
                peers[clients],
            )
        for clients in REFERENCE_CLIENTS:
            rate = await asyncio.to_thread(
                measure_pgbench, server, db, clients, sizes.update_seconds
            )
            report.add(
                f"update_commits_per_s_{clients}_pgbench",
                f"UPDATE commits/s, {clients} client{'s' if clients > 1 else ''} (pgbench)",
                rate,
                "commits/s",
                peers[clients],
            )
    return measured


async def measure_throughput(
    server: EmbeddedPostgres,
    model: type[Workflow],
    first_step: str,
    runs: int,
    pool_size: int | None,
) -> dict[str, Any]:
    """Bulk-insert `runs` due runs, start one worker, time it from "ready" to the last run."""
    table = model.__table__.name  # type: ignore[attr-defined]
    async with BenchDatabase(server, f"bench_{table}") as db:
        await insert_due_runs(db, model, first_step, runs)
        async with WorkerProcess(db, [model.__name__], pool_size) as worker:
            done_at = await wait_until_done(db, table, runs)
        failed = await count_failed(db, table)
    if failed:
        raise RuntimeError(f"{failed} runs of {table} failed an attempt; see the worker's log.")
    elapsed = done_at - worker.ready_at
    return {"runs": runs, "seconds": elapsed, "runs_per_s": runs / elapsed, "passes": worker.passes}


async def start_spaced(
    db: BenchDatabase, model: type[Workflow], make: Callable[[int], Any], first_step: str, n: int
) -> None:
    """Start `n` runs one at a time, START_EVERY apart on a fixed cadence."""
    step = getattr(model, first_step)
    async with connect_workflows(db.sessionmaker(), workflows=[model]):
        async with db.engine.connect() as conn:  # type: ignore[union-attr]
            await conn.execute(select(1))  # open the pool's first connection before timing
        cadence = time.monotonic()
        for i in range(n):
            await make(i).start(step)
            cadence += START_EVERY
            await asyncio.sleep(max(0.0, cadence - time.monotonic()))


async def measure_latency(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> list[float]:
    """Figure 4: ms from just before start() to the first line of the step, per run."""
    async with BenchDatabase(server, "bench_latency") as db:
        async with WorkerProcess(db, ["Latency"], pool_size):
            # started_at is read as the row is built, i.e. just before its start().
            await start_spaced(db, Latency, lambda i: Latency(started_at=time.time()), "run", runs)
            await wait_until_done(db, "bench_latency", runs)
        failed = await count_failed(db, "bench_latency")
        async with db.engine.connect() as conn:  # type: ignore[union-attr]
            rows = (await conn.execute(select(Latency.started_at, Latency.ran_at))).all()
    if failed:
        raise RuntimeError(f"{failed} latency runs failed an attempt; see the worker's log.")
    return [(ran - started) * 1000 for started, ran in rows]


def timer_delays(n: int) -> list[int]:
    """`n` delays spread evenly over TIMER_MIN_MS..TIMER_MAX_MS, in a fixed shuffled order."""
    span = TIMER_MAX_MS - TIMER_MIN_MS
    delays = [TIMER_MIN_MS + round(span * i / max(1, n - 1)) for i in range(n)]
    random.Random(TIMER_SEED).shuffle(delays)
    return delays


async def measure_lateness(
    server: EmbeddedPostgres, runs: int, pool_size: int | None
) -> list[float]:
    """Figure 5: ms between when a wake_in step was due and when it began."""
    delays = timer_delays(runs)
    async with BenchDatabase(server, "bench_timer") as db:
        async with WorkerProcess(db, ["Timer"], pool_size):
            await start_spaced(db, Timer, lambda i: Timer(delay_ms=delays[i]), "arm", runs)
            await wait_until_done(db, "bench_timer", runs)
        failed = await count_failed(db, "bench_timer")
        async with db.engine.connect() as conn:  # type: ignore[union-attr]
            rows = (await conn.execute(select(Timer.due_at, Timer.fired_at))).all()
    if failed:
        raise RuntimeError(f"{failed} timer runs failed an attempt; see the worker's log.")
    return [(fired - due) * 1000 for due, fired in rows]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 (linear interpolation between samples), min and max."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50": cuts[49],
        "p95": cuts[94],
        "p99": cuts[98],
        "min": min(values),
        "max": max(values),
    }


# -- the whole run -----------------------------------------------------------------------


def machine_info(server_version: str, settings: dict[str, str]) -> dict[str, Any]:
    """What the figures depend on besides the engine."""
    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": server_version,
        "postgres_settings": settings,
        "psycopg": psycopg.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "worker_concurrency": WORKER_CONCURRENCY,
    }


async def server_facts(server: EmbeddedPostgres) -> tuple[str, dict[str, str]]:
    """The server's version and the settings that decide what a commit costs."""
    names = ["fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"]
    async with await psycopg.AsyncConnection.connect(server.conninfo_for(), autocommit=True) as c:
        version = await (await c.execute("SHOW server_version")).fetchone()
        rows = await (
            await c.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (names,))
        ).fetchall()
    return str(version[0]) if version else "?", {name: setting for name, setting in rows}


async def run_all(
    server: EmbeddedPostgres,
    sizes: Sizes,
    only: set[str],
    pool_size: int | None,
    progress: Callable[[str], None],
) -> Report:
    """Every measurement in turn, each on a fresh database."""
    version, settings = await server_facts(server)
    report = Report(machine_info(version, settings), asdict(sizes))
    report.details["worker_pool_size"] = pool_size or "SQLAlchemy default (5 + 10 overflow)"
    ceiling = ""
    if "reference" in only:
        progress("reference: UPDATE commits/s")
        measured = await measure_reference(server, sizes, report)
        ceiling = f"; ceiling {measured[8]:,.0f}/s (8-client UPDATE)"
    if "noop" in only:
        progress(f"no-op: {sizes.noop_runs} one-step runs")
        noop = await measure_throughput(server, NoOp, "run", sizes.noop_runs, pool_size)
        report.details["noop"] = noop
        report.add(
            "noop_steps_per_s",
            "No-op steps/s (1 worker, 8 at a time)",
            noop["runs_per_s"],
            "steps/s",
            "pgqueuer 1,100-1,250 jobs/s; procrastinate ~300" + ceiling,
        )
    if "chain" in only:
        progress(f"chain: {sizes.chain_runs} three-step runs")
        chain = await measure_throughput(server, Chain, "a", sizes.chain_runs, pool_size)
        report.details["chain"] = chain
        report.add(
            "chain_runs_per_s",
            "3-step chains/s",
            chain["runs_per_s"],
            "chains/s",
            "pgqueuer ~370-420 (1,100-1,250 jobs/s / 3)",
        )
        report.add(
            "chain_steps_per_s",
            "3-step chains: steps/s",
            chain["runs_per_s"] * 3,
            "steps/s",
            "pgqueuer 1,100-1,250 jobs/s" + ceiling,
        )
    if "latency" in only:
        progress(f"latency: {sizes.latency_runs} starts, {START_EVERY * 1000:.0f} ms apart")
        latency = percentiles(await measure_latency(server, sizes.latency_runs, pool_size))
        report.details["latency_ms"] = latency
        for p in ("p50", "p95", "p99"):
            report.add(
                f"start_to_run_{p}_ms",
                f"Start-to-run latency {p}",
                latency[p],
                "ms",
                "pgqueuer, procrastinate p50 1-3 ms" if p == "p50" else "",
            )
    if "timer" in only:
        progress(f"timers: {sizes.timer_runs} wake_in of {TIMER_MIN_MS}-{TIMER_MAX_MS} ms")
        lateness = percentiles(await measure_lateness(server, sizes.timer_runs, pool_size))
        report.details["lateness_ms"] = lateness
        for p in ("p50", "p95", "p99"):
            report.add(
                f"wake_in_lateness_{p}_ms",
                f"wake_in lateness {p}",
                lateness[p],
                "ms",
                "pgqueuer ~140 ms; procrastinate ~3.3 s" if p == "p50" else "",
            )
    return report


def format_value(value: float | None, unit: str) -> str:
    """Rates as whole numbers with separators, milliseconds to a tenth."""
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if unit == "ms" else f"{value:,.0f}"


def format_table(report: Report) -> str:
    """The figures as a plain-text table."""
    header = ("metric", "value", "unit", "reference")
    rows = [header] + [
        (f.metric, format_value(f.value, f.unit), f.unit, f.reference) for f in report.figures
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for n, (metric, value, unit, reference) in enumerate(rows):
        cells = f"{metric:<{widths[0]}}  {value:>{widths[1]}}  {unit:<{widths[2]}}  {reference}"
        lines.append(cells.rstrip())
        if n == 0:
            lines.append("-" * (sum(widths) + 4 + max(len(r[3]) for r in rows) + 2))
    return "\n".join(lines)


MEASUREMENTS = ("reference", "noop", "chain", "latency", "timer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description="Benchmark one duly worker process.")
    parser.add_argument("--quick", action="store_true", help="every size ~5x smaller (smoke run)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the JSON here")
    parser.add_argument(
        "--only",
        default=",".join(MEASUREMENTS),
        help=f"comma-separated subset of {','.join(MEASUREMENTS)}",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="the worker's SQLAlchemy pool_size (default: SQLAlchemy's own, 5)",
    )
    args = parser.parse_args(argv)
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - set(MEASUREMENTS)
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the server, measure, print; stop the server whatever happens."""
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL

    def progress(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    progress("starting embedded PostgreSQL (fsync on)")
    server = start_embedded()
    try:
        report = asyncio.run(run_all(server, sizes, args.only, args.pool_size, progress))
    except KeyboardInterrupt:
        progress("interrupted; worker processes and the server are stopped")
        return 130
    finally:
        server.stop()
    print(format_table(report))
    print()
    text = json.dumps(report.as_json(), indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
