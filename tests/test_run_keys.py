"""A run's key, read once from its text into a typed `RunKey` that travels as is.

Every door reads a key with one function (`parse_key`, wrapped by the request
layer's `run_key` and `url_key`), and the engine takes the `RunKey` itself
(`Model.by_key`): its WHERE clause and its statement's parameters come from
it, never pulled back out of clauses. A key with `/`, a composite key, and a
bad key (a 422 with a sentence, or the CLI's sentence and exit 2).
"""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import DulyError, connect_workflows
from engine.model.registry import workflow_info
from engine.runs.keys import RunKey
from engine.views.filters import parse_key
from functions.app import create_app
from functions.command_line import USAGE_ERROR
from functions.requests.errors import InputError
from functions.requests.runs import run_key, url_key
from tests.apps import chores, slashes
from tests.apps.chores import Shift
from tests.apps.slashes import Ticket
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving

TWO_PARTS = "The key of shift has 2 parts: give a JSON list."


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    Session = await db.create(chores.Base.metadata)
    async with Session.begin() as session:
        await session.execute(insert(Shift), [{"team": "a/b", "day": 10}, {"team": "c", "day": 1}])
    return Session


def test_a_key_is_read_once_into_typed_values() -> None:
    info = workflow_info(Shift)
    key = parse_key(info, '["a/b", "10"]')
    assert key == RunKey("shift", ("a/b", 10))  # the day typed as its column is
    assert key.params() == {"duly_key_0": "a/b", "duly_key_1": 10}
    assert key.text == '["a/b", 10]'
    assert run_key(info, ["a/b", 10]) == key == url_key(info, key.text)
    assert [str(c.compile()) for c in key.where(info)] == [
        "shift.team = :team_1",
        "shift.day = :day_1",
    ]
    one = url_key(workflow_info(Ticket), "x/cancel")
    assert one == RunKey("slash_ticket", ("x/cancel",)) and one.text == "x/cancel"


def test_a_bad_key_is_refused_with_a_sentence_placed_at_key() -> None:
    info = workflow_info(Shift)
    for bad in ("abc", '["a"]', '["a", "ten"]', "[1, 2"):
        with pytest.raises(InputError) as refused:
            url_key(info, bad)
        [problem] = refused.value.problems
        assert problem.loc == ("key",)
    with pytest.raises(InputError, match="expected int"):
        run_key(info, ["a", "ten"])
    with pytest.raises(DulyError, match="2 parts"):
        Shift.by_key("a")  # a handle's key has every part of the primary key


async def test_a_composite_key_reads_runs_and_delivers_by_its_typed_values(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    composite = quote('["a/b", 10]', safe="")
    async with serving(create_app(Session, run_worker=False)) as client:
        read = await client.get(f"/workflows/shift/runs/{composite}")
        ran = await client.post("/workflows/shift/run", json={"key": ["a/b", 10], "step": "work"})
        unknown = await client.post(
            "/workflows/shift/deliver", json={"key": ["z", 1], "step": "work"}
        )
    assert read.status_code == 200 and read.json()["key"] == '["a/b", 10]'
    assert read.json()["row"]["team"] == "a/b"
    assert ran.json()["addressed"] == 1
    # One run named by its whole key: the engine's one-run statement, which names its reason.
    assert unknown.json()["refused"] == {"unknown_key": 1}
    async with connect_workflows(Session, workflows=[Shift]):
        [row] = await Shift.by_key("a/b", 10).all()
    assert (row.team, row.day, row.next_step) == ("a/b", 10, "work")


async def test_a_bad_key_is_a_422_with_a_sentence_over_http(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with serving(create_app(Session, run_worker=False)) as client:
        read = await client.get("/workflows/shift/runs/abc")
        written = await client.post("/workflows/shift/cancel", json={"key": "abc"})
    assert read.status_code == written.status_code == 422
    assert read.json()["detail"] == [
        {"loc": ["path", "key"], "msg": TWO_PARTS, "type": "value_error"}
    ]
    assert written.json()["detail"][0]["loc"] == ["body", "key"]
    assert written.json()["detail"][0]["msg"] == TWO_PARTS


async def test_a_slashed_key_is_one_run_at_every_door(db: Database) -> None:
    Session = await db.create(slashes.Base.metadata)
    async with connect_workflows(Session, workflows=[Ticket]):
        for code in ("x", "x/cancel"):
            assert await Ticket(code=code).start(Ticket.open)
    async with serving(create_app(Session, run_worker=False)) as client:
        cancelled = await client.post("/workflows/slash_ticket/cancel", json={"key": "x/cancel"})
        states = {
            code: (await client.get(f"/workflows/slash_ticket/runs/{quote(code, safe='')}")).json()
            for code in ("x", "x/cancel")
        }
    assert cancelled.json()["cancelled"] == 1
    assert {code: run["state"] for code, run in states.items()} == {
        "x": "scheduled",
        "x/cancel": "cancelled",
    }


async def test_the_command_line_says_a_bad_key_and_exits_2(
    db: Database, Session: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    env = dev_env(tmp_path / "pg", DULY_APP="tests.apps.chores", DULY_DATABASE_URL=db.url)
    shown = run_duly("show", "shift", "abc", cwd=REPO_ROOT, env=env)
    delivered = run_duly("deliver", "shift", "work", "--key", "[1, 2", cwd=REPO_ROOT, env=env)
    for answer in (shown, delivered):
        assert answer.returncode == USAGE_ERROR, answer.stderr
        assert answer.stderr.strip() == f"duly: key: {TWO_PARTS}"
    good = run_duly("show", "shift", '["a/b", 10]', "--json", cwd=REPO_ROOT, env=env)
    assert good.returncode == 0, good.stderr
    assert '"team": "a/b"' in good.stdout


async def test_the_console_answers_a_bad_key_with_a_422_page_and_its_sentence(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with serving(create_app(Session, run_worker=False)) as client:
        page = await client.get("/console/runs/shift/abc")
        good = await client.get("/console/runs/shift/" + quote('["c", 1]', safe=""))
    assert page.status_code == 422
    assert f"key: {TWO_PARTS}" in html.unescape(page.text)
    assert good.status_code == 200
