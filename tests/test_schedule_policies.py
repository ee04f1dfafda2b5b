"""every()'s policies on the real database, the clock moved, never slept: missed firings,
overlapping ones, and a failed firing that leaves its schedule going (or ends it)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import String, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    InvalidArgumentError,
    StepFailed,
    Workflow,
    connect_workflows,
    declare_engine_tables,
    every,
    step,
)
from engine.model.registry import workflow_info
from engine.runs.schedules import steer_schedule
from engine.testing import drain, move_clock
from tests.conftest import Database
from tests.helpers import fetch

HOUR = timedelta(hours=1)
BACKOFF = timedelta(minutes=10)

policies: dict[str, dict[str, Any]] = {}  # every()'s keyword arguments, by the chore's name
failing: dict[str, int] = {}  # how many of a chore's next attempts raise
ran: list[str] = []  # every attempt, by the chore's name
schedules: dict[str, Any] = {}  # a chore's schedule, when not hourly
stopping: set[str] = set()  # chores whose next firing raises StepFailed


def on_the_hour(at: datetime) -> datetime:
    """A function schedule the worker can find again by its name."""
    return (at + HOUR).replace(minute=0, second=0, microsecond=0)


class Base(DeclarativeBase):
    pass


class Chore(Base, Workflow):
    """An hourly job whose policy and failures the test sets under its name."""

    __tablename__ = "policy_chore"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    count: Mapped[int] = mapped_column(default=0)

    @step(retries=1, backoff=BACKOFF, max_backoff=BACKOFF)
    async def tick(self) -> object:
        ran.append(self.name)
        if failing.get(self.name, 0) > 0:
            failing[self.name] -= 1
            raise RuntimeError("the provider is down")
        if self.name in stopping:
            raise StepFailed("the account is closed")
        self.count += 1
        return every(Chore.tick, schedules.get(self.name, HOUR), **policies.get(self.name, {}))


declare_engine_tables(Base, events=False, names={"attempt_log": "policy_chore_attempt"})
Session = async_sessionmaker[AsyncSession]


@pytest.fixture(autouse=True)
def fresh() -> None:
    policies.clear()
    failing.clear()
    ran.clear()
    schedules.clear()
    stopping.clear()


async def started(Session: Session, name: str, **policy: Any) -> Chore:
    """A chore on its schedule after its first firing (at t0; it next fires at t0 + 1h)."""
    policies[name] = policy
    async with connect_workflows(Session, workflows=[Chore]):
        row = Chore(name=name)
        assert await row.start(Chore.tick)
    await drain(Session, [Chore])
    stored = await fetch(Session, Chore, row.id)
    assert stored.count == 1 and stored.wake_at is not None
    return stored


async def jumped(db: Database, **policy: Any) -> tuple[Chore, Chore]:
    """A chore before and after five and a half hours with no worker, then a drain."""
    Session = await db.create(Base.metadata)
    before = await started(Session, "report", **policy)
    await move_clock(Session, timedelta(hours=5, minutes=30))
    await drain(Session, [Chore])
    return before, await fetch(Session, Chore, before.id)


async def test_missed_skip_runs_the_late_firing_and_skips_the_rest(db: Database) -> None:
    before, after = await jumped(db)  # the default; missed="skip" says it too
    assert after.count == 2, "the firing it waited for, late; the four it missed: none"
    assert after.wake_at == before.wake_at + 5 * HOUR, "then on its grid, after now"


async def test_missed_once_makes_up_the_missed_firings_with_one(db: Database) -> None:
    before, after = await jumped(db, missed="once")
    assert after.count == 3, "the late firing, then one for the four it missed"
    assert after.wake_at == before.wake_at + 5 * HOUR


async def test_missed_each_runs_every_missed_firing(db: Database) -> None:
    before, after = await jumped(db, missed="each", up_to=10)
    assert after.count == 6, "the late firing and each of the four missed"
    assert after.wake_at == before.wake_at + 5 * HOUR


async def test_missed_each_makes_up_at_most_up_to(db: Database) -> None:
    before, after = await jumped(db, missed="each", up_to=2)
    assert after.count == 4, "the late firing and the latest two missed"
    assert after.wake_at == before.wake_at + 5 * HOUR


async def test_nothing_missed_nothing_made_up(db: Database) -> None:
    Session = await db.create(Base.metadata)
    before = await started(Session, "report", missed="each", up_to=10)
    for _ in range(3):
        await move_clock(Session, HOUR)
        await drain(Session, [Chore])
    after = await fetch(Session, Chore, before.id)
    assert after.count == 4 and after.wake_at == before.wake_at + 3 * HOUR


async def retried_across_an_occurrence(db: Database, **policy: Any) -> tuple[Chore, Chore]:
    """A firing that fails once, then succeeds on its retry 1.5 hours later: the next
    occurrence came due while it was still retrying."""
    Session = await db.create(Base.metadata)
    before = await started(Session, "sync", **policy)
    failing["sync"] = 1
    await move_clock(Session, HOUR)
    await drain(Session, [Chore])
    retrying = await fetch(Session, Chore, before.id)
    assert retrying.attempts == 1 and retrying.count == 1
    await move_clock(Session, timedelta(minutes=90))
    await drain(Session, [Chore])
    return before, await fetch(Session, Chore, before.id)


async def test_overlap_skip_drops_the_occurrence_that_came_due_while_retrying(
    db: Database,
) -> None:
    before, after = await retried_across_an_occurrence(db)
    assert after.count == 2 and ran == ["sync", "sync", "sync"]
    assert after.wake_at == before.wake_at + 2 * HOUR


async def test_overlap_queue_runs_it_once_the_firing_ends(db: Database) -> None:
    before, after = await retried_across_an_occurrence(db, overlap="queue")
    assert after.count == 3, "the retried firing, then the one queued behind it"
    assert after.wake_at == before.wake_at + 2 * HOUR


async def test_overlap_is_not_missed(db: Database) -> None:
    """An occurrence that came due while a firing retried is overlap's, not missed's."""
    _, after = await retried_across_an_occurrence(db, missed="once")
    assert after.count == 2


async def failed_firing(Session: Session, name: str, **policy: Any) -> tuple[Chore, Chore]:
    """A chore whose next firing fails, its retry too: before, and as it stands after."""
    before = await started(Session, name, **policy)
    failing[name] = 2
    await move_clock(Session, HOUR)
    await drain(Session, [Chore])
    await move_clock(Session, BACKOFF)
    await drain(Session, [Chore])
    return before, await fetch(Session, Chore, before.id)


async def test_a_failed_firing_keeps_its_schedule(db: Database) -> None:
    Session = await db.create(Base.metadata)
    before, after = await failed_firing(Session, "billing")
    assert after.next_step == "tick" and after.attempts == 0
    assert after.last_error == "RuntimeError: the provider is down"
    assert after.wake_at == before.wake_at + HOUR, "its next occurrence, on its grid"
    async with connect_workflows(Session, workflows=[Chore]):
        outcomes = [attempt.outcome for attempt in await after.history()]
    assert outcomes[-2:] == ["retry", "failed"]
    await move_clock(Session, HOUR)
    await drain(Session, [Chore])
    assert (await fetch(Session, Chore, before.id)).count == 2, "the next firing runs"


async def test_a_function_schedule_found_by_its_name_goes_on_after_a_failure(
    db: Database,
) -> None:
    Session = await db.create(Base.metadata)
    schedules["hourly"] = on_the_hour
    _, after = await failed_firing(Session, "hourly")
    assert after.next_step == "tick" and after.last_error is not None
    assert after.wake_at is not None and (after.wake_at.minute, after.wake_at.second) == (0, 0)


async def test_a_lambda_schedule_cannot_be_asked_again_and_ends(db: Database) -> None:
    Session = await db.create(Base.metadata)
    schedules["anonymous"] = lambda at: at + HOUR
    _, after = await failed_firing(Session, "anonymous")
    assert after.next_step is None and after.last_error is not None


async def test_stop_on_failure_ends_the_schedule(db: Database) -> None:
    Session = await db.create(Base.metadata)
    _, after = await failed_firing(Session, "strict", stop_on_failure=True)
    assert after.next_step is None and after.wake_at is None
    assert after.last_error == "RuntimeError: the provider is down"


async def test_a_step_failed_firing_stops_its_schedule(db: Database) -> None:
    """StepFailed (or a stop_on error) stops the run, as it does any run: no retry, no next."""
    Session = await db.create(Base.metadata)
    before = await started(Session, "closed")
    stopping.add("closed")
    await move_clock(Session, HOUR)
    await drain(Session, [Chore])
    after = await fetch(Session, Chore, before.id)
    assert after.next_step is None and after.last_error == "StepFailed: the account is closed"


async def test_a_trigger_counts_on_from_its_instant(db: Database) -> None:
    Session = await db.create(Base.metadata)
    before = await started(Session, "report", missed="once")
    await move_clock(Session, timedelta(minutes=20))
    async with connect_workflows(Session, workflows=[Chore]) as connection:
        steered = await steer_schedule(connection, workflow_info(Chore), (before.id,), "trigger")
    await drain(Session, [Chore])
    after = await fetch(Session, Chore, before.id)
    assert after.count == 2 and steered.next_firing is not None
    assert after.wake_at == steered.next_firing + HOUR


async def test_the_policy_travels_in_the_schedules_entry(db: Database) -> None:
    Session = await db.create(Base.metadata)
    before = await started(Session, "report", missed="each", up_to=3, overlap="queue")
    async with Session() as session:
        args = (await session.execute(select(Chore.next_args))).scalar_one()
    entry = args["schedule"]
    assert (entry["missed"], entry["up_to"], entry["overlap"]) == ("each", 3, "queue")
    assert entry["occurrence"] == before.wake_at.isoformat()


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ({"missed": "sometimes"}, "missed='skip', 'once' or 'each'"),
        ({"missed": "each"}, "needs up_to=N"),
        ({"missed": "each", "up_to": 0}, "needs up_to=N"),
        ({"missed": "each", "up_to": True}, "needs up_to=N"),
        ({"missed": "once", "up_to": 3}, "up_to only with missed='each'"),
        ({"overlap": "parallel"}, "overlap='skip' or 'queue'"),
        ({"stop_on_failure": "yes"}, "stop_on_failure=True or False"),
    ],
)
def test_every_refuses_a_policy_it_does_not_know(policy: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says.replace("(", r"\(")):
        every(Chore.tick, HOUR, **policy)
