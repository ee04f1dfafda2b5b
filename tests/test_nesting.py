"""JSON nested past MAX_NESTING levels is refused at every door, and nothing stored breaks a read.

A payload, a step's arguments, a run's row or a graph design nested deeper
than the request layer allows is refused by HTTP (422), the console (its
form redrawn with the refusal) and the Lambda entries (`{"error", "type"}`)
in one sentence, and writes nothing. A value already stored deeper than
Python's recursion limit (written by SQL here) is read back, truncated.
"""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.base.shown import SHOWN_NESTING, TRUNCATED
from functions import examples
from functions.app import create_app
from functions.examples import Research
from functions.lambdas import handlers as lambda_handlers
from functions.local.dev import create_dev_app, install_example_graph
from functions.requests.errors import Problem
from functions.requests.nesting import MAX_NESTING, TOO_DEEP
from tests.apps.serverless_app import SIGNUP, Outbox, Signup
from tests.aws_fakes import create_tables, function, row_of, settings_for, waiting_signup
from tests.conftest import Database
from tests.helpers import csrf_of, serving

STORED_LEVELS = 2_000  # twice Python's recursion limit: no recursive walk could read it
DEEP_DESIGN_LEVELS = 300  # past the 255 levels that used to break a design's save
PAST_RECURSIVE_WALKS = 700  # levels: past what jsonable_encoder and a recursive walk reach


def nested(levels: int) -> dict[str, Any]:
    """An object `levels` objects deep: {"a": {"a": ... {"a": 1}}}."""
    value: dict[str, Any] = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def nested_text(levels: int) -> str:
    """nested(levels) as JSON text, built without recursion."""
    return '{"a":' * levels + "1" + "}" * levels


def levels_shown(value: Any) -> tuple[int, Any]:
    """How many objects deep `value` is shown, and what its innermost "a" holds."""
    levels = 0
    while isinstance(value, dict):
        levels, value = levels + 1, value["a"]
    return levels, value


def said_by_http(reply: httpx.Response) -> str:
    """The sentence of a 422's one problem."""
    assert reply.status_code == 422, reply.text[:2000]
    [problem] = reply.json()["detail"]
    assert problem["loc"][0] == "body"
    return Problem(tuple(problem["loc"][1:]), problem["msg"]).sentence()


async def outbox_count(Session: async_sessionmaker[AsyncSession]) -> int:
    async with Session() as session:
        return (await session.execute(select(func.count()).select_from(Outbox))).scalar_one()


async def test_a_publish_nested_too_deep_is_refused_by_http_and_lambda_alike(
    db: Database,
) -> None:
    Session = await create_tables(db)
    bodies = {
        "a payload 400 levels deep": (
            {"event_type": SIGNUP, "payload": nested(400)},
            f"event.payload: {TOO_DEEP}",
        ),
        "metadata one level too deep": (
            {"event_type": SIGNUP, "metadata": nested(MAX_NESTING + 1)},
            f"event.metadata: {TOO_DEEP}",
        ),
        "a batch's second payload": (
            {"events": [{"event_type": SIGNUP}, {"event_type": SIGNUP, "payload": nested(400)}]},
            f"batch.events[1].payload: {TOO_DEEP}",
        ),
    }
    async with (
        function(settings_for(db)) as fn,
        serving(create_app(Session, run_worker=False)) as client,
    ):
        for case, (body, sentence) in bodies.items():
            by_http = said_by_http(await client.post("/events", json=body))
            assert by_http == sentence, case
            answer = await fn.call(lambda_handlers.publish, body)
            assert answer == {"error": sentence, "type": "InputError"}, case
        assert await outbox_count(Session) == 0, "the refused publishes wrote nothing"
        deepest = {"event_type": SIGNUP, "event_id": "deepest", "payload": nested(MAX_NESTING)}
        accepted = await client.post("/events", json=deepest)
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["stored"] == ["deepest"]
        shown = (await client.get("/outbox/events/deepest")).json()["event"]["payload"]
        assert shown == nested(MAX_NESTING), "a value within the limit reads back whole"


