"""EventBridge Scheduler registration of on_idle (infra/aws/scheduler.py), on moto and PostgreSQL.

The rules, and the tests that hold them:

- one one-time `at()` schedule per deployment in its group, UTC, flexible
  window off, target the wake function with the fixed input, the role, and
  ActionAfterCompletion NONE
  (test_a_future_instant_is_one_schedule_as_specified)
- instants are rounded down to whole seconds: a schedule fires up to a second
  early, and its wake waits for the instant and kicks
  (test_instants_are_rounded_down_to_whole_seconds,
  test_an_instant_within_a_second_kicks_once_it_is_due)
- the earlier of the instant told and the one registered wins while that one
  is in the future; a passed one is replaced
  (test_an_earlier_instant_moves_the_schedule_a_later_one_does_not,
  test_a_later_instant_replaces_one_that_has_passed)
- None deletes only when nothing future is registered
  (test_none_deletes_only_when_nothing_future_is_registered)
- the one invocation whose tells alone the registration reflects may move it
  later or delete it (its newer view: a lease's end, then the step's
  `wake_in`); once another's tell is absorbed it only moves earlier
  (test_an_invocation_moves_its_own_instant_later_until_another_tells)
- an instant already past, or within KICK_WITHIN (two seconds), kicks instead of scheduling,
  and leaves a future registration alone; the kick is an Event invoke of the
  wake function with the schedule's input
  (test_a_past_instant_kicks_instead_of_scheduling,
  test_a_kick_invokes_the_wake_function_asynchronously,
  test_an_instant_within_a_second_kicks_once_it_is_due, test_a_kick_keeps_a_future_schedule)
- created, moved or deleted only when the instant changes: a hundred calls
  that do not change it make no scheduler request (counted by the class and
  by a botocore hook on every HTTP request sent)
  (test_a_hundred_calls_that_do_not_change_the_instant_make_no_scheduler_call)
- concurrent invocations, serialized by the row lock, leave exactly one
  schedule at the earliest instant
  (test_five_concurrent_invocations_leave_the_earliest_instant)
- AWS's answers: ConflictException on create is an update, ResourceNotFound
  on update is a create and on delete is ignored
  (test_a_schedule_that_exists_already_is_updated,
  test_a_schedule_deleted_by_hand_is_made_again,
  test_deleting_a_schedule_already_gone_is_not_an_error)
- a failing write leaves the row as it was and raises
  (test_a_failing_write_leaves_the_row_unchanged_and_raises)
- the group is looked up before it is created, so its schedules survive
  (test_create_group_keeps_an_existing_groups_schedules,
  test_create_group_makes_a_missing_group)
- the client is made only when a scheduler call is needed
  (test_the_client_is_made_only_when_a_call_is_needed)
- names are AWS's (test_names_are_checked)
- a worker that runs `wake_in(step, 2 hours)` leaves exactly one schedule at
  that instant (test_a_worker_registers_its_wake_in_instant)
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.request import Request, urlopen

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import ConfigurationError, run_workflows, wake
from engine.base.clock import db_now
from engine.testing import move_clock
from infra.aws.scheduler import (
    WAKE_INPUT,
    WakeScheduler,
    create_wake_schedule_table,
    wake_invoker,
)
from tests.apps import serverless
from tests.apps.serverless import Reminder
from tests.conftest import Database

GROUP = "duly-test"
TARGET = "arn:aws:lambda:us-east-1:123456789012:function:duly-wake"
ROLE = "arn:aws:iam::123456789012:role/duly-scheduler"
NAME = "duly-wake"


@dataclass
class Requests:
    """Every HTTP request the test's scheduler clients sent, by operation."""

    sent: list[str] = field(default_factory=list)

    def hook(self, event_name: str, **_: Any) -> None:
        self.sent.append(event_name.rsplit(".", 1)[-1])  # before-send.scheduler.<Operation>


@pytest.fixture
def requests() -> Requests:
    return Requests()


@pytest.fixture
def client_factory(moto_endpoint: str, requests: Requests) -> Callable[..., Any]:
    """Makes scheduler clients on the moto server, each counted by the botocore hook."""

    def make(counted: bool = True, **config: Any) -> Any:
        client = boto3.client(
            "scheduler",
            endpoint_url=moto_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(**config) if config else None,
        )
        if counted:
            client.meta.events.register("before-send.scheduler", requests.hook)
        return client

    return make


