"""No lost wake-up on AWS, and the bound on wakes at once.

Lambda is played by `Lambda`: every invocation of the wake function runs in
an idle container or a new one (a `Runtime` driven on a thread of its own,
as the Lambda runtime calls a handler), with a fake context whose deadline
is short, so wakes come and go. Invocations come from three places only:
the kicks of a process that starts runs (`tests.apps.wakeups`, through
`infra.aws.kicks`), the wakes themselves (more wakes for a backlog, a successor,
the scheduler's kick), and EventBridge Scheduler, which moto stands in for
but never fires: `EventBridge` polls the registered schedule and invokes
wake with its target input once its `at()` has passed. There is no safety
net: a lost wake-up leaves a run unfinished, and the test fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from engine import configure_event_registry, connect_workflows
from functions.lambdas import handlers as lambda_handlers, work as lambda_work
from functions.lambdas.runtime import WAKE_INPUT, Runtime
from infra.aws.scheduler import DEFAULT_NAME, metadata as schedule_metadata
from infra.aws.settings import AwsSettings
from infra.aws.wake_slots import WakeSlots
from tests.apps import wakeups
from tests.apps.wakeups import WAKE_ARN, Piece
from tests.aws_fakes import Aws, Context, SlotWatch, moto_scheduler, quiet_scheduler
from tests.conftest import Database
from tests.processes.conftest import REPO_ROOT

pytestmark = pytest.mark.processes

APP = "tests.apps.wakeups"
ROLE_ARN = "arn:aws:iam::123456789012:role/duly-wakeups-scheduler"
RUNS = 100  # started by the starting process
PAUSES_RANDOM = 20260110  # the starting process draws its pauses from random.Random(this)
FINISH_TIMEOUT = 60.0  # seconds for every run to finish once the last one was started
BACKLOG = 5000
FIRE_POLL = 0.1  # seconds between EventBridge's looks at the schedule
AT = re.compile(r"at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)")


class Lambda:
    """The wake function: each invocation in an idle container, else in a new one.

    `invoke` may be called from any thread (a wake's own invoke, the test's
    loop); it returns at once, as an asynchronous (Event) invoke does.
    """

    def __init__(
        self, settings: AwsSettings, remaining: float, aws: Aws | None, max_concurrency: int
    ) -> None:
        self.settings = settings
        self.remaining = remaining
        self.aws = aws
        self.max_concurrency = max_concurrency
        self.lock = threading.Lock()
        self.idle: list[tuple[Runtime, ThreadPoolExecutor]] = []
        self.containers: list[tuple[Runtime, ThreadPoolExecutor]] = []
        self.pending: list[Future[dict[str, Any]]] = []
        self.results: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []

    def invoke(self, event: Any = None) -> None:
        """Start one invocation of wake with `event` (the wake input by default)."""
        with self.lock:
            if self.idle:
                container = self.idle.pop()
            else:
                container = (self._runtime(), ThreadPoolExecutor(1))
                self.containers.append(container)
            self.pending.append(container[1].submit(self._run, container, event or WAKE_INPUT))

    async def invoke_async(self) -> None:
        """The runtime's `invoke`: Lambda's Event invoke returns once the event is queued."""
        self.invoke()

    def _runtime(self) -> Runtime:
        aws = self.aws
        return Runtime(
            self.settings,
            scheduler=moto_scheduler if aws is not None else quiet_scheduler,
            invoke=self.invoke_async,
            clients=aws.client if aws is not None else None,
            max_concurrency=self.max_concurrency,
        )

    def _run(self, container: tuple[Runtime, ThreadPoolExecutor], event: Any) -> dict[str, Any]:
        try:
            context = Context(self.remaining, WAKE_ARN)
            result = lambda_handlers.handle(lambda_work.wake, event, context, container[0])
            with self.lock:
                self.results.append(result)
            return result
        except BaseException as error:
            with self.lock:
                self.errors.append(error)
            raise
        finally:
            with self.lock:
                self.idle.append(container)

    def busy(self) -> bool:
        with self.lock:
            return any(not future.done() for future in self.pending)

    async def settle(self, timeout: float = 60.0) -> None:
        """Wait until no invocation runs (one may start another: wait for that one too)."""
        deadline = time.monotonic() + timeout
        while self.busy():
            assert time.monotonic() < deadline, "wake invocations still running"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        for runtime, executor in self.containers:
            executor.submit(runtime.close).result(30)
            executor.shutdown()


class EventBridge:
    """Fires the registered `at()` schedule once it has passed, as the scheduler would."""

    def __init__(self, aws: Aws, fn: Lambda) -> None:
        self.aws = aws
        self.fn = fn
        self.fired: list[str] = []  # the expressions fired, in order
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = self.aws.client("scheduler")
        while not self.stopping.wait(FIRE_POLL):
            listed = client.list_schedules(GroupName=self.aws.group)["Schedules"]
            if not any(s["Name"] == DEFAULT_NAME for s in listed):
                continue
            try:
                schedule = client.get_schedule(Name=DEFAULT_NAME, GroupName=self.aws.group)
            except client.exceptions.ResourceNotFoundException:
                continue  # deleted meanwhile
            expression = schedule["ScheduleExpression"]
            found = AT.fullmatch(expression)
            assert found and schedule["ScheduleExpressionTimezone"] == "UTC", schedule
            at = datetime.fromisoformat(found.group(1)).replace(tzinfo=UTC)
            # A one-time schedule fires once; ActionAfterCompletion NONE keeps it until moved.
            if at <= datetime.now(UTC) and (not self.fired or self.fired[-1] != expression):
                self.fired.append(expression)
                self.fn.invoke(json.loads(schedule["Target"]["Input"]))

    def __enter__(self) -> EventBridge:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)


def settings_for(db: Database, group: str, max_wakes: int, margin: float) -> AwsSettings:
    return AwsSettings(
        database_url=db.url,
        database_secret_arn=None,
        wake_function_arn=WAKE_ARN,
        schedule_group=group,
        scheduler_role_arn=ROLE_ARN,
        app_module=APP,
        max_wakes=max_wakes,
        wake_margin_seconds=margin,
    )


@pytest.fixture(autouse=True)
def no_app_registry() -> Iterator[None]:
    yield
    configure_event_registry(None)


@pytest.fixture(autouse=True)
def quiet_moto() -> Iterator[None]:
    """moto's server logs every request: thousands of lines from EventBridge's polling."""
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)
    yield
    werkzeug.setLevel(level)


async def test_runs_started_at_random_moments_all_finish_without_the_safety_net(
    db: Database, moto_endpoint: str
) -> None:
    await db.create(wakeups.Base.metadata, schedule_metadata)
    aws = Aws(moto_endpoint)
    # Two slots and three seconds an invocation (one of margin): wakes come, are refused,
    # ring, run out of time and hand over while runs keep arriving.
    fn = Lambda(settings_for(db, aws.group, 2, 1.0), 3.0, aws, max_concurrency=4)
    await WakeSlots(db.engine(), 2).ensure()  # the watch reads the table from the start
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    starter = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        APP,
        db.url,
        str(RUNS),
        str(PAUSES_RANDOM),
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    report: dict[str, int] = {}
    kicks = 0
    try:
        with SlotWatch(db.conninfo) as slots, EventBridge(aws, fn) as bridge:
            assert starter.stdout is not None
            ready = await asyncio.wait_for(starter.stdout.readline(), 20)
            assert ready.strip() == b"ready", ready
            async for line in starter.stdout:
                message = json.loads(line)
                if "invoke" in message:
                    kicks += 1
                    fn.invoke(message["invoke"])  # the starting process's kick
                else:
                    report = message
            assert await starter.wait() == 0
            assert report["started"] == RUNS

            deadline = time.monotonic() + FINISH_TIMEOUT
            while (finished := count_finished(db)) < RUNS:
                assert time.monotonic() < deadline, (
                    f"{RUNS - finished} runs never finished: a wake-up was lost. "
                    + diagnosis(db, aws, bridge, fn)
                )
                await asyncio.sleep(0.1)
            await fn.settle()
    finally:
        if starter.returncode is None:
            starter.kill()
            await starter.wait()
        fn.close()
    assert not fn.errors, fn.errors
    counts = db.sql("SELECT pinged, ponged, count(*) FROM wakeup_ping GROUP BY 1, 2")
    assert counts == [(1, 1, RUNS)], "every run ran each step exactly once"
    assert bridge.fired, "the last run's pong was left to the schedule, and it fired"
    assert 1 <= kicks == report["sent"] < report["requested"] == RUNS, (
        "every start kicked; the starting process sent fewer invokes than kicks (debounced)"
    )
    assert slots.most <= 2, f"{slots.most} wakes held a slot at once, over the bound of 2"


def diagnosis(db: Database, aws: Aws, bridge: EventBridge, fn: Lambda) -> str:
    """What a failed run-through leaves behind, for the assertion's message."""
    unfinished = db.sql(
        "SELECT id, delay, pinged, ponged, next_step, wake_at, claimed_until, clock_timestamp() "
        "FROM wakeup_ping WHERE NOT (ponged >= 1 AND next_step IS NULL) ORDER BY id"
    )
    registered = db.sql("SELECT * FROM duly_wake_schedule")
    held = db.sql("SELECT * FROM duly_wake_slots ORDER BY slot")
    client = aws.client("scheduler")
    listed = client.list_schedules(GroupName=aws.group)["Schedules"]
    schedules = [
        client.get_schedule(Name=s["Name"], GroupName=aws.group)["ScheduleExpression"]
        for s in listed
    ]
    return (
        f"unfinished {unfinished}; registered {registered}; moto {schedules}; "
        f"fired {bridge.fired}; slots {held}; invocations {len(fn.results)}; "
        f"last results {fn.results[-6:]}"
    )


