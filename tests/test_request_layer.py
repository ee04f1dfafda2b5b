"""One request layer under three front doors: HTTP, the console and the Lambda entries.

The same bad delivery, sent through the app over real HTTP, through the
console's deliver form and to the Lambda `deliver` entry (called as Lambda
calls it), is refused by the same rule with the same sentence, and writes
nothing; a publish refused by HTTP is refused by the Lambda `publish` entry
alike.
"""

from __future__ import annotations

import html
import re

import httpx
from sqlalchemy import func, select

from functions.app import create_app
from functions.lambdas import handlers as lambda_handlers
from functions.requests.errors import Problem
from tests.apps.serverless_app import SIGNUP, Outbox
from tests.aws_fakes import create_tables, function, row_of, settings_for, waiting_signup
from tests.conftest import Database
from tests.helpers import csrf_of, serving

LONG = "x" * 100_000  # characters: a hundred times what any name may hold
CONFIRM = {"step": "confirm", "args": {"code": "x"}}


def said_by_http(reply: httpx.Response) -> str:
    """The sentence of a 422's one problem, as the request layer writes it."""
    assert reply.status_code == 422, reply.text
    [problem] = reply.json()["detail"]
    assert problem["loc"][0] == "body"
    return Problem(tuple(problem["loc"][1:]), problem["msg"]).sentence()


def said_by_console(page: httpx.Response, status: int = 400) -> str:
    """The sentence of a console error page (a form's values 400, the URL's run key 422)."""
    assert page.status_code == status, page.text[:2000]
    found = re.search(r'<p class="refusal" role="alert">(.*?)</p>', page.text, re.S)
    assert found is not None, page.text[:2000]
    return html.unescape(found.group(1).strip())


async def test_a_bad_delivery_gets_the_same_refusal_from_every_door(db: Database) -> None:
    Session = await create_tables(db)
    key = await waiting_signup(Session)
    before = await row_of(Session)
    deliveries = {
        "a where on an engine column": {"where": {"next_step": "nudge"}, **CONFIRM},
        "a step name of 100,000 characters": {"key": key, "step": LONG, "args": {"code": "x"}},
        "a key of the wrong type": {"key": "abc", **CONFIRM},
    }
    async with (
        function(settings_for(db)) as fn,
        serving(create_app(Session, run_worker=False)) as client,
    ):
        for case, body in deliveries.items():
            by_http = said_by_http(await client.post("/workflows/lambda_signup/deliver", json=body))
            answer = await fn.call(lambda_handlers.deliver, {"workflow": "lambda_signup", **body})
            assert answer == {"error": by_http, "type": "InputError"}, case
        engine_column = deliveries["a where on an engine column"]
        refused = await client.post("/workflows/lambda_signup/deliver", json=engine_column)
        assert "next_step is one of the engine's columns" in said_by_http(refused)

        # The console's deliver form names its run by the page's key: the where case has no
        # form, the others do.
        form_url = f"/console/runs/lambda_signup/{key}/deliver"
        token = csrf_of(await client.get(form_url))
        form = {"csrf_token": token, "args.code": "x", "confirmed": "yes"}
        long_step = await client.post(form_url, data={**form, "step": LONG})
        wrong_key = await client.post(
            "/console/runs/lambda_signup/abc/deliver", data={**form, "step": "confirm"}
        )
        for case, page, status in (("a step name of 100,000 characters", long_step, 400),
                                   ("a key of the wrong type", wrong_key, 422)):  # fmt: skip
            body = deliveries[case]
            answer = await fn.call(lambda_handlers.deliver, {"workflow": "lambda_signup", **body})
            assert said_by_console(page, status) == answer["error"], case
        assert fn.invokes == 0, "nothing refused kicked a wake"
    assert await row_of(Session) == before, "the refused deliveries wrote nothing"


async def test_a_publish_http_refuses_is_refused_by_the_lambda_entry_alike(db: Database) -> None:
    Session = await create_tables(db)
    bodies = {
        "an event type of 100,000 characters": {"event_type": LONG},
        "a blank event type": {"event_type": "  "},
        "an unknown field": {"event_type": SIGNUP, "colour": "red"},
    }
    async with (
        function(settings_for(db)) as fn,
        serving(create_app(Session, run_worker=False)) as client,
    ):
        for case, body in bodies.items():
            by_http = said_by_http(await client.post("/events", json=body))
            answer = await fn.call(lambda_handlers.publish, body)
            assert answer == {"error": by_http, "type": "InputError"}, case
        assert fn.invokes == 0
    async with Session() as session:
        stored = (await session.execute(select(func.count()).select_from(Outbox))).scalar_one()
    assert stored == 0, "the refused publishes wrote nothing"
