"""Registering the engine's next instant with EventBridge Scheduler (`on_idle` on AWS).

`WakeScheduler` keeps one one-time `at(...)` schedule per deployment (its target
the wake function with `WAKE_INPUT`) and writes it only when the instant
registered changes, under a lock on its `duly_wake_schedule` row; which instant
wins when invocations disagree, and why, is in docs/architecture.md ("The next
instant"). An instant due within `KICK_WITHIN` is a kick instead. A failed write
rolls the row back and propagates; boto3 runs in a thread. `keep_armed` leaves a
wake-up to come when the database cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Column, DateTime, MetaData, String, Table, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from engine import ConfigurationError, InvalidArgumentError, db_now

TABLE = "duly_wake_schedule"
DEFAULT_NAME = "duly-wake"
WAKE_INPUT: dict[str, str] = {"duly": "wake"}  # the event the wake function receives
# An instant this close (or past) is waited for and kicked, not scheduled: an `at()` names a
# whole second, rounded down, so a schedule fires up to a second before its instant, and the
# wake it starts must find the instant within reach (a second more for the clocks to differ).
KICK_WITHIN = timedelta(seconds=2)
TIMEZONE = "UTC"
ACTION_AFTER_COMPLETION = "NONE"  # a fired schedule stays: the row always tells if it exists
LOCK_TIMEOUT = "10s"  # waiting for another invocation's registration longer is an error
# A frozen or killed Lambda that held the row: the server ends its session after this.
IDLE_IN_TRANSACTION_TIMEOUT = "60s"
AT_PATTERN = re.compile(r"at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)")
NAME_PATTERN = re.compile(r"[0-9A-Za-z_.\-]{1,64}")  # AWS's rule for schedule and group names

metadata = MetaData()

wake_schedule = Table(
    TABLE,
    metadata,
    Column("name", String(64), primary_key=True),
    # The instant registered with the scheduler; NULL: no schedule exists.
    Column("at", DateTime(timezone=True), nullable=True),
    # The one WakeScheduler whose tells alone `at` reflects, which may move it later;
    # NULL once another's tell was absorbed (or nothing is registered).
    Column("owner", String(32), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


async def create_wake_schedule_table(engine: AsyncEngine) -> None:
    """Create `duly_wake_schedule` if it does not exist (tests, `duly dev`)."""
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


def schedule_expression(at: datetime) -> str:
    """`at(yyyy-mm-ddThh:mm:ss)` in UTC: `at()` takes no offset, the zone goes beside it."""
    return f"at({at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S')})"


def instant_of(expression: str) -> datetime | None:
    """The UTC instant of an `at(...)` expression; None for any other."""
    found = AT_PATTERN.fullmatch(expression)
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)


def whole_second(at: datetime) -> datetime:
    """`at` in UTC, rounded down to a whole second: the `at()` that fires just before it.

    The wake that fires finds the instant within `KICK_WITHIN`, waits for it and kicks:
    late by a kick, not by the rest of a second as a rounding up would be.
    """
    if at.tzinfo is None:
        raise InvalidArgumentError(
            f"on_idle needs an aware datetime, not the naive {at.isoformat()}."
        )
    return at.astimezone(UTC).replace(microsecond=0)


def lock_statement(name: str) -> Executable:
    """The registered instant of `name`, its row locked, and the database's time."""
    return (
        select(wake_schedule.c.at, wake_schedule.c.owner, db_now().label("now"))
        .where(wake_schedule.c.name == name)
        .with_for_update(of=wake_schedule)
    )


def insert_statement(name: str) -> Executable:
    """The row of `name` with nothing registered, unless another transaction made it."""
    return insert(wake_schedule).values(name=name, at=None).on_conflict_do_nothing()


def record_statement(name: str, at: datetime | None, owner: str | None) -> Executable:
    """Remember what is registered now, and whose view it reflects."""
    return (
        wake_schedule.update()
        .where(wake_schedule.c.name == name)
        .values(at=at, owner=owner, updated_at=func.now())
    )


