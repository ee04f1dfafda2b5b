"""every(): intervals that count from the last occurrence, missed ones collapsed; any function."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine import every, run_workflows
from engine.testing import move_clock
from tests.apps import behaviour
from tests.apps.behaviour import Ticker, Timer
from tests.conftest import Database
from tests.helpers import fetch, wait_until

HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def fresh_ticks() -> None:
    behaviour.ticks.clear()
    behaviour.schedule_of.clear()


async def counted(Session, row: Ticker, n: int) -> bool:  # type: ignore[no-untyped-def]
    stored = await fetch(Session, Ticker, row.id)
    return stored.count == n and stored.claimed_until is None


async def test_an_interval_counts_from_the_last_occurrence_not_the_finish(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["hourly"] = HOUR
    async with run_workflows(Session, workflows=[Ticker]):
        row = Ticker(name="hourly")
        assert await row.start(Ticker.tick)
        await wait_until(lambda: counted(Session, row, 1))
        first = (await fetch(Session, Ticker, row.id)).wake_at
        assert first is not None
        for n in range(2, 5):
            await move_clock(Session, HOUR)
            await wait_until(lambda n=n: counted(Session, row, n))
        later = (await fetch(Session, Ticker, row.id)).wake_at
    assert later == first + 3 * HOUR, "no drift: each occurrence is the last one plus an hour"


async def test_missed_occurrences_collapse_into_one_run(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["collapsing"] = HOUR
    async with run_workflows(Session, workflows=[Ticker]):
        row = Ticker(name="collapsing")
        assert await row.start(Ticker.tick)
        await wait_until(lambda: counted(Session, row, 1))
        first = (await fetch(Session, Ticker, row.id)).wake_at
        assert first is not None
        # Five and a half hours pass with nothing running: five occurrences were missed.
        await move_clock(Session, timedelta(hours=5, minutes=30))
        await wait_until(lambda: counted(Session, row, 2))
        stored = await fetch(Session, Ticker, row.id)
    assert behaviour.ticks == ["collapsing", "collapsing"]
    assert stored.wake_at == first + 5 * HOUR, "then it carries on on the same grid"


async def test_any_function_of_the_time_is_a_schedule(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["nine"] = lambda now: (now + timedelta(days=1)).replace(
        hour=9, minute=0, second=0, microsecond=0
    )
    async with run_workflows(Session, workflows=[Ticker]):
        row = Ticker(name="nine")
        assert await row.start(Ticker.tick)
        await wait_until(lambda: counted(Session, row, 1))
        stored = await fetch(Session, Ticker, row.id)
    assert stored.wake_at is not None
    assert (stored.wake_at.hour, stored.wake_at.minute) == (9, 0)
    assert stored.next_step == "tick"


async def test_a_schedule_that_returns_no_later_time_fails_the_attempt(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.schedule_of["stuck"] = lambda now: datetime(2000, 1, 1, tzinfo=UTC)
    async with run_workflows(Session, workflows=[Ticker]):
        row = Ticker(name="stuck")
        assert await row.start(Ticker.tick)

        async def failed() -> bool:
            return (await fetch(Session, Ticker, row.id)).last_error is not None

        await wait_until(failed)
    stored = await fetch(Session, Ticker, row.id)
    assert stored.last_error is not None and "2000-01-01" in stored.last_error
    assert stored.next_step is None and stored.count == 0, "the schedule is over"


def test_every_refuses_what_is_not_a_schedule() -> None:
    with pytest.raises(ValueError, match="positive interval"):
        every(Timer.fire, timedelta(0))
    with pytest.raises(TypeError, match="a Cron, or a function"):
        every(Timer.fire, "hourly")  # type: ignore[arg-type]
