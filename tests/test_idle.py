"""The idle contract: on_idle told once per change, wake(timeout), and their options."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event as sa_event, func, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from engine import NotRunningError, run_workflows, wake
from engine.base.clock import db_now
from engine.testing import move_clock
from engine.worker import loop as worker_module
from tests.apps import behaviour
from tests.apps.behaviour import Held, Timer
from tests.conftest import Database
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("fresh_behaviour")


async def earliest_due(Session) -> datetime | None:  # type: ignore[no-untyped-def]
    async with Session() as session:
        return await session.scalar(
            select(func.min(Timer.wake_at)).where(Timer.next_step.isnot(None))
        )


async def test_on_idle_is_told_once_per_change_not_once_per_pass(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    told: list[datetime | None] = []
    async with run_workflows(Session, workflows=[Timer], on_idle=told.append) as worker:
        assert await wake(5)
        assert told == [None], "nothing is scheduled"
        assert await Timer().start(Timer.arm)
        assert await wake(5)
        reports, passes = len(told), worker.passes
        while worker.passes < passes + 100:
            worker.kick("*")
            await asyncio.sleep(0.002)
        assert await wake(5)
    assert len(told) == reports, "a hundred passes, the same instant: not told again"
    assert told[-1] == await earliest_due(Session)


async def test_a_pass_whose_question_raced_a_commit_does_not_count_as_caught_up(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer came from before a running step's commit: wake() waits for a fresh one."""
    Session = await db.create(behaviour.Base.metadata)
    real_next_due = worker_module.next_due

    asking = asyncio.Event()  # set once the step is running: the next question races it

    async def release_while_answering(*args: Any, **kwargs: Any) -> Any:
        answer = await real_next_due(*args, **kwargs)
        if asking.is_set() and not behaviour.release.is_set():
            # The held step finishes and commits after the question, before the pass ends.
            behaviour.release.set()
            await wait_until(lambda: not worker._claims)
        return answer

    monkeypatch.setattr(worker_module, "next_due", release_while_answering)
    told: list[datetime | None] = []
    # No listener: the only looks are the kicks of start() and wake(), in that order.
    async with run_workflows(
        Session, workflows=[Held], on_idle=told.append, suspends_when_idle=True
    ) as worker:
        assert await Held().start(Held.work)
        await wait_until(lambda: behaviour.holding)
        asking.set()
        assert await wake(5)
        reported = told[-1]
    # Not the running step's lease end (five minutes away): the run has finished.
    assert reported is None


async def test_the_reported_instant_is_the_databases_earliest_due_time(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    told: list[datetime | None] = []
    await move_clock(Session, timedelta(days=10))
    async with run_workflows(Session, workflows=[Timer], on_idle=told.append):
        for _ in range(3):
            assert await Timer().start(Timer.arm)
        assert await wake(5)
        expected = await earliest_due(Session)
        async with Session() as session:
            now = await session.scalar(select(db_now()))
    assert told[-1] == expected
    assert expected is not None and now is not None
    assert timedelta(hours=23) < expected - now <= timedelta(days=1), "on the moved clock"


async def test_wake_returns_true_only_when_caught_up_and_false_on_timeout(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Held], on_idle=lambda at: None):
        row = Held()
        assert await row.start(Held.work)
        await wait_until(lambda: behaviour.holding)
        assert not await wake(0.3), "a step is still running"
        behaviour.release.set()
        assert await wake(5)


async def test_a_ninth_concurrent_caller_returns_false_at_once(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Held]):
        assert await Held().start(Held.work)
        await wait_until(lambda: behaviour.holding)
        waiting = [asyncio.create_task(wake(10)) for _ in range(8)]
        await asyncio.sleep(0.05)
        started = asyncio.get_running_loop().time()
        assert not await wake(10)
        assert asyncio.get_running_loop().time() - started < 0.1
        behaviour.release.set()
        assert all(await asyncio.gather(*waiting))


async def test_wake_without_a_worker_is_a_clear_error() -> None:
    with pytest.raises(NotRunningError, match="run_workflows"):
        await wake(1)


async def test_suspends_when_idle_and_listen_engine_together_are_refused(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    with pytest.raises(ValueError, match="not both"):
        async with run_workflows(
            Session, workflows=[Timer], suspends_when_idle=True, listen_engine=db.engine()
        ):
            pass


async def test_suspends_when_idle_listens_for_nothing_and_waits_an_hour(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer], suspends_when_idle=True) as worker:
        assert worker.listener is None
        assert worker.options.max_idle_interval == timedelta(hours=1)
        row = Timer()
        assert await row.start(Timer.arm)  # a start in this process still kicks it
        assert await wake(5)


async def test_listen_engine_holds_the_listen_connection(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    direct = db.engine()
    async with run_workflows(Session, workflows=[Timer], listen_engine=direct) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 5)
        applications = db.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'duly-listener'"
        )
        assert applications[0][0] >= 1


