"""The example Onboarding workflow runs as written, on the moved clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from engine import run_workflows
from engine.testing import move_clock
from functions import examples
from functions.examples import Onboarding
from tests.conftest import Database
from tests.helpers import fetch, wait_until


async def test_onboarding_runs_to_two_nudges_on_the_moved_clock(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.sent_emails.clear()
    started = time.monotonic()
    async with run_workflows(Session, workflows=[Onboarding]):
        row = Onboarding(user_id="u-nudge", email="n@example.com")
        assert await row.start(Onboarding.welcome)

        async def status() -> Onboarding:
            async with Session() as session:
                return (await session.scalars(select(Onboarding))).one()

        async def waiting() -> bool:
            return (await status()).status == "waiting"

        await wait_until(waiting)
        await move_clock(Session, timedelta(days=3))

        def nudged(n: int) -> Callable[[], object]:
            async def check() -> bool:
                return (await status()).nudges == n

            return check

        await wait_until(nudged(1))
        await move_clock(Session, timedelta(days=4))
        await wait_until(nudged(2))
        final = await status()
        outcomes = [(a.step, a.outcome) for a in await row.history()]
    elapsed = time.monotonic() - started
    assert final.next_step is None and final.wake_at is None
    assert [t for _, t in examples.sent_emails] == ["welcome", "nudge_1", "nudge_2"]
    assert elapsed < 1.5, f"seven days of waits took {elapsed:.2f} s"
    assert outcomes == [("welcome", "ok"), ("check", "ok"), ("check", "ok")]


async def test_onboarding_runs_to_activated(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.activated_users.add("u-active")
    async with run_workflows(Session, workflows=[Onboarding]):
        row = Onboarding(user_id="u-active", email="a@example.com")
        assert await row.start(Onboarding.welcome)

        async def waiting() -> bool:
            async with Session() as session:
                return (await session.get(Onboarding, row.id)).status == "waiting"  # type: ignore[union-attr]

        await wait_until(waiting)
        await move_clock(Session, timedelta(days=3))

        async def activated() -> bool:
            async with Session() as session:
                return (await session.get(Onboarding, row.id)).status == "activated"  # type: ignore[union-attr]

        await wait_until(activated)
        done = await fetch(Session, Onboarding, row.id)
    assert (done.status, done.nudges, done.next_step) == ("activated", 0, None), "no nudge"
