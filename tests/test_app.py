"""The FastAPI app over real HTTP: uvicorn on a free port, httpx against it, a real database."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import psycopg
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions import examples
from functions.app import create_app
from functions.examples import Onboarding
from tests.conftest import Database
from tests.helpers import serving, wait_until

SETTLE = 5.0  # seconds a run may take to reach a state before the test fails
FAST_WORKER = {"workflows": [Onboarding], "max_idle_interval": timedelta(seconds=0.5)}


async def onboarding(Session: async_sessionmaker[AsyncSession], user_id: str) -> Onboarding:
    async with Session() as session:
        return (
            await session.scalars(select(Onboarding).where(Onboarding.user_id == user_id))
        ).one()


async def test_healthz_answers_ok_then_503_when_the_database_refuses(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.get("/healthz")
        assert (reply.status_code, reply.json()) == (200, {"ok": True})
        admin = make_url(db.conninfo).set(database="postgres").render_as_string(False)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{db.name}" ALLOW_CONNECTIONS false')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (db.name,),
            )
        reply = await client.get("/healthz")
        assert reply.status_code == 503
        assert reply.json()["ok"] is False
        assert reply.json()["detail"].startswith("The database is unreachable: ")


async def test_workflows_lists_tables_steps_lanes_and_limits(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.get("/workflows")
    assert reply.status_code == 200
    described = {w["name"]: w for w in reply.json()["workflows"]}
    assert described["onboarding"] == {
        "name": "onboarding",
        "steps": ["welcome", "check", "activated"],
        "lanes": ["default"],
        "limit": None,
    }
    assert described["lookup"]["limit"] == {
        "by": "customer",
        "at_most": 3,
        "rate": None,
        "per_seconds": None,
    }


async def test_runs_lists_a_started_run_with_its_engine_columns(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        row = Onboarding(user_id="u-list", email="list@example.com")
        assert await row.start(Onboarding.welcome)
        reply = await client.get("/runs/onboarding")
    assert reply.status_code == 200
    body = reply.json()
    assert body["workflow"] == "onboarding"
    [run] = body["runs"]
    assert run["id"] == row.id
    assert (run["user_id"], run["email"], run["nudges"]) == ("u-list", "list@example.com", 0)
    assert (run["next_step"], run["next_args"], run["attempts"], run["last_error"]) == (
        "welcome",
        {"args": [], "kwargs": {}},
        0,
        None,
    )
    assert datetime.fromisoformat(run["wake_at"]).tzinfo is not None
    assert "claimed_until" not in run and "wf_version" not in run


async def test_runs_are_newest_first_and_limited(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        rows = [Onboarding(user_id=f"u-{n}", email=f"{n}@example.com") for n in range(3)]
        for row in rows:
            assert await row.start(Onboarding.welcome)
        reply = await client.get("/runs/onboarding", params={"limit": 2})
    assert reply.status_code == 200
    assert [run["id"] for run in reply.json()["runs"]] == [rows[2].id, rows[1].id]


async def test_history_lists_the_attempts_the_worker_made(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=True, worker_options=FAST_WORKER)
    async with serving(app) as client:
        row = Onboarding(user_id="u-history", email="history@example.com")
        assert await row.start(Onboarding.welcome)

        async def waiting() -> bool:
            return (await onboarding(Session, "u-history")).status == "waiting"

        await wait_until(waiting, timeout=SETTLE)
        reply = await client.get(f"/runs/onboarding/{row.id}/history")
    assert reply.status_code == 200
    [attempt] = reply.json()["attempts"]
    assert (attempt["step"], attempt["attempt"], attempt["outcome"]) == ("welcome", 1, "ok")
    assert attempt["error"] is None
    assert datetime.fromisoformat(attempt["finished_at"]).tzinfo is not None


async def test_history_is_404_without_an_attempt_log(db: Database) -> None:
    engine = db.engine()
    async with engine.begin() as conn:
        tables = [examples.Base.metadata.tables[name] for name in ("onboarding", "duly_clock")]
        await conn.run_sync(examples.Base.metadata.create_all, tables=tables)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.get("/runs/onboarding/1/history")
    assert reply.status_code == 404
    assert "No AttemptLog is mapped" in reply.json()["detail"]


async def test_client_mistakes_are_4xx_with_a_message_never_500(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        row = Onboarding(user_id="u-bad", email="bad@example.com")
        assert await row.start(Onboarding.welcome)
        replies: dict[str, httpx.Response] = {}
        for url in (
            "/runs/nope",
            "/runs/nope/1/history",
            "/runs/onboarding?limit=0",
            "/runs/onboarding?limit=501",
            "/runs/onboarding?limit=many",
            "/runs/onboarding/abc/history",
            "/runs/onboarding/1.5/history",
            f"/runs/onboarding/{row.id + 1000}/history",
            f"/runs/onboarding/{10**30}/history",
            f"/runs/onboarding/{-(10**30)}/history",
        ):
            replies[url] = await client.get(url)
    assert replies["/runs/nope"].status_code == 404
    assert replies["/runs/nope"].json() == {"detail": "No workflow named 'nope'."}
    assert replies["/runs/nope/1/history"].status_code == 404
    for url in ("/runs/onboarding?limit=0", "/runs/onboarding?limit=501"):
        assert replies[url].status_code == 422
        assert "limit" in str(replies[url].json()["detail"])
    assert replies["/runs/onboarding?limit=many"].status_code == 422
    for url in ("/runs/onboarding/abc/history", "/runs/onboarding/1.5/history"):
        assert replies[url].status_code == 400
        assert replies[url].json()["detail"].endswith("for onboarding: expected int.")
    for url, reply in replies.items():
        assert reply.status_code in (400, 404, 422), (url, reply.status_code, reply.text)
        assert reply.json()["detail"], url


async def test_dev_clock_moves_the_clock_and_the_check_step_runs(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=True, worker_options=FAST_WORKER, dev=True)
    async with serving(app) as client:
        row = Onboarding(user_id="u-clock", email="clock@example.com")
        assert await row.start(Onboarding.welcome)

        async def waiting() -> bool:
            return (await onboarding(Session, "u-clock")).status == "waiting"

        await wait_until(waiting, timeout=SETTLE)
        assert (await onboarding(Session, "u-clock")).nudges == 0
        reply = await client.post("/dev/clock", json={"days": 3})
        assert reply.status_code == 200
        assert reply.json() == {"shift_seconds": 3 * 24 * 3600.0}

        async def nudged() -> bool:
            return (await onboarding(Session, "u-clock")).nudges == 1

        await wait_until(nudged, timeout=SETTLE)
        history = (await client.get(f"/runs/onboarding/{row.id}/history")).json()
        reply = await client.post("/dev/clock", json={"hours": 1.5, "minutes": 30})
        assert reply.json() == {"shift_seconds": (3 * 24 + 2) * 3600.0}
    assert [(a["step"], a["outcome"]) for a in history["attempts"]] == [
        ("welcome", "ok"),
        ("check", "ok"),
    ]


async def test_dev_clock_refuses_bad_moves(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False, dev=True)) as client:
        statuses = [
            (await client.post("/dev/clock", json=body)).status_code
            for body in ({"days": "soon"}, {"day": 3}, {"days": 1e300}, {"years": 1})
        ]
        not_json = await client.post(
            "/dev/clock", content="days=3", headers={"content-type": "text/plain"}
        )
    assert statuses == [422, 422, 400, 422]
    assert not_json.status_code == 422


async def test_dev_onboarding_starts_a_run_once(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False, dev=True)) as client:
        body = {"user_id": "u-dev", "email": "dev@example.com"}
        first = await client.post("/dev/onboarding", json=body)
        second = await client.post("/dev/onboarding", json=body)
        empty = await client.post("/dev/onboarding", json={"user_id": "", "email": "x"})
        runs = (await client.get("/runs/onboarding")).json()["runs"]
    assert first.status_code == 200 and first.json()["started"] is True
    assert second.status_code == 200
    assert second.json() == {"started": False, "id": first.json()["id"]}
    assert empty.status_code == 422
    assert [(run["id"], run["user_id"]) for run in runs] == [(first.json()["id"], "u-dev")]


async def test_dev_routes_exist_only_in_dev(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        clock = await client.post("/dev/clock", json={"days": 3})
        start = await client.post("/dev/onboarding", json={"user_id": "u", "email": "e"})
    assert (clock.status_code, start.status_code) == (404, 404)
