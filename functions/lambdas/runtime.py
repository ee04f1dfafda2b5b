"""What a Lambda container keeps between invocations: one event loop, one engine, the app.

Each is made on first use and kept for the container's life: one `asyncio.Runner` (mangum
runs the HTTP app on it too); an engine of `POOL_SIZE` kept connections with
`pool_pre_ping` and `prepare_threshold=None`; the app module (DULY_APP) and its event
registry; the workflow connection, the wake slots and the scheduler; boto3 clients; the
HTTP app, on the first HTTP event only. Under DULY_DATABASE_PAUSES an invocation's first
use reaches the database within its budget (`functions.lambdas.resting`) and `release`
closes the pool after it. Why each: docs/architecture.md, "On AWS Lambda".
A call to AWS after a committed write (`kick`, `invoke_another_wake`, `tell_idle`) never
raises: `infra.aws.kicks.survive_aws_call` logs and counts its failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from engine import Application, WorkerOptions, WorkflowConnection, open_connection
from functions.lambdas.resting import RETRY_AFTER_SECONDS, ConnectBound, connect_options, reach
from infra.app_config import app_application, mapped_event_tables, registry_before_app
from infra.aws.iam_auth import install_iam_auth
from infra.aws.kicks import survive_aws_call
from infra.aws.scheduler import WakeScheduler
from infra.aws.secret_login import RotatingSecret
from infra.aws.settings import AwsSettings, read_secret_string, resolve_database_url
from infra.aws.wake_slots import WakeSlots
from infra.schema import load_app

if TYPE_CHECKING:
    from types import TracebackType

    from engine import EventRegistry, EventTables, RetentionSettings


log = logging.getLogger("duly.lambda")

T = TypeVar("T")

WAKE_INPUT = {"duly": "wake"}  # what the scheduler and a kick send the wake function
POOL_SIZE = 2  # connections kept between invocations
POOL_RECYCLE = 300  # seconds: a kept connection older than this is replaced
DEFAULT_REMAINING = 60.0  # seconds, when an invocation has no Lambda context (a local call)
BOTO_TIMEOUTS = {"connect_timeout": 3, "read_timeout": 10}  # seconds
# Three tries in all: an AWS that cannot be reached (a VPC with no route to it) holds an
# answer about ten seconds at most before the failure is logged, not a minute.
BOTO_RETRIES = {"mode": "standard", "total_max_attempts": 3}


class Scheduler(Protocol):
    """What the runtime needs of `infra.aws.scheduler.WakeScheduler`."""

    async def on_idle(self, at: datetime | None) -> None: ...
    async def kick(self) -> None: ...
    async def keep_armed(self, at: datetime) -> None: ...


SchedulerFactory = Callable[["Runtime", AsyncEngine], Scheduler]
LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class Budget:
    """The time an invocation has: what was left at its start, and the margin kept at its end."""

    remaining: float  # seconds left when the invocation started
    margin: float  # seconds kept back at the end: stop claiming this long before the deadline
    started: float  # time.monotonic() at the start

    @classmethod
    def of(cls, context: Any, margin: float) -> Budget:
        """The budget of the invocation `context` belongs to (DEFAULT_REMAINING without one)."""
        remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
        remaining = remaining_ms() / 1000 if callable(remaining_ms) else DEFAULT_REMAINING
        return cls(float(remaining), float(margin), time.monotonic())

    def left(self) -> float:
        """Seconds until the invocation's deadline."""
        return self.remaining - (time.monotonic() - self.started)

    def until_stop(self) -> float:
        """Seconds until claiming must stop (the deadline less the margin)."""
        return self.left() - self.margin

    def lease(self) -> timedelta:
        """The claims' lease: no longer than the invocation, so a timeout strands nothing longer."""
        return timedelta(seconds=max(1.0, self.remaining))

    def shutdown(self) -> timedelta:
        """How long running steps may finish once claiming stops: half the margin, at most 10 s."""
        return timedelta(seconds=max(0.0, min(10.0, self.margin / 2)))


@dataclass
class Container:
    """The database side of a container, made once on its loop."""

    engine: AsyncEngine
    Session: async_sessionmaker[AsyncSession]
    connection: WorkflowConnection
    application: Application  # the app's, current in every invocation
    app_module: str
    registry: EventRegistry | None  # None: the app uses no event layer
    tables: EventTables | None  # the app's outbox, if it maps one
    slots: WakeSlots
    scheduler: Scheduler


def aws_scheduler(runtime: Runtime, engine: AsyncEngine) -> Scheduler:
    """`infra.aws.scheduler.WakeScheduler` for this deployment, on the runtime's clients."""
    settings = runtime.settings
    scheduler: Scheduler = WakeScheduler(
        engine,
        group=settings.schedule_group,
        target_arn=settings.wake_function_arn,
        role_arn=settings.scheduler_role_arn,
        client=lambda: runtime.client("scheduler"),
        invoke=runtime.invoke_wake,
    )
    return scheduler


