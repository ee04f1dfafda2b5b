"""A fake AWS deployment for the tests: Lambda's context, containers of the runtime, moto.

A "container" is a `Runtime` driven on a thread of its own, as the Lambda runtime calls
a handler (synchronously), with a fake context; EventBridge Scheduler is moto's (the
`moto_endpoint` fixture of tests/conftest.py), and the asynchronous invoke of the wake
function is a callable the test chooses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import boto3
import psycopg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.testing import drain as drain_steps
from functions.lambdas import handlers as lambda_handlers, work as lambda_work
from functions.lambdas.runtime import WAKE_INPUT, Runtime, Scheduler, install
from infra.aws.scheduler import WakeScheduler, metadata as schedule_metadata
from infra.aws.settings import AwsSettings
from infra.testing.pytest_plugin import Database
from tests.apps import serverless_app
from tests.apps.serverless_app import Signup
from tests.helpers import wait_until

APP = "tests.apps.serverless_app"
WAKE_ARN = "arn:aws:lambda:us-east-1:123456789012:function:duly-test-wake"
ROLE_ARN = "arn:aws:iam::123456789012:role/duly-test-scheduler"
# The settings of a deployed stack, as the template sets them (no database reached).
PROD_SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:duly-db-AbCdEf"
PROD_WAKE_ARN = "arn:aws:lambda:us-east-1:123456789012:function:duly-wake"
PROD_ROLE_ARN = "arn:aws:iam::123456789012:role/duly-scheduler"
PROD_ENV = {
    "DULY_DATABASE_SECRET_ARN": PROD_SECRET_ARN,
    "DULY_WAKE_FUNCTION_ARN": PROD_WAKE_ARN,
    "DULY_SCHEDULE_GROUP": "duly-prod",
    "DULY_SCHEDULER_ROLE_ARN": PROD_ROLE_ARN,
}
AWKWARD_PASSWORD = "p@ss:w/rd%?#&=+ é"  # every character a URL gives a meaning to
REGION = "us-east-1"
SETTLE_TIMEOUT = 60.0  # seconds for every wake invocation to end
SLOT_SAMPLE = 0.005  # seconds between looks at the wake slots
Entry = Callable[[Any, Any], dict[str, Any]]


# -- moto -------------------------------------------------------------------------------------


def aws_client(endpoint: str, service: str) -> Any:
    """A boto3 client of `service` on moto (a session per client: the default one is not
    safe across threads)."""
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


# -- the pieces of a fake deployment ------------------------------------------------------


@dataclass
class Context:
    """A Lambda context: the time left from when it was made, the function's ARN, and the
    invocation's request id."""

    remaining: float = 30.0  # seconds
    invoked_function_arn: str = WAKE_ARN
    started: float = field(default_factory=time.monotonic)
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_remaining_time_in_millis(self) -> int:
        return int((self.remaining - (time.monotonic() - self.started)) * 1000)


@dataclass
class Aws:
    """moto's scheduler, and this test's own schedule group on it."""

    endpoint: str
    group: str = field(default_factory=lambda: f"duly-{uuid.uuid4().hex[:10]}")

    def client(self, service: str) -> Any:
        return aws_client(self.endpoint, service)

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule of the group, as get_schedule answers."""
        client = self.client("scheduler")
        listed = client.list_schedules(GroupName=self.group)["Schedules"]
        return [client.get_schedule(Name=s["Name"], GroupName=self.group) for s in listed]


def settings_for(db: Database, group: str = "duly-test", **changes: Any) -> AwsSettings:
    """The settings of a deployment of the serverless test app on `db`."""
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
    """A `Function` for the block, closed at its end."""
    fn = Function(settings, **options)
    try:
        yield fn
    finally:
        await fn.close()


class FreshContainers:
    """Wake invocations, each in a fresh container: a thread with a runtime of its own,
    whose own invokes start more of them."""

    def __init__(self, settings: AwsSettings, max_concurrency: int = 4) -> None:
        self.settings = settings
        self.max_concurrency = max_concurrency
        self.results: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def _container(self) -> None:
        fn = Runtime(
            self.settings,
            scheduler=quiet_scheduler,
            invoke=self.invoke,
            max_concurrency=self.max_concurrency,
        )
        try:
            result = lambda_handlers.handle(lambda_work.wake, WAKE_INPUT, Context(30.0), fn)
        finally:
            fn.close()
        with self.lock:
            self.results.append(result)

    async def invoke(self) -> None:
        """Start one invocation of wake, as Lambda's Event invoke does: return at once."""
        thread = threading.Thread(target=self._container)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def _all_ended(self) -> bool:
        with self.lock:
            ended = all(not thread.is_alive() for thread in self.threads)
            return ended and len(self.results) == len(self.threads)

    async def settled(self) -> list[dict[str, Any]]:
        """Every invocation's result, once none runs (one may start another)."""
        await wait_until(self._all_ended, timeout=SETTLE_TIMEOUT, interval=0.05)
        with self.lock:
            return list(self.results)


