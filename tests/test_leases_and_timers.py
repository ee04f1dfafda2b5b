"""Leases are renewed while a step runs; a sleeping worker wakes when a timer is due."""

from __future__ import annotations

import time
from datetime import timedelta

from engine import run_workflows
from engine.testing import move_clock, read_clock_shift, reset_clock
from tests.apps import behaviour
from tests.apps.behaviour import Alarm, Lasting, Timer
from tests.conftest import Database
from tests.helpers import fetch, wait_until

LOOKS = 4  # looks at work held elsewhere, timed


async def test_a_running_step_keeps_its_row_past_its_lease(db: Database) -> None:
    behaviour.holding.clear()
    Session = await db.create(behaviour.Base.metadata)
    lease = timedelta(milliseconds=600)
    async with run_workflows(Session, workflows=[Lasting], lease=lease):
        row = Lasting()
        assert await row.start(Lasting.work(2.0))
        # A second worker looks the whole time: without renewals it takes the row at 0.6 s.
        async with run_workflows(
            Session, workflows=[Lasting], lease=lease, poll_interval=timedelta(milliseconds=50)
        ):

            async def finished() -> bool:
                return (await fetch(Session, Lasting, row.id)).next_step is None

            await wait_until(finished, timeout=6)
    assert behaviour.holding == ["lasting"], "the step ran once: nobody took its row"
    assert (await fetch(Session, Lasting, row.id)).runs == 1


async def test_a_sleeping_worker_wakes_when_its_next_timer_comes_due(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Alarm], max_idle_interval=timedelta(minutes=1)):
        row = Alarm()
        armed_at = time.time()
        assert await row.start(Alarm.arm(400))

        async def rang() -> bool:
            return (await fetch(Session, Alarm, row.id)).rang_at is not None

        await wait_until(rang, timeout=3)
    rang_at = (await fetch(Session, Alarm, row.id)).rang_at
    assert rang_at is not None
    assert 0.4 <= rang_at - armed_at < 0.8, "on time: no notification, only the timer"


async def test_reset_clock_puts_the_clock_back(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    assert await move_clock(Session, timedelta(days=3)) == timedelta(days=3)
    assert await move_clock(Session, timedelta(hours=-1)) == timedelta(days=3, hours=-1)
    assert await read_clock_shift(Session) == timedelta(days=2, hours=23)
    await reset_clock(Session)
    assert await read_clock_shift(Session) == timedelta(0)


async def test_drain_runs_what_is_due_now_and_nothing_later(db: Database) -> None:
    from engine import connect_workflows
    from engine.testing import drain

    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        rows = [Timer() for _ in range(3)]
        for row in rows:
            assert await row.start(Timer.arm)
    assert await drain(Session, [Timer]) == 3
    assert await drain(Session, [Timer]) == 0, "fire is a day away"
    await move_clock(Session, timedelta(days=1))
    assert await drain(Session, [Timer]) == 3
    assert all([(await fetch(Session, Timer, r.id)).fired == 1 for r in rows])


async def test_poll_interval_spaces_out_looks_at_work_due_but_held_elsewhere(
    db: Database,
) -> None:
    import asyncio

    import psycopg

    Session = await db.create(behaviour.Base.metadata)
    db.sql(
        "INSERT INTO timer (id, fired, next_step, next_args, wake_at, attempts, wf_version) "
        "VALUES (1, 0, 'fire', '{}', now() - interval '1 second', 0, 0)"
    )
    async with await psycopg.AsyncConnection.connect(db.conninfo) as locker:
        # Due, but another transaction holds the row: every claim passes it over.
        await locker.execute("SELECT 1 FROM timer WHERE id = 1 FOR UPDATE")
        async with run_workflows(
            Session,
            workflows=[Timer],
            poll_interval=timedelta(milliseconds=300),
            max_idle_interval=timedelta(seconds=30),
        ) as worker:
            # Past its first looks (the second comes at once): from here on, one a poll.
            await wait_until(lambda: worker.passes >= 3)
            started = worker.passes
            await wait_until(lambda: worker.passes > started)  # a look begins: time from here
            passes, began = worker.passes, time.monotonic()
            await wait_until(lambda: worker.passes >= passes + LOOKS, timeout=5)
            took = time.monotonic() - began
            await locker.commit()
            released = asyncio.get_running_loop().time()
            passes_at_release = worker.passes

            async def fired() -> bool:
                return (await fetch(Session, Timer, 1)).fired == 1

            await wait_until(fired, timeout=3)
            taken_after = asyncio.get_running_loop().time() - released
            looks_to_take_it = worker.passes - passes_at_release
    # LOOKS looks a poll_interval (0.3 s) apart, never sooner: a busy loop takes no time,
    # and about one a poll_interval (at most 0.5 s each, as three in 1.5 s was).
    assert LOOKS * 0.3 * 0.95 <= took <= LOOKS * 0.5, f"{LOOKS} looks took {took:.2f} s"
    # Counted in looks, not seconds, so a loaded machine cannot fail it; the
    # time bound only shows the 30 s idle interval was not what woke the worker.
    assert looks_to_take_it <= 3, f"taken at the next look: {looks_to_take_it}"
    assert taken_after < 5, "no notification came; the poll interval found it"
