"""The schedules over HTTP: `GET /schedules`, and pause, resume, trigger with their refusals.

The example app's Digest runs on a cron (09:00 on weekdays in Los Angeles);
the engine's deterministic worker (`engine.testing.drain`) fires it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.base.audit import recent_actions
from engine.testing import drain, move_clock
from functions import examples
from functions.examples import Digest, Onboarding
from tests.conftest import Database
from tests.helpers import csrf_of, fetch

LOS_ANGELES = "America/Los_Angeles"


pytestmark = pytest.mark.usefixtures("open_writes")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(examples.Base.metadata)


async def digest_fired(Session: async_sessionmaker[AsyncSession]) -> Digest:
    """A Digest run after its first firing: on its cron from now on."""
    row = Digest(name="weekday")
    assert await row.start(Digest.send)
    await drain(Session, [Digest])
    return await fetch(Session, Digest, row.id)


async def test_get_schedules_lists_every_scheduled_run_with_its_firings(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    row = await digest_fired(Session)
    assert await Onboarding(user_id="u-1", email="u@example.com").start(Onboarding.welcome)
    reply = await client.get("/schedules")
    assert reply.status_code == 200, reply.text
    [listed] = reply.json()["schedules"]
    assert listed["workflow"] == "digest" and listed["key"] == str(row.id)
    assert (listed["kind"], listed["expression"], listed["timezone"]) == (
        "cron",
        "0 9 * * MON-FRI",
        LOS_ANGELES,
    )
    assert listed["next_firing"] == row.wake_at.isoformat()  # type: ignore[union-attr]
    assert listed["last_firing"] is not None and not listed["paused"]
    one = await client.get("/workflows/digest/schedules")
    assert one.json() == {"workflow": "digest", "schedules": [listed]}
    assert (await client.get("/workflows/onboarding/schedules")).json()["schedules"] == []
    assert (await client.get("/workflows/nothing/schedules")).status_code == 404


async def test_pause_resume_and_trigger_over_http_are_recorded(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    row = await digest_fired(Session)
    base = f"/workflows/digest/runs/{row.id}/schedule"
    paused = await client.post(f"{base}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["next_firing"] is None
    assert "paused" in paused.json()["message"]
    assert (await client.get("/schedules")).json()["schedules"][0]["paused"] is True
    again = await client.post(f"{base}/pause")
    assert again.json()["changed"] is False
    await move_clock(Session, timedelta(days=7))
    assert await drain(Session, [Digest]) == 0, "a paused schedule does not fire"
    resumed = (await client.post(f"{base}/resume")).json()
    next_firing = datetime.fromisoformat(resumed["next_firing"])
    assert not resumed["paused"] and next_firing > row.wake_at + timedelta(days=6)  # type: ignore[operator]
    assert (next_firing.astimezone(ZoneInfo(LOS_ANGELES)).hour, next_firing.minute) == (9, 0)
    triggered = (await client.post(f"{base}/trigger")).json()
    assert datetime.fromisoformat(triggered["next_firing"]) < next_firing
    assert await drain(Session, [Digest]) == 1, "fired once, now"
    assert (await fetch(Session, Digest, row.id)).wake_at == next_firing, "the cron's times stay"
    async with Session() as session:
        actions = await recent_actions(session, workflow="digest")
    assert [(a.action, a.via, a.count) for a in actions] == [
        ("schedule.trigger", "http", 1),
        ("schedule.resume", "http", 1),
        ("schedule.pause", "http", 0),
        ("schedule.pause", "http", 1),
    ]
    assert actions[0].subject == {"key": str(row.id)}


async def test_a_running_step_unknown_runs_and_unscheduled_runs_are_refused(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    row = await digest_fired(Session)
    async with Session() as session, session.begin():
        lease = datetime.now().astimezone() + timedelta(hours=1)
        await session.execute(update(Digest).where(Digest.id == row.id).values(claimed_until=lease))
    busy = await client.post(f"/workflows/digest/runs/{row.id}/schedule/trigger")
    assert busy.status_code == 409
    assert "running its step now: try again" in busy.json()["detail"]
    unknown = await client.post("/workflows/digest/runs/404/schedule/pause")
    assert unknown.status_code == 404 and "No digest run has the key 404" in unknown.text
    onboarding = Onboarding(user_id="u-2", email="u2@example.com")
    assert await onboarding.start(Onboarding.welcome)
    off = await client.post(f"/workflows/onboarding/runs/{onboarding.id}/schedule/pause")
    assert off.status_code == 404 and "not on a schedule" in off.text
    assert (await client.post(f"/workflows/digest/runs/{row.id}/schedule/stop")).status_code == 422
    async with Session() as session:
        assert await recent_actions(session) == [], "nothing refused is recorded"


async def test_the_console_page_lists_and_steers_behind_a_confirmation(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    row = await digest_fired(Session)
    page = await client.get("/console/schedules")
    assert page.status_code == 200
    assert f'id="schedule-digest-{row.id}"' in page.text and "0 9 * * MON-FRI" in page.text
    form = {"csrf_token": csrf_of(page), "workflow": "digest", "key": str(row.id)}
    asked = await client.post("/console/schedules/pause", data=form)
    assert f"Pause digest run {row.id}?" in asked.text
    assert (await fetch(Session, Digest, row.id)).wake_at is not None, "nothing before yes"
    done = await client.post("/console/schedules/pause", data={**form, "confirmed": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/console/schedules?done=pause"
    listed = await client.get(done.headers["location"])
    assert "Paused: nothing fires until it is resumed." in listed.text
    assert (await fetch(Session, Digest, row.id)).wake_at is None
    async with Session() as session, session.begin():
        lease = datetime.now().astimezone() + timedelta(hours=1)
        await session.execute(update(Digest).where(Digest.id == row.id).values(claimed_until=lease))
    busy = await client.post("/console/schedules/resume", data={**form, "confirmed": "yes"})
    assert busy.status_code == 409 and "running its step now" in busy.text
    async with Session() as session:
        [paused] = await recent_actions(session, workflow="digest")
    assert (paused.action, paused.via) == ("schedule.pause", "console")