class SlotWatch:
    """How many wake slots were held, sampled every few milliseconds from its own connection."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.held: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self.stopping.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM duly_wake_slots WHERE held_until > clock_timestamp()"
                ).fetchone()
                self.held.append(int(row[0]) if row else 0)
                time.sleep(SLOT_SAMPLE)

    def __enter__(self) -> SlotWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)

    @property
    def most(self) -> int:
        return max(self.held, default=0)


# -- the serverless test app's tables and requests ------------------------------------------


async def create_tables(db: Database) -> async_sessionmaker[AsyncSession]:
    """The serverless test app's tables and the wake schedule's, on `db`."""
    return await db.create(serverless_app.Base.metadata, schedule_metadata)


async def one_signup(Session: async_sessionmaker[AsyncSession]) -> Signup:
    """The one Signup row of the test."""
    async with Session() as session:
        return (await session.execute(select(Signup))).scalar_one()


def function_url_event(
    method: str, path: str, body: Any = None, query: str = "", *, caller: str | None = None
) -> dict[str, Any]:
    """A Function URL request (payload format 2.0, as HTTP API v2 sends it too); with
    `caller` (an ARN), as an AWS_IAM Function URL hands on a SigV4-signed call."""
    host = "abcdefghij.lambda-url.us-east-1.on.aws"
    event = {
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
    if caller is not None:
        # The signed call's own headers reach the function too, its SigV4 Authorization first.
        event["headers"] |= {  # type: ignore[operator]
            "authorization": "AWS4-HMAC-SHA256 Credential=ASIAEXAMPLE/20260101/us-east-1/"
            "lambda/aws4_request, SignedHeaders=host;x-amz-date, Signature=0123abcd",
            "x-amz-date": "20260101T000000Z",
            "x-amz-security-token": "FwoGZXIvYXdzEXAMPLE",
        }
        event["requestContext"]["authorizer"] = {  # type: ignore[index]
            "iam": {
                "accessKey": "ASIAEXAMPLE",
                "accountId": "123456789012",
                "callerId": "AROAEXAMPLE:session",
                "cognitoIdentity": None,
                "principalOrgId": None,
                "userArn": caller,
                "userId": "AROAEXAMPLE:session",
            }
        }
    return event


async def row_of(Session: async_sessionmaker[AsyncSession]) -> tuple[Any, ...]:
    """What a delivery would change on the one run: every engine column that moves."""
    async with Session() as session:
        signup = (await session.execute(select(Signup))).scalar_one()
        return (
            signup.status,
            signup.next_step,
            signup.waiting_for,
            signup.pending_event,
            signup.wf_version,
            signup.recent_event_keys,
        )


async def waiting_signup(Session: async_sessionmaker[AsyncSession]) -> int:
    """A signup run waiting for `confirm`; its key."""
    async with connect_workflows(Session):
        signup = Signup(email="same@example.com")
        await signup.start(Signup.nudge)
    await drain_steps(Session, [Signup])
    return signup.id
