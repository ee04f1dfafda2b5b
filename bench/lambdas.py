"""The serverless figures: what a Lambda entry costs cold, a warm wake, and scheduler API calls.

Cold imports of each `functions.lambdas.handlers` entry in fresh processes beside the floor
(`sqlalchemy.ext.asyncio` and `psycopg` alone), and the first direct wake after one; a warm
wake that finds nothing due, its scheduler the real `WakeScheduler` on moto; and scheduler
API calls per 1,000 runs that sleep hours with wake_in. The Runtime runs on a thread of its
own, as Lambda calls a handler, so the bench's loop is not its. bench/README.md says how
each figure is taken.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.harness import REPO_ROOT, BenchDatabase
from bench.measures import percentiles
from bench.models import Sleeper
from engine import configure_event_registry, connect_workflows
from engine.testing import move_clock
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT, Container, Runtime, Scheduler, install
from infra.aws.scheduler import WakeScheduler, create_wake_schedule_table, whole_second
from infra.aws.settings import AwsSettings
from infra.embedded import EmbeddedPostgres

ENTRIES = ("publish", "wake", "drain", "deliver")  # functions.lambdas.handlers' entries
DIRECT_WITHIN = 1.3  # the aim: wake, drain and deliver import within 1.3x the floor
CLAIMED_ENTRIES = ("wake", "drain", "deliver")  # the entries that claim holds for
# What each timed fresh process imports; the entries are one module, reached through it.
IMPORTS = {
    "floor": "import sqlalchemy.ext.asyncio, psycopg",
    **{name: f"import functions.lambdas.handlers as h; h.{name}" for name in ENTRIES},
    # What the first HTTP event adds (Runtime._make_http): for contrast, not a claim.
    "http": "import functions.lambdas.handlers, functions.app, mangum",
}
IMPORT_SCRIPT = (
    "import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)\n"
)
PACKAGES = ("engine", "functions", "infra", "bench")  # compiled before the clock starts
MARK = "duly-bench-floor-done"  # written to stderr between the floor and the handlers' import
TOP_PACKAGES = 8  # packages listed in the import breakdown
APP = "bench.models"  # DULY_APP: the bench's workflows, outbox and all
WAKE_ARN = "arn:aws:lambda:us-east-1:123456789012:function:duly-bench-wake"
ROLE_ARN = "arn:aws:iam::123456789012:role/duly-bench-scheduler"
REGION = "us-east-1"
CONTEXT_SECONDS = 60.0  # what the fake Lambda context says is left at each invocation
# A fresh process's first wake: its own scheduler, which must never reach AWS.
FIRST_WAKE_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
import functions.lambdas.handlers as h
t1 = time.perf_counter()
rt = h.runtime()
container = rt.run(rt.container())
t2 = time.perf_counter()
first = h.wake({"duly": "wake"}, None)
t3 = time.perf_counter()
second = h.wake({"duly": "wake"}, None)
t4 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "container_s": t2 - t1, "first_wake_s": t3 - t2, "second_wake_s": t4 - t3,
    "first": first, "second": second, "tables": len(container.connection.workflows),
    "imported": {m: m in sys.modules for m in ("fastapi", "mangum", "boto3", "botocore")},
}))
rt.close()
"""
SLEEP_MIN_H = 1  # the Sleeper runs' wake_in delays, spread evenly over this many hours...
SLEEP_MAX_H = 6  # ...to this many, in a fixed shuffled order
SLEEP_SEED = 20261201
MAX_WAKES_PER_PHASE = 40  # wake invocations before a phase that is not caught up fails


# -- cold imports -------------------------------------------------------------------------


def python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This venv's Python in the repository root; its failure raises with its stderr."""
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)[:80]} failed: {done.stderr.strip()[-600:]}")
    return done


def timed_import(statement: str) -> float:
    """Seconds `statement` takes in a fresh process, timed inside it: its imports alone."""
    return float(python("-c", IMPORT_SCRIPT.format(statement=statement)).stdout.split()[-1])