async def test_step_args_nested_too_deep_are_refused_by_every_door(db: Database) -> None:
    Session = await create_tables(db)
    key = await waiting_signup(Session)
    before = await row_of(Session)
    deep = {"code": nested(400)}
    sentence = f"args: {TOO_DEEP}"
    async with (
        function(settings_for(db)) as fn,
        serving(create_app(Session, run_worker=False)) as client,
    ):
        for action in ("deliver", "run"):
            body = {"key": key, "step": "confirm", "args": deep}
            refused = await client.post(f"/workflows/lambda_signup/{action}", json=body)
            assert said_by_http(refused) == sentence, action
        start = {"row": {"email": "new@example.com"}, "step": "welcome", "args": deep}
        refused = await client.post("/workflows/lambda_signup/start", json=start)
        assert said_by_http(refused) == sentence
        where = {"where": {"email": nested(400)}, "step": "confirm"}
        refused = await client.post("/workflows/lambda_signup/deliver", json=where)
        assert said_by_http(refused) == f"where: {TOO_DEEP}"
        event = {"workflow": "lambda_signup", "key": key, "step": "confirm", "args": deep}
        answer = await fn.call(lambda_handlers.deliver, event)
        assert answer == {"error": sentence, "type": "InputError"}
        assert fn.invokes == 0, "nothing refused kicked a wake"
    assert await row_of(Session) == before, "the refused writes wrote nothing"
    async with Session() as session:
        count = (await session.execute(select(func.count()).select_from(Signup))).scalar_one()
    assert count == 1, "the refused start inserted no run"


