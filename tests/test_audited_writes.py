"""Who started, ran and cancelled a run is recorded with the write, through the API and the
console, on a real database.

- the API's start, run and cancel each record their actor: test_the_api_records_who_acted
- a refused write records nothing: test_a_refused_start_records_nothing
- the console's actions record the console as the door: test_the_console_records_its_actions
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions.http.app import create_app
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Role
from tests.apps import chores
from tests.conftest import Database
from tests.helpers import csrf_of, serving


@pytest.fixture(autouse=True)
def open_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DULY_API_TOKEN", "DULY_API_KEYS", "DULY_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(chores.Base.metadata)


@pytest.fixture
async def client(Session: async_sessionmaker[AsyncSession]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client


def trail(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT actor, via, action, workflow, subject, count, detail FROM duly_audit ORDER BY id"
    )


async def test_the_api_records_who_acted(
    db: Database, Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    entry = ApiKey("ops-key", frozenset({Role.OPERATOR}), frozenset(), digest_of(key)).entry()
    monkeypatch.setenv("DULY_API_KEYS", json.dumps([entry]))
    headers = {"authorization": f"Bearer {key}"}
    async with serving(create_app(Session, run_worker=False)) as client:
        started = await client.post(
            "/workflows/chore/start", json={"row": {"label": "a"}, "step": "work"}, headers=headers
        )
        assert started.status_code == 201, started.text
        ran = await client.post(
            "/workflows/chore/run",
            json={"where": {"label": "a"}, "step": "explode"},
            headers=headers,
        )
        assert ran.json()["addressed"] == 1
        cancelled = await client.post("/workflows/chore/cancel", json={"key": 1}, headers=headers)
        assert cancelled.json()["cancelled"] == 1
        again = await client.post("/workflows/chore/cancel", json={"key": 1}, headers=headers)
        assert again.json()["cancelled"] == 0
    assert trail(db) == [
        ("ops-key", "http", "run.start", "chore", {"key": 1}, 1, {"step": "work"}),
        ("ops-key", "http", "run.step", "chore", {"where": {"label": "a"}}, 1, {"step": "explode"}),
        ("ops-key", "http", "run.cancel", "chore", {"key": 1}, 1, None),
        ("ops-key", "http", "run.cancel", "chore", {"key": 1}, 0, None),
    ]


async def test_a_refused_start_records_nothing(db: Database, client: httpx.AsyncClient) -> None:
    refused = await client.post(
        "/workflows/chore/start", json={"row": {"done": "x"}, "step": "work"}
    )
    assert refused.status_code == 422
    unknown = await client.post("/workflows/chore/run", json={"key": 1, "step": "nope"})
    assert unknown.status_code == 404
    assert trail(db) == []


async def test_the_console_records_its_actions(db: Database, client: httpx.AsyncClient) -> None:
    token = csrf_of(await client.get("/console/runs/chore/start?step=work"))
    started = await client.post(
        "/console/runs/chore/start", data={"csrf_token": token, "step": "work", "args.label": "c"}
    )
    assert started.status_code == 303, started.text
    base = "/console/runs/chore/1"
    ran = await client.post(
        f"{base}/run",
        data={"csrf_token": token, "step": "work", "args.label": "d", "confirmed": "yes"},
    )
    assert ran.status_code == 303, ran.text
    done = await client.post(f"{base}/cancel", data={"csrf_token": token, "confirmed": "yes"})
    assert done.status_code == 303
    assert [(r[0], r[1], r[2], r[5]) for r in trail(db)] == [
        ("local", "console", "run.start", 1),
        ("local", "console", "run.step", 1),
        ("local", "console", "run.cancel", 1),
    ]
