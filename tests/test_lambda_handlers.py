"""The four Lambda entries end to end: real PostgreSQL, moto for EventBridge Scheduler.

Each test's "container" is a `Runtime` driven on a thread of its own (as the
Lambda runtime calls a handler: synchronously), with a fake Lambda context.
The asynchronous invoke of the wake function is replaced by a callable that
counts (or, for the bound, starts another container on another thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import boto3
import psycopg
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import configure_event_registry, connect_workflows
from engine.testing import drain as drain_steps
from engine.testing import move_clock
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas import work as lambda_work
from functions.lambdas.runtime import WAKE_INPUT, Runtime, Scheduler, install
from infra.aws_settings import AwsSettings
from infra.scheduler import WakeScheduler, round_up, schedule_expression
from infra.scheduler import metadata as schedule_metadata
from infra.wake_slots import WakeSlots
from tests.apps import serverless_app
from tests.apps.serverless_app import LATER, SIGNUP, Chunk, Outbox, Signup, Stuck
from tests.conftest import Database

APP = "tests.apps.serverless_app"
WAKE_ARN = "arn:aws:lambda:us-east-1:123456789012:function:duly-test-wake"
ROLE_ARN = "arn:aws:iam::123456789012:role/duly-test-scheduler"
REGION = "us-east-1"
Entry = Callable[[Any, Any], dict[str, Any]]


# -- the pieces of a fake deployment ------------------------------------------------------


@dataclass
class Context:
    """A Lambda context: the time left from when it was made, and the function's ARN."""

    remaining: float = 30.0  # seconds
    invoked_function_arn: str = WAKE_ARN
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return int((self.remaining - (time.monotonic() - self.started)) * 1000)


@dataclass
class Aws:
    """moto's scheduler, and this test's own schedule group on it."""

    endpoint: str
    group: str = field(default_factory=lambda: f"duly-{uuid.uuid4().hex[:10]}")

    def client(self, service: str) -> Any:
        # A session per client: boto3's default session is not safe across threads.
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule of the group, as get_schedule answers."""
        client = self.client("scheduler")
        listed = client.list_schedules(GroupName=self.group)["Schedules"]
        return [client.get_schedule(Name=s["Name"], GroupName=self.group) for s in listed]


def settings_for(db: Database, group: str = "duly-test", **changes: Any) -> AwsSettings:
    values: dict[str, Any] = {
        "database_url": db.url,
        "database_secret_arn": None,
        "wake_function_arn": WAKE_ARN,
        "schedule_group": group,
        "scheduler_role_arn": ROLE_ARN,
        "app_module": APP,
        "max_wakes": 4,
        "wake_margin_seconds": 2.0,
        **changes,
    }
    return AwsSettings(**values)


def moto_scheduler(rt: Runtime, engine: AsyncEngine) -> Scheduler:
    """The real WakeScheduler on moto (which needs the group made first)."""
    return WakeScheduler(
        engine,
        group=rt.settings.schedule_group,
        target_arn=rt.settings.wake_function_arn,
        role_arn=rt.settings.scheduler_role_arn,
        client=lambda: rt.client("scheduler"),
        invoke=rt.invoke_wake,
        create_group=True,
    )


@dataclass
class QuietScheduler:
    """A scheduler that remembers what it was told; its kick invokes wake like the real one."""

    rt: Runtime
    told: list[datetime | None] = field(default_factory=list)

    async def on_idle(self, at: datetime | None) -> None:
        self.told.append(at)

    async def kick(self) -> None:
        await self.rt.invoke_wake()


def quiet_scheduler(rt: Runtime, engine: AsyncEngine) -> Scheduler:
    return QuietScheduler(rt)


class Function:
    """One Lambda container: a runtime whose handlers run on a thread of its own."""

    def __init__(
        self,
        settings: AwsSettings,
        *,
        aws: Aws | None = None,
        invoke: Callable[[], Any] | None = None,
        max_concurrency: int = 8,
    ) -> None:
        self.invokes = 0
        self._on_invoke = invoke
        self.runtime = Runtime(
            settings,
            scheduler=moto_scheduler if aws is not None else quiet_scheduler,
            invoke=self._invoke,
            clients=aws.client if aws is not None else None,
            max_concurrency=max_concurrency,
        )
        self._thread = ThreadPoolExecutor(1)

    async def _invoke(self) -> None:
        self.invokes += 1
        if self._on_invoke is not None:
            self._on_invoke()

    async def call(self, entry: Entry, event: Any, remaining: float = 30.0) -> dict[str, Any]:
        """`entry(event, context)` as Lambda calls it, this function's runtime installed."""

        def invoke() -> dict[str, Any]:
            install(self.runtime)
            return entry(event, Context(remaining))

        return await asyncio.get_running_loop().run_in_executor(self._thread, invoke)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.runtime.close)
        self._thread.shutdown()


