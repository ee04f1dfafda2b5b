"""What a large `duly prune --apply` costs a worker: its claims' latency while the prune runs.

An attempt log (mapped here, on a base of its own: this module is also the
DULY_APP the prune's process loads) is filled with `old` rows that finished
more than the retention period ago and `new` ones within it, by
`INSERT ... SELECT generate_series`, then `VACUUM ANALYZE`d; `bench_backlog`
gets BACKLOG due rows, the work a worker claims. Then, in the bench process:

1. `duly prune --json` (the dry run) in a subprocess: it must count `old` rows;
2. a steady claim loop (8 rows with `engine.claims.claim.claim_due` every CLAIM_EVERY,
   the rows made due again untimed after each, so the backlog keeps its size)
   for BASELINE_SECONDS with nothing else running;
3. the same loop while `duly prune --apply --json` runs in a subprocess, until
   it exits. The bench stops and resumes that process (SIGSTOP, SIGCONT) every
   WINDOW seconds, so the claims fall in windows where the prune runs and
   windows where it is paused, taking turns: the machine's other load (a
   shared 2-CPU VM) weighs on both alike. A stop takes effect between two
   batches (a batch is one statement, which the server finishes), and the
   first SETTLE of each window is left out. Only claims inside the deletion
   itself count: the process's start and imports are left out (the prune
   says how long it deleted);
4. the same loop alone again for BASELINE_SECONDS: the claims of 2 and 4 are
   the "no prune" figures, those of the paused windows the "paused" ones;
5. the log must then hold exactly the `new` rows, by count and by id.

The prune runs with duly's defaults (DULY_PRUNE_* from the environment, if set).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import DeclarativeBase

from bench.harness import REPO_ROOT, BenchDatabase
from bench.models import Backlog
from engine import declare_engine_tables
from engine.claims.claim import claim_due
from engine.model.registry import workflow_info
from engine.retention import RetentionSettings
from infra.embedded import EmbeddedPostgres

APP = "bench.prune"  # what the prune's process imports: it maps the attempt log below
LOG = "bench_prune_attempts"
BACKLOG = 100_000  # due rows behind the claims
GROUPS = 100  # tenants they are spread over (Backlog's column; no limit applies)
CLAIM_SIZE = 8  # rows a claim asks for, as in bench/claims.py
CLAIM_EVERY = 0.005  # seconds between claims: a steady worker, not a flat-out one
BASELINE_SECONDS = 6.0  # the claim loop alone, before the prune and again after it
WINDOW = 0.5  # seconds the prune runs, then is paused, in turn
SETTLE = 0.05  # seconds left out at the start of a window: a stopped prune's last batch ends
LEASE = timedelta(minutes=5)
PERIOD_DAYS = RetentionSettings().attempts_days or 30  # the default period, which the prune uses
PRUNE_TIMEOUT = 1800.0  # seconds: a prune past this fails the measurement


class PruneBase(DeclarativeBase):
    """The base of the attempt log only this measurement fills."""


# The attempt log the prune empties of its old rows.
declare_engine_tables(PruneBase, events=False, names={"attempt_log": LOG})


async def measure_prune(server: EmbeddedPostgres, old: int, new: int) -> dict[str, Any]:
    """Fill, count (dry run), claim alone, claim while pruning, check; the raw figures."""
    settings = RetentionSettings.from_env()  # what the prune's process reads too
    async with BenchDatabase(server, "bench_prune") as db:
        async with db.engine.begin() as conn:
            await conn.run_sync(PruneBase.metadata.create_all)
        fill_seconds = await fill(db, old, new)
        dry = await duly_prune(db, apply=False)
        counted = rows_of(dry, LOG)
        if counted != old:
            raise RuntimeError(f"the dry run counted {counted} rows of {LOG}, not {old}")
        async with claiming(db) as claims:
            before = await claims.run_for(BASELINE_SECONDS)
            process = await start_prune(db)
            during = await claims.run_alternating(process)
            ended = time.monotonic()
            after = await claims.run_for(BASELINE_SECONDS)
        stdout, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"duly prune --apply exited with status {process.returncode}")
        done = json.loads(stdout)
        deleted = rows_of(done, LOG)
        # The claims inside the deletion: the prune says how long it deleted, and ends there.
        began = ended - float(done["seconds"])
        running = [ms for at, ms, runs in during if at >= began and runs]
        paused = [ms for at, ms, runs in during if at >= began and not runs]
        stopped = sum(max(0.0, end - max(start, began)) for start, end in claims.stops)
        left = await check_left(db, old, new)
    return {
        "old_rows": old,
        "new_rows": new,
        "fill_s": fill_seconds,
        "dry_run": {"rows": counted, "seconds": dry["seconds"]},
        "deleted": deleted,
        "deleted_all_tables": done["rows"],
        "batches": done["batches"],
        "batch_size": settings.batch_size,
        "pause_ms": settings.pause_ms,
        "prune_seconds": float(done["seconds"]) - stopped,  # its running time
        "prune_wall_seconds": float(done["seconds"]),  # with the windows it was stopped
        "left": left,
        "before_ms": [ms for _, ms in before],
        "after_ms": [ms for _, ms in after],
        "with_prune_ms": running,
        "paused_ms": paused,
        "window_s": WINDOW,
    }


def rows_of(result: dict[str, Any], table: str) -> int:
    """The rows `duly prune --json` counted or deleted in `table`."""
    return sum(int(t["rows"]) for t in result["tables"] if t["table"] == table)


async def fill(db: BenchDatabase, old: int, new: int) -> float:
    """`old` log rows finished a second apart, the newest a day past the period; `new` rows
    finished a second apart within the last day; the backlog. Then VACUUM ANALYZE."""
    began = time.perf_counter()
    insert = (
        "INSERT INTO {} (workflow, run_key, step, attempt, outcome, error, took_ms, finished_at) "
        "SELECT 'bench_backlog', g::text, 'run', 1, 'ok', NULL, 1.0, "
        "now() - make_interval(days => %s) - make_interval(secs => %s - g) "
        "FROM generate_series(1, %s) AS g"
    )
    log = sql.Identifier(LOG)
    await db.scalar(sql.SQL(insert).format(log), PERIOD_DAYS + 1, old, old)
    await db.scalar(sql.SQL(insert).format(log), 0, new, new)
    await db.scalar(
        sql.SQL(
            "INSERT INTO {} (tenant, next_step, next_args, wake_at) "
            "SELECT g %% %s, 'run', '{{\"args\": [], \"kwargs\": {{}}}}'::jsonb, "
            "now() - make_interval(secs => (%s - g) / 1000.0) FROM generate_series(1, %s) AS g"
        ).format(sql.Identifier(Backlog.__tablename__)),
        GROUPS,
        BACKLOG,
        BACKLOG,
    )
    for table in (LOG, Backlog.__tablename__):
        await db.scalar(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    return time.perf_counter() - began


def prune_command(apply: bool) -> list[str]:
    """`duly prune --json` (with `--apply`), as an operator runs it."""
    return [sys.executable, "-m", "functions.cli", "prune", "--json", *(["--apply"] * apply)]


def prune_env(db: BenchDatabase) -> dict[str, str]:
    """The prune's environment: this module as the app, the bench database, the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DULY_RETAIN_")}
    return {**env, "DULY_APP": APP, "DULY_DATABASE_URL": db.url}