def import_breakdown() -> dict[str, float]:
    """Milliseconds by top-level package that lambda_handlers imports beyond the floor.

    The self times `-X importtime` reports (its own overhead inflates them),
    for the modules imported after the floor's, largest first.
    """
    script = (
        f"{IMPORTS['floor']}\nimport sys\nsys.stderr.write('{MARK}\\n')\nsys.stderr.flush()\n"
        "import functions.lambdas.handlers\n"
    )
    lines = python("-X", "importtime", "-c", script).stderr.splitlines()
    by_package: collections.Counter[str] = collections.Counter()
    for line in lines[lines.index(MARK) + 1 :]:
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].startswith("import time:"):
            continue
        with contextlib.suppress(ValueError):  # the header line
            by_package[parts[2].strip().split(".")[0]] += int(parts[0].split(":")[1])
    return {name: us / 1000 for name, us in by_package.most_common(TOP_PACKAGES)}


def measure_cold_imports(processes: int) -> dict[str, Any]:
    """The median import time of each of IMPORTS over `processes` fresh processes each.

    The repository's packages are compiled first and every kind is imported
    once untimed, so no timed process writes bytecode. The kinds take turns
    (in a rotating order) so a burst of other work on the machine lands on
    all of them alike.
    """
    python("-m", "compileall", "-q", *PACKAGES)
    kinds = list(IMPORTS)
    for kind in kinds:
        timed_import(IMPORTS[kind])  # untimed: any bytecode still missing is written now
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for turn in range(processes):
        for kind in kinds[turn % len(kinds) :] + kinds[: turn % len(kinds)]:
            seconds[kind].append(timed_import(IMPORTS[kind]))
    ms = {kind: statistics.median(values) * 1000 for kind, values in seconds.items()}
    floor = ms["floor"]
    ratios = {kind: ms[kind] / floor for kind in kinds if kind != "floor"}
    return {
        "processes": processes,
        "statements": IMPORTS,
        "median_ms": ms,
        "all_ms": {kind: [s * 1000 for s in values] for kind, values in seconds.items()},
        "ratio_to_floor": ratios,
        "within": DIRECT_WITHIN,
        "holds": {name: ratios[name] <= DIRECT_WITHIN for name in CLAIMED_ENTRIES},
        "beyond_floor_importtime_ms": import_breakdown(),
    }


async def measure_first_wake(server: EmbeddedPostgres, processes: int) -> dict[str, Any]:
    """What a fresh process's first direct wake costs beyond its import, nothing being due.

    Each process imports the handlers, makes its container (engine, DULY_APP
    imported, the first connection, which tables exist: timed apart), then
    calls `wake` twice. Its scheduler is the deployment's (`aws_scheduler`):
    with nothing due and nothing registered it makes no call, and AWS_*
    points boto3 at a closed local port in case it ever tried.
    """
    async with BenchDatabase(server, "bench_coldstart") as db:
        await create_wake_schedule_table(db.engine)
        env = {
            **os.environ,
            "DULY_DATABASE_URL": db.url,
            "DULY_WAKE_FUNCTION_ARN": WAKE_ARN,
            "DULY_SCHEDULE_GROUP": "duly-bench",
            "DULY_SCHEDULER_ROLE_ARN": ROLE_ARN,
            "DULY_APP": APP,
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
        }
        env.pop("DULY_DATABASE_SECRET_ARN", None)

        def one() -> dict[str, Any]:
            found: dict[str, Any] = json.loads(python("-c", FIRST_WAKE_SCRIPT, env=env).stdout)
            return found

        await asyncio.to_thread(one)  # untimed: makes the wake slots and the schedule row
        runs = [await asyncio.to_thread(one) for _ in range(processes)]
    for run in runs:
        for result in (run["first"], run["second"]):
            if not result.get("caught_up") or result.get("steps"):
                raise RuntimeError(f"A fresh process's wake did not find nothing due: {result}.")
    parts = ("import_s", "container_s", "first_wake_s", "second_wake_s")
    ms = {
        part.removesuffix("_s") + "_ms": statistics.median(r[part] for r in runs) * 1000
        for part in parts
    }
    return {
        "processes": processes,
        **ms,
        "beyond_import_ms": statistics.median(
            (r["container_s"] + r["first_wake_s"]) * 1000 for r in runs
        ),
        "tables_served": runs[0]["tables"],
        # After two wakes: the direct path must not have imported any of them.
        "imported_after": {m: any(r["imported"][m] for r in runs) for m in runs[0]["imported"]},
        "runs": runs,
    }


