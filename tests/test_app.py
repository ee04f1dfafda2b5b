"""The FastAPI app over real HTTP: uvicorn on a free port, httpx against it, a real database."""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker

from engine import ConfigurationError, NotFoundError
from functions import examples
from functions.app import create_app
from functions.examples import Onboarding
from functions.http.errors import SERVER_ERROR
from tests.conftest import Database
from tests.helpers import onboarding, serving, wait_until

SETTLE = 5.0  # seconds a run may take to reach a state before the test fails
FAST_WORKER = {"workflows": [Onboarding], "max_idle_interval": timedelta(seconds=0.5)}
# What every door says of a workflow the examples do not map: the names of those they do.
NO_SUCH_WORKFLOW = (
    "No workflow named 'nope'. This app maps: digest, duly_graph_timers, duly_outbox, expense, "
    "lookup, onboarding, research."
)


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
        "engine_owned": False,
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
        reply = await client.get("/workflows/onboarding/runs")
        older = await client.get("/runs/onboarding")
    assert reply.status_code == 200
    body = reply.json()
    assert older.json() == body  # the older path is the same handler
    assert body["workflow"] == "onboarding"
    [listed] = body["runs"]
    assert (listed["key"], listed["state"]) == (str(row.id), "scheduled")
    run = listed["row"]
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
    assert [run["row"]["id"] for run in reply.json()["runs"]] == [rows[2].id, rows[1].id]


async def test_history_lists_the_attempts_the_worker_made(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=True, worker_options=FAST_WORKER)
    async with serving(app) as client:
        row = Onboarding(user_id="u-history", email="history@example.com")
        assert await row.start(Onboarding.welcome)

        async def waiting() -> bool:
            return (await onboarding(Session, "u-history")).status == "waiting"

        await wait_until(waiting, timeout=SETTLE)
        reply = await client.get(f"/workflows/onboarding/runs/{row.id}")
        older = await client.get(f"/runs/onboarding/{row.id}/history")
    assert reply.status_code == 200
    assert older.json() == reply.json()  # the older path is the same handler
    [attempt] = reply.json()["history"]
    assert (attempt["step"], attempt["attempt"], attempt["outcome"]) == ("welcome", 1, "ok")
    assert attempt["error"] is None
    assert datetime.fromisoformat(attempt["finished_at"]).tzinfo is not None


async def test_a_run_without_an_attempt_log_has_no_history(db: Database) -> None:
    engine = db.engine()
    async with engine.begin() as conn:
        tables = [examples.Base.metadata.tables[name] for name in ("onboarding", "duly_clock")]
        await conn.run_sync(examples.Base.metadata.create_all, tables=tables)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    async with Session() as session:
        row = Onboarding(user_id="u-nolog", email="nolog@example.com")
        session.add(row)
        await session.commit()
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.get(f"/runs/onboarding/{row.id}/history")
    assert reply.status_code == 200
    assert (reply.json()["key"], reply.json()["history"]) == (str(row.id), None)


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
    assert replies["/runs/nope"].json() == {"detail": NO_SUCH_WORKFLOW}
    assert replies["/runs/nope/1/history"].status_code == 404
    for url in ("/runs/onboarding?limit=0", "/runs/onboarding?limit=501"):
        assert replies[url].status_code == 422
        assert "limit" in str(replies[url].json()["detail"])
    assert replies["/runs/onboarding?limit=many"].status_code == 422
    for url in ("/runs/onboarding/abc/history", "/runs/onboarding/1.5/history"):
        assert replies[url].status_code == 422  # a key that is not one: placed at `key`
        [problem] = replies[url].json()["detail"]
        assert problem["loc"] == ["path", "key"]
        assert problem["msg"].endswith("for onboarding: expected int.")
    for url, reply in replies.items():
        assert reply.status_code in (400, 404, 422), (url, reply.status_code, reply.text)
        assert reply.json()["detail"], url


