"""`duly dev --serverless`: the AWS loop on this machine, with moto for EventBridge Scheduler.

No worker runs in the HTTP app: its `app.state.wake`, `drain` and `kick` are a `Runtime`'s,
as the `http` entry (`functions.lambdas.handlers.http`, the template's API) gives them.
The wake entry runs in a second `Runtime` on a thread of its own, with the real
`WakeScheduler` writing to moto. Kicks go to the local firer, which also reads the
registered schedule from moto every `POLL_SECONDS` (moto never fires one) and invokes `wake`
at its instant on the database clock (read once at start and once per clock move, never
while waiting), once per registration, one wake at a time, with a fake context of
`INVOCATION_SECONDS`. Both containers hold no connection between invocations.
Why: docs/architecture.md, "On AWS Lambda".
boto3 and moto are the dev extra's: only `functions.local.command` imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import boto3
from fastapi import FastAPI
from moto.server import ThreadedMotoServer
from sqlalchemy import DateTime, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp, Receive, Scope, Send

from engine import clock_shift, settings as variables
from functions.lambdas import handlers as lambda_handlers, http_events
from functions.lambdas.runtime import Runtime, install
from functions.local.dev import DEFAULT_BIND_HOST, create_dev_app
from infra.aws import scheduler as scheduler_tables, wake_slots as slot_tables
from infra.aws.scheduler import DEFAULT_NAME, WAKE_INPUT, error_code, wake_schedule
from infra.aws.settings import AwsSettings
from infra.aws.wake_slots import wake_slots
from infra.settings import database_url

log = logging.getLogger("duly.serverless")

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
WAKE_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:duly-dev-wake"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/duly-dev-scheduler"
GROUP = "duly-dev"
FAKE_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
POLL_SECONDS = 0.5  # how often the firer reads the schedule from moto (never the database)
KICK_FOLD_SECONDS = 0.1  # kicks this close together are one invocation (the API kicks twice)
INVOCATION_SECONDS = 60.0  # the fake Lambda context's time to its deadline
STOP_GRACE_SECONDS = 5.0  # an invocation still running at Ctrl-C gets this long, then cancelled
QUIET_LOGGERS = ("werkzeug",)  # moto's server logs every request (the firer polls)
AT_EXPRESSION = re.compile(r"at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)")


def local_settings(
    url: str, app_module: str, environ: Mapping[str, str] | None = None
) -> AwsSettings:
    """The AWS functions' settings for this machine: the URL and app given, moto's fake ARNs.

    DULY_MAX_WAKES and DULY_WAKE_MARGIN_SECONDS are read from the environment
    as on AWS (a bad one is a ConfigurationError naming it).
    """
    return AwsSettings(
        database_url=database_url(url),
        database_secret_arn=None,
        wake_function_arn=WAKE_ARN,
        schedule_group=GROUP,
        scheduler_role_arn=ROLE_ARN,
        app_module=app_module,
        max_wakes=variables.MAX_WAKES.read(environ),
        wake_margin_seconds=variables.WAKE_MARGIN_SECONDS.read(environ),
    )


# -- moto ----------------------------------------------------------------------------------


class LocalAws:
    """moto's server on a free loopback port, standing in for EventBridge Scheduler."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""

    def start(self) -> None:
        """Serve (in milliseconds), and create the schedule group, as the template does on AWS."""
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client("scheduler").create_schedule_group(Name=GROUP)

    def stop(self) -> None:
        self._server.stop()

    def client(self, service: str) -> Any:
        """A boto3 client for moto: fake credentials, never the developer's own AWS account.

        A session per client: boto3's default session is not thread-safe, and
        the HTTP app and the firer each make theirs on their own thread.
        """
        session = boto3.session.Session(region_name=REGION, **FAKE_CREDENTIALS)
        return session.client(service, endpoint_url=self.endpoint)


# -- the registered schedule -----------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    """The wake schedule as moto has it."""

    at: datetime
    input: Any  # the target's Input, parsed: what the scheduler would send
    version: tuple[str, str]  # expression and last change: one registration, fired once

    def describe(self) -> str:
        return self.at.strftime("%Y-%m-%d %H:%M:%S %Z")