@contextlib.asynccontextmanager
async def function(settings: AwsSettings, **options: Any) -> AsyncIterator[Function]:
    fn = Function(settings, **options)
    try:
        yield fn
    finally:
        await fn.close()


async def create_tables(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(serverless_app.Base.metadata, schedule_metadata)


async def one_signup(Session: async_sessionmaker[AsyncSession]) -> Signup:
    async with Session() as session:
        return (await session.execute(select(Signup))).scalar_one()


def function_url_event(method: str, path: str, body: Any = None, query: str = "") -> dict[str, Any]:
    """A Function URL request (payload format 2.0, as HTTP API v2 sends it too)."""
    host = "abcdefghij.lambda-url.us-east-1.on.aws"
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": {"content-type": "application/json", "host": host},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abcdefghij",
            "domainName": host,
            "domainPrefix": "abcdefghij",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "pytest",
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": "$default",
            "stage": "$default",
            "time": "01/Jan/2026:00:00:00 +0000",
            "timeEpoch": 1767225600000,
        },
        "body": None if body is None else json.dumps(body),
        "isBase64Encoded": False,
    }


@pytest.fixture(scope="module")
def moto_endpoint() -> Any:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def fresh_runtime() -> Any:
    yield
    install(None)
    configure_event_registry(None)


# -- done when 1: publish, a schedule two hours off, the wake it fires -----------------------


async def test_a_published_signup_is_woken_two_hours_later_by_its_schedule(
    db: Database, moto_endpoint: str
) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    async with function(settings_for(db, aws.group), aws=aws) as fn:
        event = {"event_type": SIGNUP, "event_id": "s-1", "payload": {"email": "ada@example.com"}}
        published = await fn.call(lambda_handlers.publish, event)
        assert published == {"ids": ["s-1"], "stored": ["s-1"], "duplicates": [], "kicked": True}
        assert fn.invokes == 1, "the stored event kicked one asynchronous wake"

        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert woken["caught_up"] is True
        assert woken["steps"] == 2, "the outbox row's route, then the run the handler started"
        signup = await one_signup(Session)
        assert (signup.status, signup.next_step) == ("welcomed", "nudge")
        [schedule] = aws.schedules()
        assert schedule["ScheduleExpression"] == schedule_expression(round_up(signup.wake_at))
        assert schedule["ScheduleExpressionTimezone"] == "UTC"
        assert schedule["Target"]["Arn"] == WAKE_ARN

        await move_clock(Session, LATER + timedelta(seconds=1))
        target_input = json.loads(schedule["Target"]["Input"])
        woken = await fn.call(lambda_handlers.wake, target_input)
        assert (woken["steps"], woken["caught_up"]) == (1, True)
        signup = await one_signup(Session)
        assert (signup.status, signup.waiting_for) == ("nudged", "confirm")
        [moved] = aws.schedules()
        assert moved["Name"] == schedule["Name"]
        # The wait's deadline (a day on) is what is next now.
        assert moved["ScheduleExpression"] == schedule_expression(round_up(signup.wake_at))
        assert moved["ScheduleExpression"] != schedule["ScheduleExpression"]

        # The confirmation ends the run: nothing is next, so the schedule goes.
        invokes = fn.invokes
        delivered = await fn.call(
            lambda_handlers.deliver,
            {
                "workflow": "lambda_signup",
                "key": signup.id,
                "step": "confirm",
                "args": {"code": "7"},
            },
        )
        assert delivered == {"accepted": 1, "workflow": "lambda_signup", "step": "confirm"}
        assert fn.invokes == invokes + 1, "an accepted delivery kicks a wake"
        woken = await fn.call(lambda_handlers.wake, target_input)
        assert (woken["steps"], woken["caught_up"]) == (1, True)
        assert (await one_signup(Session)).status == "confirmed 7"
        assert aws.schedules() == []


