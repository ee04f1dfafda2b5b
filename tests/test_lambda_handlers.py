"""The four Lambda entries end to end: real PostgreSQL, moto for EventBridge Scheduler.

Each test's "container" is a `Runtime` driven on a thread of its own (as the
Lambda runtime calls a handler: synchronously), with a fake Lambda context
(tests/aws_fakes.py). The asynchronous invoke of the wake function is replaced
by a callable that counts (or, for the bound, starts another container on
another thread).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from engine import connect_workflows
from engine.testing import drain as drain_steps, move_clock
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT
from infra.aws.scheduler import schedule_expression, whole_second
from infra.aws.wake_slots import WakeSlots
from tests.apps import serverless_app
from tests.apps.serverless_app import LATER, SIGNUP, Chunk, Outbox, Signup, Stuck
from tests.aws_fakes import (
    WAKE_ARN,
    Aws,
    FreshContainers,
    SlotWatch,
    create_tables,
    function,
    function_url_event,
    one_signup,
    settings_for,
)
from tests.conftest import Database

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")


# -- done when 1: publish, a schedule two hours off, the wake it fires -----------------------


async def test_a_published_signup_is_woken_two_hours_later_by_its_schedule(
    db: Database, moto_endpoint: str
) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    async with function(settings_for(db, aws.group), aws=aws) as fn:
        event = {"event_type": SIGNUP, "event_id": "s-1", "payload": {"email": "ada@example.com"}}
        published = await fn.call(lambda_handlers.publish, event)
        assert published == {"ids": ["s-1"], "stored": ["s-1"], "duplicates": [], "kicked": True}
        assert fn.invokes == 1, "the stored event kicked one asynchronous wake"

        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert woken["caught_up"] is True
        assert woken["steps"] == 2, "the outbox row's route, then the run the handler started"
        signup = await one_signup(Session)
        assert (signup.status, signup.next_step) == ("welcomed", "nudge")
        [schedule] = aws.schedules()
        assert schedule["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))
        assert schedule["ScheduleExpressionTimezone"] == "UTC"
        assert schedule["Target"]["Arn"] == WAKE_ARN

        await move_clock(Session, LATER + timedelta(seconds=1))
        target_input = json.loads(schedule["Target"]["Input"])
        woken = await fn.call(lambda_handlers.wake, target_input)
        assert (woken["steps"], woken["caught_up"]) == (1, True)
        signup = await one_signup(Session)
        assert (signup.status, signup.waiting_for) == ("nudged", "confirm")
        [moved] = aws.schedules()
        assert moved["Name"] == schedule["Name"]
        # The wait's deadline (a day on) is what is next now.
        assert moved["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))
        assert moved["ScheduleExpression"] != schedule["ScheduleExpression"]

        # The confirmation ends the run: nothing is next, so the schedule goes.
        invokes = fn.invokes
        delivered = await fn.call(
            lambda_handlers.deliver,
            {
                "workflow": "lambda_signup",
                "key": signup.id,
                "step": "confirm",
                "args": {"code": "7"},
            },
        )
        assert delivered == {
            "workflow": "lambda_signup",
            "step": "confirm",
            "accepted": 1,
            "taken": 1,
            "held": 0,
            "refused": {},
            "message": "1 run took the event now.",
        }
        assert fn.invokes == invokes + 1, "an accepted delivery kicks a wake"
        woken = await fn.call(lambda_handlers.wake, target_input)
        assert (woken["steps"], woken["caught_up"]) == (1, True)
        assert (await one_signup(Session)).status == "confirmed 7"
        assert aws.schedules() == []


async def test_the_same_through_function_url_events(db: Database, moto_endpoint: str) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    async with function(settings_for(db, aws.group), aws=aws) as fn:
        body = {"event_type": SIGNUP, "event_id": "s-2", "payload": {"email": "bo@example.com"}}
        answer = await fn.call(lambda_handlers.http, function_url_event("POST", "/events", body))
        assert answer["statusCode"] == 200, answer
        assert json.loads(answer["body"])["stored"] == ["s-2"]
        assert fn.invokes == 1, "POST /events kicked a wake"

        answer = await fn.call(
            lambda_handlers.http, function_url_event("POST", "/wake", query="timeout=10")
        )
        assert (answer["statusCode"], json.loads(answer["body"])) == (200, {"caught_up": True})
        signup = await one_signup(Session)
        assert signup.status == "welcomed"
        [schedule] = aws.schedules()
        assert schedule["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))

        await move_clock(Session, LATER + timedelta(seconds=1))
        answer = await fn.call(lambda_handlers.http, function_url_event("POST", "/wake"))
        assert answer["statusCode"] == 200, answer
        signup = await one_signup(Session)
        assert signup.status == "nudged"
        [moved] = aws.schedules()
        assert moved["ScheduleExpression"] == schedule_expression(whole_second(signup.wake_at))

        # Reads go through the same app, on the same container's engine.
        answer = await fn.call(lambda_handlers.http, function_url_event("GET", "/healthz"))
        assert (answer["statusCode"], json.loads(answer["body"])) == (200, {"ok": True})


# -- publish -------------------------------------------------------------------------------


async def test_publish_answers_duplicates_and_refuses_bad_input_writing_nothing(
    db: Database,
) -> None:
    Session = await create_tables(db)
    async with function(settings_for(db)) as fn:
        batch = {
            "events": [
                {"event_type": SIGNUP, "event_id": "a", "payload": {"email": "a@example.com"}},
                {"event_type": SIGNUP, "event_id": "b", "occurred_at": "2026-01-31T09:00Z"},
            ]
        }
        assert (await fn.call(lambda_handlers.publish, batch))["stored"] == ["a", "b"]
        again = await fn.call(lambda_handlers.publish, batch)
        assert again == {"ids": ["a", "b"], "stored": [], "duplicates": ["a", "b"], "kicked": False}
        assert fn.invokes == 1, "only the publish that stored something kicked a wake"

        naive = {
            "events": [
                {"event_type": SIGNUP, "event_id": "c"},
                {"event_type": SIGNUP, "event_id": "d", "occurred_at": "2026-01-31T09:00"},
            ]
        }
        refused = await fn.call(lambda_handlers.publish, naive)
        assert refused["type"] == "InputError"
        assert "events[1].occurred_at" in refused["error"]
        for bad, says in [
            ({"event_type": ""}, "event_type"),
            ({"event_type": SIGNUP, "colour": "red"}, "colour"),
            ({"events": []}, "empty"),
            ({"event_type": SIGNUP, "payload": [1]}, "payload"),
            ({"duly": "wake"}, "wake function"),
            ([1, 2], "JSON object"),
        ]:
            answer = await fn.call(lambda_handlers.publish, bad)
            assert answer["type"] == "InputError" and says in answer["error"], answer
    async with Session() as session:
        ids = (await session.execute(select(Outbox.event_id).order_by(Outbox.event_id))).scalars()
        assert list(ids) == ["a", "b"], "the refused batches wrote nothing"


async def test_a_value_the_database_refuses_is_answered_and_logged_without_the_statement(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A NUL byte in the second event: nothing is written, and neither the answer nor the log
    line holds the SQL or its parameters (the first event's payload), only the reason."""
    Session = await create_tables(db)
    private = "Jane Doe, diagnosis confidential"
    batch = {
        "events": [
            {"event_type": SIGNUP, "event_id": "ok", "payload": {"note": private}},
            {"event_type": SIGNUP, "event_id": "nul", "payload": {"note": "a\u0000b"}},
        ]
    }
    async with function(settings_for(db)) as fn:
        with caplog.at_level(logging.INFO, logger="duly"):
            answer = await fn.call(lambda_handlers.publish, batch)
    assert answer["type"] == "DataError", answer
    assert answer["error"].startswith("The database refused a value in this request:"), answer
    for said in (answer["error"], caplog.text):
        assert private not in said and "INSERT" not in said and "SELECT" not in said, said
    assert "refused its input" in caplog.text
    async with Session() as session:
        assert (await session.execute(select(Outbox.event_id))).first() is None, "nothing written"