def parse_at(expression: str, timezone: str) -> datetime | None:
    """The instant of `at(yyyy-mm-ddThh:mm:ss)` in `timezone`; None for another expression."""
    found = AT_EXPRESSION.fullmatch(expression.strip())
    if found is None:
        return None
    return datetime.fromisoformat(found.group(1)).replace(tzinfo=ZoneInfo(timezone or "UTC"))


def read_schedule(client: Any, group: str = GROUP, name: str = DEFAULT_NAME) -> Registered | None:
    """The enabled `at()` schedule `name` of `group`, or None when there is none."""
    try:
        found = client.get_schedule(Name=name, GroupName=group)
    except Exception as error:
        if error_code(error) == "ResourceNotFoundException":
            return None
        raise
    at = parse_at(found["ScheduleExpression"], found.get("ScheduleExpressionTimezone", "UTC"))
    if at is None or found.get("State", "ENABLED") != "ENABLED":
        return None
    raw_input = found.get("Target", {}).get("Input")
    version = (found["ScheduleExpression"], str(found.get("LastModificationDate")))
    return Registered(at, json.loads(raw_input) if raw_input else {}, version)


async def clock_offset(engine: AsyncEngine) -> timedelta:
    """The database clock less this machine's, never more than it is: a firing is never early.

    The database's time is read before this machine's, so the difference errs
    low by the read's return trip (a millisecond on loopback), late not early.
    """
    async with engine.connect() as conn:
        shifted = (func.clock_timestamp() + clock_shift()).cast(DateTime(timezone=True))
        database = (await conn.execute(select(shifted))).scalar_one()
    assert isinstance(database, datetime)
    return database - datetime.now(UTC)


# -- the firer --------------------------------------------------------------------------------


@dataclass
class LocalContext:
    """A Lambda context: the deadline the wake invocation plans by, and the function's ARN."""

    seconds: float = INVOCATION_SECONDS
    invoked_function_arn: str = WAKE_ARN
    function_name: str = "duly-dev-wake"
    aws_request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.seconds - (time.monotonic() - self.started)) * 1000))


def describe_result(result: dict[str, Any], registered: Registered | None) -> str:
    """One wake invocation in words: its steps, whether it caught up, what is registered next."""
    if "error" in result:
        return f"refused: {result['error']}"
    steps = int(result.get("steps", 0))
    parts = [f"{steps} step{'' if steps == 1 else 's'}"]
    parts.append("caught up" if result.get("caught_up") else "not caught up")
    if result.get("reason"):
        parts.append(str(result["reason"]))
    if result.get("invoked"):
        parts.append(f"invoked {result['invoked']} more")
    parts.append("nothing scheduled" if registered is None else f"next at {registered.describe()}")
    return ", ".join(parts)


