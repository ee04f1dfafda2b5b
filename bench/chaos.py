"""The chaos soak: a mixed load on several worker processes while they are killed.

    python bench/chaos.py [--seconds 600] [--workers 3] [--json PATH]

Worker processes (`bench.chaos_worker`) serve the workflows of
`bench.chaos_app` (multi-step runs with wake_in timers, waits fed by the
driver and by outbox handlers, fan-outs, a limited workflow) and drain its
outbox, while the driver keeps starting runs, publishing events and
delivering, kills a random worker with SIGKILL every 3-5 s and starts
another in its place, restarts PostgreSQL once in immediate mode (a crash,
recovered from the WAL), and keeps one worker slot behind a real PgBouncer in
transaction mode. Then it stops the load, lets the workers finish, and counts
the invariants from the database, never from its own memory:

- unfinished / failed: every run ended, none with an error;
- step_not_once: every run committed each of its steps exactly once (`ok`
  per run and step in the attempt log), and none is missing;
- event_wrong: every waiter took its own event, once;
- outbox_unprocessed / delivery_not_once: every outbox event processed, each
  of its two handlers with exactly one successful attempt;
- journey_missing: every Journey an event asked for exists;
- left_claimed: no run or outbox row is still leased;
- timer_early: no wake_in step ran before its time;
- limit_exceeded: no tenant ever had more than its limit running (sampled).

`tests/processes/test_chaos.py` runs the same soak for about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script, Python puts bench/ on the path

import psycopg  # noqa: E402
from sqlalchemy import func, select, text  # noqa: E402
from sqlalchemy.exc import DBAPIError  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine  # noqa: E402

from bench import chaos_app as app  # noqa: E402
from engine import configure_event_registry, connect_workflows  # noqa: E402
from engine.base.settings import CHAOS_KEEP  # noqa: E402
from infra.embedded import EmbeddedPostgres, start_embedded  # noqa: E402
from infra.testing.pytest_plugin import Database, Server  # noqa: E402
from tests.pgbouncer import start_pgbouncer  # noqa: E402

READY_TIMEOUT = 60.0  # seconds for a worker process to say "ready"
SETTLE_TIMEOUT = 60.0  # seconds for the workers to finish everything after the load stops
TICK = 0.1  # seconds between two rounds of the driver's load
RETRY_DELAY = 0.2  # seconds before an operation the database refused is tried again


class NotReady(Exception):
    """A worker process ended before it said "ready"."""


TRANSIENT = (DBAPIError, OSError, ConnectionError, NotReady)


@dataclass
class SoakSettings:
    seconds: float = 600.0
    workers: int = 3
    pooled_workers: int = 1  # of the worker slots, how many reach PostgreSQL through PgBouncer
    kill_every: tuple[float, float] = (3.0, 5.0)
    restarts: int = 1  # PostgreSQL restarts (immediate mode), spread over the load


@dataclass
class SoakReport:
    seconds: float = 0.0
    workers: int = 0
    kills: int = 0
    restarts: int = 0
    pooled_workers: int = 0
    runs: int = 0
    steps: int = 0
    events: int = 0
    deliveries: int = 0
    steps_per_s: float = 0.0
    events_per_s: float = 0.0
    settle_seconds: float = 0.0
    violations: dict[str, int] = field(default_factory=dict)
    left_undone: list[str] = field(default_factory=list)  # the rows settling did not finish

    @property
    def violated(self) -> int:
        return sum(self.violations.values())


class WorkerSlot:
    """One worker process of the soak, direct or behind the pooler, restartable."""

    def __init__(self, url: str, listen_url: str | None) -> None:
        self.url, self.listen_url = url, listen_url
        self.process: asyncio.subprocess.Process | None = None
        self.running = False  # said "ready", and not killed since

    async def start(self) -> None:
        extra = ["--listen-url", self.listen_url] if self.listen_url else []
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.chaos_worker",
            self.url,
            *extra,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT)
        if line.strip() != b"ready":
            # As a process manager would, the driver starts it again (a worker that starts
            # while the database, or the pooler's login to it, is down exits at once).
            await self.kill()
            raise NotReady(f"a chaos worker said {line!r}, not ready; its stderr is above")
        self.running = True

    async def kill(self) -> None:
        self.running = False
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                await self.kill()


async def retried(operation: Callable[[], Awaitable[Any]], stop_at: float) -> Any:
    """Run `operation` until the database takes it (restarts and kills make it refuse)."""
    while True:
        try:
            return await operation()
        except TRANSIENT:
            if time.monotonic() > stop_at:
                raise
            await asyncio.sleep(RETRY_DELAY)


class Load:
    """The driver's side of the load: starts, events and deliveries, each until it lands."""

    def __init__(self, Session: async_sessionmaker[Any], deadline: float) -> None:
        self.Session = Session
        self.deadline = deadline
        self.next_id = 0
        self.waiting_for_delivery: list[int] = []
        self.limit_samples = 0
        self.limit_exceeded = 0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def round(self) -> None:
        """One tick's work: about 15 runs, two events and the deliveries that are due."""
        for _ in range(3):
            journey = app.Journey(id=self.new_id(), delay_ms=random.randint(*app.WAKE_MS))
            await retried(lambda row=journey: row.start(app.Journey.begin), self.deadline)
        fan = app.Fan(id=self.new_id())
        await retried(lambda: fan.start(app.Fan.split), self.deadline)
        for _ in range(2):
            limited = app.Limited(id=self.new_id(), tenant=f"t{random.randrange(app.TENANTS)}")
            await retried(lambda row=limited: row.start(app.Limited.work), self.deadline)
        for _ in range(2):
            waiter = app.Waiter(id=self.new_id(), via="driver")
            await retried(lambda row=waiter: row.start(app.Waiter.park), self.deadline)
            self.waiting_for_delivery.append(waiter.id)
        for _ in range(2):
            await self.order()
        # Deliver to the waiters of an earlier round: most have parked by now, some hold it.
        due, self.waiting_for_delivery = (
            self.waiting_for_delivery[:-2],
            self.waiting_for_delivery[-2:],
        )
        for waiter_id in due:
            await retried(lambda w=waiter_id: deliver(w), self.deadline)
        await retried(self.sample_limit, self.deadline)

    async def finish(self) -> None:
        """Deliver to the waiters the last round left for the next one."""
        for waiter_id in self.waiting_for_delivery:
            await retried(lambda w=waiter_id: deliver(w), self.deadline)
        self.waiting_for_delivery = []

    async def order(self) -> None:
        """A waiter fed by the outbox, and the event whose handlers start a Journey and feed it."""
        waiter = app.Waiter(id=self.new_id(), via="outbox")
        await retried(lambda: waiter.start(app.Waiter.park), self.deadline)
        event = app.order_event(self.new_id(), waiter.id)

        async def publish() -> None:
            async with self.Session() as session:
                await app_registry.publish(event, session=session)
                await session.commit()

        await retried(publish, self.deadline)

    async def sample_limit(self) -> None:
        """Count each tenant's leased rows now: never more than the limit."""
        table = app.Limited.__table__
        async with self.Session() as session:
            rows = await session.execute(
                select(table.c.tenant, func.count())
                .where(table.c.claimed_until > func.now())
                .group_by(table.c.tenant)
            )
            counts = [count for _, count in rows]
        self.limit_samples += 1
        self.limit_exceeded += sum(1 for count in counts if count > app.AT_MOST)


