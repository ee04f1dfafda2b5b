"""`duly bulk` and `duly audit` as an operator runs them: processes on a real database.

The app is tests/apps/chores.py; failed runs are written from the test, and what the
commands print and leave in the database (and its audit trail, whose actor is the process's
user id's name even when $LOGNAME and $USER say another) is checked; on a
terminal an apply draws rich's progress bar, and off one it prints nothing on stderr.
"""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path

import pytest

from functions.app import create_app
from tests.apps import chores
from tests.bulk_helpers import add_failed
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, run_duly_on_terminal, serving

APP = "tests.apps.chores"


def env_for(db: Database, tmp_path: Path) -> dict[str, str]:
    return dev_env(tmp_path / "pg", DULY_APP=APP, DULY_DATABASE_URL=db.url)


async def test_a_retry_is_a_dry_run_then_an_apply_the_audit_names(
    db: Database, tmp_path: Path
) -> None:
    Session = await db.create(chores.Base.metadata)
    await add_failed(Session, 3)
    # $LOGNAME and $USER are anyone's to set: the audit names the process's user id's user.
    env = {**env_for(db, tmp_path), "LOGNAME": "the-ceo", "USER": "the-ceo"}
    me = pwd.getpwuid(os.getuid()).pw_name
    retry = ("bulk", "retry", "chore", "--step", "work", "--args", '{"label": "again"}')
    dry = run_duly(*retry, cwd=REPO_ROOT, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "a dry run, nothing written. 3 chore runs match, 0 held by a worker now." in dry.stdout
    confirm = re.search(r"--apply --expected (\d+) --upto (\S+)", dry.stdout)
    assert confirm is not None and confirm[1] == "3"
    assert db.sql("SELECT count(*) FROM chore WHERE next_step IS NOT NULL") == [(0,)]
    unconfirmed = run_duly(*retry, "--apply", cwd=REPO_ROOT, env=env)
    assert unconfirmed.returncode == 2 and "run the dry run first" in unconfirmed.stderr
    too_few = run_duly(*retry, "--apply", "--expected", "2", "--upto", "3", cwd=REPO_ROOT, env=env)
    assert too_few.returncode == 2 and "the dry run counted 2" in too_few.stderr
    upto = confirm[2]
    applied = run_duly(*retry, "--apply", "--expected", "3", "--upto", upto, cwd=REPO_ROOT, env=env)
    assert applied.returncode == 0, applied.stderr
    assert "duly bulk retry: 3 of 3 in chore done, 0 skipped, in 1 batches" in applied.stdout
    assert applied.stderr == "", "no progress bar off a terminal"
    assert db.sql("SELECT next_step, next_args->'args' FROM chore") == [("work", ["again"])] * 3

    trail = run_duly("audit", "--workflow", "chore", "--json", cwd=REPO_ROOT, env=env)
    assert trail.returncode == 0, trail.stderr
    [entry] = json.loads(trail.stdout)
    assert (entry["actor"], entry["via"], entry["action"], entry["count"]) == (
        me, "cli", "bulk.retry", 3,
    )  # fmt: skip
    assert entry["subject"] == {"state": "failed"}
    searched = run_duly("bulk", "cancel", "chore", "--where", "id>=2", cwd=REPO_ROOT, env=env)
    assert "2 chore runs match" in searched.stdout, searched.stderr
    table = run_duly("audit", cwd=REPO_ROOT, env=env)
    assert re.search(rf"{re.escape(me)} +cli +bulk\.retry +chore +3", table.stdout)


async def test_bad_arguments_are_usage_errors_that_write_nothing(
    db: Database, tmp_path: Path
) -> None:
    Session = await db.create(chores.Base.metadata)
    await add_failed(Session, 1)
    env = env_for(db, tmp_path)
    for args, said in [
        (("bulk", "run", "chore", "--step", "nope"), "no step"),
        (("bulk", "run", "chore", "--step", "work", "--args", "[1"), "do not fit"),
        (("bulk", "cancel", "nothing"), "No workflow named 'nothing'"),
        (("bulk", "cancel", "chore", "--expected", "1"), "add --apply"),
        (("bulk", "replay"), "maps no outbox"),
        (("audit", "--limit", "0"), "1 to 500"),
    ]:
        done = run_duly(*args, cwd=REPO_ROOT, env=env)
        assert done.returncode in (1, 2), (args, done.stdout)
        assert said.lower() in done.stderr.lower(), (args, done.stderr)
    assert db.sql("SELECT count(*) FROM duly_audit") == [(0,)]


@pytest.fixture(autouse=True)
def open_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DULY_API_TOKEN", "DULY_API_KEYS"):
        monkeypatch.delenv(name, raising=False)


async def test_get_audit_reads_the_trail_newest_first(db: Database) -> None:
    Session = await db.create(chores.Base.metadata)
    await add_failed(Session, 2)
    async with serving(create_app(Session, run_worker=False)) as client:
        for key in ("1", "2"):
            body = {"action": "retry", "step": "work", "filter": {"key": key}}
            body |= {"expected": 1, "upto": key}
            assert (await client.post("/workflows/chore/bulk", json=body)).status_code == 200
        page = (await client.get("/audit", params={"limit": 1})).json()
        assert [a["subject"] for a in page["actions"]] == [{"state": "failed", "key": "2"}]
        rest = (await client.get("/audit", params={"before": page["before"]})).json()
        assert [a["subject"]["key"] for a in rest["actions"]] == ["1"]
        assert rest["before"] is None
        assert (await client.get("/audit", params={"workflow": "other"})).json()["actions"] == []
        assert (await client.get("/audit", params={"limit": 501})).status_code == 422


async def test_an_apply_draws_a_progress_bar_on_a_terminal(db: Database, tmp_path: Path) -> None:
    Session = await db.create(chores.Base.metadata)
    await add_failed(Session, 3)
    process, text = run_duly_on_terminal(
        "bulk", "cancel", "chore", "--apply", "--expected", "3", "--upto", "3",
        cwd=REPO_ROOT,
        env=env_for(db, tmp_path) | {"COLUMNS": "100"},
    )  # fmt: skip
    assert process.returncode == 0, text
    # Finished runs are not live: a cancel leaves them, and says it skipped them.
    assert "0 of 3 in chore done, 3 skipped" in process.stdout
    assert "cancel chore" in text and "3/3" in text and "3 skipped" in text
