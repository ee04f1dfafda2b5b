"""The operator's overview: runs by state, through the API and the CLI.

- each run is counted in the one state its engine columns say (running,
  waiting, scheduled, retrying, finished, failed, cancelled), and across them
  the due-now and the stranded (due for longer than the grace period, 15
  minutes: no worker has taken it; a lease ended a minute ago is not), with
  the next due instant of a step not running: test_each_run_counts_in_its_state
- the stranded runs are listed by workflow and step, in the API's answer and
  under `duly status`'s table: test_the_api_answers_the_same_counts,
  test_duly_status_prints_the_overview
- `GET /overview` answers the same counts, with the outbox's summary beside
  them: test_the_api_answers_the_same_counts
- the console's overview lists the app's workflows only: the engine's own
  tables (the outbox, graph deadlines) are named under the table, as links,
  never as rows: test_the_console_lists_the_apps_workflows_only
- `duly status` prints them as a table, and as JSON with `--json`, through the
  same queries: test_duly_status_prints_the_overview
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.views.overview import RUN_STATES, workflow_overview
from functions import examples
from functions.app import create_app
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving

# (user id, the engine's columns as SQL): one onboarding run in each situation.
RUNS = {
    "running": "claimed_until = now() + interval '1 minute', next_step = 'check'",
    "expired": "claimed_until = now() - interval '1 minute', next_step = 'check', "
    "wake_at = now() - interval '1 minute'",
    "stranded": "next_step = 'check', wake_at = now() - interval '1 hour'",
    "waiting": "next_step = NULL, waiting_for = 'activated'",
    "due": "next_step = 'check', wake_at = now() - interval '1 second'",
    "later": "next_step = 'check', wake_at = now() + interval '1 hour'",
    "retrying": "next_step = 'check', attempts = 2, wake_at = now() + interval '1 minute'",
    "finished": "next_step = NULL",
    "failed": "next_step = NULL, last_error = 'ValueError: no such user'",
    "cancelled": "next_step = NULL, last_error = 'cancelled'",
}
EXPECTED = {
    "running": 2,  # the expired lease is still a lease
    "waiting": 1,
    "scheduled": 3,  # due, later, and the stranded one
    "retrying": 1,
    "finished": 1,
    "failed": 1,
    "cancelled": 1,
}


async def filled(db: Database) -> async_sessionmaker[AsyncSession]:
    Session = await db.create(examples.Base.metadata)
    async with Session() as session, session.begin():
        await session.execute(
            insert(examples.Onboarding),
            [{"user_id": user, "email": f"{user}@example.com"} for user in RUNS],
        )
        for user, columns in RUNS.items():
            await session.execute(
                text(f"UPDATE onboarding SET {columns} WHERE user_id = :user"), {"user": user}
            )
    return Session


async def test_each_run_counts_in_its_state(db: Database) -> None:
    Session = await filled(db)
    assert set(EXPECTED) == set(RUN_STATES)
    async with connect_workflows(Session) as connection:
        counts = {c.workflow: c for c in await workflow_overview(connection)}
    onboarding = counts["onboarding"]
    assert dict(onboarding.states) == EXPECTED
    assert (onboarding.total, onboarding.due, onboarding.stranded) == (len(RUNS), 2, 1)
    # The earliest wake_at of a step nobody holds: the stranded one, an hour ago.
    assert onboarding.next_due is not None
    assert abs(onboarding.next_due - datetime.now(UTC) + timedelta(hours=1)) < timedelta(minutes=1)
    assert counts["expense"].total == 0 and counts["expense"].next_due is None


async def test_the_api_answers_the_same_counts(db: Database) -> None:
    Session = await filled(db)
    async with serving(create_app(Session, run_worker=False)) as client:
        response = await client.get("/overview")
    assert response.status_code == 200, response.text
    body = response.json()
    [onboarding] = [w for w in body["workflows"] if w["workflow"] == "onboarding"]
    assert onboarding["states"] == EXPECTED
    assert (onboarding["due"], onboarding["stranded"]) == (2, 1)
    [stranded] = body["stranded"]
    assert (stranded["workflow"], stranded["step"], stranded["runs"]) == ("onboarding", "check", 1)
    assert body["outbox"]["counts"]["pending"] == 0


async def test_the_console_lists_the_apps_workflows_only(db: Database) -> None:
    Session = await filled(db)
    async with serving(create_app(Session, run_worker=False)) as client:
        page = await client.get("/console")
    assert page.status_code == 200, page.text
    rows = re.findall(r'<th scope="row"><a id="workflow-([^"]+)"', page.text)
    assert {"onboarding", "expense", "digest"} <= set(rows)  # in the order they were mapped
    assert not [name for name in rows if name.startswith("duly_")]
    for own in ("duly_outbox", "duly_graph_timers"):
        assert f'<a href="/console/runs/{own}">{own}</a>' in page.text


async def test_duly_status_prints_the_overview(db: Database, tmp_path: Path) -> None:
    await filled(db)
    env = dev_env(tmp_path / "pg", DULY_APP="functions.examples", DULY_DATABASE_URL=db.url)
    as_json = run_duly("status", "--json", cwd=REPO_ROOT, env=env)
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    [onboarding] = [w for w in document["workflows"] if w["workflow"] == "onboarding"]
    assert onboarding["states"] == EXPECTED and onboarding["due"] == 2
    assert document["outbox"]["counts"]["dead_letter"] == 0

    table = run_duly("status", cwd=REPO_ROOT, env=env)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["workflow", "due", "running"]
    [line] = [row for row in rows if row.startswith("onboarding ")]
    assert line.split()[1:10] == ["2", "2", "1", "3", "1", "1", "1", "1", "1"]
    assert "onboarding at check: 1 runs, the oldest due since" in table.stdout
    assert "outbox: pending 0" in table.stdout

    missing = run_duly("status", cwd=REPO_ROOT, env={**env, "DULY_DATABASE_URL": ""})
    assert missing.returncode == 2 and "needs the workflow database" in missing.stderr
