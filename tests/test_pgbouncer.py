"""The Lambda path through a real PgBouncer in transaction mode, as poolers run on AWS.

On AWS the functions reach PostgreSQL through PgBouncer or RDS Proxy in
transaction mode, where LISTEN, session state and server-side prepared
statements do not survive a transaction. The Lambda path must need none of
them: these tests run publish, wake (with a `wake_in` registered on moto's
EventBridge Scheduler), deliver and the wake slots with the runtime's
database URL pointing at PgBouncer (`tests/pgbouncer.py`, which resets every
server connection after every transaction, so reliance on session state
fails every time, not once in a while). The first test shows the pooler
really is that strict. Setup and checks use the database directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from engine import connect_workflows
from engine.testing import move_clock
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT
from infra.aws.scheduler import schedule_expression, whole_second
from infra.aws.wake_slots import WakeSlots
from infra.testing.pytest_plugin import Database, Server
from tests.apps import serverless_app
from tests.apps.serverless_app import LATER, SIGNUP, Chunk, Signup
from tests.aws_fakes import (
    Aws,
    FreshContainers,
    create_tables,
    function,
    function_url_event,
    one_signup,
    settings_for,
)
from tests.pgbouncer import Bouncer, start_pgbouncer

LAMBDA_APPLICATION = "duly-lambda"  # the runtime's application_name (functions/lambdas/runtime.py)


@pytest.fixture
def bouncer(db: Database, server: Server) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of this test's database."""
    with start_pgbouncer(db, server) as running:
        yield running


pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")


def lambda_clients(bouncer: Bouncer) -> list[dict[str, Any]]:
    """PgBouncer's clients that the Lambda runtime's engine opened."""
    return [c for c in bouncer.show("CLIENTS") if c["application_name"] == LAMBDA_APPLICATION]


def transactions(bouncer: Bouncer) -> int:
    """How many transactions PgBouncer has pooled for the test's database."""
    [row] = [r for r in bouncer.show("STATS") if r["database"] == bouncer.database]
    return int(row["total_xact_count"])


# -- the pooler is what production runs -----------------------------------------------------