async def test_the_same_through_function_url_events(db: Database, moto_endpoint: str) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    async with function(settings_for(db, aws.group), aws=aws) as fn:
        body = {"event_type": SIGNUP, "event_id": "s-2", "payload": {"email": "bo@example.com"}}
        answer = await fn.call(lambda_handlers.wake, function_url_event("POST", "/events", body))
        assert answer["statusCode"] == 200, answer
        assert json.loads(answer["body"])["stored"] == ["s-2"]
        assert fn.invokes == 1, "POST /events kicked a wake"

        answer = await fn.call(
            lambda_handlers.wake, function_url_event("POST", "/wake", query="timeout=10")
        )
        assert (answer["statusCode"], json.loads(answer["body"])) == (200, {"caught_up": True})
        signup = await one_signup(Session)
        assert signup.status == "welcomed"
        [schedule] = aws.schedules()
        assert schedule["ScheduleExpression"] == schedule_expression(round_up(signup.wake_at))

        await move_clock(Session, LATER + timedelta(seconds=1))
        answer = await fn.call(lambda_handlers.wake, function_url_event("POST", "/wake"))
        assert answer["statusCode"] == 200, answer
        signup = await one_signup(Session)
        assert signup.status == "nudged"
        [moved] = aws.schedules()
        assert moved["ScheduleExpression"] == schedule_expression(round_up(signup.wake_at))

        # Reads go through the same app, on the same container's engine.
        answer = await fn.call(lambda_handlers.publish, function_url_event("GET", "/healthz"))
        assert (answer["statusCode"], json.loads(answer["body"])) == (200, {"ok": True})


# -- publish -------------------------------------------------------------------------------


async def test_publish_answers_duplicates_and_refuses_bad_input_writing_nothing(
    db: Database,
) -> None:
    Session = await create_tables(db)
    async with function(settings_for(db)) as fn:
        batch = {
            "events": [
                {"event_type": SIGNUP, "event_id": "a", "payload": {"email": "a@example.com"}},
                {"event_type": SIGNUP, "event_id": "b", "occurred_at": "2026-01-31T09:00Z"},
            ]
        }
        assert (await fn.call(lambda_handlers.publish, batch))["stored"] == ["a", "b"]
        again = await fn.call(lambda_handlers.publish, batch)
        assert again == {"ids": ["a", "b"], "stored": [], "duplicates": ["a", "b"], "kicked": False}
        assert fn.invokes == 1, "only the publish that stored something kicked a wake"

        naive = {
            "events": [
                {"event_type": SIGNUP, "event_id": "c"},
                {"event_type": SIGNUP, "event_id": "d", "occurred_at": "2026-01-31T09:00"},
            ]
        }
        refused = await fn.call(lambda_handlers.publish, naive)
        assert refused["type"] == "InputError"
        assert "events[1].occurred_at" in refused["error"]
        for bad, says in [
            ({"event_type": ""}, "event_type"),
            ({"event_type": SIGNUP, "colour": "red"}, "colour"),
            ({"events": []}, "empty"),
            ({"event_type": SIGNUP, "payload": [1]}, "payload"),
            ({"duly": "wake"}, "wake function"),
            ([1, 2], "JSON object"),
        ]:
            answer = await fn.call(lambda_handlers.publish, bad)
            assert answer["type"] == "InputError" and says in answer["error"], answer
    async with Session() as session:
        ids = (await session.execute(select(Outbox.event_id).order_by(Outbox.event_id))).scalars()
        assert list(ids) == ["a", "b"], "the refused batches wrote nothing"


# -- deliver -------------------------------------------------------------------------------