# -- a Lambda container in the bench process ------------------------------------------------


@dataclass
class LambdaContext:
    """The part of a Lambda context the entries read: the time left, the function's ARN."""

    remaining: float = CONTEXT_SECONDS
    invoked_function_arn: str = WAKE_ARN
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return int((self.remaining - (time.monotonic() - self.started)) * 1000)


class Moto:
    """moto's EventBridge Scheduler on a local port, with a schedule group made for the bench.

    Every client made by `client()` counts the requests it sends, by
    operation, in a botocore `before-send` hook: what AWS would bill and
    throttle, whatever WakeScheduler thinks it did.
    """

    def __init__(self) -> None:
        self.group = f"duly-bench-{uuid.uuid4().hex[:8]}"
        self.sent: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._server: Any = None
        self.endpoint = ""

    async def __aenter__(self) -> Moto:
        from moto.server import ThreadedMotoServer

        # Its web server logs every request to stderr, where the bench's progress goes.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        # The template owns the group on AWS: made here, uncounted, as a deployment has it.
        await asyncio.to_thread(self._plain_client().create_schedule_group, Name=self.group)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop()

    def _plain_client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "scheduler",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )

    def client(self, service: str) -> Any:
        """A counted client for `service` (the Runtime's `clients`)."""
        import boto3

        made = boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        made.meta.events.register(f"before-send.{service}", self._count)
        return made

    def _count(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.sent[event_name.rsplit(".", 1)[-1]] += 1

    async def schedules(self) -> list[dict[str, Any]]:
        """Every schedule of the group, read with an uncounted client."""

        def read() -> list[dict[str, Any]]:
            client = self._plain_client()
            listed = client.list_schedules(GroupName=self.group)["Schedules"]
            return [client.get_schedule(Name=s["Name"], GroupName=self.group) for s in listed]

        return await asyncio.to_thread(read)


class CountingScheduler:
    """The real WakeScheduler, and how often the worker told it an instant (`on_idle`)."""

    def __init__(self, inner: WakeScheduler) -> None:
        self.inner = inner
        self.told: list[datetime | None] = []

    async def on_idle(self, at: datetime | None) -> None:
        self.told.append(at)
        await self.inner.on_idle(at)

    async def kick(self) -> None:
        await self.inner.kick()


class BenchFunction:
    """One Lambda container: a Runtime whose entries run on a thread of its own, timed there.

    Its scheduler is the real WakeScheduler on moto (counted); an
    asynchronous invoke of the wake function (a kick, or a wake handing on)
    is counted and not run: the bench invokes the next wake itself.
    """

    def __init__(self, db: BenchDatabase, aws: Moto) -> None:
        self.aws = aws
        self.invokes = 0
        self.scheduler: CountingScheduler | None = None
        settings = AwsSettings(
            database_url=db.url,
            database_secret_arn=None,
            wake_function_arn=WAKE_ARN,
            schedule_group=aws.group,
            scheduler_role_arn=ROLE_ARN,
            app_module=APP,
        )
        self.runtime = Runtime(
            settings, scheduler=self._make_scheduler, invoke=self._invoke, clients=aws.client
        )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="bench-lambda")

    def _make_scheduler(self, rt: Runtime, engine: AsyncEngine) -> Scheduler:
        inner = WakeScheduler(
            engine,
            group=rt.settings.schedule_group,
            target_arn=rt.settings.wake_function_arn,
            role_arn=rt.settings.scheduler_role_arn,
            client=lambda: rt.client("scheduler"),
            invoke=rt.invoke_wake,
        )
        self.scheduler = CountingScheduler(inner)
        return self.scheduler

    async def _invoke(self) -> None:
        self.invokes += 1

    async def wake(self) -> tuple[dict[str, Any], float]:
        """`lambda_handlers.wake(WAKE_INPUT, context)` as Lambda calls it; its answer, seconds."""

        def invoke() -> tuple[dict[str, Any], float]:
            install(self.runtime)
            began = time.perf_counter()
            result = lambda_handlers.wake(dict(WAKE_INPUT), LambdaContext())
            return result, time.perf_counter() - began

        return await asyncio.get_running_loop().run_in_executor(self._thread, invoke)

    async def container(self) -> Container:
        """The container's engine, connection and the rest (made if they are not yet)."""

        def make() -> Container:
            return self.runtime.run(self.runtime.container())

        return await asyncio.get_running_loop().run_in_executor(self._thread, make)

    def counts(self) -> dict[str, Any]:
        """Scheduler API calls (by WakeScheduler and as sent), tells, kicks and invokes so far."""
        inner = self.scheduler.inner if self.scheduler else None
        return {
            "scheduler_calls": inner.calls if inner else 0,
            "sent": sum(self.aws.sent.values()),
            "sent_by_operation": dict(self.aws.sent),
            "on_idle_calls": len(self.scheduler.told) if self.scheduler else 0,
            "kicks": inner.kicks if inner else 0,
            "invokes": self.invokes,
        }

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.runtime.close)
        self._thread.shutdown()
        install(None)
        configure_event_registry(None)  # the container configured the bench outbox's


