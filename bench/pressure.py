"""duly under database pressure: a steady offered load through phases that strain PostgreSQL.

    python bench/pressure.py [--phase-seconds 300] [--json PATH] [--long] [--fraction 0.5]
                             [--workers 2] [--idle-connections 300] [--only clean,overload]

It starts its own embedded PostgreSQL (fsync on), measures the no-op capacity
of the pipeline kept full (the producer's starts and the workers' steps on the
same server), then offers runs at a fraction of it through the phases of
PHASES; after each, offers back at the fraction, it waits for the phase's
backlog to drain (reporting how long and how fast) before the next. Per
phase: completions, pickup, the claim's cost, dead tuples and size of every
table and index, WAL per step, drain and recovery; at the end, every run
finished, still queued, lost or run twice, from the database. Exit status 1
if any run was lost or ran twice (bench/README.md: the rules).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script, Python puts bench/ on the path

from bench import (  # noqa: E402
    pressure_faults as faults,
    pressure_figures as figures,
)
from bench.pressure_app import ATTEMPTS_TABLE, TABLE  # noqa: E402
from bench.pressure_processes import Producer, Subprocess  # noqa: E402
from bench.pressure_report import aims, format_report  # noqa: E402
from bench.pressure_server import (  # noqa: E402
    DATABASE,
    create_database,
    load_average,
    prepare_server,
    server_settings,
)
from bench.pressure_worker import CONCURRENCY  # noqa: E402
from engine.worker.options import LEASE  # noqa: E402
from infra.embedded import EmbeddedPostgres, start_embedded  # noqa: E402

PHASES = ("clean", "held_xmin", "readers", "overload", "terminate", "idle_connections")
OVERLOAD = 1.5  # the overload phase offers this many times the capacity
LONG_CLEAN_SECONDS = 3600.0  # --long: the clean phase, for drift
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "pressure.json"  # ignored by git
POLL_EVERY = 0.5  # seconds between two looks at the backlog, at least
READ_SHARE = 0.05  # at most this share of the time goes to counting the backlog
FILL_TARGET = 2_000  # unfinished runs the producer keeps while the capacity is read
CAPACITY_WARM_UP = 0.1  # of the capacity's seconds, first, untimed
CAPACITY_SETTLE = 120.0  # seconds at most for the capacity's last runs to finish
DRAINED_WITHIN = 0.5  # the backlog is drained when under this many seconds of offers
SETTLE_MARGIN = 15.0  # seconds beyond two leases for a passed-over run to count as lost
DRAIN_SECONDS = 600.0  # at most, for a phase's backlog to drain before the next phase


@dataclass(frozen=True)
class Settings:
    """How long and how hard: the command line's options."""

    phase_seconds: float = 300.0
    clean_seconds: float | None = None  # the clean phase's own length (--long); else phase_seconds
    fraction: float = 0.5  # of the capacity, offered in every phase but the overload
    workers: int = 2
    concurrency: int = CONCURRENCY  # each worker's max_concurrency
    capacity_seconds: float = 60.0  # the pipeline kept full, timed
    idle_connections: int = 300
    recovery_seconds: float = 60.0  # at most, after each phase's drain
    drain_seconds: float = DRAIN_SECONDS  # at most, for each phase's backlog and at the end
    lease_seconds: float | None = None  # the workers' lease; None: the engine's default (30 s)
    start_many: bool = False  # the producer builds rows and calls start_many() (--start-many)
    phases: tuple[str, ...] = PHASES

    @property
    def settle_seconds(self) -> float:
        """How long before the workers caught up a run still unfinished must have been due
        to count as lost: two leases, and a margin."""
        lease = self.lease_seconds or LEASE.total_seconds()
        return 2 * lease + SETTLE_MARGIN