async def duly_prune(db: BenchDatabase, *, apply: bool) -> dict[str, Any]:
    """Run `duly prune` to its end; its JSON."""
    process = await asyncio.create_subprocess_exec(
        *prune_command(apply), cwd=REPO_ROOT, env=prune_env(db), stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), PRUNE_TIMEOUT)
    if process.returncode != 0:
        raise RuntimeError(f"duly prune exited with status {process.returncode}")
    found: dict[str, Any] = json.loads(stdout)
    return found


async def start_prune(db: BenchDatabase) -> asyncio.subprocess.Process:
    """Start `duly prune --apply --json`, its output piped."""
    return await asyncio.create_subprocess_exec(
        *prune_command(True), cwd=REPO_ROOT, env=prune_env(db), stdout=asyncio.subprocess.PIPE
    )


class Claims:
    """A steady claim loop on the backlog, each claim timed (its start and milliseconds)."""

    def __init__(self, lookup: AsyncConnection) -> None:
        self.lookup = lookup
        self.info = workflow_info(Backlog)
        self.stops: list[tuple[float, float]] = []  # when run_alternating's process was stopped

    async def once(self) -> tuple[float, float]:
        """Claim CLAIM_SIZE rows, timed; then, untimed, make them due again."""
        table = self.info.table
        began = time.monotonic()
        taken = list(await claim_due(self.lookup, self.info, CLAIM_SIZE, LEASE))
        took = (time.monotonic() - began) * 1000
        if len(taken) != CLAIM_SIZE:
            raise RuntimeError(f"a claim took {len(taken)} rows, not {CLAIM_SIZE}")
        # Due again at the back of the queue: the backlog keeps its size and its order.
        await self.lookup.execute(
            update(table)
            .where(table.c.id.in_([row.id for row in taken]))
            .values(claimed_until=None, wake_at=func.now())
        )
        return began, took

    async def run_for(self, seconds: float) -> list[tuple[float, float]]:
        """Claim for `seconds`."""
        found = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            found.append(await self.once())
            await asyncio.sleep(CLAIM_EVERY)
        return found

    async def run_alternating(
        self, process: asyncio.subprocess.Process
    ) -> list[tuple[float, float, bool]]:
        """Claim until `process` exits, stopping and resuming it every WINDOW seconds; each
        claim with whether the process ran (claims in a window's first SETTLE left out)."""
        found = []
        self.stops = []
        exited = asyncio.ensure_future(process.wait())
        runs, switched = True, time.monotonic()
        deadline = switched + PRUNE_TIMEOUT
        try:
            while not exited.done():
                now = time.monotonic()
                if now > deadline:
                    raise RuntimeError(f"duly prune --apply ran past {PRUNE_TIMEOUT:.0f} s")
                if now - switched >= WINDOW:
                    runs, switched = not runs, now
                    process.send_signal(signal.SIGCONT if runs else signal.SIGSTOP)
                    if runs:
                        self.stops.append((now - WINDOW, now))
                at, ms = await self.once()
                if at - switched >= SETTLE:
                    found.append((at, ms, runs))
                await asyncio.sleep(CLAIM_EVERY)
        finally:
            if not exited.done():
                if not runs:
                    process.send_signal(signal.SIGCONT)
                if sys.exc_info()[0] is not None:
                    process.kill()
            await exited
        return found


@contextlib.asynccontextmanager
async def claiming(db: BenchDatabase) -> AsyncIterator[Claims]:
    """A claim loop on an autocommit connection of its own, warmed up first."""
    autocommit = db.engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as conn:
        claims = Claims(conn)
        await claims.run_for(1.0)  # warm-up: plans and caches, left out
        yield claims


async def check_left(db: BenchDatabase, old: int, new: int) -> dict[str, Any]:
    """What the log holds after the prune; RuntimeError unless exactly the `new` rows."""
    query = sql.SQL(
        "SELECT count(*), min(id), max(id), "
        "count(*) FILTER (WHERE finished_at < now() - make_interval(days => %s)) FROM {}"
    ).format(sql.Identifier(LOG))
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn:
        row = await (await conn.execute(query, (PERIOD_DAYS,))).fetchone()
    assert row is not None
    count, first, last, past = row
    left = {"rows": count, "first_id": first, "last_id": last, "past_period": past}
    if (count, first, last, past) != (new, old + 1, old + new, 0):
        raise RuntimeError(f"the prune left {left}, not exactly the {new} newer rows")
    return left
