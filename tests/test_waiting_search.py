"""Searching runs by what they wait for: the `waiting:STEP` term, at every door.

Three expenses wait for `decide` (a wait with a timeout: their next step is `escalate`, the
timeout's, so `step:decide` finds none of them), one has not run its first step yet and one
was cancelled.

- the term reads `waiting_for`, `step:` still reads `next_step`, and a mistake names what is
  allowed: test_the_term_matches_what_a_run_waits_for
- the API's `?q=` and the console's search box find the three; the console's list says what
  each waits for: test_the_api_and_the_console_find_the_waiting_runs
- a bulk action's filter takes it: test_a_bulk_action_acts_on_the_waiting_runs
- `duly runs --where` and `duly bulk --where` take it, and the table says what each run
  waits for: test_the_command_line_finds_the_waiting_runs
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    InvalidArgumentError,
    RunFilter,
    connect_workflows,
    find_workflow,
    list_runs,
    parse_filter,
)
from engine.testing import drain
from functions import examples
from functions.app import create_app
from functions.examples import Expense
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving

pytestmark = pytest.mark.usefixtures("open_writes")  # the bulk route's answers are under test

URL = "/workflows/expense/runs"
WAITING = ["3", "2", "1"]  # newest first


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    """Expenses 1-3 waiting for `decide`, 4 not started on its step yet, 5 cancelled."""
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=[Expense]):
        for amount in (10, 20, 30):
            assert await Expense(amount=amount).start(Expense.request_approval)
    await drain(Session, [Expense])
    async with connect_workflows(Session, workflows=[Expense]):
        for amount in (40, 50):
            assert await Expense(amount=amount).start(Expense.request_approval)
        assert await Expense.by(Expense.id == 5).cancel() == 1
    return Session


async def keys_found(Session: async_sessionmaker[AsyncSession], text: str) -> list[str]:
    async with connect_workflows(Session, workflows=[Expense]) as connection:
        info = find_workflow(connection, "expense")
        page = await list_runs(connection, info, parse_filter(info, text))
    return [run.key for run in page.runs]


async def test_the_term_matches_what_a_run_waits_for(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    assert await keys_found(Session, "waiting:decide") == WAITING
    assert await keys_found(Session, "waiting:decide id>=2") == ["3", "2"]
    assert await keys_found(Session, "waiting:escalate") == []
    assert await keys_found(Session, "step:decide") == [], "step: reads next_step, as it did"
    assert await keys_found(Session, "step:escalate") == WAITING, "the timeout's step"
    assert await keys_found(Session, "step:request_approval") == ["4"]
    async with connect_workflows(Session, workflows=[Expense]) as connection:
        info = find_workflow(connection, "expense")
        page = await list_runs(connection, info, RunFilter(waiting="decide", state="waiting"))
        assert [run.key for run in page.runs] == WAITING
        for text, says in [
            ("waiting:nope", "expense has no step 'nope': its steps are request_approval"),
            ("waiting:decide waiting:escalate", "The waiting filter is given twice"),
            ("waiting_for:decide", "waiting_for is the engine's column: search it with waiting:"),
            ("waiting>decide", "waiting takes waiting:value, not >."),
        ]:
            with pytest.raises(InvalidArgumentError, match=re.escape(says)):
                parse_filter(info, text)
        with pytest.raises(InvalidArgumentError, match="The waiting filter is given twice"):
            parse_filter(info, "waiting:decide").also(RunFilter(waiting="escalate"))


async def test_the_api_and_the_console_find_the_waiting_runs(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with serving(create_app(Session, run_worker=False)) as client:
        found = await client.get(URL, params={"q": "waiting:decide"})
        assert found.status_code == 200, found.text
        runs = found.json()["runs"]
        assert [run["key"] for run in runs] == WAITING
        assert {run["waiting_for"] for run in runs} == {"decide"}
        assert (await client.get(URL, params={"q": "step:decide"})).json()["runs"] == []
        refused = await client.get(URL, params={"q": "waiting:nope"})
        assert refused.status_code == 400 and "has no step 'nope'" in refused.text

        page = await client.get("/console/runs/expense", params={"q": "waiting:decide"})
        assert page.status_code == 200, page.text
        shown = re.findall(r'href="/console/runs/expense/(\d+)"', page.text)
        assert shown == WAITING
        assert page.text.count("(waits for decide)") == 3
        assert "waiting:" in page.text, "the search box's hint names the term"
        bad = await client.get("/console/runs/expense", params={"q": "waiting_for:decide"})
        assert bad.status_code == 400 and "search it with waiting:" in bad.text


async def test_a_bulk_action_acts_on_the_waiting_runs(
    db: Database, Session: async_sessionmaker[AsyncSession]
) -> None:
    cancel = {"action": "cancel", "filter": {"q": "waiting:decide"}}
    async with serving(create_app(Session, run_worker=False)) as client:

        async def bulk(body: dict[str, object]) -> dict[str, object]:
            reply = await client.post("/workflows/expense/bulk", json=body)
            assert reply.status_code == 200, reply.text
            answer: dict[str, object] = reply.json()
            return answer

        dry = await bulk(cancel)
        assert (dry["expected"], dry["upto"]) == (3, "3")
        done = await bulk({**cancel, "expected": 3, "upto": "3"})
        assert done["done"] == 3
    rows = db.sql("SELECT id, last_error, waiting_for FROM expense ORDER BY id")
    assert rows == [
        (1, "cancelled", None),
        (2, "cancelled", None),
        (3, "cancelled", None),
        (4, None, None),
        (5, "cancelled", None),
    ]


async def test_the_command_line_finds_the_waiting_runs(
    db: Database, Session: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    env = dev_env(tmp_path / "pg", DULY_APP="functions.examples", DULY_DATABASE_URL=db.url)
    listed = run_duly("runs", "expense", "--where", "waiting:decide", "--json", cwd=REPO_ROOT,
                      env=env)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert [run["key"] for run in json.loads(listed.stdout)["runs"]] == WAITING
    table = run_duly("runs", "expense", "--where", "waiting:decide", cwd=REPO_ROOT, env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("escalate (waits for decide)") == 3, table.stdout
    none = run_duly("runs", "expense", "--where", "step:decide", cwd=REPO_ROOT, env=env)
    assert none.stdout.strip() == "no expense run matches", none.stdout
    wrong = run_duly("runs", "expense", "--where", "waiting:nope", cwd=REPO_ROOT, env=env)
    assert wrong.returncode == 2 and "has no step 'nope'" in wrong.stderr, wrong.stderr
    dry = run_duly("bulk", "cancel", "expense", "--where", "waiting:decide", cwd=REPO_ROOT,
                   env=env)  # fmt: skip
    assert "3 expense runs match" in dry.stdout, (dry.stdout, dry.stderr)
    assert db.sql("SELECT count(*) FROM expense WHERE waiting_for = 'decide'") == [(3,)]