# -- deliver -------------------------------------------------------------------------------


async def test_deliver_to_a_waiting_run_and_its_refusals(db: Database) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        signup = Signup(email="cy@example.com")
        await signup.start(Signup.nudge)
    await drain_steps(Session, [Signup])
    async with function(settings_for(db)) as fn:
        by_email = {"workflow": "lambda_signup", "where": {"email": "cy@example.com"}}
        request = {**by_email, "step": "confirm", "args": {"code": "x"}, "idempotency_key": "k1"}
        assert (await fn.call(lambda_handlers.deliver, request))["accepted"] == 1
        assert fn.invokes == 1
        repeated = await fn.call(lambda_handlers.deliver, request)
        assert repeated["accepted"] == 0, "the same idempotency key is taken once"
        assert repeated["refused"] == {"deduplicated": 1} and "taken already" in repeated["message"]

        refusals = [
            ({**request, "workflow": "nope"}, "NotFoundError",
             "No workflow named 'nope'. This app maps: lambda_chunk, lambda_outbox, lambda_signup"),
            ({**request, "step": "nope"}, "NotFoundError", "confirm"),
            ({**request, "args": {"code": 5}}, "StepError", "code"),
            ({**request, "args": {}}, "StepError", "code"),
            ({**request, "key": signup.id}, "InputError", "not both"),
            ({**request, "where": {"colour": "red"}}, "InputError", "colour"),
            ({**request, "restart": "yes"}, "InputError", "restart"),
            ({"workflow": "lambda_signup", "key": "abc", "step": "confirm", "args": {"code": "1"}},
             "InputError", "expected int"),
        ]  # fmt: skip
        for event, kind, says in refusals:
            answer = await fn.call(lambda_handlers.deliver, event)
            assert answer["type"] == kind and says in answer["error"], (event, answer)
        assert fn.invokes == 1, "nothing refused kicked a wake"
    steps = await drain_steps(Session, [Signup])
    assert steps == 1
    assert (await one_signup(Session)).status == "confirmed x"


