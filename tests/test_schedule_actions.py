"""The schedules view and its actions: pause, resume, trigger, on a real database and worker."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import Cron, RunBusyError, connect_workflows, run_workflows
from engine.base.errors import NotFoundError
from engine.model.registry import workflow_info
from engine.runs.schedules import steer_schedule
from engine.testing import drain, move_clock
from engine.views.schedules import ScheduledRun, list_schedules
from tests.apps import behaviour
from tests.apps.behaviour import Ticker
from tests.conftest import Database
from tests.helpers import fetch, wait_until

HOUR = timedelta(hours=1)
TICKER = workflow_info(Ticker)


@pytest.fixture(autouse=True)
def fresh_ticks() -> None:
    behaviour.ticks.clear()
    behaviour.schedule_of.clear()


async def started(Session: async_sessionmaker[AsyncSession], name: str) -> Ticker:
    """A Ticker run on the schedule under `name`, after its first firing."""
    async with connect_workflows(Session, workflows=[Ticker]):
        row = Ticker(name=name)
        assert await row.start(Ticker.tick)
    await drain(Session, [Ticker])
    return await fetch(Session, Ticker, row.id)


async def schedule_of(Session: async_sessionmaker[AsyncSession], row: Ticker) -> ScheduledRun:
    async with connect_workflows(Session, workflows=[Ticker]) as connection:
        [found] = [s for s in await list_schedules(connection) if s.key == str(row.id)]
    return found


async def steer(Session: async_sessionmaker[AsyncSession], row: Ticker, action: str) -> None:
    async with connect_workflows(Session, workflows=[Ticker]) as connection:
        await steer_schedule(connection, TICKER, (row.id,), action)  # type: ignore[arg-type]


async def test_the_view_shows_each_kind_of_schedule_with_its_firings(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of |= {
        "cron": Cron("0 9 * * MON-FRI", "Europe/Paris"),
        "hourly": HOUR,
        "function": lambda now: now + HOUR,
    }
    rows = {name: await started(Session, name) for name in behaviour.schedule_of}
    cron, hourly, function = [await schedule_of(Session, rows[n]) for n in rows]
    assert (cron.kind, cron.timezone) == ("cron", "Europe/Paris")
    assert cron.expression == "0 9 * * MON-FRI"
    assert (hourly.kind, hourly.expression, hourly.timezone) == ("interval", "1:00:00", None)
    assert function.kind == "function" and "test_schedule_actions" in function.expression
    for run, row in ((cron, rows["cron"]), (hourly, rows["hourly"])):
        assert run.next_firing == row.wake_at and run.step == "tick"
        assert run.last_firing is not None and run.last_firing < run.next_firing
        assert not run.paused and not run.running
    assert cron.next_firing is not None and cron.next_firing.weekday() < 5


async def test_a_paused_schedule_fires_no_more_and_resumes_on_its_grid(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["hourly"] = HOUR
    row = await started(Session, "hourly")
    first_due = row.wake_at
    assert first_due is not None
    await steer(Session, row, "pause")
    paused = await fetch(Session, Ticker, row.id)
    assert paused.wake_at is None and paused.next_step == "tick"
    assert (await schedule_of(Session, row)).paused
    await move_clock(Session, timedelta(hours=2, minutes=30))
    assert await drain(Session, [Ticker]) == 0, "nothing fires while paused"
    await steer(Session, row, "resume")
    resumed = await fetch(Session, Ticker, row.id)
    assert resumed.count == 1
    assert resumed.wake_at == first_due + 2 * HOUR, "the next point of the grid after now"
    assert not (await schedule_of(Session, row)).paused


async def test_a_cron_resumes_at_its_next_time_and_a_function_now(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of |= {"cron": Cron("30 6 * * *"), "function": lambda now: now + HOUR}
    cron, function = await started(Session, "cron"), await started(Session, "function")
    for row in (cron, function):
        await steer(Session, row, "pause")
    await move_clock(Session, timedelta(days=3))
    for row in (cron, function):
        await steer(Session, row, "resume")
    resumed = await fetch(Session, Ticker, cron.id)
    assert resumed.wake_at is not None and (resumed.wake_at.hour, resumed.wake_at.minute) == (6, 30)
    assert resumed.wake_at > cron.wake_at + timedelta(days=2)  # type: ignore[operator]
    assert await drain(Session, [Ticker]) == 1, "the function's schedule fires now"
    assert (await fetch(Session, Ticker, function.id)).count == 2


async def test_trigger_fires_now_and_a_cron_keeps_its_times(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["cron"] = Cron("0 3 * * *")
    row = await started(Session, "cron")
    await steer(Session, row, "trigger")
    assert await drain(Session, [Ticker]) == 1
    fired = await fetch(Session, Ticker, row.id)
    assert fired.count == 2 and fired.wake_at == row.wake_at, "the next 03:00 still"
    last = (await schedule_of(Session, row)).last_firing
    assert last is not None and last > datetime.fromisoformat(row.next_args["schedule"]["fired_at"])


async def test_a_paused_schedule_triggered_fires_once_and_stays_paused(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["hourly"] = HOUR
    row = await started(Session, "hourly")
    await steer(Session, row, "pause")
    await steer(Session, row, "trigger")
    assert await drain(Session, [Ticker]) == 1
    fired = await fetch(Session, Ticker, row.id)
    assert fired.count == 2 and fired.wake_at is None
    assert (await schedule_of(Session, row)).paused
    await move_clock(Session, 3 * HOUR)
    assert await drain(Session, [Ticker]) == 0


async def test_a_run_whose_step_is_running_is_refused_without_waiting(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["hourly"] = HOUR
    row = await started(Session, "hourly")
    # A worker's claim or commit holds the row's lock: the action does not wait for it.
    async with Session() as holder, holder.begin():
        await holder.execute(text("SELECT 1 FROM ticker WHERE id = :id FOR UPDATE"), {"id": row.id})
        with pytest.raises(RunBusyError, match="running its step now"):
            await steer(Session, row, "pause")
    # A lease still running: its step has not committed yet.
    async with Session() as session, session.begin():
        leased = update(Ticker).where(Ticker.id == row.id)
        await session.execute(leased.values(claimed_until=datetime.now().astimezone() + HOUR))
    for action in ("pause", "resume", "trigger"):
        with pytest.raises(RunBusyError):
            await steer(Session, row, action)
    assert (await fetch(Session, Ticker, row.id)).wake_at == row.wake_at, "nothing moved"


async def test_unknown_keys_and_runs_off_schedule_are_not_found(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Ticker]) as connection:
        with pytest.raises(NotFoundError, match="No ticker run has the key 404"):
            await steer_schedule(connection, TICKER, (404,), "pause")
        row = Ticker(name="never")
        assert await row.start(Ticker.tick)  # not yet fired: no schedule written
        with pytest.raises(NotFoundError, match="is not on a schedule"):
            await steer_schedule(connection, TICKER, (row.id,), "pause")


async def test_a_paused_run_survives_a_worker_restart_and_is_never_claimed(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of |= {"paused": HOUR, "witness": HOUR}
    async with run_workflows(Session, workflows=[Ticker]):
        paused, witness = Ticker(name="paused"), Ticker(name="witness")
        assert await paused.start(Ticker.tick) and await witness.start(Ticker.tick)

        async def fired(row: Ticker, n: int) -> bool:
            stored = await fetch(Session, Ticker, row.id)
            return stored.count == n and stored.claimed_until is None

        await wait_until(lambda: fired(paused, 1))
        await wait_until(lambda: fired(witness, 1))
        await steer(Session, paused, "pause")
    # A new worker, two hours on: the witness fires twice over, the paused run never.
    await move_clock(Session, 2 * HOUR)
    async with run_workflows(Session, workflows=[Ticker]):
        await wait_until(lambda: fired(witness, 2))
        await move_clock(Session, HOUR)
        await wait_until(lambda: fired(witness, 3))
        stored = await fetch(Session, Ticker, paused.id)
    assert stored.count == 1 and stored.wake_at is None and stored.claimed_until is None
    assert behaviour.ticks.count("paused") == 1