class Bench:
    """The database, the workers and the producer of one pressure run, and its figures."""

    def __init__(self, server: EmbeddedPostgres, settings: Settings) -> None:
        self.server, self.settings = server, settings
        self.url, self.conninfo = server.url_for(DATABASE), server.conninfo_for(DATABASE)
        self.conn: figures.Connection | None = None
        self.capacity = 0.0
        self.clean_p99_ms: float | None = None
        self.workers: list[Subprocess] = []
        self.caught_up_at: float | None = None  # time.time() the backlog was last seen drained
        self.on_backlog = False  # the last phase's backlog was not drained within its bound
        self.count_took = 0.0  # seconds the last count of the backlog took

    @property
    def db(self) -> figures.Connection:
        assert self.conn is not None, "outside Bench.running()"
        return self.conn

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Producer]:
        """A fresh database with the tables, the workers and the producer, stopped at the end."""
        await create_database(self.server, self.url)
        self.workers = [
            Subprocess("bench.pressure_worker", self.url, *worker_options(self.settings))
            for _ in range(self.settings.workers)
        ]
        producer = Producer(self.url, self.settings.start_many)
        async with contextlib.AsyncExitStack() as stack:
            self.conn = await stack.enter_async_context(await faults.connect(self.conninfo))
            # The bench's own counts read one core's worth, never both as parallel queries.
            await self.conn.execute("SET max_parallel_workers_per_gather = 0")
            for process in self.workers:
                stack.push_async_callback(process.stop)
            stack.push_async_callback(producer.finish)
            await asyncio.gather(*(process.start() for process in self.workers))
            await producer.start()
            self.capacity = await self.measure_capacity(producer)
            yield producer

    async def measure_capacity(self, producer: Producer) -> float:
        """No-op steps/s of the pipeline kept full: the producer tops the unfinished runs up to
        FILL_TARGET every tick, so the capacity pays for the starts as every phase does. After
        an untimed warm-up, the steps started in capacity_seconds ÷ those seconds."""
        seconds = self.settings.capacity_seconds
        await producer.fill(FILL_TARGET, "warm-up")
        await asyncio.sleep(seconds * CAPACITY_WARM_UP)
        began = await producer.fill(FILL_TARGET, "capacity")
        await asyncio.sleep(seconds)
        ended = await producer.offer(0.0, "capacity/after")
        left = await self.wait_for_backlog(0, time.monotonic() + CAPACITY_SETTLE)
        if left:
            raise RuntimeError(f"{left} capacity runs did not finish in {CAPACITY_SETTLE:g} s.")
        self.caught_up_at = time.time()  # nothing is left unfinished
        started = await figures.count(self.db, figures.STARTED_IN, began, ended)
        # The capacity's dead rows are its own: vacuumed now, not during the clean phase.
        for table in (TABLE, ATTEMPTS_TABLE):
            await self.db.execute(f"VACUUM (ANALYZE) {table}")
        return started / (ended - began)

    async def wait_for_backlog(
        self, at_most: int, deadline: float, every: float = POLL_EVERY
    ) -> int:
        """Poll until at most `at_most` runs are unfinished or `deadline`; the last count."""
        while True:
            backlog = await self.backlog()
            if backlog <= at_most or time.monotonic() > deadline:
                return backlog
            await asyncio.sleep(self.pause(every))

    async def backlog(self) -> int:
        """Runs unfinished now, counted on the due index; how long that took is kept."""
        began = time.monotonic()
        found = await figures.count(self.db, figures.BACKLOG)
        self.count_took = time.monotonic() - began
        return found

    def pause(self, every: float = POLL_EVERY) -> float:
        """Seconds before the next count: `every`, or longer when counting is slow (a backlog
        of a million runs), so the bench's own reads never take the workers' share."""
        return max(every, self.count_took / READ_SHARE)

    def pressure(self, phase: str) -> AbstractAsyncContextManager[dict[str, Any]]:
        """What `phase` puts on the database while it lasts."""
        pressures: dict[str, Callable[[], AbstractAsyncContextManager[dict[str, Any]]]] = {
            "held_xmin": lambda: faults.held_xmin(self.conninfo),
            "readers": lambda: faults.repeatable_readers(self.conninfo, [TABLE, ATTEMPTS_TABLE]),
            "terminate": lambda: faults.terminator(self.conninfo),
            "idle_connections": lambda: faults.idle_connections(
                self.conninfo, self.settings.idle_connections
            ),
        }
        return pressures.get(phase, nothing)()

    async def run_phase(self, producer: Producer, phase: str) -> dict[str, Any]:
        """One phase, then its drain and recovery window; its figures."""
        steady = self.settings.fraction * self.capacity
        rate = OVERLOAD * self.capacity if phase == "overload" else steady
        seconds = self.settings.phase_seconds
        if phase == "clean" and self.settings.clean_seconds is not None:
            seconds = self.settings.clean_seconds
        drained_below = max(1, int(steady * DRAINED_WITHIN))
        started_on_backlog = self.on_backlog  # the last phase's backlog outlasted its bound
        backlog_at_start = await self.backlog()
        opened = time.monotonic()
        async with self.pressure(phase) as pressure:
            pressure["set_up_s"] = time.monotonic() - opened
            wal_before = await figures.wal_counters(self.db)
            done_before = await figures.count(self.db, figures.DONE)
            claims_before = await figures.claim_counters(self.db)
            began = await producer.offer(rate, phase)
            claim_slices = await self.hold(seconds)
            ended = await producer.offer(steady, f"{phase}/after")
            done_after = await figures.count(self.db, figures.DONE)
            claims_after = await figures.claim_counters(self.db)
            wal_after = await figures.wal_counters(self.db)
            tables = await figures.relations(self.db)
            backlog_at_end = await self.backlog()
        completed = done_after - done_before
        wal = await figures.wal_between(self.db, wal_before, wal_after)
        if phase == "clean":
            await self.settle([phase])
            self.clean_p99_ms = (await figures.pickup(self.db, phase))["pickup_p99_ms"]
        drain, recovery = await self.drain_and_recover(phase, ended, backlog_at_end, drained_below)
        self.on_backlog = not drain["drained"]
        return {
            "phase": phase,
            "seconds": ended - began,
            "offered_rate": rate,
            **await figures.pickup(self.db, phase),  # read again once the bench has drained
            "completed": completed,
            "completed_per_s": completed / (ended - began),
            "completed_of_capacity": completed / (ended - began) / self.capacity,
            "wal": wal,
            "wal_bytes_per_step": wal["bytes"] / completed if completed else None,
            "wal_syncs_per_step": per_step(wal["syncs"], completed),
            "wal_writes_per_step": per_step(wal["writes"], completed),
            "claims": figures.claim_between(claims_before, claims_after),
            "claim_slices": claim_slices,
            "started_on_backlog": started_on_backlog,
            "backlog_at_start": backlog_at_start,
            "backlog_at_end": backlog_at_end,
            "drained_below": drained_below,
            "pressure": pressure,
            "slices": await figures.slices(self.db, phase, began, ended),
            "tables": tables,
            "drain": drain,
            "recovery": recovery,
        }

    async def hold(self, seconds: float) -> list[dict[str, Any]]:
        """`seconds` under the phase's load; the claim's cost and the backlog in each tenth."""
        found: list[dict[str, Any]] = []
        began = time.monotonic()
        before = await figures.claim_counters(self.db)
        for tenth in range(1, figures.SLICES + 1):
            until = began + seconds * tenth / figures.SLICES
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            after = await figures.claim_counters(self.db)
            backlog = await self.backlog()
            claims = figures.claim_between(before, after)
            found.append({"slice": tenth, "backlog": backlog, **claims})
            before = after
        return found

    async def drain_and_recover(
        self, phase: str, ended: float, backlog: int, drained_below: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """After the phase, with offers back at the fraction: until its backlog is drained (at
        most drain_seconds), then, for the phases after the clean one, recovery_seconds more,
        after which its after-runs' pickup is compared with the clean phase's once (a scan of
        the whole table, so not polled)."""
        done_at_end = await figures.count(self.db, figures.DONE)
        drain: dict[str, Any] = {"drained": backlog <= drained_below, "backlog": backlog}
        drain |= {"seconds": 0.0} if drain["drained"] else {}  # nothing to drain: no rate
        recovery: dict[str, Any] = {"recovered_after_s": None}
        if not drain["drained"]:
            left = await self.wait_for_backlog(
                drained_below, time.monotonic() + self.settings.drain_seconds
            )
            done = await figures.count(self.db, figures.DONE) - done_at_end
            took = time.time() - ended
            drain |= {"drained": left <= drained_below, "seconds": took, "left": left}
            drain |= {"completed_per_s": done / took, "net_per_s": (backlog - left) / took}
            drain["of_capacity"] = drain["completed_per_s"] / self.capacity
        # The after-runs wait behind an undrained backlog: then there is no recovery to see.
        if drain["drained"] and self.clean_p99_ms is not None and phase != "clean":
            await asyncio.sleep(self.settings.recovery_seconds + 2 * figures.RECOVERY_BUCKET)
            series = await figures.p99_by_second(self.db, f"{phase}/after", ended)
            recovery["after_p99_ms_by_second"] = series
            recovery["recovered_after_s"] = figures.recovered_after(series, self.clean_p99_ms)
        if drain["drained"]:
            self.caught_up_at = time.time()
        recovery["window_s"] = time.time() - ended
        return drain, recovery

    async def drain_all(self) -> dict[str, Any]:
        """With the producer stopped: until no run is unfinished (drain_seconds at most)."""
        backlog = await figures.count(self.db, figures.BACKLOG)
        done_before = await figures.count(self.db, figures.DONE)
        began = time.time()
        left = await self.wait_for_backlog(0, time.monotonic() + self.settings.drain_seconds)
        took = time.time() - began
        if not left:
            self.caught_up_at = time.time()
        done = await figures.count(self.db, figures.DONE) - done_before
        return {
            "drained": not left,
            "backlog": backlog,
            "left": left,
            "seconds": took,
            "completed_per_s": done / took if backlog and took else None,
        }

    async def settle(self, phases: list[str]) -> None:
        """Wait (settle_seconds at most) for the runs of `phases` to finish."""
        deadline = time.monotonic() + self.settings.settle_seconds
        while await figures.count(self.db, figures.UNFINISHED, phases):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(POLL_EVERY)

    async def outcomes(self, phases: list[str]) -> dict[str, int]:
        """What became of the runs of `phases`, counted now (see bench/README.md for lost)."""
        caught_up = self.caught_up_at
        before = None if caught_up is None else caught_up - self.settings.settle_seconds
        return await figures.invariants(self.db, phases, before)


@contextlib.asynccontextmanager
async def nothing() -> AsyncIterator[dict[str, Any]]:
    """The clean and overload phases put nothing on the database but the load."""
    yield {}


def per_step(value: int | None, steps: int) -> float | None:
    return None if value is None or not steps else value / steps


def worker_options(settings: Settings) -> list[str]:
    lease = [] if settings.lease_seconds is None else ["--lease", str(settings.lease_seconds)]
    return [*lease, "--concurrency", str(settings.concurrency)]


async def pressure(server: EmbeddedPostgres, settings: Settings) -> dict[str, Any]:
    """Every phase of `settings` on `server`; the report (phases, machine, invariants)."""
    max_connections = prepare_server(server, settings.idle_connections)
    bench = Bench(server, settings)
    report: dict[str, Any] = {"settings": asdict(settings), "max_connections": max_connections}
    report["phases_run"] = list(settings.phases)
    report["load_before"] = load_average()
    async with bench.running() as producer:
        report["capacity_steps_per_s"] = bench.capacity
        report["phases"] = [await bench.run_phase(producer, phase) for phase in settings.phases]
        await producer.finish()
        report["producer_failed_batches"] = producer.failed_batches
        report["final_drain"] = await bench.drain_all()
        for phase in report["phases"]:
            name = phase["phase"]
            phase |= await figures.pickup(bench.db, name)  # every run that ran, counted in
            phase["invariants"] = await bench.outcomes([name, f"{name}/after"])
        report["capacity_invariants"] = await bench.outcomes(["warm-up", "capacity"])
        report["claims_measured"] = await figures.claim_counters(bench.db) is not None
        report["server"] = await server_settings(bench.db)
        # A worker that died would leave its share to the other: say so beside the figures.
        report["workers_exited_early"] = sum(w.exit_code is not None for w in bench.workers)
    report["load_after"] = load_average()
    counted = [p["invariants"] for p in report["phases"]] + [report["capacity_invariants"]]
    report["lost"] = sum(found["lost"] for found in counted)
    report["ran_twice"] = sum(found["ran_twice"] for found in counted)
    report["still_queued"] = sum(found["still_queued"] for found in counted)
    report["violations"] = report["lost"] + report["ran_twice"]
    report["aims"] = aims(report)  # figures, not invariants: they do not set the exit status
    return report


def parse_settings(argv: list[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Settings()  # the one place the defaults are written
    parser.add_argument("--phase-seconds", type=float, default=default.phase_seconds)
    parser.add_argument("--long", action="store_true", help="an hour of the clean phase")
    parser.add_argument(
        "--json", default=str(DEFAULT_JSON), help="(default: bench/results/pressure.json)"
    )
    parser.add_argument(
        "--fraction", type=float, default=default.fraction, help="of the capacity offered"
    )
    parser.add_argument("--workers", type=int, default=default.workers, help="worker processes")
    parser.add_argument(
        "--concurrency", type=int, default=default.concurrency, help="each worker's steps at once"
    )
    parser.add_argument(
        "--capacity-seconds", type=float, default=default.capacity_seconds, help="timed"
    )
    parser.add_argument("--idle-connections", type=int, default=default.idle_connections)
    parser.add_argument(
        "--recovery-seconds", type=float, default=default.recovery_seconds, help="at most"
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=default.drain_seconds, help="at most, each backlog"
    )
    parser.add_argument("--lease", type=float, default=None, help="seconds (engine default)")
    parser.add_argument(
        "--start-many", action="store_true", help="offer through start_many(), as an app"
    )
    parser.add_argument("--only", help=f"some of {','.join(PHASES)} (clean always first)")
    args = parser.parse_args(argv)
    phases: tuple[str, ...] = PHASES
    if args.only:
        chosen = set(args.only.split(","))
        unknown = chosen - set(PHASES)
        if unknown:
            parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
        phases = tuple(p for p in PHASES if p in chosen or p == "clean")
    settings = Settings(
        phase_seconds=args.phase_seconds,
        clean_seconds=LONG_CLEAN_SECONDS if args.long else None,
        fraction=args.fraction,
        workers=args.workers,
        concurrency=args.concurrency,
        capacity_seconds=args.capacity_seconds,
        idle_connections=args.idle_connections,
        recovery_seconds=args.recovery_seconds,
        drain_seconds=args.drain_seconds,
        lease_seconds=args.lease,
        start_many=args.start_many,
        phases=phases,
    )
    return settings, Path(args.json)


def main(argv: list[str] | None = None) -> int:
    settings, json_path = parse_settings(argv)
    server = start_embedded()
    try:
        report = asyncio.run(pressure(server, settings))
    finally:
        server.stop()
    print(format_report(report))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON written to {json_path}", file=sys.stderr)
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
