"""Console links to runs and events whose key or id holds `/`: each opens its own page.

A key `x/cancel` is sent encoded (`x%2Fcancel`) and matched on the raw path
(functions/http/segments.py), so it opens run `x/cancel`, never the cancel
confirmation of a run `x`; its action forms, its live fragment, the login's
way back and the JSON API's routes take it whole too, as an event id does.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from engine import WorkflowEvent
from functions import examples
from functions.app import create_app
from functions.http.segments import raw_route_path, sent_path
from tests.apps import slashes
from tests.apps.slashes import Ticket
from tests.conftest import Database
from tests.helpers import csrf_of, serving

KEYS = ("x/cancel", "a/b", "x")  # "x" too: the run a decoded `x/cancel` would have opened
EVENT_ID = "order/7/replay"
ATTRIBUTE = r'{}="(/console/[^"]*)"'


@asynccontextmanager
async def console(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    Session = await db.create(examples.Base.metadata, slashes.Base.metadata)
    event = WorkflowEvent(event_type="console.test", event_id=EVENT_ID)
    async with Session() as session, session.begin():
        await examples.event_registry.publish(event, session=session)
    async with serving(create_app(Session, run_worker=False)) as client:
        for key in KEYS:  # in the app's connection, which its lifespan entered
            assert await Ticket(code=key).start(Ticket.open)
        yield client


def links(page: httpx.Response, attribute: str) -> list[str]:
    """Every console URL the page names in `attribute` (href, action, hx-get)."""
    return [html.unescape(u) for u in re.findall(ATTRIBUTE.format(attribute), page.text)]


async def test_a_key_with_a_slash_opens_its_own_run_from_every_link(db: Database) -> None:
    async with console(db) as client:
        listed = await client.get("/console/runs/slash_ticket")
        hrefs = links(listed, "href")
        run_url = "/console/runs/slash_ticket/x%2Fcancel"
        assert run_url in hrefs and "/console/runs/slash_ticket/a%2Fb" in hrefs
        run = await client.get(run_url)
        assert run.status_code == 200, run.text[:500]
        assert '<span class="key">x/cancel</span>' in run.text and "Yes, cancel it" not in run.text
        assert links(run, "hx-get") == [f"{run_url}/live"]
        live = await client.get(f"{run_url}/live")
        assert live.status_code == 200 and 'id="run-live"' in live.text
        assert links(live, "hx-get") == [f"{run_url}/live"]  # it redraws the same run
        assert '<th scope="row">code</th><td>x/cancel</td>' in live.text
        actions = links(run, "action")
        assert {f"{run_url}/run", f"{run_url}/deliver", f"{run_url}/cancel"} <= set(actions)
        for form in (f"{run_url}/run", f"{run_url}/deliver"):
            page = await client.get(form, params={"step": "close"})
            assert page.status_code == 200, (form, page.text[:500])
            assert "slash_ticket x/cancel" in page.text
            assert f'action="{form}"' in page.text  # the form posts back to the same run
        token = csrf_of(run)
        asked = await client.post(f"{run_url}/cancel", data={"csrf_token": token})
        assert asked.status_code == 200 and "Cancel slash_ticket x/cancel?" in asked.text
        assert f'action="{run_url}/cancel"' in asked.text
        done = await client.post(
            f"{run_url}/cancel", data={"csrf_token": token, "confirmed": "yes"}
        )
        assert done.status_code == 303
        assert done.headers["location"] == f"{run_url}?done=cancel&count=1"
        states = {
            key: (await client.get(f"/workflows/slash_ticket/runs/{quoted}")).json()["state"]
            for key, quoted in (("x/cancel", "x%2Fcancel"), ("a/b", "a%2Fb"), ("x", "x"))
        }
        assert states == {"x/cancel": "cancelled", "a/b": "scheduled", "x": "scheduled"}
        nested = await client.get("/console/runs/slash_ticket/a%2Fb")
        assert nested.status_code == 200 and '<span class="key">a/b</span>' in nested.text
        assert links(nested, "hx-get") == ["/console/runs/slash_ticket/a%2Fb/live"]
        ran = await client.post(
            "/console/runs/slash_ticket/a%2Fb/run",
            data={"csrf_token": token, "step": "close", "confirmed": "yes"},
        )
        assert ran.headers["location"] == "/console/runs/slash_ticket/a%2Fb?done=run&count=1"
        history = await client.get("/runs/slash_ticket/a%2Fb/history")
        assert history.status_code == 200 and history.json()["key"] == "a/b"


async def test_an_event_id_with_slashes_opens_its_own_page(db: Database) -> None:
    async with console(db) as client:
        listed = await client.get("/console/outbox")
        event_url = "/console/outbox/events/order%2F7%2Freplay"
        assert event_url in links(listed, "href")
        page = await client.get(event_url)
        assert page.status_code == 200 and f"<code>{EVENT_ID}</code>" in page.text
        token = csrf_of(await client.get("/console/runs/slash_ticket/x"))  # a page with forms
        asked = await client.post(f"{event_url}/replay", data={"csrf_token": token})
        assert asked.status_code == 200, asked.text[:500]
        assert f"Replay console.test {EVENT_ID}?" in asked.text
        refused = await client.post(
            f"{event_url}/replay", data={"csrf_token": token, "confirmed": "yes"}
        )
        assert refused.status_code == 409 and "Nothing to replay" in refused.text
        api = await client.get("/outbox/events/order%2F7%2Freplay")
        assert api.status_code == 200 and api.json()["event"]["event_id"] == EVENT_ID


async def test_the_login_sends_back_to_the_run_with_a_slash(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_TOKEN", "s3cret-token-for-the-console")
    async with console(db) as client:
        page = await client.get("/console/runs/slash_ticket/x%2Fcancel")
    assert page.status_code == 303
    [target] = parse_qs(urlsplit(page.headers["location"]).query)["next"]
    assert target == "/console/runs/slash_ticket/x%2Fcancel"


def test_the_raw_path_is_read_with_or_without_a_root_path() -> None:
    key = "/console/runs/t/x%2Fcancel"

    def scope(path: str, raw: bytes | None, root: str = "") -> dict[str, Any]:
        return {"type": "http", "path": path, "raw_path": raw, "root_path": root}

    decoded = "/console/runs/t/x/cancel"
    assert raw_route_path(scope(decoded, key.encode())) == key
    assert raw_route_path(scope(decoded, None)) is None  # mangum gives none: the path is used
    # A root path in the path, and in the raw path (httpx) or not (uvicorn).
    assert raw_route_path(scope("/api" + decoded, b"/api" + key.encode(), "/api")) == key
    assert raw_route_path(scope("/api" + decoded, key.encode(), "/api")) == key
    assert raw_route_path(scope("/elsewhere", key.encode())) is None  # rewritten on the way
    assert sent_path(scope("/api" + decoded, key.encode(), "/api")) == "/api" + key
    assert sent_path(scope("/console/runs/t/a b", None)) == "/console/runs/t/a%20b"