@pytest.fixture
def aws(client_factory: Callable[..., Any]) -> Any:
    """The test's own view of AWS (not counted: it is the test reading, not duly writing)."""
    client = client_factory(counted=False)
    client.create_schedule_group(Name=GROUP)
    return client


@pytest.fixture
async def Session(db: Database) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    Session = await db.create(serverless.Base.metadata)  # brings duly_clock
    await create_wake_schedule_table(engine_of(Session))
    await create_wake_schedule_table(engine_of(Session))  # again: it exists, nothing happens
    yield Session


@dataclass
class Kicks:
    count: int = 0

    async def invoke(self) -> None:
        self.count += 1


def make_scheduler(
    engine: AsyncEngine,
    client_factory: Callable[..., Any],
    invoke: Callable[[], Any] | None = None,
    **kwargs: Any,
) -> WakeScheduler:
    options: dict[str, Any] = {"group": GROUP, "name": NAME} | kwargs
    return WakeScheduler(
        engine,
        target_arn=TARGET,
        role_arn=ROLE,
        client=client_factory,
        invoke=invoke,
        **options,
    )


def engine_of(Session: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    bind = Session.kw["bind"]
    assert isinstance(bind, AsyncEngine)
    return bind


async def db_time(engine: AsyncEngine) -> datetime:
    """The database clock's now (shifted by move_clock), the one instants are measured on."""
    async with engine.connect() as conn:
        now = await conn.scalar(select(db_now()))
    assert isinstance(now, datetime)
    return now


def schedules(aws: Any, group: str = GROUP) -> list[dict[str, Any]]:
    """Every schedule in the group, each read whole."""
    names = [s["Name"] for s in aws.list_schedules(GroupName=group)["Schedules"]]
    return [aws.get_schedule(Name=name, GroupName=group) for name in names]


def expression(at: datetime) -> str:
    return f"at({at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S')})"


def whole(at: datetime) -> datetime:
    """`at` with a fraction of a second, so rounding shows."""
    return at.replace(microsecond=250_000)


def floor(at: datetime) -> datetime:
    """The whole second an `at()` names for `at`: the one just before it."""
    return at.astimezone(UTC).replace(microsecond=0)


async def test_a_future_instant_is_one_schedule_as_specified(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory)
    at = whole(await db_time(engine) + timedelta(hours=2))
    await scheduler.on_idle(at)
    [schedule] = schedules(aws)
    assert schedule["Name"] == NAME
    assert schedule["GroupName"] == GROUP
    assert schedule["ScheduleExpression"] == expression(floor(at))
    assert schedule["ScheduleExpressionTimezone"] == "UTC"
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["State"] == "ENABLED"
    assert schedule["ActionAfterCompletion"] == "NONE"
    assert schedule["Target"]["Arn"] == TARGET
    assert schedule["Target"]["RoleArn"] == ROLE
    assert json.loads(schedule["Target"]["Input"]) == WAKE_INPUT == {"duly": "wake"}
    assert await scheduler.registered() == floor(at)
    assert (scheduler.calls, scheduler.kicks) == (1, 0)


async def test_instants_are_rounded_down_to_whole_seconds(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory)
    on_the_second = (await db_time(engine) + timedelta(hours=3)).replace(microsecond=0)
    await scheduler.on_idle(on_the_second)
    assert schedules(aws)[0]["ScheduleExpression"] == expression(on_the_second)
    # Earlier by a microsecond: it moves to the second before, which fires early; the wake
    # it starts finds the instant within KICK_WITHIN, waits for it and kicks.
    just_before = on_the_second - timedelta(hours=1, microseconds=1)
    await scheduler.on_idle(just_before)
    [schedule] = schedules(aws)
    second_before = on_the_second - timedelta(hours=1, seconds=1)
    assert schedule["ScheduleExpression"] == expression(second_before)
    assert await scheduler.registered() == second_before


async def test_an_earlier_instant_moves_the_schedule_a_later_one_does_not(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    """Two invocations: the second's earlier instant wins, and then neither can move it later."""
    engine = engine_of(Session)
    first = make_scheduler(engine, client_factory)
    second = make_scheduler(engine, client_factory)
    now = await db_time(engine)
    await first.on_idle(whole(now + timedelta(hours=2)))
    await second.on_idle(whole(now + timedelta(hours=1)))
    assert requests.sent == ["CreateSchedule", "UpdateSchedule"]
    await first.on_idle(whole(now + timedelta(hours=3)))
    await second.on_idle(whole(now + timedelta(hours=3)))
    assert requests.sent == ["CreateSchedule", "UpdateSchedule"], "later: no call"
    [schedule] = schedules(aws)
    assert schedule["ScheduleExpression"] == expression(floor(whole(now + timedelta(hours=1))))


async def test_a_later_instant_replaces_one_that_has_passed(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    first = make_scheduler(engine, client_factory)
    woken = make_scheduler(engine, client_factory)  # the invocation the schedule started
    now = await db_time(engine)
    await first.on_idle(whole(now + timedelta(hours=1)))
    await move_clock(Session, timedelta(hours=2))  # the schedule has fired
    later = whole(now + timedelta(hours=3))
    await woken.on_idle(later)
    [schedule] = schedules(aws)
    assert schedule["ScheduleExpression"] == expression(floor(later))
    assert await woken.registered() == floor(later)


async def test_none_deletes_only_when_nothing_future_is_registered(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    registering = make_scheduler(engine, client_factory)
    other = make_scheduler(engine, client_factory)
    at = whole(await db_time(engine) + timedelta(hours=1))
    await registering.on_idle(at)
    await other.on_idle(None)  # a stale None: another invocation's instant is in the future
    assert len(schedules(aws)) == 1
    assert await other.registered() == floor(at)
    assert other.calls == 0
    await move_clock(Session, timedelta(hours=2))
    await other.on_idle(None)
    assert schedules(aws) == []
    assert await other.registered() is None
    assert other.calls == 1
    await other.on_idle(None)
    assert other.calls == 1, "nothing registered, nothing to delete"


async def test_an_invocation_moves_its_own_instant_later_until_another_tells(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    """Its newer view supersedes its older one (a lease's end, then the step's wake_in)."""
    engine = engine_of(Session)
    mine = make_scheduler(engine, client_factory)
    other = make_scheduler(engine, client_factory)
    now = await db_time(engine)
    await mine.on_idle(whole(now + timedelta(minutes=5)))
    await mine.on_idle(whole(now + timedelta(hours=2)))
    assert await mine.registered() == floor(whole(now + timedelta(hours=2)))
    await mine.on_idle(None)
    assert schedules(aws) == []
    assert requests.sent == ["CreateSchedule", "UpdateSchedule", "DeleteSchedule"]
    await mine.on_idle(whole(now + timedelta(hours=1)))
    await other.on_idle(whole(now + timedelta(hours=3)))  # absorbed: the 1 h wake-up covers it
    await mine.on_idle(whole(now + timedelta(hours=4)))  # shared now: stays at 1 h
    await mine.on_idle(None)
    assert [s["ScheduleExpression"] for s in schedules(aws)] == [
        expression(floor(whole(now + timedelta(hours=1))))
    ]
    assert requests.sent[3:] == ["CreateSchedule"]


async def test_a_past_instant_kicks_instead_of_scheduling(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    kicks = Kicks()
    scheduler = make_scheduler(engine, client_factory, invoke=kicks.invoke)
    await scheduler.on_idle(await db_time(engine) - timedelta(minutes=5))
    assert (kicks.count, scheduler.kicks, scheduler.calls) == (1, 1, 0)
    assert schedules(aws) == []
    assert await scheduler.registered() is None


@pytest.fixture
def lambda_without_docker(moto_endpoint: str) -> Iterator[None]:
    """moto's Lambda that answers invokes without running the code in Docker (not here)."""

    def lambda_config(use_docker: bool) -> None:
        body = json.dumps({"lambda": {"use_docker": use_docker}}).encode()
        urlopen(Request(f"{moto_endpoint}/moto-api/config", data=body, method="POST")).close()

    lambda_config(False)
    try:
        yield
    finally:
        lambda_config(True)  # moto's configuration is the process's: put the default back


async def test_a_kick_invokes_the_wake_function_asynchronously(
    Session: async_sessionmaker[AsyncSession],
    moto_endpoint: str,
    client_factory: Callable[..., Any],
    lambda_without_docker: None,
) -> None:
    """wake_invoker: an Event invoke of the wake function on moto, with the schedule's input."""
    aws = {
        "endpoint_url": moto_endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    role = boto3.client("iam", **aws).create_role(RoleName="wake", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("handler.py", "def wake(event, context):\n    return event\n")
    functions = boto3.client("lambda", **aws)
    arn = functions.create_function(
        FunctionName="duly-wake",
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="handler.wake",
        Code={"ZipFile": code.getvalue()},
    )["FunctionArn"]
    sent: list[tuple[str, bytes]] = []

    answers: list[tuple[int, Any]] = []

    def record(request: Any, **_: Any) -> None:
        sent.append((request.headers["X-Amz-Invocation-Type"].decode(), request.body))

    def answered(http_response: Any, parsed: Any, **_: Any) -> None:
        answers.append((http_response.status_code, parsed))

    made: list[Any] = []

    def lambda_client() -> Any:
        client = boto3.client("lambda", **aws)
        client.meta.events.register("before-send.lambda.Invoke", record)
        client.meta.events.register("after-call.lambda.Invoke", answered)
        made.append(client)
        return client

    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory, invoke=wake_invoker(lambda_client, arn))
    assert made == [], "no client before the first kick"
    await scheduler.on_idle(await db_time(engine) - timedelta(seconds=5))
    await scheduler.on_idle(await db_time(engine) - timedelta(seconds=1))
    assert sent == [("Event", json.dumps(WAKE_INPUT).encode())] * 2
    assert [status for status, _ in answers] == [202, 202]
    assert (len(made), scheduler.kicks, scheduler.calls) == (1, 2, 0)


async def test_an_instant_within_a_second_kicks_once_it_is_due(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    kicked_at: list[datetime] = []

    async def invoke() -> None:
        kicked_at.append(await db_time(engine))

    scheduler = make_scheduler(engine, client_factory, invoke=invoke)
    for ms in (1500, 900, 400, 0, -500):
        at = await db_time(engine) + timedelta(milliseconds=ms)
        await scheduler.on_idle(at)
        assert kicked_at[-1] >= at, "a wake invoked before the instant would find nothing due"
    assert (len(kicked_at), scheduler.calls) == (5, 0)
    assert schedules(aws) == []


async def test_a_kick_keeps_a_future_schedule(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    kicks = Kicks()
    scheduler = make_scheduler(engine, client_factory, invoke=kicks.invoke)
    now = await db_time(engine)
    await scheduler.on_idle(whole(now + timedelta(hours=1)))
    await scheduler.on_idle(now - timedelta(seconds=1))
    assert (kicks.count, scheduler.calls) == (1, 1)
    assert [s["ScheduleExpression"] for s in schedules(aws)] == [
        expression(floor(whole(now + timedelta(hours=1))))
    ]


async def test_a_hundred_calls_that_do_not_change_the_instant_make_no_scheduler_call(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    """One invocation registered; then a hundred tells of five, the same, later or None."""
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory)
    at = whole(await db_time(engine) + timedelta(hours=1))
    await scheduler.on_idle(at)
    assert (scheduler.calls, len(requests.sent)) == (1, 1)
    others = [make_scheduler(engine, client_factory) for _ in range(4)]
    tellers = [scheduler, *others]
    told: list[datetime | None] = [at, at + timedelta(minutes=30), None, floor(at), None]
    for number in range(100):
        teller = tellers[number % len(tellers)]
        await teller.on_idle(at if teller is scheduler else told[number % len(told)])
    assert sum(teller.calls for teller in tellers) == 1
    assert requests.sent == ["CreateSchedule"], "no request reached the scheduler"
    assert [s["ScheduleExpression"] for s in schedules(aws)] == [expression(floor(at))]


async def test_five_concurrent_invocations_leave_the_earliest_instant(
    db: Database,
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
) -> None:
    """Five invocations, each with its engine and client, tell at once; in ten rounds."""
    now = await db_time(engine_of(Session))
    kicks = Kicks()
    schedulers = [
        make_scheduler(db.engine(pool_size=1), client_factory, invoke=kicks.invoke)
        for _ in range(5)
    ]
    shuffle = random.Random(10)
    for round_number in range(10):
        name = f"round-{round_number}"
        for scheduler in schedulers:
            scheduler.name = name  # a fresh row and schedule for each round
        offsets: list[timedelta | None] = [
            timedelta(hours=3),
            None,
            timedelta(hours=1, minutes=round_number),
            timedelta(hours=2),
            None if round_number % 2 else -timedelta(minutes=1),  # a kick every other round
        ]
        shuffle.shuffle(offsets)
        await asyncio.gather(
            *(
                scheduler.on_idle(None if offset is None else whole(now + offset))
                for scheduler, offset in zip(schedulers, offsets, strict=True)
            )
        )
        earliest = floor(whole(now + timedelta(hours=1, minutes=round_number)))
        [schedule] = [s for s in schedules(aws) if s["Name"] == name]
        assert schedule["ScheduleExpression"] == expression(earliest), round_number
        assert await schedulers[0].registered() == earliest
    assert len(schedules(aws)) == 10
    assert kicks.count == 5


async def test_a_schedule_that_exists_already_is_updated(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    """The row was lost (a new database) but the schedule was not: ConflictException → update."""
    engine = engine_of(Session)
    now = await db_time(engine)
    scheduler = make_scheduler(engine, client_factory)
    aws.create_schedule(
        Name=NAME,
        GroupName=GROUP,
        ScheduleExpression=expression(now + timedelta(days=1)),
        FlexibleTimeWindow={"Mode": "OFF"},
        Target={"Arn": TARGET, "RoleArn": ROLE},
    )
    at = whole(now + timedelta(hours=1))
    await scheduler.on_idle(at)
    assert requests.sent == ["CreateSchedule", "UpdateSchedule"]
    [schedule] = schedules(aws)
    assert schedule["ScheduleExpression"] == expression(floor(at))
    assert json.loads(schedule["Target"]["Input"]) == WAKE_INPUT


async def test_a_schedule_deleted_by_hand_is_made_again(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory)
    now = await db_time(engine)
    await scheduler.on_idle(whole(now + timedelta(hours=2)))
    aws.delete_schedule(Name=NAME, GroupName=GROUP)
    await scheduler.on_idle(whole(now + timedelta(hours=1)))
    assert requests.sent == ["CreateSchedule", "UpdateSchedule", "CreateSchedule"]
    assert [s["ScheduleExpression"] for s in schedules(aws)] == [
        expression(floor(whole(now + timedelta(hours=1))))
    ]


async def test_deleting_a_schedule_already_gone_is_not_an_error(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory)
    await scheduler.on_idle(whole(await db_time(engine) + timedelta(hours=1)))
    aws.delete_schedule(Name=NAME, GroupName=GROUP)
    await move_clock(Session, timedelta(hours=2))
    await scheduler.on_idle(None)
    assert await scheduler.registered() is None
    assert schedules(aws) == []


async def test_a_failing_write_leaves_the_row_unchanged_and_raises(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    """A schedule in a group moto does not have fails (moto answers 500; AWS 404)."""
    engine = engine_of(Session)
    now = await db_time(engine)
    scheduler = make_scheduler(
        engine, lambda: client_factory(retries={"total_max_attempts": 1}), group="missing"
    )
    with pytest.raises(ClientError):
        await scheduler.on_idle(whole(now + timedelta(hours=1)))
    assert await scheduler.registered() is None
    aws.create_schedule_group(Name="missing")
    await scheduler.on_idle(whole(now + timedelta(hours=1)))  # told again: it works now
    assert await scheduler.registered() == floor(whole(now + timedelta(hours=1)))
    assert len(schedules(aws, "missing")) == 1


async def test_create_group_keeps_an_existing_groups_schedules(
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
    requests: Requests,
) -> None:
    engine = engine_of(Session)
    now = await db_time(engine)
    aws.create_schedule(
        Name="someone-else",
        GroupName=GROUP,
        ScheduleExpression=expression(now + timedelta(days=1)),
        FlexibleTimeWindow={"Mode": "OFF"},
        Target={"Arn": TARGET, "RoleArn": ROLE},
    )
    scheduler = make_scheduler(engine, client_factory, create_group=True)
    await scheduler.on_idle(whole(now + timedelta(hours=1)))
    await move_clock(Session, timedelta(hours=2))
    await scheduler.on_idle(None)
    await scheduler.on_idle(whole(now + timedelta(hours=4)))  # a second create: no lookup
    assert requests.sent == [
        "GetScheduleGroup",
        "CreateSchedule",
        "DeleteSchedule",
        "CreateSchedule",
    ]
    assert sorted(s["Name"] for s in schedules(aws)) == [NAME, "someone-else"]


async def test_create_group_makes_a_missing_group(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    scheduler = make_scheduler(engine, client_factory, create_group=True, group="fresh")
    await scheduler.on_idle(whole(await db_time(engine) + timedelta(hours=1)))
    assert aws.get_schedule_group(Name="fresh")["Name"] == "fresh"
    assert [s["Name"] for s in schedules(aws, "fresh")] == [NAME]


async def test_the_client_is_made_only_when_a_call_is_needed(
    Session: async_sessionmaker[AsyncSession], client_factory: Callable[..., Any], aws: Any
) -> None:
    engine = engine_of(Session)
    made: list[Any] = []

    def factory() -> Any:
        made.append(client_factory())
        return made[-1]

    scheduler = make_scheduler(engine, factory)
    now = await db_time(engine)
    await scheduler.on_idle(None)
    await scheduler.on_idle(now - timedelta(minutes=1))  # a kick: no scheduler call either
    assert made == []
    await scheduler.on_idle(whole(now + timedelta(hours=1)))
    await scheduler.on_idle(whole(now + timedelta(minutes=30)))
    assert len(made) == 1, "made once, then reused"
    given = make_scheduler(engine, made[0])  # a client itself is used as it is
    await given.on_idle(whole(now + timedelta(minutes=10)))
    assert given.calls == 1
    assert len(made) == 1


def test_names_are_checked() -> None:
    engine: Any = object()
    with pytest.raises(ConfigurationError, match="schedule name"):
        WakeScheduler(
            engine, group=GROUP, target_arn=TARGET, role_arn=ROLE, client=object(), name="a b"
        )
    with pytest.raises(ConfigurationError, match="schedule group"):
        WakeScheduler(engine, group="x" * 65, target_arn=TARGET, role_arn=ROLE, client=object())
    with pytest.raises(ConfigurationError, match="role_arn"):
        WakeScheduler(engine, group=GROUP, target_arn=TARGET, role_arn="", client=object())


async def test_a_worker_registers_its_wake_in_instant(
    db: Database,
    Session: async_sessionmaker[AsyncSession],
    client_factory: Callable[..., Any],
    aws: Any,
) -> None:
    """run_workflows(on_idle=scheduler.on_idle, suspends_when_idle=True), as the wake function."""
    kicks = Kicks()
    scheduler = make_scheduler(db.engine(), client_factory, invoke=kicks.invoke)
    async with run_workflows(
        Session, workflows=[Reminder], on_idle=scheduler.on_idle, suspends_when_idle=True
    ):
        assert await wake(5)
        assert scheduler.calls == 0, "nothing due, nothing registered: no call"
        await Reminder().start(Reminder.plan)
        assert await wake(5)
    async with Session() as session:
        reminder = (await session.scalars(select(Reminder))).one()
    assert reminder.next_step == "send"
    assert reminder.wake_at is not None
    started = await db_time(engine_of(Session))
    assert started + serverless.LATER - timedelta(minutes=1) < reminder.wake_at
    [schedule] = schedules(aws)
    assert schedule["ScheduleExpression"] == expression(floor(reminder.wake_at))
    assert json.loads(schedule["Target"]["Input"]) == WAKE_INPUT
    assert await scheduler.registered() == floor(reminder.wake_at)
    # The pass after the claim may have told the running step's lease end first (then
    # moved to the wake_in instant, its own newer view): at most two calls.
    assert scheduler.calls in (1, 2)
    # The start kicked: due at once when it committed, so the worker may have told a
    # past instant before running it; what it left registered is all that counts.
    assert kicks.count <= 1
