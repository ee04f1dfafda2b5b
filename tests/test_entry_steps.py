"""Entry steps: a workflow that declares `@step(entry=True)` is started from outside only there.

Every door that starts runs refuses another step with a clear 4xx (or exit 2) and writes
nothing: HTTP `POST /workflows/{name}/start`, the console's start form (which offers
only entry steps), `duly start`; each accepts an entry step. A workflow that declares none
starts at any step, as before; a start from Python code is never checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import ConfigurationError, connect_workflows, step
from engine.model.registry import workflow_info
from tests.apps import entries
from tests.apps.entries import Errand, Parcel
from tests.conftest import Database
from tests.helpers import REPO_ROOT, csrf_of, dev_env, run_duly

REFUSED = "ship is not an entry step of consignment: a run starts at charge or imported."

pytestmark = pytest.mark.usefixtures("open_writes")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(entries.Base.metadata)


async def parcels(Session: async_sessionmaker[AsyncSession]) -> int:
    async with Session() as session:
        return int((await session.execute(select(func.count()).select_from(Parcel))).scalar_one())


def test_the_workflow_knows_its_entry_steps() -> None:
    assert workflow_info(Parcel).entry_steps == ("charge", "imported")
    assert workflow_info(Errand).entry_steps == ()
    with pytest.raises(ConfigurationError, match="entry must be True or False"):
        step(entry="yes")  # type: ignore[call-overload]


async def test_http_refuses_a_step_that_is_not_an_entry(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    refused = await client.post("/workflows/consignment/start", json={"step": "ship"})
    assert refused.status_code == 422, refused.text
    [problem] = refused.json()["detail"]
    assert problem["loc"][-1] == "step" and problem["msg"] == REFUSED
    assert await parcels(Session) == 0
    started = await client.post(
        "/workflows/consignment/start", json={"step": "charge", "args": {"amount": 5}}
    )
    assert started.status_code == 201, started.text
    assert started.json()["step"] == "charge" and await parcels(Session) == 1


async def test_the_api_schema_offers_only_entry_steps_to_start(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]

    def steps(path: str) -> list[str]:
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return [one["properties"]["step"]["enum"][0] for one in body["oneOf"]]

    assert steps("/workflows/consignment/start") == ["charge", "imported"]
    assert steps("/workflows/consignment/run") == ["charge", "imported", "ship"]
    assert steps("/workflows/errand/start") == ["first", "second"]


async def test_http_starts_a_workflow_without_entries_at_any_step(
    client: httpx.AsyncClient,
) -> None:
    started = await client.post("/workflows/errand/start", json={"step": "second"})
    assert started.status_code == 201, started.text


async def test_the_console_offers_and_takes_only_entry_steps(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    form = await client.get("/console/runs/consignment/start")
    assert form.status_code == 200
    offered = form.text.split('id="start-step-choice"')[1].split("</select>")[0]
    assert 'value="charge"' in offered and 'value="imported"' in offered
    assert 'value="ship"' not in offered
    asked = await client.get("/console/runs/consignment/start", params={"step": "ship"})
    assert asked.status_code == 400 and "not an entry step of consignment" in asked.text
    token = csrf_of(form)
    posted = await client.post(
        "/console/runs/consignment/start", data={"csrf_token": token, "step": "ship"}
    )
    assert posted.status_code == 400 and "not an entry step of consignment" in posted.text
    assert await parcels(Session) == 0
    taken = await client.post(
        "/console/runs/consignment/start", data={"csrf_token": token, "step": "imported"}
    )
    assert taken.status_code == 303 and await parcels(Session) == 1
    every_step = await client.get("/console/runs/errand/start")
    assert 'value="second"' in every_step.text, "no entry declared: every step is offered"


async def test_duly_start_refuses_a_step_that_is_not_an_entry(
    Session: async_sessionmaker[AsyncSession], db: Database, tmp_path: Path
) -> None:
    env = dev_env(tmp_path / "pg", DULY_APP="tests.apps.entries", DULY_DATABASE_URL=db.url)
    refused = run_duly("start", "consignment", "ship", cwd=REPO_ROOT, env=env)
    assert refused.returncode == 2 and f"step: {REFUSED}" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert await parcels(Session) == 0
    started = run_duly(
        "start",
        "consignment",
        "charge",
        "--args",
        '{"amount": 5}',
        "--json",
        cwd=REPO_ROOT,
        env=env,
    )
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {"workflow": "consignment", "key": "1", "step": "charge"}
    assert await parcels(Session) == 1


async def test_a_start_from_python_is_not_checked(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with connect_workflows(Session, workflows=[Parcel]):
        assert await Parcel(label="repair").start(Parcel.ship)
    assert await parcels(Session) == 1