@contextlib.asynccontextmanager
async def lambda_container(db: BenchDatabase) -> AsyncIterator[BenchFunction]:
    """moto and one container on `db`, both stopped however the block ends."""
    await create_wake_schedule_table(db.engine)
    async with Moto() as aws:
        fn = BenchFunction(db, aws)
        try:
            yield fn
        finally:
            await fn.close()


def since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The counts of `after` less those of `before` (by operation too)."""
    found: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            old = before.get(key, {})
            found[key] = {op: n - old.get(op, 0) for op, n in value.items() if n - old.get(op, 0)}
        else:
            found[key] = value - before.get(key, 0)
    return found


# -- a warm wake, nothing due --------------------------------------------------------------


async def measure_lambda_wake(server: EmbeddedPostgres, wakes: int, warmup: int) -> dict[str, Any]:
    """Time `wakes` warm `lambda_handlers.wake` calls that find nothing due, after `warmup`.

    Every bench table exists and is empty, so the container's worker serves
    them all. Each call must answer caught up with no step; the statements
    its engine sends are counted by a `before_cursor_execute` listener.
    """
    async with BenchDatabase(server, "bench_lambda_wake") as db, lambda_container(db) as fn:
        first, first_seconds = await fn.wake()  # the container is made here (no imports)
        for _ in range(warmup - 1):
            await fn.wake()
        container = await fn.container()
        engine = container.engine
        sent = [0]

        def count(*_: object) -> None:
            sent[0] += 1

        event.listen(engine.sync_engine, "before_cursor_execute", count)
        before = fn.counts()
        ms: list[float] = []
        try:
            for _ in range(wakes):
                result, seconds = await fn.wake()
                if not result.get("caught_up") or result.get("steps"):
                    raise RuntimeError(f"A wake with nothing due answered {result}.")
                ms.append(seconds * 1000)
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", count)
        counted = since(before, fn.counts())
    return {
        "wakes": wakes,
        "warmup": warmup,
        "ms": percentiles(ms),
        "first_wake_ms": first_seconds * 1000,  # the container made, in a warm process
        "first_wake": first,
        "tables_served": len(container.connection.workflows),
        "statements_per_wake": sent[0] / wakes,
        **counted,
    }


# -- scheduler API calls per 1,000 runs --------------------------------------------------------


def sleep_delays(runs: int) -> list[int]:
    """`runs` wake_in delays in seconds, spread evenly over the hours, in a fixed shuffle."""
    low, high = SLEEP_MIN_H * 3600, SLEEP_MAX_H * 3600
    delays = [round(low + (high - low) * i / max(1, runs - 1)) for i in range(runs)]
    random.Random(SLEEP_SEED).shuffle(delays)
    return delays


async def wake_until_done(fn: BenchFunction, db: BenchDatabase, pending: str) -> dict[str, Any]:
    """Invoke wake, one after another, until one is caught up and `pending` counts none.

    `pending` is a WHERE clause on bench_sleeper. What the scheduler was
    asked and sent meanwhile is counted; a phase that needs more than
    MAX_WAKES_PER_PHASE invocations fails.
    """
    query = f"SELECT count(*) FROM bench_sleeper WHERE {pending}"  # the callers' constants
    before = fn.counts()
    results: list[dict[str, Any]] = []
    began = time.perf_counter()
    while True:
        result, _ = await fn.wake()
        results.append(result)
        left = int(await db.scalar(query))
        if result.get("caught_up") and left == 0:
            break
        if len(results) >= MAX_WAKES_PER_PHASE:
            raise RuntimeError(
                f"{left} runs still {pending} after {len(results)} wakes; the last: {result}."
            )
    return {
        "wakes": len(results),
        "steps": sum(r.get("steps", 0) for r in results),
        "seconds": time.perf_counter() - began,
        **since(before, fn.counts()),
    }


async def measure_scheduler_calls(server: EmbeddedPostgres, runs: int) -> dict[str, Any]:
    """Scheduler API calls while wakes run `runs` Sleeper runs' first steps, then their second.

    The runs are started through the engine (start(), one commit each).
    Wakes run until caught up: every run then sleeps SLEEP_MIN_H to
    SLEEP_MAX_H hours, and exactly one schedule should be registered, at the
    earliest wake-up. The database clock is moved past the last, and wakes
    run until every run has finished: no schedule should be left.
    """
    delays = sleep_delays(runs)
    async with BenchDatabase(server, "bench_scheduler_calls") as db, lambda_container(db) as fn:
        Session = db.sessionmaker()
        began = time.perf_counter()
        async with connect_workflows(Session, workflows=[Sleeper]):
            for delay in delays:
                await Sleeper(delay_s=delay).start(Sleeper.arm)
        start_seconds = time.perf_counter() - began
        await db.scalar("ANALYZE bench_sleeper")
        await fn.container()  # made before the counts: it calls no scheduler API
        first = await wake_until_done(fn, db, "next_step IS DISTINCT FROM 'finish'")
        earliest = await db.scalar("SELECT min(wake_at) FROM bench_sleeper")
        registered = await fn.aws.schedules()
        await move_clock(Session, timedelta(hours=SLEEP_MAX_H, minutes=1))
        second = await wake_until_done(fn, db, "next_step IS NOT NULL")
        left = await fn.aws.schedules()
        failed = await db.scalar(
            "SELECT count(*) FROM bench_sleeper WHERE attempts > 0 OR last_error IS NOT NULL"
        )
    if failed:
        raise RuntimeError(f"{failed} Sleeper runs failed an attempt.")
    for phase in (first, second):
        if phase["sent"] != phase["scheduler_calls"]:
            raise RuntimeError(
                f"The client sent {phase['sent']} scheduler requests where WakeScheduler "
                f"counted {phase['scheduler_calls']} calls."
            )
    expression = f"at({whole_second(earliest).strftime('%Y-%m-%dT%H:%M:%S')})"
    per = 1000 / runs
    return {
        "runs": runs,
        "delays_h": [SLEEP_MIN_H, SLEEP_MAX_H],
        "start_seconds": start_seconds,
        "first_steps": first,
        "second_steps": second,
        "calls_per_1000_runs": {
            "first_steps": first["sent"] * per,
            "second_steps": second["sent"] * per,
        },
        "registered_after_first": [s["ScheduleExpression"] for s in registered],
        "earliest_wake_at": expression,
        "registered_is_earliest": [s["ScheduleExpression"] for s in registered] == [expression],
        "schedules_left_at_end": len(left),
    }