async def test_deliver_to_a_waiting_run_and_its_refusals(db: Database) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        signup = Signup(email="cy@example.com")
        await signup.start(Signup.nudge)
    await drain_steps(Session, [Signup])
    async with function(settings_for(db)) as fn:
        by_email = {"workflow": "lambda_signup", "where": {"email": "cy@example.com"}}
        request = {**by_email, "step": "confirm", "args": {"code": "x"}, "idempotency_key": "k1"}
        assert (await fn.call(lambda_handlers.deliver, request))["accepted"] == 1
        assert fn.invokes == 1
        repeated = await fn.call(lambda_handlers.deliver, request)
        assert repeated["accepted"] == 0, "the same idempotency key is taken once"

        refusals = [
            ({**request, "workflow": "nope"}, "NotFoundError", "lambda_signup"),
            ({**request, "step": "nope"}, "NotFoundError", "confirm"),
            ({**request, "args": {"code": 5}}, "StepError", "code"),
            ({**request, "args": {}}, "StepError", "code"),
            ({**request, "key": signup.id}, "InputError", "not both"),
            ({**request, "where": {"colour": "red"}}, "InputError", "colour"),
            ({**request, "restart": "yes"}, "InputError", "restart"),
            ({"workflow": "lambda_signup", "key": "abc", "step": "confirm", "args": {"code": "1"}},
             "InputError", "expected int"),
        ]  # fmt: skip
        for event, kind, says in refusals:
            answer = await fn.call(lambda_handlers.deliver, event)
            assert answer["type"] == kind and says in answer["error"], (event, answer)
        assert fn.invokes == 1, "nothing refused kicked a wake"
    steps = await drain_steps(Session, [Signup])
    assert steps == 1
    assert (await one_signup(Session)).status == "confirmed x"


# -- drain ---------------------------------------------------------------------------------


async def test_drain_routes_the_outbox_and_kicks_a_wake_for_what_it_made_due(
    db: Database,
) -> None:
    Session = await create_tables(db)
    async with function(settings_for(db)) as fn:
        batch = {
            "events": [
                {"event_type": SIGNUP, "payload": {"email": f"{n}@example.com"}} for n in range(3)
            ]
        }
        await fn.call(lambda_handlers.publish, batch)
        kicks = fn.invokes
        drained = await fn.call(lambda_handlers.drain, {"duly": "drain"})
        assert drained == {"routed": 3, "caught_up": True, "kicked": True}
        assert fn.invokes == kicks + 1, "the runs the handlers started are due: a wake is kicked"
        async with Session() as session:
            statuses = (await session.execute(select(Outbox.status))).scalars().all()
            signups = (await session.execute(select(Signup.next_step))).scalars().all()
        assert statuses == ["processed"] * 3
        assert signups == ["welcome"] * 3, "started, not run: only the outbox is drained"

        again = await fn.call(lambda_handlers.drain, None)
        assert again["routed"] == 0
        misrouted = await fn.call(lambda_handlers.drain, {"duly": "wake"})
        assert misrouted["type"] == "InputError"


# -- the deadline ----------------------------------------------------------------------------


async def test_a_wake_near_its_deadline_stops_claiming_and_hands_back(db: Database) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        for _ in range(3):
            await Stuck().start(Stuck.grind)
    # Two seconds of margin, four left: claiming stops after two, the steps get one to finish.
    async with function(settings_for(db, wake_margin_seconds=2.0), max_concurrency=2) as fn:
        started = time.monotonic()
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT, remaining=4.0)
        took = time.monotonic() - started
    assert woken["caught_up"] is False
    assert woken["steps"] == 2, "two slots: the third run was never claimed"
    assert woken["invoked"] >= 1, "what is left goes on in another invocation"
    assert took < 4.0, f"the invocation outlived its deadline ({took:.1f} s)"
    rows = db.sql(
        "SELECT claimed_until IS NULL, wake_at <= now(), wf_version FROM lambda_stuck ORDER BY id"
    )
    assert [row[:2] for row in rows] == [(True, True)] * 3, "every run is due again, none held"
    assert sorted(row[2] for row in rows) == [0, 2, 2], "two claimed and handed back"
    assert db.sql("SELECT count(*) FROM duly_wake_slots WHERE held_until IS NOT NULL") == [(0,)]


