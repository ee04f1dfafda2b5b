"""The seed's Digest example: a schedule is a run, declared on every boot, re-armed with run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import select

from engine import run_workflows
from engine.base.clock import db_now
from engine.testing import move_clock
from functions import examples
from functions.examples import Digest
from tests.conftest import Database
from tests.helpers import fetch, wait_until

LOS_ANGELES = ZoneInfo("America/Los_Angeles")


async def test_digest_runs_at_nine_on_weekdays_in_los_angeles(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.digests_sent.clear()
    async with run_workflows(Session, workflows=[Digest]):
        row = Digest(name="daily")
        assert await row.start(Digest.send)

        async def sent(n: int) -> bool:
            # Count first: a row read before the step ran must not pass with a later count.
            count = len(examples.digests_sent)
            stored = await fetch(Session, Digest, row.id)
            return count == n and stored.claimed_until is None

        await wait_until(lambda: sent(1))
        for n in range(2, 5):
            stored = await fetch(Session, Digest, row.id)
            assert stored.wake_at is not None
            local = stored.wake_at.astimezone(LOS_ANGELES)
            assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
            async with Session() as session:
                now = (await session.execute(select(db_now()))).scalar_one()
            await move_clock(Session, stored.wake_at - now + timedelta(seconds=1))
            await wait_until(lambda n=n: sent(n))
        # Declaring the schedule again on boot does nothing: the row is there.
        assert not await Digest(name="daily").start(Digest.send)


async def test_a_stopped_schedule_is_rearmed_with_run(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.digests_sent.clear()
    async with run_workflows(Session, workflows=[Digest]):
        row = Digest(name="weekly")
        assert await row.start(Digest.send)
        await wait_until(lambda: _has(examples.digests_sent, 1))
        assert await Digest.by(Digest.name == "weekly").cancel() == 1
        assert (await fetch(Session, Digest, row.id)).next_step is None
        assert await Digest.by(Digest.name == "weekly").run(Digest.send) == 1
        await wait_until(lambda: _has(examples.digests_sent, 2))
        stored = await fetch(Session, Digest, row.id)
    assert stored.next_step == "send" and stored.wake_at is not None
    assert stored.wake_at > datetime(2026, 1, 1, tzinfo=UTC)


async def _has(items: list[str], n: int) -> bool:
    return len(items) == n