async def test_deliver_tells_taken_held_and_refused_apart(db: Database) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        waiting, finished = Signup(email="w@example.com"), Signup(email="f@example.com")
        await waiting.start(Signup.nudge)
        await finished.start(Signup.expire)
    await drain_steps(Session, [Signup])  # one waits for `confirm`, one has finished
    async with connect_workflows(Session):
        on_its_way = Signup(email="h@example.com")
        await on_its_way.start(Signup.nudge)  # no wait armed until `nudge` runs
    async with function(settings_for(db)) as fn:
        confirm = {"workflow": "lambda_signup", "step": "confirm", "args": {"code": "c"}}
        answers = [
            await fn.call(lambda_handlers.deliver, {**confirm, "key": run.id})
            for run in (waiting, on_its_way, finished)
        ]
    said = [(a["accepted"], a["taken"], a["held"], a["refused"], a["message"]) for a in answers]
    assert said == [
        (1, 1, 0, {}, "1 run took the event now."),
        (1, 0, 1, {}, "1 run holds the event until it waits for it."),
        (
            0,
            0,
            0,
            {"finished": 1},
            "No run took the event; 1 refused it: the run has finished (deliver with restart "
            "to start it again).",
        ),
    ]


# -- drain ---------------------------------------------------------------------------------


async def test_drain_routes_the_outbox_and_kicks_a_wake_for_what_it_made_due(
    db: Database,
) -> None:
    Session = await create_tables(db)
    async with function(settings_for(db)) as fn:
        batch = {
            "events": [
                {"event_type": SIGNUP, "payload": {"email": f"{n}@example.com"}} for n in range(3)
            ]
        }
        await fn.call(lambda_handlers.publish, batch)
        kicks = fn.invokes
        drained = await fn.call(lambda_handlers.drain, {"duly": "drain"})
        assert drained == {"routed": 3, "caught_up": True, "kicked": True}
        assert fn.invokes == kicks + 1, "the runs the handlers started are due: a wake is kicked"
        async with Session() as session:
            statuses = (await session.execute(select(Outbox.status))).scalars().all()
            signups = (await session.execute(select(Signup.next_step))).scalars().all()
        assert statuses == ["processed"] * 3
        assert signups == ["welcome"] * 3, "started, not run: only the outbox is drained"

        again = await fn.call(lambda_handlers.drain, None)
        assert again["routed"] == 0
        misrouted = await fn.call(lambda_handlers.drain, {"duly": "wake"})
        assert misrouted["type"] == "InputError"