# -- the bound -------------------------------------------------------------------------------


async def test_slots_refuse_a_fifth_wake_and_ring_the_holders(db: Database) -> None:
    engine = db.engine()
    slots = WakeSlots(engine, 4)
    taken = [await slots.take(f"h{n}", 30) for n in range(4)]
    assert taken == [1, 2, 3, 4]
    before = await slots.now()
    assert await slots.take("h4", 30) is None
    assert await slots.held() == 4
    assert not await slots.release(1, "h0", since=before), "rung after `before`: look again"
    assert await slots.release(1, "h0", since=await slots.now())
    assert await slots.take("h4", 30) == 1
    assert await slots.release(2, "someone else"), "not the holder: nothing to free"
    assert await slots.held() == 4
    db.sql("UPDATE duly_wake_slots SET held_until = clock_timestamp() - interval '1 s'")
    assert await slots.take("h5", 30) == 1, "an expired slot is free"


@pytest.mark.parametrize("kicked", [1, 6], ids=["one-kick", "six-kicks-at-once"])
async def test_a_backlog_is_worked_by_at_most_max_wakes_invocations_at_once(
    db: Database, kicked: int
) -> None:
    """One kick spreads to max_wakes wakes; six at once are cut down to max_wakes."""
    Session = await create_tables(db)
    async with connect_workflows(Session):
        for _ in range(600):
            await Chunk().start(Chunk.work)
    serverless_app.running.update(now=0, most=0)
    settings = settings_for(db, max_wakes=4)
    results: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    lock = threading.Lock()

    def container() -> None:
        """One invocation of wake in a fresh container (a thread with its own runtime)."""
        fn = Runtime(settings, scheduler=quiet_scheduler, invoke=invoke, max_concurrency=4)
        try:
            result = lambda_handlers.handle(lambda_work.wake, WAKE_INPUT, Context(30.0), fn)
        finally:
            fn.close()
        with lock:
            results.append(result)

    async def invoke() -> None:
        thread = threading.Thread(target=container)
        with lock:
            threads.append(thread)
        thread.start()

    held: list[int] = []
    watching = threading.Event()

    def watch() -> None:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            while not watching.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM duly_wake_slots WHERE held_until > clock_timestamp()"
                ).fetchone()
                held.append(int(row[0]) if row else 0)
                time.sleep(0.005)

    await WakeSlots(db.engine(), 4).ensure()  # the first wake would make it: the watcher reads it
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(kicked):
            await invoke()
        while True:
            with lock:
                alive = [t for t in threads if t.is_alive()]
                if not alive and len(results) == len(threads):
                    break
            await asyncio.sleep(0.05)
    finally:
        watching.set()
        watcher.join()
    done = db.sql("SELECT count(*), min(done), max(done) FROM lambda_chunk")
    assert done == [(600, 1, 1)], "every run ran exactly once"
    working = [r for r in results if r["slot"] is not None]
    assert max(held) <= 4, f"at most max_wakes wakes at once, not {max(held)}"
    assert max(held) == 4, f"the backlog spread to max_wakes wakes (at most {max(held)})"
    assert len(working) >= 4
    refused = [r for r in results if r["slot"] is None]
    assert all(r["reason"].startswith("busy") for r in refused), refused
    if kicked > 4:
        assert refused, "six wakes at once: some found every slot held"
    assert all(r["caught_up"] for r in working if r["steps"]), results
    assert serverless_app.running["most"] <= 4 * 4, "four wakes of four steps each"
    assert sum(r["steps"] for r in results) == 600


# -- imports -------------------------------------------------------------------------------


def test_the_direct_entries_import_neither_fastapi_nor_mangum_nor_boto3() -> None:
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import functions.lambdas.handlers"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in found.stderr.splitlines()}
    roots = {name.split(".")[0] for name in imported}
    assert "functions.lambdas.handlers" in imported
    assert not roots & {"fastapi", "starlette", "mangum", "boto3", "botocore"}