class Runtime:
    """One container's state; the handlers use `runtime()`, tests make their own.

    `scheduler`, `invoke` and `clients` replace the AWS pieces (tests, `duly
    dev --serverless`): `invoke` is the asynchronous invocation of the wake
    function, `clients(service)` makes a boto3 client.
    """

    def __init__(
        self,
        settings: AwsSettings | None = None,
        *,
        scheduler: SchedulerFactory = aws_scheduler,
        invoke: Callable[[], Awaitable[None]] | None = None,
        clients: Callable[[str], Any] | None = None,
        max_concurrency: int = WorkerOptions.max_concurrency,
        engine_options: dict[str, Any] | None = None,
        retention: RetentionSettings | None = None,
    ) -> None:
        self._settings = settings
        self._retention = retention
        self._scheduler_factory = scheduler
        self._invoke = invoke
        self._client_factory = clients
        self.max_concurrency = max_concurrency
        self._engine_options = engine_options or {}
        self._runner: asyncio.Runner | None = None
        self._container: Container | None = None
        self._engine: AsyncEngine | None = None
        self._scheduler: Scheduler | None = None  # one with the container's engine
        self._reached_in: Budget | None = None  # the invocation that reached the database
        self._bound = ConnectBound()  # the connect timeout of that wait
        self._container_lock: asyncio.Lock | None = None
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self.http_handler: LambdaHandler | None = None  # the app through mangum, once built
        self.invoked_function_arn: str | None = None  # the last invocation's, for self-invokes
        self.budget: Budget | None = None  # the current invocation's (HTTP /wake reads it)

    # -- settings, loop, clients ------------------------------------------------------

    @property
    def settings(self) -> AwsSettings:
        """The settings given, else the environment's (read once)."""
        if self._settings is None:
            self._settings = AwsSettings.from_env()
        return self._settings

    @property
    def retention(self) -> RetentionSettings:
        """The retention settings given, else the environment's (read once, when first used)."""
        if self._retention is None:
            from engine import RetentionSettings

            self._retention = RetentionSettings.from_env()
        return self._retention

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The container's event loop."""
        return self._loop_runner().get_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` to its end on the container's loop."""
        return self._loop_runner().run(coroutine)

    def _loop_runner(self) -> asyncio.Runner:
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner

    def client(self, service: str) -> Any:
        """The container's boto3 client for `service`, made (and boto3 imported) on first use."""
        with self._clients_lock:
            found = self._clients.get(service)
            if found is None:
                found = self._clients[service] = self._make_client(service)
            return found

    def _make_client(self, service: str) -> Any:
        if self._client_factory is not None:
            return self._client_factory(service)
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            service, config=Config(**BOTO_TIMEOUTS, retries=BOTO_RETRIES)
        )

    def close(self) -> None:
        """Dispose of the engine (every pooled connection closed), forget the container and the
        AWS clients, close the loop: the next invocation makes them afresh (tests; SnapStart's
        before-snapshot hook, `functions.lambdas.snapshots`)."""
        with self._clients_lock:
            self._clients.clear()  # their HTTP connections too
        if self._runner is None:
            return
        if self._engine is not None:
            self.run(self._engine.dispose())
            self._container = self._engine = self._scheduler = None
        self._runner.close()
        self._runner = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- the database side ---------------------------------------------------------------

    async def container(self) -> Container:
        """The container's engine, app, registry, connection, slots and scheduler (under
        DULY_DATABASE_PAUSES, the database reached first in each invocation)."""
        if self.settings.database_pauses and self._reached_in is not self.budget:
            budget = self.budget or Budget.of(None, self.settings.wake_margin_seconds)
            await reach(self.engine(), self._bound, budget.until_stop())
            self._reached_in = self.budget
        if self._container is not None:
            return self._container
        if self._container_lock is None:
            self._container_lock = asyncio.Lock()
        async with self._container_lock:
            if self._container is None:
                self._container = await self._make_container()
        return self._container

    def engine(self) -> AsyncEngine:
        """The container's engine, made (no connection opened) on first use."""
        if self._engine is None:
            self._engine = self._make_engine()
        return self._engine

    def scheduler(self) -> Scheduler:
        """The container's scheduler, on its engine."""
        if self._scheduler is None:
            self._scheduler = self._scheduler_factory(self, self.engine())
        return self._scheduler

    async def release(self) -> None:
        """Under DULY_DATABASE_PAUSES, close the pooled connections: nothing holds the
        database awake once the invocation is done."""
        if self.settings.database_pauses and self._engine is not None:
            await self._engine.dispose()

    def _make_engine(self) -> AsyncEngine:
        settings = self.settings
        secret = self._rotating_secret()
        url = secret.url() if secret is not None else self._database_url()
        connect_args: dict[str, Any] = {"prepare_threshold": None}
        connect_args["application_name"] = "duly-lambda"
        if settings.database_pauses:
            connect_args.update(connect_options(url))
        options: dict[str, Any] = {
            "pool_size": POOL_SIZE,
            # The worker's steps, its claim, commit and lease upkeep each hold one at times.
            "max_overflow": self.max_concurrency + 4,
            "pool_pre_ping": True,
            "pool_recycle": POOL_RECYCLE,
            "connect_args": connect_args,
            **self._engine_options,
        }
        engine = create_async_engine(url, **options)
        if settings.database_pauses:
            self._bound.install(engine)  # first: the login's hooks below may connect
        if settings.database.iam_auth:
            install_iam_auth(engine, lambda: self.client("rds"))
        elif secret is not None:
            secret.install(engine)  # a rotated password is read again, not failed on
        return engine

    async def _make_container(self) -> Container:
        settings = self.settings
        engine = self.engine()
        Session = async_sessionmaker(engine, expire_on_commit=False)
        app_module = settings.app_module
        before = registry_before_app()
        metadatas = load_app(app_module)
        tables = mapped_event_tables(metadatas)
        application = app_application(app_module, metadatas, Session, before)
        registry = application.event_registry
        connection = await open_connection(Session)
        connection.application, application.connection = application, connection
        slots = WakeSlots(engine, max(1, int(settings.max_wakes)))
        scheduler = self.scheduler()
        return Container(
            engine, Session, connection, application, app_module, registry, tables, slots, scheduler
        )

    def _database_url(self) -> str:
        return resolve_database_url(self.settings, lambda: self.client("secretsmanager"))

    def _rotating_secret(self) -> RotatingSecret | None:
        """The secret's login, kept fresh, when the password comes from DULY_DATABASE_SECRET_ARN."""
        settings = self.settings
        if settings.database_url or not settings.database_secret_arn:
            return None
        if settings.database.iam_auth:
            return None  # a token per connection: the secret's password is never used

        def read() -> str:
            return read_secret_string(settings, self.client("secretsmanager"))

        return RotatingSecret(read, settings.database, settings.secret_max_age)

    # -- waking ----------------------------------------------------------------------

    async def invoke_wake(self) -> None:
        """Invoke the wake function asynchronously (InvocationType Event): it runs elsewhere."""
        if self._invoke is not None:
            await self._invoke()
            return
        await asyncio.to_thread(self._invoke_wake_now)

    def _invoke_wake_now(self) -> None:
        target = self.settings.wake_function_arn or self.invoked_function_arn
        if not target:
            raise RuntimeError("No wake function to invoke: set DULY_WAKE_FUNCTION_ARN.")
        self.client("lambda").invoke(
            FunctionName=target,
            InvocationType="Event",
            Payload=json.dumps(WAKE_INPUT).encode(),
        )

    async def kick(self) -> bool:
        """Make sure a wake comes now: one kick per invocation that left work ready (processes
        that address runs themselves debounce with `infra.aws.kicks`). Never raises: whether
        the kick was sent (a failure is logged and counted; the safety net bounds it)."""
        container = await self.container()
        return await survive_aws_call("kick", container.scheduler.kick)

    async def invoke_another_wake(self) -> bool:
        """Invoke one more wake now, as `kick` never raising; whether it was invoked."""
        return await survive_aws_call("kick", self.invoke_wake)

    async def tell_idle(self, at: datetime | None) -> None:
        """The wake's `on_idle`: register the next instant with the scheduler. AWS's failure
        is logged and counted, not raised (the row keeps what AWS has, and the next wake's
        tell writes it); the database's is raised, and the worker tells again next pass."""
        container = await self.container()

        async def register() -> None:
            await container.scheduler.on_idle(at)

        await survive_aws_call("schedule", register, aws_errors_only=True)

    async def keep_wake_armed(self) -> None:
        """Leave a wake-up to come, about one resume from now, when the database could not
        be reached (`WakeScheduler.keep_armed`); AWS's failure is logged and counted."""
        at = datetime.now(UTC) + timedelta(seconds=RETRY_AFTER_SECONDS)

        async def arm() -> None:
            await self.scheduler().keep_armed(at)

        await survive_aws_call("schedule", arm)


_runtime: list[Runtime] = []


def runtime() -> Runtime:
    """The container's runtime, made on first use."""
    if not _runtime:
        _runtime.append(Runtime())
    return _runtime[-1]


def existing() -> Runtime | None:
    """The container's runtime if one was made (None: nothing made, nothing to close)."""
    return _runtime[-1] if _runtime else None


def install(replacement: Runtime | None) -> Runtime | None:
    """Make `replacement` the container's runtime (None: made afresh on next use); the old one."""
    old = _runtime[-1] if _runtime else None
    _runtime.clear()
    if replacement is not None:
        _runtime.append(replacement)
    return old