# -- the deadline ----------------------------------------------------------------------------


async def test_a_wake_near_its_deadline_stops_claiming_and_hands_back(db: Database) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        for _ in range(3):
            await Stuck().start(Stuck.grind)
    # Two seconds of margin, four left: claiming stops after two, the steps get one to finish.
    async with function(settings_for(db, wake_margin_seconds=2.0), max_concurrency=2) as fn:
        started = time.monotonic()
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT, remaining=4.0)
        took = time.monotonic() - started
    assert woken["caught_up"] is False
    assert woken["steps"] == 2, "two slots: the third run was never claimed"
    assert woken["invoked"] >= 1, "what is left goes on in another invocation"
    assert took < 4.0, f"the invocation outlived its deadline ({took:.1f} s)"
    rows = db.sql(
        "SELECT claimed_until IS NULL, wake_at <= now(), wf_version FROM lambda_stuck ORDER BY id"
    )
    assert [row[:2] for row in rows] == [(True, True)] * 3, "every run is due again, none held"
    assert sorted(row[2] for row in rows) == [0, 2, 2], "two claimed and handed back"
    assert db.sql("SELECT count(*) FROM duly_wake_slots WHERE held_until IS NOT NULL") == [(0,)]


# -- the bound -------------------------------------------------------------------------------


async def test_slots_refuse_a_fifth_wake_and_ring_the_holders(db: Database) -> None:
    engine = db.engine()
    slots = WakeSlots(engine, 4)
    taken = [await slots.take(f"h{n}", 30) for n in range(4)]
    assert taken == [1, 2, 3, 4]
    before = await slots.now()
    assert await slots.take("h4", 30) is None
    assert await slots.held() == 4
    assert not await slots.release(1, "h0", since=before), "rung after `before`: look again"
    assert await slots.release(1, "h0", since=await slots.now())
    assert await slots.take("h4", 30) == 1
    assert await slots.release(2, "someone else"), "not the holder: nothing to free"
    assert await slots.held() == 4
    db.sql("UPDATE duly_wake_slots SET held_until = clock_timestamp() - interval '1 s'")
    assert await slots.take("h5", 30) == 1, "an expired slot is free"


@pytest.mark.parametrize("kicked", [1, 6], ids=["one-kick", "six-kicks-at-once"])
async def test_a_backlog_is_worked_by_at_most_max_wakes_invocations_at_once(
    db: Database, kicked: int
) -> None:
    """One kick spreads to max_wakes wakes; six at once are cut down to max_wakes."""
    Session = await create_tables(db)
    async with connect_workflows(Session):
        for _ in range(600):
            await Chunk().start(Chunk.work)
    serverless_app.running.update(now=0, most=0)
    containers = FreshContainers(settings_for(db, max_wakes=4))
    await WakeSlots(db.engine(), 4).ensure()  # the first wake would make it: the watcher reads it
    with SlotWatch(db.conninfo) as slots:
        for _ in range(kicked):
            await containers.invoke()
        results = await containers.settled()
    done = db.sql("SELECT count(*), min(done), max(done) FROM lambda_chunk")
    assert done == [(600, 1, 1)], "every run ran exactly once"
    working = [r for r in results if r["slot"] is not None]
    assert slots.most <= 4, f"at most max_wakes wakes at once, not {slots.most}"
    assert slots.most == 4, f"the backlog spread to max_wakes wakes (at most {slots.most})"
    assert len(working) >= 4
    refused = [r for r in results if r["slot"] is None]
    assert all(r["reason"].startswith("busy") for r in refused), refused
    if kicked > 4:
        assert refused, "six wakes at once: some found every slot held"
    assert all(r["caught_up"] for r in working if r["steps"]), results
    assert serverless_app.running["most"] <= 4 * 4, "four wakes of four steps each"
    assert sum(r["steps"] for r in results) == 600


# -- imports -------------------------------------------------------------------------------


def test_the_direct_entries_import_neither_fastapi_nor_mangum_nor_boto3() -> None:
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import functions.lambdas.handlers"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in found.stderr.splitlines()}
    roots = {name.split(".")[0] for name in imported}
    assert "functions.lambdas.handlers" in imported
    assert not roots & {"fastapi", "starlette", "mangum", "boto3", "botocore"}
