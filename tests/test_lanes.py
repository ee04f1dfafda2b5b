"""Lanes: a worker claims only steps of the lanes it serves; the rest waits, not lost."""

from __future__ import annotations

import asyncio

import pytest

from engine import run_workflows
from tests.apps import behaviour
from tests.apps.behaviour import Timer, Upload
from tests.conftest import Database
from tests.helpers import fetch, wait_until


@pytest.fixture(autouse=True)
def fresh_log() -> None:
    behaviour.ran_in_lane.clear()


async def test_a_default_worker_never_runs_a_media_step(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Upload]) as worker:
        row = Upload()
        assert await row.start(Upload.transcode)
        passes = worker.passes
        # The claim is an absence over time: few looks in half a second, none of them a run.
        await asyncio.sleep(0.5)
        assert worker.passes - passes <= 2, "it does not poll for work it cannot take"
    assert behaviour.ran_in_lane == []
    assert (await fetch(Session, Upload, row.id)).next_step == "transcode"


async def test_a_media_worker_runs_media_steps_and_hands_the_rest_on(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Upload], lanes=["media"]) as media:
        row = Upload()
        assert await row.start(Upload.transcode)

        async def transcoded() -> bool:
            stored = await fetch(Session, Upload, row.id)
            return stored.done == "t" and stored.claimed_until is None

        await wait_until(transcoded)
        assert await media.wake(5), "it looked again, with `notify` due, and took nothing"
        assert behaviour.ran_in_lane == ["transcode"], "notify is not in the media lane"
        async with run_workflows(Session, workflows=[Upload]):

            async def notified() -> bool:
                return (await fetch(Session, Upload, row.id)).done == "tn"

            await wait_until(notified)
    assert behaviour.ran_in_lane == ["transcode", "notify"], "each step in its own lane"
    assert (await fetch(Session, Upload, row.id)).next_step is None


async def test_work_in_a_lane_nobody_serves_waits_and_finishes_once_a_worker_does(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Upload]) as worker:
        row = Upload()
        assert await row.start(Upload.transcode)
        assert await worker.wake(5), "it looked, with `transcode` due, and took nothing"
        assert (await fetch(Session, Upload, row.id)).done == ""
        async with run_workflows(Session, workflows=[Upload], lanes=["media", "default"]):

            async def finished() -> bool:
                return (await fetch(Session, Upload, row.id)).done == "tn"

            await wait_until(finished)
    done = await fetch(Session, Upload, row.id)
    assert (done.done, done.next_step, done.claimed_until) == ("tn", None, None)


async def test_a_worker_skips_a_table_it_can_run_nothing_of(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer, Upload], lanes=["media"]) as worker:
        assert set(worker.tables) == {"upload"}


async def test_lanes_must_name_a_lane(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    with pytest.raises(ValueError, match="lanes"):
        async with run_workflows(Session, workflows=[Upload], lanes=[]):
            pass