class Firer:
    """Invokes the wake entry on a thread of its own when a kick comes or the schedule is due.

    The thread is the wake function's one container: its `Runtime` (engine,
    loop, scheduler) lives there, installed as the process's `runtime()` so
    the entry is called exactly as Lambda calls it. Between invocations it
    holds no connection and reads no database: `clock_moved` makes it read
    the database clock again.
    """

    def __init__(
        self,
        settings: AwsSettings,
        clients: Any,
        *,
        poll: float = POLL_SECONDS,
        invocation_seconds: float = INVOCATION_SECONDS,
    ) -> None:
        self.runtime = Runtime(settings, invoke=self.invoked, clients=clients)
        self.poll = poll
        self.invocation_seconds = invocation_seconds
        self.invocations = 0
        self.clock_reads = 0  # database clock reads: at start and once per clock move
        self._wakeup = threading.Event()  # a kick, a clock move or stop: the wait ends at once
        self._clock_moved = threading.Event()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._reason: str | None = None  # why the kick waiting was asked for; None: no kick
        self._lock = threading.Lock()
        self._fired: tuple[str, str] | None = None
        self._offset = timedelta(0)  # the database clock less this machine's
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="duly-firer", daemon=True)

    # -- from any thread --------------------------------------------------------------

    def kick(self, reason: str = "kick") -> None:
        """Ask for a wake invocation (Lambda's asynchronous invoke, delivered here)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._wakeup.set()

    def clock_moved(self) -> None:
        """The database clock moved (`POST /dev/clock`): read it once, then fire what is due."""
        self._clock_moved.set()
        self._wakeup.set()

    async def invoked(self) -> None:
        """The runtimes' `invoke`: the asynchronous invoke of the wake function."""
        self.kick()

    def start(self) -> None:
        """Start the thread and make the wake container (its cold start); raise what failed."""
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def stop(self) -> None:
        """Stop waiting; an invocation still running gets a grace, then is cancelled."""
        self._stopping.set()
        self._wakeup.set()
        self._thread.join(STOP_GRACE_SECONDS)
        loop = self._loop
        if self._thread.is_alive() and loop is not None:
            log.info("stopping the wake invocation still running")
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_cancel_all, loop)
            self._thread.join(STOP_GRACE_SECONDS)

    # -- on the firer's thread ----------------------------------------------------------

    def _run(self) -> None:
        rt = self.runtime
        try:
            install(rt)
            self._loop = rt.loop
            self._read_clock()  # the container made here: its cold start
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            rt.close()
            return
        self._ready.set()
        try:
            while (due := self._next()) is not None:
                self._invoke(*due)
        except asyncio.CancelledError:
            log.info("the wake invocation was cancelled; its leases come due again")
        finally:
            install(None)
            rt.close()

    def _read_clock(self) -> None:
        """Read the database clock's offset from this machine's; hold no connection after."""
        try:
            self._offset = self.runtime.run(clock_offset(self._engine()))
            self.clock_reads += 1
        finally:
            self._release()

    def _next(self) -> tuple[str, Any] | None:
        """Wait for a kick or the schedule's instant; why, and the event to invoke with."""
        while not self._stopping.is_set():
            self._wakeup.clear()  # before the checks: a signal sent during them is kept
            if self._clock_moved.is_set():
                self._clock_moved.clear()
                try:
                    self._read_clock()
                except Exception:
                    log.exception("could not read the database clock; trying again")
                    self._clock_moved.set()  # the next pass, a poll later
            with self._lock:
                kicked = self._reason is not None
            if kicked:
                self._stopping.wait(KICK_FOLD_SECONDS)
                with self._lock:
                    reason, self._reason = self._reason or "kick", None
                if self._stopping.is_set():
                    break
                return reason, dict(WAKE_INPUT)  # an invoke sends what the schedule does
            due, wait = self._due_schedule()
            if due is not None:
                return due
            self._wakeup.wait(min(self.poll, wait))
        return None

    def _due_schedule(self) -> tuple[tuple[str, Any] | None, float]:
        """The schedule's reason and input if it is registered, not fired yet, and due;
        else None and how long until its instant (at most a poll)."""
        try:
            registered = read_schedule(self.runtime.client("scheduler"))
        except Exception:
            log.exception("could not read the wake schedule; trying again")
            return None, self.poll
        if registered is None:
            self._fired = None
            return None, self.poll
        if registered.version == self._fired:
            return None, self.poll
        early = (registered.at - (datetime.now(UTC) + self._offset)).total_seconds()
        if early > 0:
            return None, early
        self._fired = registered.version
        return (f"schedule at {registered.describe()}", registered.input), 0.0

    def _invoke(self, reason: str, event: Any) -> None:
        """One wake invocation, as Lambda makes it; logged with what it did."""
        self.invocations += 1
        started = time.monotonic()
        try:
            result = lambda_handlers.wake(event, LocalContext(self.invocation_seconds))
        except Exception:
            # Lambda would retry an asynchronous invoke twice; the next kick or schedule will.
            log.exception("wake (%s) failed", reason)
            return
        finally:
            self._release()
        try:
            registered = read_schedule(self.runtime.client("scheduler"))
        except Exception:
            log.exception("could not read the wake schedule")
            registered = None
        took = time.monotonic() - started
        log.info("wake (%s): %s, in %.2f s", reason, describe_result(result, registered), took)

    def _engine(self) -> AsyncEngine:
        return self.runtime.run(self.runtime.container()).engine

    def _release(self) -> None:
        """Close the container's pooled connections: none is held until the next invocation."""
        self.runtime.run(self._engine().dispose())


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