def test_the_pooler_is_in_transaction_mode_and_keeps_no_session_state(
    bouncer: Bouncer, db: Database
) -> None:
    config = bouncer.config()
    assert config["pool_mode"] == "transaction"
    assert bouncer.pool()["pool_mode"] == "transaction"
    assert (config["server_reset_query"], config["server_reset_query_always"]) == (
        "DISCARD ALL",
        "1",
    )

    with psycopg.connect(bouncer.conninfo, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '7s'")
        shown = conn.execute("SHOW statement_timeout").fetchone()
        assert shown == ("0",), "a session SET is gone by the next transaction"

        conn.execute("SELECT pg_advisory_lock(42)")
        held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
        assert held == (0,), "a session advisory lock is released with the transaction"

        with conn.transaction():  # within one transaction the session is the client's
            conn.execute("SET statement_timeout = '7s'")
            assert conn.execute("SHOW statement_timeout").fetchone() == ("7s",)

        conn.execute("LISTEN duly_pooler_test")
        db.sql("NOTIFY duly_pooler_test, 'lost'")
        heard = [n.payload for n in conn.notifies(timeout=0.5)]
        assert heard == [], "LISTEN does not outlive its transaction"

    # psycopg's default prepares a query on its sixth run: through this pooler that fails.
    with psycopg.connect(bouncer.conninfo, autocommit=True) as conn:
        for n in range(5):
            assert conn.execute("SELECT %s::int", [n]).fetchone() == (n,)
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("SELECT %s::int", [5])

    # The runtime's setting (prepare_threshold=None) never prepares: a hundred runs pass.
    with psycopg.connect(bouncer.conninfo, autocommit=True, prepare_threshold=None) as conn:
        for n in range(100):
            assert conn.execute("SELECT %s::int", [n]).fetchone() == (n,)


# -- publish, wake and deliver ---------------------------------------------------------------


async def test_publish_wake_and_deliver_end_to_end_through_pgbouncer(
    bouncer: Bouncer, db: Database, moto_endpoint: str
) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    settings = settings_for(db, aws.group, database_url=bouncer.url)
    before = transactions(bouncer)
    async with function(settings, aws=aws) as fn:
        event = {"event_type": SIGNUP, "event_id": "p-1", "payload": {"email": "ada@example.com"}}
        published = await fn.call(lambda_handlers.publish, event)
        assert published == {"ids": ["p-1"], "stored": ["p-1"], "duplicates": [], "kicked": True}
        assert fn.invokes == 1, "the stored event kicked a wake"
        assert lambda_clients(bouncer), "the runtime's engine connects through PgBouncer"

        # The outbox row's route runs the handler, which starts the run; its welcome
        # returns wake_in(nudge, 2 hours): one schedule at that instant.
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert (woken["steps"], woken["caught_up"]) == (2, True), woken
        signup = await one_signup(Session)
        assert (signup.status, signup.next_step) == ("welcomed", "nudge")
        assert signup.wake_at is not None
        [schedule] = aws.schedules()
        assert schedule["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))

        await move_clock(Session, LATER + timedelta(seconds=1))
        woken = await fn.call(lambda_handlers.wake, json.loads(schedule["Target"]["Input"]))
        assert (woken["steps"], woken["caught_up"]) == (1, True), woken
        signup = await one_signup(Session)
        assert (signup.status, signup.waiting_for) == ("nudged", "confirm")
        assert signup.wake_at is not None, "the wait's deadline"
        [moved] = aws.schedules()
        assert moved["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))
        assert moved["ScheduleExpression"] != schedule["ScheduleExpression"]

        request = {
            "workflow": "lambda_signup",
            "where": {"email": "ada@example.com"},
            "step": "confirm",
            "args": {"code": "42"},
            "idempotency_key": "confirm-1",
        }
        delivered = await fn.call(lambda_handlers.deliver, request)
        assert (delivered["taken"], delivered["workflow"], delivered["step"]) == (
            1,
            "lambda_signup",
            "confirm",
        )
        assert (await fn.call(lambda_handlers.deliver, request))["accepted"] == 0, "key taken"
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert (woken["steps"], woken["caught_up"]) == (1, True), woken
        assert (await one_signup(Session)).status == "confirmed 42"
        assert aws.schedules() == [], "nothing is next: the schedule is gone"

    assert transactions(bouncer) - before >= 20, "the work went through PgBouncer"
    assert db.sql("SELECT count(*) FROM duly_wake_slots WHERE held_until IS NOT NULL") == [(0,)]


async def test_function_url_events_and_drain_through_pgbouncer(
    bouncer: Bouncer, db: Database
) -> None:
    """The HTTP app (mangum on the container's loop and engine) and drain, pooled."""
    Session = await create_tables(db)
    async with function(settings_for(db, database_url=bouncer.url)) as fn:
        batch = {
            "events": [
                {"event_type": SIGNUP, "event_id": f"h-{n}", "payload": {"email": f"{n}@ex.com"}}
                for n in range(3)
            ]
        }
        posted = function_url_event("POST", "/events", batch)
        answer = await fn.call(lambda_handlers.http, posted)
        assert answer["statusCode"] == 200, answer
        assert json.loads(answer["body"])["stored"] == ["h-0", "h-1", "h-2"]

        drained = await fn.call(lambda_handlers.drain, {"duly": "drain"})
        assert drained == {"routed": 3, "caught_up": True, "kicked": True}

        answer = await fn.call(
            lambda_handlers.http, function_url_event("POST", "/wake", query="timeout=10")
        )
        assert (answer["statusCode"], json.loads(answer["body"])) == (200, {"caught_up": True})
        answer = await fn.call(
            lambda_handlers.http,
            function_url_event("GET", "/workflows/lambda_signup/runs", query="next_step=nudge"),
        )
        assert answer["statusCode"] == 200, answer
        runs = json.loads(answer["body"])["runs"]
        assert sorted(r["row"]["email"] for r in runs) == ["0@ex.com", "1@ex.com", "2@ex.com"]
        assert {r["state"] for r in runs} == {"scheduled"}, "welcomed, the nudge two hours off"
        assert lambda_clients(bouncer), "the HTTP app used the runtime's pooled engine"
    async with Session() as session:
        statuses = (await session.execute(select(Signup.status))).scalars().all()
    assert statuses == ["welcomed"] * 3


# -- the wake slots ----------------------------------------------------------------------------


async def test_wake_slots_serialize_through_pgbouncer(bouncer: Bouncer, db: Database) -> None:
    """Take, ring and release hold only a transaction-level advisory lock: they work pooled."""
    engines = [pooled_engine(db, bouncer) for _ in range(8)]
    slots = [WakeSlots(e, 4) for e in engines]
    taken = await asyncio.gather(*(s.take(f"h{n}", 30) for n, s in enumerate(slots)))
    assert sorted(t for t in taken if t is not None) == [1, 2, 3, 4], taken
    assert taken.count(None) == 4, "four of eight refused: every slot held"
    rung = db.sql("SELECT count(*) FROM duly_wake_slots WHERE rang_at IS NOT NULL")
    assert rung == [(4,)], "the refused rang every holder"

    holder = taken.index(1)
    first = slots[holder]
    before = await first.now()
    assert await slots[-1].take("ninth", 30) is None, "refused, it rings the holders again"
    assert not await first.release(1, f"h{holder}", since=before), "rung since: look again"
    assert await first.release(1, f"h{holder}", since=await first.now())
    assert await first.held() == 3
    assert await slots[0].take("late", 30) == 1
    assert await first.release(2, "someone else"), "not the holder: nothing to free"
    assert await first.held() == 4


def pooled_engine(db: Database, bouncer: Bouncer) -> AsyncEngine:
    """An engine on the pooler as the Lambda runtime makes it: no server-side prepares."""
    engine = create_async_engine(
        bouncer.url,
        pool_pre_ping=True,
        connect_args={"prepare_threshold": None, "application_name": LAMBDA_APPLICATION},
    )
    db.engines.append(engine)  # disposed of with the test's database
    return engine


# -- concurrent wakes over a backlog -------------------------------------------------------------


async def test_concurrent_wakes_work_a_backlog_through_pgbouncer(
    bouncer: Bouncer, db: Database
) -> None:
    """Wakes spread over a backlog through the pooler, bounded by the slots, each run once."""
    Session = await create_tables(db)
    async with connect_workflows(Session):
        for _ in range(200):
            await Chunk().start(Chunk.work)
    serverless_app.running.update(now=0, most=0)
    containers = FreshContainers(settings_for(db, max_wakes=2, database_url=bouncer.url))
    await containers.invoke()
    results = await containers.settled()

    assert db.sql("SELECT count(*), min(done), max(done) FROM lambda_chunk") == [(200, 1, 1)]
    assert sum(r["steps"] for r in results) == 200, results
    working = [r for r in results if r["slot"] is not None]
    assert len(working) >= 2, "the first wake invoked a second while work stayed due"
    assert {r["slot"] for r in working} <= {1, 2}
    assert serverless_app.running["most"] <= 2 * 4, "two wakes of four steps each at most"
    assert db.sql("SELECT count(*) FROM duly_wake_slots WHERE held_until IS NOT NULL") == [(0,)]
    assert bouncer.pool()["cl_waiting"] == 0