def count_finished(db: Database) -> int:
    [(finished,)] = db.sql(
        "SELECT count(*) FROM wakeup_ping WHERE ponged >= 1 AND next_step IS NULL"
    )
    assert isinstance(finished, int)
    return finished


async def test_a_backlog_of_5000_is_worked_by_four_wakes_at_once_never_five(
    db: Database,
) -> None:
    """One kick spreads to the bound of four; four more invocations meanwhile are refused."""
    Session = await db.create(wakeups.Base.metadata)
    async with connect_workflows(Session, workflows=[Piece]):
        assert await Piece().start(Piece.work)
    # The other 4,999 as copies of the row the engine wrote: one statement, not 4,999.
    columns = ", ".join(c.name for c in Piece.__table__.c if c.name != "id")
    db.sql(
        f"INSERT INTO wakeup_piece ({columns}) SELECT {columns} FROM wakeup_piece, "
        f"generate_series(2, {BACKLOG})"
    )
    wakeups.running.update(now=0, most=0, wakes=0)
    fn = Lambda(settings_for(db, "duly-unused", 4, 2.0), 30.0, None, max_concurrency=8)
    await WakeSlots(db.engine(), 4).ensure()
    try:
        with SlotWatch(db.conninfo) as slots:
            fn.invoke()  # one kick: the wakes spread to the bound themselves
            deadline = time.monotonic() + 60.0
            while slots.most < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert slots.most == 4, "the backlog did not spread to four wakes"
            [(left,)] = db.sql("SELECT count(*) FROM wakeup_piece WHERE done = 0")
            for _ in range(4):
                fn.invoke()  # a fifth (to eighth) wake at once: each is refused a slot
            await fn.settle(120.0)
    finally:
        fn.close()
    assert not fn.errors, fn.errors
    done = db.sql("SELECT count(*), min(done), max(done) FROM wakeup_piece")
    assert done == [(BACKLOG, 1, 1)], "every run ran exactly once"
    assert slots.most == 4, f"{slots.most} wakes held a slot at once, over the bound"
    assert wakeups.running["wakes"] == 4, "four wakes ran steps at the same moment, never five"
    working = [r for r in fn.results if r["slot"] is not None]
    refused = [r for r in fn.results if r["slot"] is None]
    assert len(working) >= 4
    assert len(refused) >= 4, f"the extra invocations got slots ({left} runs were left)"
    assert all(r["reason"].startswith("busy") for r in refused), refused
    assert sum(r["steps"] for r in fn.results) == BACKLOG
    assert wakeups.running["most"] <= 4 * 8, "four wakes of eight steps each, at most"