# -- the HTTP app -----------------------------------------------------------------------------


def configure_like_lambda(app: FastAPI, rt: Runtime, firer: Firer, engine: AsyncEngine) -> None:
    """Give the dev app what the `http` entry's `Runtime` gives the app it serves on Lambda.

    `wake` and `drain` run in this container, as `POST /wake` and `/drain`
    do on AWS; `kick` is the scheduler's kick, whose invoke the firer gets.
    The /dev routes that start runs (`/dev/onboarding`) do not call
    `app.state.kick`: the connection's commit kicks reach the firer instead,
    as `kick_wake_after_commits` does for a `connect_workflows` process on AWS.
    A clock move is told to the firer; `engine`, the container's, holds no
    connection once no request is in flight.
    """
    http_events.serve(rt, app)
    app.state.clock_moved = firer.clock_moved
    app.add_middleware(ReleaseWhenIdle, engine=engine)

    def commit_kick(workflow: str) -> None:
        firer.kick()

    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(served: Any) -> AsyncIterator[Any]:
        async with inner(served) as state:
            connection = served.state.connection
            connection.kicks.append(commit_kick)
            await engine.dispose()  # what starting the app read
            try:
                yield state
            finally:
                connection.kicks.remove(commit_kick)

    app.router.lifespan_context = lifespan


class ReleaseWhenIdle:
    """ASGI middleware: when the last request in flight ends, close the engine's pooled
    connections, so the HTTP container holds none between invocations."""

    def __init__(self, app: ASGIApp, engine: AsyncEngine) -> None:
        self.app = app
        self.engine = engine
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                await self.engine.dispose()


async def prepare_tables(engine: AsyncEngine) -> None:
    """Create the schedule row's and the slots' tables; start from what a fresh moto holds.

    No schedule registered, no wake slot held: the row would otherwise say an
    earlier run's schedule exists, and a wake telling the same instant would
    not register it again; a slot held by a `duly dev` that was killed would
    refuse wakes until its lease ended.
    """
    async with engine.begin() as conn:
        for metadata in (scheduler_tables.metadata, slot_tables.metadata):
            await conn.run_sync(metadata.create_all)
        await conn.execute(update(wake_schedule).values(at=None, owner=None))
        await conn.execute(update(wake_slots).values(held_until=None, holder=None))


@dataclass(frozen=True)
class LocalServerless:
    """What `duly dev --serverless` serves and shows."""

    app: FastAPI
    endpoint: str  # moto's URL
    group: str
    schedule: str
    firer: Firer


@contextlib.asynccontextmanager
async def serverless(
    engine: AsyncEngine, url: str, app_module: str, bind_host: str = DEFAULT_BIND_HOST
) -> AsyncIterator[LocalServerless]:
    """moto, the wake container and its firer, and the HTTP app on this loop; stopped after.

    `engine` is the schema's (the tables exist); the app gets a `Runtime`
    container of its own on this loop, configured as on Lambda.
    """
    settings = local_settings(url, app_module)
    await prepare_tables(engine)
    await engine.dispose()  # the schema's engine: nothing more to read with it while serving
    aws = LocalAws()
    aws.start()
    try:
        firer = Firer(settings, aws.client)
        await asyncio.to_thread(firer.start)
        try:
            rt = Runtime(settings, invoke=firer.invoked, clients=aws.client)
            container = await rt.container()
            try:
                app = create_dev_app(container.Session, run_worker=False, bind_host=bind_host)
                configure_like_lambda(app, rt, firer, container.engine)
                # Runs started before (the demo, an earlier session's) were never kicked:
                # on AWS the safety-net schedule would find them, here this first wake does.
                firer.kick("start")
                yield LocalServerless(app, aws.endpoint, GROUP, DEFAULT_NAME, firer)
            finally:
                await container.engine.dispose()
        finally:
            await asyncio.to_thread(firer.stop)
    finally:
        aws.stop()
