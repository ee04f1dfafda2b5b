"""`duly schedules` and `duly deliver`: the API's schedules and deliveries in the terminal.

- `duly schedules [NAME]` lists what `GET /schedules` does; pause, resume and
  trigger act on one run, recorded as the user, and a running step is refused
- `duly deliver` says why a run refused an event, for each reason
"""

from __future__ import annotations

import json
import os
import pwd
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.base.audit import recent_actions
from engine.testing import drain, move_clock
from functions import examples
from functions.examples import Digest, Expense
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, fetch, run_duly


def env_for(db: Database, tmp_path: Path) -> dict[str, str]:
    return dev_env(tmp_path / "pg", DULY_APP="functions.examples", DULY_DATABASE_URL=db.url)


async def digest_fired(Session: async_sessionmaker[AsyncSession]) -> Digest:
    async with connect_workflows(Session, workflows=[Digest]):
        row = Digest(name="weekday")
        assert await row.start(Digest.send)
    await drain(Session, [Digest])
    return await fetch(Session, Digest, row.id)


async def test_duly_schedules_lists_and_steers_a_schedule(db: Database, tmp_path: Path) -> None:
    Session = await db.create(examples.Base.metadata)
    row = await digest_fired(Session)
    env = {**env_for(db, tmp_path), "LOGNAME": "the-ceo", "USER": "the-ceo"}
    table = run_duly("schedules", cwd=REPO_ROOT, env=env)
    assert table.returncode == 0, table.stderr
    header, line = table.stdout.splitlines()
    assert header.split()[:4] == ["workflow", "key", "step", "schedule"]
    assert line.split()[:4] == ["digest", str(row.id), "send", "cron"]
    assert "0 9 * * MON-FRI" in line and "America/Los_Angeles" in line
    listed = run_duly("schedules", "digest", "--json", cwd=REPO_ROOT, env=env)
    [shown] = json.loads(listed.stdout)["schedules"]
    assert shown["next_firing"] == row.wake_at.isoformat()  # type: ignore[union-attr]

    paused = run_duly("schedules", "pause", "digest", str(row.id), cwd=REPO_ROOT, env=env)
    assert paused.returncode == 0, paused.stderr
    assert (
        paused.stdout.strip()
        == f"The digest run {row.id} is paused: nothing fires until it is resumed."
    )
    assert "paused" in run_duly("schedules", cwd=REPO_ROOT, env=env).stdout.splitlines()[1]
    assert (await fetch(Session, Digest, row.id)).wake_at is None
    resumed = run_duly(
        "schedules", "resume", "digest", str(row.id), "--json", cwd=REPO_ROOT, env=env
    )
    assert json.loads(resumed.stdout)["next_firing"] == row.wake_at.isoformat()  # type: ignore[union-attr]
    triggered = run_duly("schedules", "trigger", "digest", str(row.id), cwd=REPO_ROOT, env=env)
    assert "triggered: it fires now" in triggered.stdout
    assert await drain(Session, [Digest]) == 1
    async with Session() as session:
        actions = await recent_actions(session, workflow="digest")
    assert [(a.action, a.via) for a in actions] == [
        ("schedule.trigger", "cli"),
        ("schedule.resume", "cli"),
        ("schedule.pause", "cli"),
    ]
    me = pwd.getpwuid(os.getuid()).pw_name  # the process's user, never $LOGNAME
    assert {a.actor for a in actions} == {me}


async def test_duly_schedules_refuses_with_a_sentence(db: Database, tmp_path: Path) -> None:
    Session = await db.create(examples.Base.metadata)
    row = await digest_fired(Session)
    async with Session() as session, session.begin():
        lease = datetime.now().astimezone() + timedelta(hours=1)
        await session.execute(update(Digest).where(Digest.id == row.id).values(claimed_until=lease))
    env = env_for(db, tmp_path)
    busy = run_duly("schedules", "pause", "digest", str(row.id), cwd=REPO_ROOT, env=env)
    assert busy.returncode == 1 and "running its step now: try again" in busy.stderr
    unknown = run_duly("schedules", "resume", "digest", "404", cwd=REPO_ROOT, env=env)
    assert unknown.returncode == 1 and "No digest run has the key 404" in unknown.stderr
    wrong = run_duly("schedules", "pause", "digest", cwd=REPO_ROOT, env=env)
    assert wrong.returncode == 2 and "pause|resume|trigger NAME KEY" in wrong.stderr
    assert "Traceback" not in busy.stderr + unknown.stderr + wrong.stderr


async def test_duly_deliver_says_why_each_run_refused(db: Database, tmp_path: Path) -> None:
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=[Expense]):
        rows = [Expense(amount=n) for n in range(4)]
        for row in rows:
            assert await row.start(Expense.request_approval)
        assert await Expense.by(Expense.id == rows[2].id).cancel() == 1
    await drain(Session, [Expense])
    env = env_for(db, tmp_path)
    approve = json.dumps({"verdict": "approve", "by": "ada"})

    def deliver(key: object, *options: str, step: str = "decide") -> str:
        done = run_duly(
            "deliver", "expense", step, "--key", str(key), *options, cwd=REPO_ROOT, env=env
        )
        assert "Traceback" not in done.stderr
        return done.stdout.strip()

    assert deliver(rows[0].id, "--args", approve, "--idempotency-key", "k") == (
        "1 run took the event now."
    )
    said = {
        "deduplicated": deliver(rows[0].id, "--args", approve, "--idempotency-key", "k"),
        "unknown_key": deliver(404, "--args", approve),
        "waiting_for_other_step": deliver(rows[1].id, step="escalate"),
        "cancelled": deliver(rows[2].id, "--args", approve),
    }
    await drain(Session, [Expense])
    said["finished"] = deliver(rows[0].id, "--args", approve)
    await move_clock(Session, timedelta(days=3))
    said["deadline_passed"] = deliver(rows[3].id, "--args", approve, "--json")
    assert json.loads(said.pop("deadline_passed"))["refused"] == {"deadline_passed": 1}
    assert said == {
        "deduplicated": "No run took the event; 1 refused it: the event's key was taken "
        "already (a resent event).",
        "unknown_key": "No run took the event; 1 refused it: no run has this key.",
        "waiting_for_other_step": "No run took the event; 1 refused it: the run waits for "
        "another step's event.",
        "cancelled": "No run took the event; 1 refused it: the run was cancelled (deliver "
        "with restart to start it again).",
        "finished": "No run took the event; 1 refused it: the run has finished (deliver "
        "with restart to start it again).",
    }
    async with connect_workflows(Session, workflows=[Expense]):
        on_its_way = Expense(amount=9)
        assert await on_its_way.start(Expense.request_approval)  # no wait armed yet
    held = run_duly(
        "deliver", "expense", "decide", "--key", str(on_its_way.id), "--args", approve,
        cwd=REPO_ROOT, env=env,
    )  # fmt: skip
    assert (held.returncode, held.stdout.strip()) == (
        0,
        "1 run holds the event until it waits for it.",
    )
    as_json = run_duly(
        "deliver", "expense", "decide", "--key", str(on_its_way.id), "--args", approve,
        "--json", cwd=REPO_ROOT, env=env,
    )  # fmt: skip
    answer = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and (answer["taken"], answer["held"]) == (0, 0)
    assert answer["refused"] == {"holding_another_event": 1}