def timeouts_statement() -> Executable:
    """This transaction's lock and idle timeouts (SET LOCAL: safe behind a pooler)."""
    return select(
        func.set_config("lock_timeout", LOCK_TIMEOUT, True),
        func.set_config("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT, True),
    )


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (read without importing botocore)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return code if isinstance(code, str) else None
    return None


class WakeScheduler:
    """Keeps the deployment's one wake-up schedule at the earliest instant any worker told."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        group: str,
        target_arn: str,
        role_arn: str,
        client: Any | Callable[[], Any],
        invoke: Callable[[], Awaitable[None]] | None = None,
        name: str = DEFAULT_NAME,
        create_group: bool = False,
    ) -> None:
        """`client` is a boto3 `scheduler` client or a factory for one (a client is not callable).

        `create_group`: look the group up before the first create and create it
        when missing (local runs and moto). On AWS the template owns the group
        and the functions' policy grants no group actions.
        """
        for what, value in (("schedule name", name), ("schedule group", group)):
            if not NAME_PATTERN.fullmatch(value):
                raise ConfigurationError(
                    f"The {what} {value!r} is not one EventBridge Scheduler accepts: "
                    "1 to 64 letters, digits, '-', '_' or '.'."
                )
        for what, value in (("target_arn", target_arn), ("role_arn", role_arn)):
            if not value.startswith("arn:"):
                raise ConfigurationError(f"WakeScheduler {what} must be an ARN, not {value!r}.")
        self.engine = engine
        self.group = group
        self.name = name
        self.target_arn = target_arn
        self.role_arn = role_arn
        self.create_group = create_group
        self._client: Any | None = None if callable(client) else client
        self._make_client: Callable[[], Any] | None = client if callable(client) else None
        self._invoke = invoke
        self._group_checked = False
        self.token = uuid.uuid4().hex  # this scheduler (one worker's views) in the row
        self.calls = 0  # scheduler API calls made (create, update, delete, get)
        self.kicks = 0

    async def on_idle(self, at: datetime | None) -> None:
        """Register `at` (or the earlier one already registered), or kick when it is due."""
        told = None if at is None else whole_second(at)
        async with self.engine.begin() as conn:
            await conn.execute(timeouts_statement())
            registered, owner, now = await self._lock(conn)
            # Judged before rounding, which would push an instant due now past the margin.
            due_now = at is not None and at <= now + KICK_WITHIN
            wanted, new_owner = self.decide(told, due_now, registered, owner, now)
            if wanted != registered:
                await self._write(registered, wanted)
            if (wanted, new_owner) != (registered, owner):
                await conn.execute(record_statement(self.name, wanted, new_owner))
        if due_now:
            assert at is not None
            # A wake invoked before the instant would find nothing due, and, refused a slot,
            # ring holders that tell an unchanged instant no more: wait for it (at most
            # KICK_WITHIN), then kick.
            early = (at - now).total_seconds()
            if early > 0:
                await asyncio.sleep(early)
            await self.kick()

    def decide(
        self,
        told: datetime | None,
        due_now: bool,
        registered: datetime | None,
        owner: str | None,
        now: datetime,
    ) -> tuple[datetime | None, str | None]:
        """What to register, and whose view alone it reflects (None: several invocations').

        A registration still in the future is moved earlier by anyone, and
        later or away only by the one invocation whose tells alone it
        reflects: a newer view of its own supersedes its older one (the
        lease of its running step, then the step's `wake_in`), where another
        invocation's stale view must not. Once a second invocation's tell is
        absorbed, the registration is shared and only moves earlier until it
        has passed.
        """
        live = registered if registered is not None and registered > now else None
        if live is None:
            if told is None or due_now:
                return None, None  # a passed schedule has fired: nothing to keep
            return told, self.token
        mine = owner == self.token
        if due_now:
            return live, owner  # the kick covers now; what comes after stays registered
        if told is None:
            return (None, None) if mine else (live, owner)
        if mine:
            return told, self.token
        return min(told, live), None

    async def keep_armed(self, at: datetime) -> None:
        """Leave a wake-up to come, without the database (which did not answer): a schedule
        still to fire stays as it is; a fired or missing one is set to `at`. The row is not
        read or written: the next tell finds its instant passed and writes what it wants."""
        try:
            found = await self._call("get_schedule", Name=self.name, GroupName=self.group)
        except Exception as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            await self._create(whole_second(at))
            return
        pending = instant_of(found.get("ScheduleExpression", ""))
        if pending is None or pending <= datetime.now(UTC):
            await self._call("update_schedule", **self._schedule(whole_second(at)))

    async def kick(self) -> None:
        """Invoke the wake function asynchronously (counted even with no `invoke`)."""
        self.kicks += 1
        if self._invoke is not None:
            await self._invoke()

    async def registered(self) -> datetime | None:
        """The instant registered now, as the database row says."""
        async with self.engine.connect() as conn:
            at: datetime | None = await conn.scalar(
                select(wake_schedule.c.at).where(wake_schedule.c.name == self.name)
            )
        return at

    async def _lock(self, conn: AsyncConnection) -> tuple[datetime | None, str | None, datetime]:
        """The registration, its owner and the database's time, the row locked (made if missing)."""
        row = (await conn.execute(lock_statement(self.name))).one_or_none()
        if row is None:
            await conn.execute(insert_statement(self.name))
            row = (await conn.execute(lock_statement(self.name))).one()
        return row.at, row.owner, row.now

    async def _write(self, registered: datetime | None, wanted: datetime | None) -> None:
        """Make the schedule say `wanted`; the row said `registered` (AWS may disagree)."""
        if wanted is None:
            try:
                await self._call("delete_schedule", Name=self.name, GroupName=self.group)
            except Exception as error:
                if error_code(error) != "ResourceNotFoundException":
                    raise  # already gone (deleted by hand, or never made): nothing to do
            return
        if registered is None:
            try:
                await self._create(wanted)
            except Exception as error:
                if error_code(error) != "ConflictException":
                    raise
                await self._call("update_schedule", **self._schedule(wanted))
            return
        try:
            await self._call("update_schedule", **self._schedule(wanted))
        except Exception as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            await self._create(wanted)

    async def _create(self, at: datetime) -> None:
        if self.create_group and not self._group_checked:
            await self._ensure_group()
        await self._call("create_schedule", **self._schedule(at))

    async def _ensure_group(self) -> None:
        """Create the group only when it is missing: moto empties an existing one it is asked
        to create (AWS refuses)."""
        try:
            await self._call("get_schedule_group", Name=self.group)
        except Exception as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            try:
                await self._call("create_schedule_group", Name=self.group)
            except Exception as error:
                if error_code(error) != "ConflictException":  # another invocation made it
                    raise
        self._group_checked = True

    def _schedule(self, at: datetime) -> dict[str, Any]:
        """The whole schedule: update_schedule replaces every field, so always all of them."""
        return {
            "Name": self.name,
            "GroupName": self.group,
            "ScheduleExpression": schedule_expression(at),
            "ScheduleExpressionTimezone": TIMEZONE,
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "State": "ENABLED",
            "ActionAfterCompletion": ACTION_AFTER_COMPLETION,
            "Description": "duly: wakes the wake function when work is next due.",
            "Target": {
                "Arn": self.target_arn,
                "RoleArn": self.role_arn,
                "Input": json.dumps(WAKE_INPUT),
            },
        }

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        """One scheduler API call, counted, in a thread (boto3 blocks)."""
        client = self._scheduler_client()
        self.calls += 1
        return await asyncio.to_thread(getattr(client, operation), **kwargs)

    def _scheduler_client(self) -> Any:
        """The client, made on first use. In the event loop, not a thread: boto3's default
        session is not thread-safe, and making a client is CPU work a thread would not speed."""
        if self._client is None:
            assert self._make_client is not None
            self._client = self._make_client()
        return self._client


def wake_invoker(
    client: Any | Callable[[], Any], function_arn: str
) -> Callable[[], Awaitable[None]]:
    """`invoke` for WakeScheduler: an asynchronous (Event) invoke of the wake function with
    WAKE_INPUT, the schedule's own input. `client` is a boto3 `lambda` client or a factory
    for one, made on the first kick."""
    made: list[Any] = [] if callable(client) else [client]

    async def invoke() -> None:
        if not made:
            made.append(client())
        await asyncio.to_thread(
            made[0].invoke,
            FunctionName=function_arn,
            InvocationType="Event",
            Payload=json.dumps(WAKE_INPUT).encode(),
        )

    return invoke
