"""A database that pauses (DULY_DATABASE_PAUSES), through tests/pausing_proxy.py: real stops.

The Lambda handlers run as on AWS (tests/aws_fakes.py: a container on a thread of its
own, EventBridge Scheduler on moto), and moto's schedules are fired by `Firer` when
their `at()` comes, as AWS fires them: nothing but the schedule wakes a resting run.
Between invocations the functions hold no connection and the proxy stops the server;
what arrives while it is stopped waits for its resume, or, out of time, answers a
retryable error and leaves a wake-up armed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import MetaData, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import NullPool

from engine import connect_workflows
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.resting import (
    RETRY_AFTER_SECONDS,
    DatabaseUnavailableError,
    connect_options,
)
from functions.lambdas.runtime import WAKE_INPUT
from infra.aws.scheduler import instant_of, metadata as schedule_metadata
from infra.testing.pytest_plugin import Database
from tests.apps import resting_app, serverless_app
from tests.apps.resting_app import Cycle
from tests.apps.serverless_app import SIGNUP, Outbox, Signup
from tests.aws_fakes import (
    Aws,
    Function,
    function,
    function_url_event,
    row_of,
    settings_for,
    waiting_signup,
)
from tests.helpers import wait_until
from tests.pausing_proxy import PausingProxy, pausing_proxy

__all__ = ["pausing_proxy"]  # the fixture, used by name

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

RESTING_APP = "tests.apps.resting_app"
OPS = "arn:aws:iam::123456789012:role/ops"
FIRE_POLL = 0.1  # seconds between looks at moto's schedules
RELEASED_WITHIN = 2.0  # seconds for a finished invocation's connections to be closed
STOPPED_SHARE = 0.9  # of each idle window, the server is stopped at least this much


# -- the pieces ----------------------------------------------------------------------------


def database_of(proxy: PausingProxy) -> Database:
    """The proxied database, as the Lambda test helpers take one."""
    return Database("postgres", proxy.url(), proxy.conninfo())


async def created(proxy: PausingProxy, *metadatas: MetaData) -> async_sessionmaker[AsyncSession]:
    """The tables of `metadatas` on the proxied database; a session factory that holds no
    connection between its sessions (the test's own reads must not keep it awake)."""
    engine = create_async_engine(proxy.url(), poolclass=NullPool)
    async with engine.begin() as conn:
        for metadata in metadatas:
            await conn.run_sync(metadata.create_all)
    return async_sessionmaker(engine, expire_on_commit=False)


async def released(proxy: PausingProxy, within: float = RELEASED_WITHIN) -> float:
    """Once no connection is open through the proxy, when (time.monotonic())."""
    await wait_until(lambda: proxy.open == 0, within, 0.005, "no connection held")
    return time.monotonic()


async def paused(proxy: PausingProxy) -> None:
    """Wait until the server is stopped."""
    await wait_until(lambda: proxy.stopped, 10.0, 0.01, "the database paused")


class Firer:
    """EventBridge Scheduler's part, which moto does not play: a schedule of the group is
    fired once its `at()` has come, with its target's input, through the wake handler."""

    def __init__(self, aws: Aws, fn: Function) -> None:
        self.aws, self.fn = aws, fn
        self.fired: set[tuple[str, str]] = set()

    async def next_due(self, timeout: float) -> dict[str, Any]:
        """Wait for a schedule whose instant has come and that was not fired; its input."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for schedule in await asyncio.to_thread(self.aws.schedules):
                fired = (schedule["Name"], schedule["ScheduleExpression"])
                at = instant_of(schedule["ScheduleExpression"])
                if at is not None and at <= datetime.now(UTC) and fired not in self.fired:
                    self.fired.add(fired)
                    found: dict[str, Any] = json.loads(schedule["Target"]["Input"])
                    return found
            await asyncio.sleep(FIRE_POLL)
        raise AssertionError(f"no schedule came due within {timeout} s")


# -- done when 1: a waiting run rests the database between its steps -----------------------


async def assert_rests_between_ticks(
    proxy: PausingProxy, moto_endpoint: str, cycles: int, wait: float
) -> None:
    """A run of `cycles` ticks `wait` seconds apart, woken by its schedule alone: each tick
    once, no connection held between ticks, the server stopped for most of each gap."""
    Session = await created(proxy, resting_app.Base.metadata, schedule_metadata)
    async with connect_workflows(Session, workflows=[Cycle]):
        run = Cycle(cycles=cycles, wait_seconds=wait)
        await run.start(Cycle.tick)
    aws = Aws(moto_endpoint)
    settings = settings_for(
        database_of(proxy), aws.group, app_module=RESTING_APP, database_pauses=True
    )
    gaps: list[tuple[float, float]] = []
    async with function(settings, aws=aws) as fn:
        firer = Firer(aws, fn)
        woken = [await fn.call(lambda_handlers.wake, WAKE_INPUT)]  # the start's kick
        while resting_app.ticks() < cycles:
            ended = await released(proxy)
            event = await firer.next_due(wait + 10.0)
            gaps.append((ended, time.monotonic()))
            woken.append(await fn.call(lambda_handlers.wake, event))
        await released(proxy)
        assert fn.invokes == 0, "every tick was woken by its schedule, none kicked"
        assert aws.schedules() == [], "the run is over: nothing left registered"
    assert [(w["steps"], w["caught_up"]) for w in woken] == [(1, True)] * cycles, woken
    expected = {(run.id, n): 1 for n in range(1, cycles + 1)}
    assert dict(resting_app.executions) == expected, "each tick ran exactly once"
    async with Session() as session:
        assert (await session.get(Cycle, run.id)).done == cycles  # type: ignore[union-attr]
    windows = proxy.idle_windows()
    for ended, began in gaps:
        assert any(w.start <= ended and w.end >= began for w in windows), "nothing connected"
        stopped = proxy.stopped_within(ended, began)
        assert stopped >= STOPPED_SHARE * (began - ended), (stopped, began - ended)
    assert proxy.pauses >= cycles - 1 and proxy.most_open <= 4


@pytest.mark.parametrize("pausing_proxy", [(0.1, 1.0)], indirect=True)
async def test_a_waiting_run_lets_the_database_pause_between_its_steps(
    pausing_proxy: PausingProxy, moto_endpoint: str
) -> None:
    resting_app.executions.clear()
    await assert_rests_between_ticks(pausing_proxy, moto_endpoint, cycles=4, wait=7.0)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("pausing_proxy", [(1.0, 3.0)], indirect=True)
async def test_soak_twenty_pauses_and_resumes_lose_no_wake_up(
    pausing_proxy: PausingProxy, moto_endpoint: str
) -> None:
    resting_app.executions.clear()
    await assert_rests_between_ticks(pausing_proxy, moto_endpoint, cycles=21, wait=20.0)


# -- done when 2: what arrives while the database is paused --------------------------------


def http_start(email: str) -> dict[str, Any]:
    """An IAM-signed POST /workflows/lambda_signup/start for a new signup."""
    body = {"row": {"email": email}, "step": "welcome"}
    return function_url_event("POST", "/workflows/lambda_signup/start", body, caller=OPS)


def confirm(key: int) -> dict[str, Any]:
    """The direct deliver event of `confirm` to the run `key`."""
    return {"workflow": "lambda_signup", "key": key, "step": "confirm", "args": {"code": "7"}}


async def emails(Session: async_sessionmaker[AsyncSession]) -> dict[str, str]:
    async with Session() as session:
        rows = (await session.execute(select(Signup.email, Signup.status))).all()
    return dict(rows)  # type: ignore[arg-type]


@pytest.mark.parametrize("pausing_proxy", [(0.25, 2.0)], indirect=True)
async def test_a_start_a_kick_and_a_delivery_to_a_paused_database_complete_after_it_resumes(
    pausing_proxy: PausingProxy,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DULY_ROLES", json.dumps({f"iam:{OPS}": ["operator"]}))
    proxy = pausing_proxy
    Session = await created(proxy, serverless_app.Base.metadata, schedule_metadata)
    key = await waiting_signup(Session)
    aws = Aws(moto_endpoint)
    settings = settings_for(database_of(proxy), aws.group, database_pauses=True)
    async with function(settings, aws=aws) as fn:
        with caplog.at_level(logging.INFO, logger="duly.lambda"):
            await paused(proxy)
            answer = await fn.call(lambda_handlers.http, http_start("ada@example.com"))
            assert answer["statusCode"] == 201, answer
            assert fn.invokes == 1, "the start kicked a wake"
            await released(proxy)

            await paused(proxy)
            woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)  # the kick's wake
            assert (woken["steps"], woken["caught_up"]) == (1, True), woken
            await released(proxy)

            await paused(proxy)
            delivered = await fn.call(lambda_handlers.deliver, confirm(key))
            assert (delivered["accepted"], delivered["taken"]) == (1, 1), delivered
            await released(proxy)
    assert proxy.resumes == 3
    waited = [r for r in caplog.records if r.getMessage().startswith("The database answered")]
    assert len(waited) == 3, "one line per invocation that waited for a resume"
    statuses = await emails(Session)
    assert statuses["ada@example.com"] == "welcomed"
    assert statuses["same@example.com"] == "nudged", "its confirmation is due, not yet run"


@pytest.mark.parametrize("pausing_proxy", [(0.25, 15.0)], indirect=True)
async def test_a_resume_slower_than_the_budget_leaves_the_wake_armed_and_loses_nothing(
    pausing_proxy: PausingProxy, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_ROLES", json.dumps({f"iam:{OPS}": ["operator"]}))
    proxy = pausing_proxy
    Session = await created(proxy, serverless_app.Base.metadata, schedule_metadata)
    key = await waiting_signup(Session)
    before = await row_of(Session)
    aws = Aws(moto_endpoint)
    settings = settings_for(database_of(proxy), aws.group, database_pauses=True)
    budget = 3.0  # seconds: one of them to wait for the database, the margin 2 s
    async with function(settings, aws=aws) as fn:
        await paused(proxy)
        with pytest.raises(DatabaseUnavailableError, match="retry in"):
            await fn.call(lambda_handlers.wake, WAKE_INPUT, remaining=budget)
        [armed] = aws.schedules()
        at = instant_of(armed["ScheduleExpression"])
        assert at is not None and at > datetime.now(UTC), "a wake-up is armed"
        assert json.loads(armed["Target"]["Input"]) == WAKE_INPUT

        answer = await fn.call(lambda_handlers.http, http_start("bo@example.com"), budget)
        assert answer["statusCode"] == 503, answer
        assert answer["headers"]["retry-after"] == str(RETRY_AFTER_SECONDS)
        assert json.loads(answer["body"])["type"] == "DatabaseUnavailableError"
        with pytest.raises(DatabaseUnavailableError):
            await fn.call(lambda_handlers.deliver, confirm(key), budget)
        event = {"event_type": SIGNUP, "event_id": "late", "payload": {"email": "c@example.com"}}
        with pytest.raises(DatabaseUnavailableError):
            await fn.call(lambda_handlers.publish, event, budget)
        assert proxy.stopped, "all asked during one resume"
        # The connections given up on are held by the proxy until the server is up.
        await released(proxy, proxy.resume_delay + RELEASED_WITHIN)
        assert fn.invokes == 0, "nothing was accepted, so nothing kicked"

        # After the resume: nothing was written, and the same requests are taken.
        assert await row_of(Session) == before
        assert await emails(Session) == {"same@example.com": "nudged"}
        async with Session() as session:
            assert (await session.execute(select(Outbox))).first() is None
        delivered = await fn.call(lambda_handlers.deliver, confirm(key))
        assert delivered["accepted"] == 1, delivered
        answer = await fn.call(lambda_handlers.http, http_start("bo@example.com"))
        assert answer["statusCode"] == 201, answer


@pytest.mark.parametrize("pausing_proxy", [(0.25, 6.0)], indirect=True)
async def test_a_wake_that_cannot_reach_the_database_leaves_a_pending_schedule_as_it_was(
    pausing_proxy: PausingProxy, moto_endpoint: str
) -> None:
    proxy = pausing_proxy
    Session = await created(proxy, serverless_app.Base.metadata, schedule_metadata)
    async with connect_workflows(Session):
        await Signup(email="ada@example.com").start(Signup.welcome)
    aws = Aws(moto_endpoint)
    settings = settings_for(database_of(proxy), aws.group, database_pauses=True)
    async with function(settings, aws=aws) as fn:
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert woken["steps"] == 1, woken
        [pending] = aws.schedules()  # the nudge, two hours on

        async def idle_bound() -> str:
            async with fn.runtime.engine().connect() as conn:
                shown = str(await conn.scalar(text("SHOW idle_session_timeout")))
            await fn.runtime.release()  # as every invocation ends
            return shown

        seen = await fn.call(lambda event, context: fn.runtime.run(idle_bound()), None)
        assert seen == "1min", "the server ends the functions' sessions idle a minute"
        await released(proxy)
        await paused(proxy)
        with pytest.raises(DatabaseUnavailableError):
            await fn.call(lambda_handlers.wake, WAKE_INPUT, remaining=3.0)
        [kept] = aws.schedules()
        assert kept["ScheduleExpression"] == pending["ScheduleExpression"], "not moved"
        with pytest.raises(DatabaseUnavailableError):  # the drain waits as the others do
            await fn.call(lambda_handlers.drain, {"duly": "drain"}, 3.0)
        await released(proxy, proxy.resume_delay + RELEASED_WITHIN)


def test_the_idle_bound_follows_the_options_a_url_already_has() -> None:
    plain = connect_options("postgresql+psycopg://duly@db.example.com/app")
    assert plain == {"options": "-c idle_session_timeout=60000"}
    neon = "postgresql+psycopg://duly@ep-x.aws.neon.tech/app?options=endpoint%3Dep-x"
    assert connect_options(neon) == {"options": "endpoint=ep-x -c idle_session_timeout=60000"}