async def test_the_listen_connection_is_made_by_the_listen_engine(db: Database) -> None:
    """Its connect_args and do_connect hooks apply (an RDS IAM token would be set there)."""
    Session = await db.create(behaviour.Base.metadata)
    hooked: list[str] = []
    listen_engine = create_async_engine(
        db.url, connect_args={"application_name": "my-listener"}, poolclass=NullPool
    )

    @sa_event.listens_for(listen_engine.sync_engine, "do_connect")
    def token(dialect: Any, conn_rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        hooked.append(cparams.get("application_name", ""))

    try:
        async with run_workflows(Session, workflows=[Timer], listen_engine=listen_engine) as worker:
            assert worker.listener is not None
            await asyncio.wait_for(worker.listener.connected.wait(), 5)
            listening = db.sql(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = 'LISTEN duly'"
            )
            assert listening == [("my-listener",)]
            assert hooked == ["my-listener"]
            # And it still hears: a start elsewhere is announced and taken at once.
            async with Session() as session:
                await session.execute(text("NOTIFY duly, 'timer'"))
                await session.commit()
    finally:
        await listen_engine.dispose()


async def test_a_platform_that_sleeps_until_on_idle_drives_onboarding_to_completion(
    db: Database,
) -> None:
    """Stands in for a serverless platform: start a worker, wake it, stop it, sleep until
    the instant on_idle last reported (on the moved clock), and again."""
    from functions import examples
    from functions.examples import Onboarding

    Session = await db.create(examples.Base.metadata)
    examples.sent_emails.clear()
    told: list[datetime | None] = []
    reported: datetime | None = None
    rounds = 0
    while rounds < 10:
        rounds += 1
        async with run_workflows(
            Session, workflows=[Onboarding], suspends_when_idle=True, on_idle=told.append
        ):
            if rounds == 1:
                assert await Onboarding(user_id="p1", email="p1@example.com").start(
                    Onboarding.welcome
                )
            assert await wake(10)
        reported = told[-1]
        if reported is None:
            break  # nothing left to wait for: the platform deletes its schedule
        async with Session() as session:
            now = await session.scalar(select(db_now()))
            earliest = await session.scalar(
                select(func.min(Onboarding.wake_at)).where(Onboarding.next_step.isnot(None))
            )
        assert now is not None and earliest is not None
        assert earliest >= reported, "no work is due before the instant last reported"
        await move_clock(Session, max(reported - now, timedelta(0)))
    assert reported is None, f"still waiting after {rounds} rounds"
    assert [t for _, t in examples.sent_emails] == ["welcome", "nudge_1", "nudge_2"]


async def test_timers_fire_on_time_when_the_listener_is_killed(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(
        Session, workflows=[behaviour.Alarm], max_idle_interval=timedelta(seconds=30)
    ) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 5)
        killed = db.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'duly-listener' AND datname = current_database()"
        )
        assert killed == [(True,)]
        row = behaviour.Alarm()
        armed_at = asyncio.get_running_loop().time()
        assert await row.start(behaviour.Alarm.arm(300))

        async def rang() -> bool:
            async with Session() as session:
                stored = await session.get(behaviour.Alarm, row.id, populate_existing=True)
                return stored is not None and stored.rang_at is not None

        await wait_until(rang, timeout=3)
        assert asyncio.get_running_loop().time() - armed_at < 0.8, "on time, listener or not"
        await asyncio.wait_for(worker.listener.connected.wait(), 5)
        assert worker.listener.reconnects >= 1


async def test_wake_is_not_true_until_on_idle_has_been_told(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    failing = [True]

    def register(at: datetime | None) -> None:
        if failing[0]:
            raise ConnectionError("the scheduler is down")

    async with run_workflows(Session, workflows=[Timer], on_idle=register):
        assert not await wake(0.5), "caught up, but the platform was not told"
        failing[0] = False
        assert await wake(5)


async def test_a_listener_that_cannot_connect_backs_off_to_the_idle_interval() -> None:
    from engine.worker.listener import Listener

    nowhere = create_async_engine(
        "postgresql+psycopg://nobody@/nowhere?host=/nonexistent-socket-dir"
    )
    listener = Listener(nowhere, lambda payload: None, max_retry_delay=0.4)
    began = time.monotonic()
    task = asyncio.create_task(listener.run())
    try:
        await wait_until(lambda: listener.reconnects >= 6, timeout=10)
        took = time.monotonic() - began
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Retries 0.1, 0.2, 0.4 s apart, then every 0.4 s (the bound): the sixth try comes after
    # 1.5 s of waits, never sooner; a delay that kept doubling would put it past 3 s.
    assert 1.5 * 0.95 <= took < 3.0, f"six tries took {took:.2f} s"


async def test_a_worker_rederives_its_wait_from_the_wall_clock_after_a_suspend(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    away = [0.0]  # seconds the machine "was suspended": the wall clock moved, the loop's not
    async with run_workflows(
        Session, workflows=[behaviour.Alarm], max_idle_interval=timedelta(minutes=5)
    ) as worker:
        worker.wall_clock = lambda: time.time() + away[0]
        worker.wall_clock_check = 0.05
        row = behaviour.Alarm()
        assert await row.start(behaviour.Alarm.arm(60_000))  # rings in a minute
        assert await wake(5)  # asleep now, for a minute by its own reckoning
        # Let any look already on its way (a late NOTIFY, a finished step's kick) end
        # first: one that began before the clocks moved would sleep a minute more. A
        # quiet spell with no look begun is what shows none is on its way.
        passes = -1
        while worker.passes != passes:
            passes = worker.passes
            await asyncio.sleep(0.3)
        # A minute passes while the machine is suspended: on the database's clock (moved
        # without a notification, as a real minute would pass), then on the wall clock.
        # The other way round, a look between the two would find nothing due yet and
        # sleep another minute by the jumped wall clock.
        db.sql("INSERT INTO duly_clock (id, shift) VALUES (1, interval '61 seconds')")
        away[0] = 61.0
        moved = time.monotonic()

        async def rang() -> bool:
            async with Session() as session:
                stored = await session.get(behaviour.Alarm, row.id, populate_existing=True)
                return stored is not None and stored.rang_at is not None

        await wait_until(rang, timeout=5)
        took = time.monotonic() - moved
    # The wall clock's check (every 50 ms here) found the minute gone: not a minute later.
    assert took < 2.0, f"it rang {took:.2f} s after the clocks moved"
