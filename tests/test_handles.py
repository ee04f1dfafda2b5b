"""Addressing runs from outside: run, cancel, get and all on Model.by(...)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from engine import DulyError, StepError, connect_workflows, run_workflows
from engine.testing import move_clock
from tests.apps import behaviour
from tests.apps.behaviour import Flaky, Held, Timer
from tests.conftest import Database
from tests.helpers import fetch, look_again, wait_until

pytestmark = pytest.mark.usefixtures("fresh_behaviour")


async def test_run_replaces_what_was_scheduled_and_runs_now(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = Timer(key="a")
        assert await row.start(Timer.arm)

        async def armed() -> bool:
            return (await fetch(Session, Timer, row.id)).next_step == "fire"

        await wait_until(armed)
        assert await Timer.by(Timer.key == "a").run(Timer.fire) == 1

        async def fired() -> bool:
            return (await fetch(Session, Timer, row.id)).fired == 1

        await wait_until(fired)
        assert (await fetch(Session, Timer, row.id)).next_step is None


async def test_run_rearms_a_finished_run(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = Timer(key="again")
        assert await row.start(Timer.fire)

        async def fired(n: int) -> bool:
            return (await fetch(Session, Timer, row.id)).fired == n

        await wait_until(lambda: fired(1))
        assert await Timer.by(Timer.id == row.id).run(Timer.fire) == 1
        await wait_until(lambda: fired(2))
    done = await fetch(Session, Timer, row.id)
    assert (done.fired, done.next_step, done.claimed_until) == (2, None, None), "ran again, once"


async def test_run_on_a_running_step_waits_for_it_and_discards_its_changes(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    lease = timedelta(minutes=10)
    async with run_workflows(Session, workflows=[Held], lease=lease) as worker:
        row = Held()
        assert await row.start(Held.work("first"))
        await wait_until(lambda: behaviour.holding == ["first"])
        assert await Held.by(Held.id == row.id).run(Held.work("second")) == 1
        await look_again(worker)  # a whole pass since, which would have started it
        assert behaviour.holding == ["first"], "the new step does not start beside the running one"
        released = time.monotonic()
        behaviour.release.set()

        async def second_done() -> bool:
            stored = await fetch(Session, Held, row.id)
            return stored.next_step is None and behaviour.holding == ["first", "second"]

        await wait_until(second_done)
        assert time.monotonic() - released < 1.0, (
            "started once the first was done, not at its lease"
        )
    stored = await fetch(Session, Held, row.id)
    assert stored.value == "run 2", "the preempted step's change was discarded"


async def test_run_checks_the_call_and_writes_nothing_when_it_is_wrong(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer, Flaky]):
        row = Timer(key="x")
        assert await row.start(Timer.arm)
        with pytest.raises(StepError, match=r"Flaky\.needs"):
            await Timer.by(Timer.id == row.id).run(Flaky.needs(1))
        with pytest.raises(StepError, match=r"Flaky\.needs"):
            await Flaky.by(Flaky.id == 1).run(Flaky.needs("a", "b"))  # type: ignore[call-arg]
        assert (await fetch(Session, Timer, row.id)).next_step == "arm"


async def test_cancel_ends_runs_where_they_stand_and_keeps_what_they_did(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        rows = [Timer(key=f"c{n}") for n in range(3)]
        for row in rows:
            assert await row.start(Timer.arm)

        async def all_armed() -> bool:
            return all([(await fetch(Session, Timer, r.id)).next_step == "fire" for r in rows])

        await wait_until(all_armed)
        assert await Timer.by(Timer.key.in_(["c0", "c1"])).cancel() == 2
        assert await Timer.by(Timer.key.in_(["c0", "c1"])).cancel() == 0, "already ended"
        await move_clock(Session, timedelta(days=2))

        async def last_fired() -> bool:
            return (await fetch(Session, Timer, rows[2].id)).fired == 1

        await wait_until(last_fired)
        await asyncio.sleep(0.1)
    for row in rows[:2]:
        stored = await fetch(Session, Timer, row.id)
        assert stored.fired == 0 and stored.next_step is None and stored.wake_at is None
        assert stored.key == row.key
        # It says it was cancelled, which a run that finished or gave up never does.
        assert (stored.last_error, stored.attempts) == ("cancelled", 0)
    assert (await fetch(Session, Timer, rows[2].id)).last_error is None


async def test_cancel_of_a_running_step_discards_its_commit(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Held]) as worker:
        row = Held()
        assert await row.start(Held.work("only"))
        await wait_until(lambda: behaviour.holding == ["only"])
        assert await Held.by(Held.id == row.id).cancel() == 1
        behaviour.release.set()
        assert await worker.wake(5), "the step ended (its commit refused) and nothing runs"
    stored = await fetch(Session, Held, row.id)
    assert stored.value == "" and stored.next_step is None and stored.claimed_until is None


async def test_get_and_all_read_runs(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        for key in ("g1", "g2"):
            assert await Timer(key=key).start(Timer.arm)
        one = await Timer.by(Timer.key == "g1").get()
        assert one is not None and one.key == "g1" and one.next_step == "arm"
        assert await Timer.by(Timer.key == "none").get() is None
        assert [t.key for t in await Timer.by(Timer.key.like("g%")).all()] == ["g1", "g2"]
        with pytest.raises(DulyError, match="More than one Timer"):
            await Timer.by(Timer.key.like("g%")).get()
