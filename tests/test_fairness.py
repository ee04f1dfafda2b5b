"""Between tables: each gets a share of a pass, so one backlog cannot hold the worker."""

from __future__ import annotations

import time

from sqlalchemy import func, insert, select, update

from engine import connect_workflows, run_workflows
from engine.clock import db_now
from tests.apps import behaviour
from tests.apps.behaviour import Timer, Upload
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
