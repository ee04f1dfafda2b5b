"""Between tables: each gets a share of a pass, so one backlog cannot hold the worker."""

from __future__ import annotations

import time

from sqlalchemy import func, insert, select, update

from engine import connect_workflows, run_workflows
from engine.base.clock import db_now
from engine.testing import drain
from tests.apps import behaviour
from tests.apps.behaviour import Alarm, Attempt, Timer, Upload
from tests.conftest import Database
from tests.helpers import wait_until

BACKLOG = 50_000


async def test_a_small_table_is_served_in_the_first_passes_beside_a_large_backlog(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    timer = Timer.__table__
    async with Session() as session:
        # 50,000 due runs of one table, written straight in (a backlog), then ten of another.
        await session.execute(
            insert(timer), [{"next_step": "fire", "next_args": {}} for _ in range(BACKLOG)]
        )
        await session.execute(update(timer).values(wake_at=db_now()))
        await session.commit()
    async with connect_workflows(Session, workflows=[Upload]):
        small = [Upload() for _ in range(10)]
        for row in small:
            assert await row.start(Upload.notify)
    started = time.monotonic()
    async with run_workflows(Session, workflows=[Timer, Upload]):

        async def small_done() -> bool:
            rows = await Upload.by(Upload.id.in_([r.id for r in small])).all()
            return all(r.next_step is None for r in rows)

        await wait_until(small_done, timeout=20)
        async with Session() as session:
            backlog_done = await session.scalar(
                select(func.count()).select_from(timer).where(timer.c.next_step.is_(None))
            )
    assert backlog_done is not None and backlog_done < 500, (
        f"{backlog_done} of the backlog ran before the ten small runs were done"
    )
    assert time.monotonic() - started < 10


async def test_with_more_tables_than_slots_each_table_takes_its_turn(db: Database) -> None:
    """One slot, three tables with work: every table runs before any runs twice, and so on."""
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer, Upload, Alarm]):
        for _ in range(4):  # each table's rows are started together: a backlog of four
            assert await Timer().start(Timer.fire)
        for _ in range(4):
            assert await Upload().start(Upload.notify)
        for _ in range(4):
            assert await Alarm().start(Alarm.ring)
    assert await drain(Session, [Timer, Upload, Alarm], max_concurrency=1) == 12
    async with Session() as session:
        order = (await session.scalars(select(Attempt.workflow).order_by(Attempt.id))).all()
    rounds = [sorted(order[i : i + 3]) for i in range(0, 12, 3)]
    assert rounds == [["alarm", "timer", "upload"]] * 4, order