async def deliver(waiter_id: int) -> None:
    # Keyed: a retry after a delivery that landed but whose answer was lost is refused.
    await app.Waiter.by(app.Waiter.id == waiter_id).deliver(
        app.Waiter.answer(waiter_id), key=f"driver-{waiter_id}"
    )


app_registry = app.registry()


@contextlib.asynccontextmanager
async def chaos_database(server: EmbeddedPostgres) -> AsyncIterator[Database]:
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    admin = server.conninfo_for("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database = Database(name, server.url_for(name), server.conninfo_for(name))
    engine = create_async_engine(database.url)
    async with engine.begin() as conn:
        await conn.run_sync(app.Base.metadata.create_all)
    await engine.dispose()
    try:
        yield database
    finally:
        if CHAOS_KEEP.read():  # to look at what the soak left
            print(f"kept database {name} on {server.socket_dir}", file=sys.stderr)
        else:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def soak(server: EmbeddedPostgres, settings: SoakSettings) -> SoakReport:
    """Run the soak on `server` (which it restarts) and count its invariants."""
    report = SoakReport(workers=settings.workers, pooled_workers=settings.pooled_workers)
    async with chaos_database(server) as database:
        with start_pgbouncer(database, Server(server.url, server), strict=False) as bouncer:
            slots = [
                WorkerSlot(bouncer.url, database.url)
                if i < settings.pooled_workers
                else WorkerSlot(database.url, None)
                for i in range(settings.workers)
            ]
            engine = create_async_engine(database.url, pool_pre_ping=True, pool_size=4)
            configure_event_registry(app_registry)
            try:
                await asyncio.gather(*(slot.start() for slot in slots))
                started = time.monotonic()
                async with connect_workflows(
                    async_sessionmaker(engine, expire_on_commit=False), workflows=app.WORKFLOWS
                ):
                    load = Load(async_sessionmaker(engine), started + settings.seconds + 60)
                    await drive(server, slots, load, settings, report)
                report.seconds = time.monotonic() - started
                settled = time.monotonic()
                await settle(engine, settled + SETTLE_TIMEOUT)
                report.settle_seconds = time.monotonic() - settled
            finally:
                await asyncio.gather(*(slot.stop() for slot in slots))
                configure_event_registry(None)
            report.violations = await invariants(engine)
            report.left_undone = await left_undone(engine)
            report.violations["limit_exceeded"] = load.limit_exceeded
            await count(engine, report)
            await engine.dispose()
    return report


async def drive(
    server: EmbeddedPostgres,
    slots: list[WorkerSlot],
    load: Load,
    settings: SoakSettings,
    report: SoakReport,
) -> None:
    """The load, the kills and the restarts, for `settings.seconds`."""
    began = time.monotonic()
    end = began + settings.seconds
    next_kill = began + random.uniform(*settings.kill_every)
    starting: set[asyncio.Task[Any]] = set()  # new workers in place of killed ones
    restarts_at = [
        began + settings.seconds * (i + 1) / (settings.restarts + 1)
        for i in range(settings.restarts)
    ]
    while time.monotonic() < end:
        tick = time.monotonic()
        await load.round()
        alive = [slot for slot in slots if slot.running]
        if time.monotonic() >= next_kill and alive:
            # Counted from the kill, not from the new worker's start: one every 3-5 s. The
            # new one starts beside the load (after a crash, the pooler refuses logins for a
            # while), and is not killed again before it is up.
            next_kill = time.monotonic() + random.uniform(*settings.kill_every)
            slot = random.choice(alive)
            await slot.kill()
            report.kills += 1
            starting.add(asyncio.create_task(retried(slot.start, end + 60)))
        if restarts_at and time.monotonic() >= restarts_at[0]:
            restarts_at.pop(0)
            await asyncio.to_thread(server.restart, "immediate")
            report.restarts += 1
        await asyncio.sleep(max(0.0, tick + TICK - time.monotonic()))
    await asyncio.gather(*starting)
    await load.finish()


async def settle(engine: AsyncEngine, deadline: float) -> None:
    """Wait until no run is left to do and every outbox event is processed."""
    while True:
        try:
            async with engine.connect() as conn:
                left = 0
                for name in ("unfinished", "outbox_unprocessed"):
                    left += int(await conn.scalar(text(INVARIANTS[name])) or 0)
            if left == 0:
                return
        except TRANSIENT:
            pass
        if time.monotonic() > deadline:
            return  # what is left is counted as unfinished
        await asyncio.sleep(0.5)


def summed(condition: str, tables: list[str]) -> str:
    """The count of rows meeting `condition` over every one of `tables`."""
    return "SELECT " + " + ".join(
        f"(SELECT count(*) FROM {table} WHERE {condition})" for table in tables
    )


def expected_steps() -> str:
    """Every (workflow, run, step) the runs must have committed (`STEPS_PER_RUN`)."""
    return " UNION ALL ".join(
        f"SELECT '{table}' AS workflow, id::text AS run_key, s AS step "
        f"FROM {table}, unnest(ARRAY[{', '.join(repr(step) for step in steps)}]) AS s"
        for table, steps in app.STEPS_PER_RUN.items()
    )


RUN_TABLE_NAMES = list(app.STEPS_PER_RUN)
HANDLERS = [f"{handler.__module__}.{handler.__qualname__}" for handler in app.HANDLERS]
INVARIANTS = {
    "unfinished": summed("next_step IS NOT NULL OR waiting_for IS NOT NULL", RUN_TABLE_NAMES),
    "failed": summed("last_error IS NOT NULL", RUN_TABLE_NAMES),
    # Every (run, step) a run of each kind must commit, against the attempt log's ok rows.
    "step_not_once": f"""
        WITH expected AS ({expected_steps()}),
        ok AS (
            SELECT workflow, run_key, step, count(*) AS n FROM chaos_attempts
             WHERE outcome = 'ok' GROUP BY workflow, run_key, step
        )
        SELECT count(*) FROM expected e FULL JOIN ok o
            ON o.workflow = e.workflow AND o.run_key = e.run_key AND o.step = e.step
         WHERE o.n IS DISTINCT FROM 1 OR e.step IS NULL""",
    "event_wrong": "SELECT count(*) FROM chaos_waiter WHERE received IS DISTINCT FROM id",
    "outbox_unprocessed": "SELECT count(*) FROM chaos_outbox WHERE status <> 'processed'",
    "delivery_not_once": f"""
        WITH expected AS (
            SELECT o.event_id, h AS handler FROM chaos_outbox o,
                   unnest(ARRAY[{", ".join(repr(handler) for handler in HANDLERS)}]) AS h
        ), succeeded AS (
            SELECT event_id, handler, count(*) AS n FROM chaos_deliveries
             WHERE status = 'succeeded' GROUP BY event_id, handler
        )
        SELECT count(*) FROM expected e FULL JOIN succeeded s
            ON s.event_id = e.event_id AND s.handler = e.handler
         WHERE s.n IS DISTINCT FROM 1 OR e.handler IS NULL""",
    "journey_missing": """
        SELECT count(*) FROM chaos_events e
         WHERE NOT EXISTS (SELECT 1 FROM chaos_journey j
                            WHERE j.id = (e.payload ->> 'journey')::int)""",
    "left_claimed": summed("claimed_until IS NOT NULL", [*RUN_TABLE_NAMES, "chaos_outbox"]),
    "timer_early": "SELECT count(*) FROM chaos_journey WHERE fired_at < due_at",
}


UNDONE_COLUMNS = "next_step, waiting_for, wake_at, claimed_until, attempts, last_error, wf_version"
UNDONE = " UNION ALL ".join(
    [
        f"SELECT '{table}', id::text, {UNDONE_COLUMNS}, NULL::text, NULL::int FROM {table} "
        "WHERE next_step IS NOT NULL OR waiting_for IS NOT NULL"
        for table in RUN_TABLE_NAMES
    ]
    + [
        f"SELECT 'chaos_outbox', event_id, {UNDONE_COLUMNS}, status, route_attempts "
        "FROM chaos_outbox WHERE status <> 'processed'",
        "SELECT 'chaos_deliveries', event_id, handler, error, updated_at, NULL, attempts, "
        "NULL, NULL, status, NULL FROM chaos_deliveries WHERE status <> 'succeeded'",
        "SELECT 'chaos_waiter_events', id::text, pending_event::text, recent_event_keys::text, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM chaos_waiter "
        "WHERE received IS DISTINCT FROM id",
    ]
)


async def left_undone(engine: AsyncEngine, most: int = 20) -> list[str]:
    """The rows settling left undone, as text, with their engine columns: what to look at."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text(f"{UNDONE} LIMIT {most}"))).all()
        now = await conn.scalar(text("SELECT now()"))
    if not rows:
        return []
    return [f"now {now}", *(" | ".join(str(value) for value in row) for row in rows)]


async def invariants(engine: AsyncEngine) -> dict[str, int]:
    """Each invariant's count of violations, from the database alone."""
    found: dict[str, int] = {}
    async with engine.connect() as conn:
        for name, query in INVARIANTS.items():
            found[name] = int(await conn.scalar(text(query)) or 0)
    return found


async def count(engine: AsyncEngine, report: SoakReport) -> None:
    """What the soak did: runs, committed steps, events, successful deliveries; their rates."""
    async with engine.connect() as conn:
        runs = 0
        for model in app.RUN_TABLES:
            runs += int(await conn.scalar(select(func.count()).select_from(model.__table__)) or 0)
        report.runs = runs
        report.steps = int(
            await conn.scalar(text("SELECT count(*) FROM chaos_attempts WHERE outcome = 'ok'")) or 0
        )
        report.events = int(await conn.scalar(text("SELECT count(*) FROM chaos_outbox")) or 0)
        report.deliveries = int(
            await conn.scalar(
                text("SELECT count(*) FROM chaos_deliveries WHERE status = 'succeeded'")
            )
            or 0
        )
    window = report.seconds + report.settle_seconds
    report.steps_per_s = report.steps / window if window else 0.0
    report.events_per_s = report.events / window if window else 0.0


def format_report(report: SoakReport) -> str:
    lines = [
        f"load held for {report.seconds:.0f} s (+{report.settle_seconds:.1f} s to settle), "
        f"{report.workers} worker processes ({report.pooled_workers} through PgBouncer)",
        f"faults survived: {report.kills} kill -9, {report.restarts} PostgreSQL restart(s)",
        f"runs {report.runs:,}, steps {report.steps:,} ({report.steps_per_s:,.0f}/s), "
        f"events {report.events:,} ({report.events_per_s:,.1f}/s), "
        f"deliveries {report.deliveries:,}",
        "violations: "
        + ", ".join(f"{name} {n}" for name, n in report.violations.items())
        + f" (total {report.violated})",
        *(f"  left undone: {row}" for row in report.left_undone),
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    server = start_embedded(Path(args.data_dir) if args.data_dir else None)
    try:
        settings = SoakSettings(seconds=args.seconds, workers=args.workers)
        report = await soak(server, settings)
    finally:
        server.stop()
    print(format_report(report))
    print(json.dumps(asdict(report), indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 1 if report.violated else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--json", help="write the report as JSON to this file too")
    parser.add_argument("--data-dir", help="PostgreSQL's data directory (default: a temporary one)")
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
