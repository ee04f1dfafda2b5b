"""Who started, ran and cancelled a run is recorded with the write, through the API and the
console, on a real database.

- the API's start, run and cancel each record their actor: test_the_api_records_who_acted
- a refused write records nothing: test_a_refused_start_records_nothing
- the console's actions record the console as the door: test_the_console_records_its_actions
- replays of dead letters, one or every one: test_a_replay_records_who_replayed_what
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions.app import create_app
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Role
from tests.apps import chores, outbox
from tests.bulk_helpers import dead_letters
from tests.conftest import Database
from tests.helpers import csrf_of, serving

pytestmark = pytest.mark.usefixtures("open_writes")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(chores.Base.metadata)


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


@pytest.mark.usefixtures("failing_registry")
async def test_a_replay_records_who_replayed_what(db: Database) -> None:
    Session = await db.create(outbox.Base.metadata)
    await dead_letters(Session, "c1", "c2", "c3")
    async with serving(create_app(Session, run_worker=False)) as client:
        one = await client.post("/outbox/events/c1/replay")
        assert one.json()["count"] == 1
        again = await client.post("/outbox/events/c1/replay")
        assert again.status_code == 409, "nothing replayed: nothing recorded"
        chosen = await client.post("/outbox/dead-letters/replay", json={"event_ids": ["c2"]})
        assert chosen.json()["count"] == 1
        token = csrf_of(await client.get("/console/outbox"))
        rest = await client.post(
            "/console/outbox/replay", data={"csrf_token": token, "confirmed": "yes"}
        )
        assert rest.status_code == 303
    assert [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in trail(db)] == [
        ("local", "http", "outbox.replay", "duly_outbox", {"event_ids": ["c1"]}, 1),
        ("local", "http", "outbox.replay", "duly_outbox", {"event_ids": ["c2"]}, 1),
        ("local", "console", "outbox.replay", "duly_outbox", {"every": True}, 1),
    ]