async def test_the_console_refuses_a_json_field_nested_too_deep(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        form_url = "/console/runs/research/start"
        token = csrf_of(await client.get(form_url))
        pages = {}
        for levels in (MAX_NESTING + 1, STORED_LEVELS):  # the second is past json.loads' limit
            form = {"csrf_token": token, "step": "research_all", "row.name": "deep"}
            pages[levels] = await client.post(
                form_url, data={**form, "row.companies": nested_text(levels)}
            )
        by_api = await client.post(
            "/workflows/research/start",
            json={"row": {"name": "deep", "companies": nested(400)}, "step": "research_all"},
        )
    for levels, page in pages.items():
        assert page.status_code == 400, (levels, page.text[:2000])
        errors = re.findall(r'<span class="error" id="[^"]*">(.*?)</span>', page.text, re.S)
        assert [html.unescape(error) for error in errors] == [TOO_DEEP], levels
    assert said_by_http(by_api) == f"row: {TOO_DEEP}"
    async with Session() as session:
        count = (await session.execute(select(func.count()).select_from(Research))).scalar_one()
    assert count == 0, "the refused starts wrote nothing"


async def test_a_design_nested_too_deep_is_refused_by_the_api_and_the_designer(
    db: Database, dev_app_configured: None
) -> None:
    Session = await db.create(examples.Base.metadata)
    node = {"id": "start", "type": "start", "name": "Start", "x": 0, "y": 0}
    design = {"name": "deep", "nodes": [{**node, "layout": nested(DEEP_DESIGN_LEVELS)}]}
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        await install_example_graph()
        before = (await client.get("/graphs/templates")).json()
        by_api = await client.post("/graphs/templates", json=design)
        token = csrf_of(await client.get("/console/graphs"))
        by_designer = await client.post(
            "/console/graphs/designer/save", json=design, headers={"X-CSRF-Token": token}
        )
        after = (await client.get("/graphs/templates")).json()
    sentence = f"nodes[0]: {TOO_DEEP}"
    assert said_by_http(by_api) == sentence
    assert by_designer.status_code == 422, by_designer.text[:2000]
    assert Problem((), by_designer.json()["detail"][0]["msg"]).sentence() == sentence
    assert after == before, "the refused saves wrote nothing"


async def test_a_value_stored_too_deep_still_reads_truncated(db: Database) -> None:
    Session = await create_tables(db)
    key = await waiting_signup(Session)
    deep = nested_text(STORED_LEVELS)
    async with serving(create_app(Session, run_worker=False)) as client:
        published = {"event_type": "deep.stored", "event_id": "deep"}
        assert (await client.post("/events", json=published)).status_code == 200
        [(records,)] = db.sql(
            "SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
            " WHERE a.attname = 'payload' AND c.relkind = 'r' AND c.relname LIKE 'lambda%%'"
        )
        db.sql(f"UPDATE {records} SET payload = %s::jsonb WHERE event_id = 'deep'", deep)
        db.sql("UPDATE lambda_signup SET next_args = jsonb_build_object('deep', %s::jsonb)", deep)
        event = await client.get("/outbox/events/deep")
        run = await client.get(f"/workflows/lambda_signup/runs/{key}")
        page = await client.get("/console/outbox/events/deep")
        run_page = await client.get(f"/console/runs/lambda_signup/{key}")
    assert event.status_code == 200, event.text[:2000]
    assert levels_shown(event.json()["event"]["payload"]) == (SHOWN_NESTING, TRUNCATED)
    assert run.status_code == 200, run.text[:2000]
    stored_args = run.json()["row"]["next_args"]
    assert levels_shown(stored_args["deep"]) == (SHOWN_NESTING - 1, TRUNCATED)
    assert page.status_code == 200, page.text[:2000]
    shown_page = html.unescape(page.text)
    assert shown_page.count('"a": {') == SHOWN_NESTING - 1
    assert shown_page.count(f'"a": "{TRUNCATED}"') == 1
    assert run_page.status_code == 200, run_page.text[:2000]


async def test_a_body_nested_past_what_python_can_parse_is_refused_alike(db: Database) -> None:
    Session = await create_tables(db)
    body = '{"event_type": "' + SIGNUP + '", "payload": ' + nested_text(STORED_LEVELS) + "}"
    async with (
        function(settings_for(db)) as fn,
        serving(create_app(Session, run_worker=False)) as client,
    ):
        by_http = await client.post(
            "/events", content=body, headers={"content-type": "application/json"}
        )
        answer = await fn.call(
            lambda_handlers.publish, {"event_type": SIGNUP, "payload": nested(STORED_LEVELS)}
        )
    assert said_by_http(by_http) == TOO_DEEP
    assert answer == {"error": f"event.payload: {TOO_DEEP}", "type": "InputError"}
    assert await outbox_count(Session) == 0


async def test_pages_of_runs_show_a_value_stored_too_deep_truncated(db: Database) -> None:
    Session = await create_tables(db)
    key = await waiting_signup(Session)
    async with serving(create_app(Session, run_worker=False)) as client:
        # Past every recursive walk, then past json.loads' own limit too.
        for levels in (PAST_RECURSIVE_WALKS, STORED_LEVELS):
            deep = nested_text(levels)
            db.sql(
                "UPDATE lambda_signup SET next_args = jsonb_build_object('deep', %s::jsonb)", deep
            )
            listed = await client.get("/workflows/lambda_signup/runs")
            soonest = await client.get("/workflows/lambda_signup/runs?order=soonest&offset=0")
            page = await client.get("/console/runs/lambda_signup")
            for reply in (listed, soonest):
                assert reply.status_code == 200, (levels, reply.text[:2000])
                [shown] = reply.json()["runs"]
                assert shown["key"] == str(key)
                stored_args = shown["row"]["next_args"]["deep"]
                assert levels_shown(stored_args) == (SHOWN_NESTING - 1, TRUNCATED), levels
            assert page.status_code == 200, (levels, page.text[:2000])
            assert f"/console/runs/lambda_signup/{key}" in page.text