async def test_unknown_workflows_and_runs_are_404_with_a_message(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        runs = await client.get("/runs/nope")
        history = await client.get("/runs/nope/1/history")
        run = await client.get("/runs/onboarding/12345/history")
    assert (runs.status_code, runs.json()) == (404, {"detail": NO_SUCH_WORKFLOW})
    assert (history.status_code, history.json()) == (404, {"detail": NO_SUCH_WORKFLOW})
    assert run.status_code == 404
    assert run.json() == {"detail": "No onboarding run has the key '12345'."}


async def test_a_configuration_error_while_serving_is_a_500_that_leaks_nothing(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=False)
    secret = "postgresql://duly:hunter2@db.internal/prod"

    @app.get("/misconfigured")
    async def misconfigured() -> None:
        raise ConfigurationError(f"DULY_DATABASE_URL {secret} names no reachable database.")

    with caplog.at_level(logging.ERROR, logger="duly.http"):
        async with serving(app) as client:
            reply = await client.get("/misconfigured")
    assert reply.status_code == 500
    assert reply.json() == {"detail": SERVER_ERROR}
    assert "hunter2" not in reply.text and "db.internal" not in reply.text
    logged = [r for r in caplog.records if r.name == "duly.http"]
    assert [r.getMessage() for r in logged] == ["GET /misconfigured failed."]
    assert logged[0].exc_info is not None and logged[0].exc_info[0] is ConfigurationError
    assert secret in caplog.text, "the operator reads the whole message in the log"


async def test_only_not_found_is_404_and_a_bug_is_a_logged_500(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=False)

    @app.get("/broken")
    async def broken() -> None:
        {"present": 1}["absent"]  # a bug: KeyError is a LookupError, yet no 404

    @app.get("/lookup")
    async def lookup() -> None:
        raise LookupError("Not a NotFoundError.")

    @app.get("/misconfigured")
    async def misconfigured() -> None:
        raise ConfigurationError("The limit of expense is set twice.")

    @app.get("/missing")
    async def missing() -> None:
        raise NotFoundError("No expense run has the key 7.")

    with caplog.at_level(logging.ERROR, logger="duly.http"):
        async with serving(app) as client:
            replies = {
                url: await client.get(url)
                for url in ("/broken", "/lookup", "/misconfigured", "/missing")
            }
    assert {url: reply.status_code for url, reply in replies.items()} == {
        "/broken": 500,
        "/lookup": 500,
        "/misconfigured": 500,
        "/missing": 404,
    }
    assert replies["/broken"].json() == {
        "detail": "Internal server error: the traceback is in the server's log."
    }
    assert replies["/misconfigured"].json() == replies["/broken"].json()
    assert replies["/missing"].json() == {"detail": "No expense run has the key 7."}
    failures = [r for r in caplog.records if r.name == "duly.http"]
    assert [r.getMessage() for r in failures] == [
        "GET /broken failed.",
        "GET /lookup failed.",
        "GET /misconfigured failed.",
    ]
    assert failures[0].exc_info is not None
    assert failures[0].exc_info[0] is KeyError
    assert "KeyError: 'absent'" in caplog.text
    assert "Traceback" in caplog.text


async def test_docs_are_served_without_a_cdn(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        pages = {url: await client.get(url) for url in ("/docs", "/redoc")}
        assets: dict[str, httpx.Response] = {}
        for page in pages.values():
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert not re.search(r"https?://", page.text), page.text
            urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
            assert urls, page.text
            for url in urls:
                assert url.startswith("/") and not url.startswith("//"), (url, page.text)
                assets[url] = await client.get(url)
    kinds = {url: reply.headers["content-type"].split(";")[0] for url, reply in assets.items()}
    assert kinds == {
        "/docs/assets/swagger-ui-bundle.js": "text/javascript",
        "/docs/assets/swagger-ui.css": "text/css",
        "/docs/assets/favicon.png": "image/png",
        "/docs/assets/redoc.standalone.js": "text/javascript",
        "/openapi.json": "application/json",
    }
    for url, reply in assets.items():
        assert reply.status_code == 200, url
        assert len(reply.content) > 1000, url
    assert "SwaggerUIBundle" in assets["/docs/assets/swagger-ui-bundle.js"].text
    assert "/workflows/{name}/runs" in assets["/openapi.json"].json()["paths"]
