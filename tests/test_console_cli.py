"""`duly runs` and `duly show`: the console's views in the terminal, through the same queries.

- `duly runs` prints a page of a workflow's runs, filtered, newest or soonest
  first, and the cursor of the next; `--json` is the API's page, run for
  run: test_duly_runs_prints_the_same_page_as_the_api
- `duly show` prints one run with its attempts; `--json` is the API's run
  with its engine columns: test_duly_show_prints_a_run_with_its_history
- a workflow or run that does not exist, or a bad key, is a sentence and an
  exit status, never a traceback: test_bad_arguments_are_refused_with_a_sentence
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions import examples
from functions.app import create_app
from functions.examples import Onboarding
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving


async def filled(db: Database) -> async_sessionmaker[AsyncSession]:
    """Five onboardings: three scheduled at rising times, one failed, one attempt logged."""
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)):
        for n in range(5):
            row = Onboarding(user_id=f"u-cli-{n}", email=f"{n}@example.com")
            assert await row.start(Onboarding.welcome)
    async with Session() as session, session.begin():
        await session.execute(
            text(
                "UPDATE onboarding SET wake_at = now() + (10 - id) * interval '1 minute' "
                "WHERE id <= 3"
            )
        )
        await session.execute(
            text(
                "UPDATE onboarding SET next_step = NULL, next_args = NULL, wake_at = NULL, "
                "last_error = 'ValueError: no such user' WHERE id = 4"
            )
        )
        await session.execute(
            text(
                "INSERT INTO workflow_attempt (workflow, run_key, step, attempt, outcome, error, "
                "took_ms, finished_at) VALUES ('onboarding', '4', 'welcome', 1, 'failed', "
                "'ValueError: no such user', 2.5, now())"
            )
        )
    return Session


def env_for(db: Database, tmp_path: Path) -> dict[str, str]:
    return dev_env(tmp_path / "pg", DULY_APP="functions.examples", DULY_DATABASE_URL=db.url)


async def test_duly_runs_prints_the_same_page_as_the_api(db: Database, tmp_path: Path) -> None:
    Session = await filled(db)
    env = env_for(db, tmp_path)
    table = run_duly("runs", "onboarding", "--limit", "2", cwd=REPO_ROOT, env=env)
    assert table.returncode == 0, table.stderr
    header, first, second, _, more = table.stdout.splitlines()
    assert header.split()[:3] == ["key", "state", "next"]
    assert [first.split()[0], second.split()[0]] == ["5", "4"]
    assert "failed" in second and "ValueError: no such user" in second
    cursor = more.split("--after ")[1]
    rest = run_duly("runs", "onboarding", "--after", cursor, "--json", cwd=REPO_ROOT, env=env)
    document = json.loads(rest.stdout)
    assert [run["key"] for run in document["runs"]] == ["3", "2", "1"]
    assert document["next_after"] is None

    soonest = run_duly("runs", "onboarding", "--order", "soonest", "--json", cwd=REPO_ROOT, env=env)
    keys = [run["key"] for run in json.loads(soonest.stdout)["runs"]]
    assert keys == ["5", "3", "2", "1", "4"]  # by due time (5 is due now), then the rest by key
    failed = run_duly("runs", "onboarding", "--state", "failed", "--json", cwd=REPO_ROOT, env=env)
    [run] = json.loads(failed.stdout)["runs"]
    assert (run["key"], run["state"], run["row"]["last_error"]) == (
        "4",
        "failed",
        "ValueError: no such user",
    )
    # The API answers the same runs, field for field.
    async with serving(create_app(Session, run_worker=False)) as client:
        api = (await client.get("/workflows/onboarding/runs", params={"state": "failed"})).json()
    assert api["runs"] == [run]


async def test_duly_show_prints_a_run_with_its_history(db: Database, tmp_path: Path) -> None:
    Session = await filled(db)
    env = env_for(db, tmp_path)
    shown = run_duly("show", "onboarding", "4", cwd=REPO_ROOT, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "onboarding 4"
    assert any(line.split() == ["state", "failed"] for line in lines)
    assert "    ValueError: no such user" in lines
    assert any("welcome" in line and "failed" in line and "2.5 ms" in line for line in lines)
    as_json = run_duly("show", "onboarding", "4", "--json", cwd=REPO_ROOT, env=env)
    document = json.loads(as_json.stdout)
    assert (document["key"], document["state"]) == ("4", "failed")
    assert [a["outcome"] for a in document["history"]] == ["failed"]
    assert document["engine"]["last_error"] == "ValueError: no such user"
    async with serving(create_app(Session, run_worker=False)) as client:
        api = (await client.get("/workflows/onboarding/runs/4")).json()
    assert {k: document[k] for k in api} == api


async def test_bad_arguments_are_refused_with_a_sentence(db: Database, tmp_path: Path) -> None:
    await filled(db)
    env = env_for(db, tmp_path)
    cases = [
        (("runs", "nope"), 1, "No workflow named 'nope'. This app maps: digest, "),
        (("show", "onboarding", "99"), 1, "No onboarding run has the key '99'."),
        (("show", "onboarding", "abc"), 2, "expected int"),
        (("runs", "onboarding", "--after", "garbage"), 2, "is not a page cursor"),
        (("runs", "onboarding", "--limit", "0"), 2, "A page holds 1 to 500 runs"),
    ]
    for args, status, message in cases:
        done = run_duly(*args, cwd=REPO_ROOT, env=env)
        assert done.returncode == status, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
