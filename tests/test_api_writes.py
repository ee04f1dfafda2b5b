"""The write routes and run views of the deployable app, over real HTTP on a real database.

Runs are started, delivered to, run and cancelled through the API; the
engine's deterministic worker (`engine.testing.drain`) runs their steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import configure_event_registry
from engine.testing import drain
from functions import examples
from functions.app import create_app
from tests.apps import api
from tests.apps.api import Invoice
from tests.conftest import Database
from tests.helpers import fetch, serving

START = {"row": {"number": "A-1", "total": 120}, "step": "issue", "args": {"plan": "gold"}}


@pytest.fixture(autouse=True)
def default_body_limit(open_writes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the routes: writes open, bodies at the default limit."""
    monkeypatch.delenv("DULY_MAX_BODY_BYTES", raising=False)


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(api.Base.metadata)


async def start(client: httpx.AsyncClient, body: dict[str, Any] = START) -> str:
    reply = await client.post("/workflows/invoice/start", json=body)
    assert reply.status_code == 201, reply.text
    key: str = reply.json()["key"]
    return key


async def test_start_inserts_the_row_with_its_first_step_and_answers_the_key(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    body = {**START, "row": {**START["row"], "due": "2030-01-02T03:04:05+00:00"}}
    reply = await client.post("/workflows/invoice/start", json=body)
    assert reply.status_code == 201, reply.text
    assert reply.json() == {"workflow": "invoice", "key": "1", "step": "issue"}
    row = await fetch(Session, Invoice, 1)
    assert (row.number, row.total, row.note, row.status) == ("A-1", 120, "", "new")
    assert row.due == datetime.fromisoformat("2030-01-02T03:04:05+00:00")
    assert (row.next_step, row.next_args) == ("issue", {"args": ["gold"], "kwargs": {}})


async def test_start_is_409_when_a_unique_key_has_a_run(client: httpx.AsyncClient) -> None:
    await start(client)
    again = await client.post("/workflows/invoice/start", json=START)
    assert again.status_code == 409
    assert "none was started" in again.json()["detail"]


async def test_start_refuses_rows_and_arguments_that_do_not_fit(client: httpx.AsyncClient) -> None:
    cases: dict[str, tuple[dict[str, Any], int, str]] = {
        "unknown column": ({**START, "row": {**START["row"], "colour": "red"}}, 422, "colour"),
        "engine column": ({**START, "row": {**START["row"], "next_step": "pay"}}, 422, "next_step"),
        "missing column": ({**START, "row": {"number": "A-2"}}, 422, "total"),
        "text for int": ({**START, "row": {"number": "A-3", "total": "lots"}}, 422, "total"),
        "numeric text": ({**START, "row": {"number": "A-4", "total": "12"}}, 422, "total"),
        "bad argument": ({**START, "args": {"plan": "platinum"}}, 422, "plan"),
        "unknown argument": ({**START, "args": {"colour": "red"}}, 422, "colour"),
        "check": ({**START, "row": {"number": "A-5", "total": -1}}, 400, "invoice_total_positive"),
        "too long": ({**START, "row": {"number": "A" * 30, "total": 1}}, 400, "too long"),
    }
    for name, (body, status, said) in cases.items():
        reply = await client.post("/workflows/invoice/start", json=body)
        assert reply.status_code == status, (name, reply.text)
        assert said in str(reply.json()["detail"]), (name, reply.text)


async def test_unknown_workflows_and_steps_are_404_with_a_message(
    client: httpx.AsyncClient,
) -> None:
    nope = await client.post("/workflows/nope/start", json=START)
    assert nope.status_code == 404
    assert nope.json()["detail"].startswith("No workflow named 'nope'. This app maps: ")
    assert "invoice" in nope.json()["detail"].split(": ")[1]
    step = await client.post("/workflows/invoice/deliver", json={"key": 1, "step": "refund"})
    assert step.status_code == 404
    assert step.json()["detail"].startswith("Workflow invoice has no step 'refund'; its steps: ")
    for url in ("/workflows/nope/runs", "/workflows/nope/runs/1", "/workflows/invoice/runs/9"):
        reply = await client.get(url)
        assert reply.status_code == 404 and reply.json()["detail"], url


async def test_deliver_hands_an_event_to_the_waiting_run_once_per_idempotency_key(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    key = await start(client)
    await drain(Session)
    body = {"key": int(key), "step": "pay", "args": {"amount": 12}, "idempotency_key": "pay-1"}
    lots = await client.post(
        "/workflows/invoice/deliver", json={**body, "args": {"amount": "lots"}}
    )
    assert lots.status_code == 422
    assert lots.json()["detail"][0]["loc"] == ["body", "args", "amount"]
    reply = await client.post("/workflows/invoice/deliver", json=body)
    assert reply.json() == {
        "workflow": "invoice",
        "accepted": 1,
        "taken": 1,
        "held": 0,
        "refused": {},
        "message": "1 run took the event now.",
    }
    again = await client.post("/workflows/invoice/deliver", json=body)
    assert again.json() == {
        "workflow": "invoice",
        "accepted": 0,
        "taken": 0,
        "held": 0,
        "refused": {"deduplicated": 1},
        "message": "No run took the event; 1 refused it: the event's key was taken already "
        "(a resent event).",
    }
    await drain(Session)
    assert (await fetch(Session, Invoice, 1)).status == "paid 12 by card"


async def test_deliver_run_and_cancel_address_runs_by_where(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    await start(client)
    await start(client, {**START, "row": {"number": "B-1", "total": 5}})
    await drain(Session)
    pay = {"where": {"number": "A-1"}, "step": "pay", "args": {"amount": 3, "by": "cash"}}
    assert (await client.post("/workflows/invoice/deliver", json=pay)).json()["accepted"] == 1
    run = {"where": {"number": "B-1"}, "step": "chase"}
    assert (await client.post("/workflows/invoice/run", json=run)).json()["addressed"] == 1
    await drain(Session)
    assert (await fetch(Session, Invoice, 1)).status == "paid 3 by cash"
    assert (await fetch(Session, Invoice, 2)).status == "chased"
    await start(client, {**START, "row": {"number": "C-1", "total": 5}})
    cancel = await client.post("/workflows/invoice/cancel", json={"where": {"total": 5}})
    assert cancel.json() == {"workflow": "invoice", "cancelled": 1}


async def test_addressing_needs_exactly_one_known_way(client: httpx.AsyncClient) -> None:
    await start(client)
    bodies = [
        {},
        {"key": 1, "where": {"number": "A-1"}},
        {"where": {}},
        {"where": {"colour": "red"}},
        {"where": {"total": "lots"}},
        {"key": "abc"},
    ]
    for body in bodies:
        reply = await client.post("/workflows/invoice/cancel", json=body)
        assert reply.status_code in (400, 422), (body, reply.text)
        assert reply.json()["detail"], body


async def test_a_run_shows_its_state_wait_deadline_held_event_and_history(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    key = await start(client)
    scheduled = (await client.get(f"/workflows/invoice/runs/{key}")).json()
    assert (scheduled["state"], scheduled["history"]) == ("scheduled", [])
    await drain(Session)
    waiting = (await client.get(f"/workflows/invoice/runs/{key}")).json()
    assert (waiting["state"], waiting["waiting_for"]) == ("waiting", "pay")
    assert datetime.fromisoformat(waiting["deadline"]).tzinfo is not None
    assert waiting["row"]["status"] == "issued (gold)"
    assert waiting["row"]["next_step"] == "chase"
    [attempt] = waiting["history"]
    assert (attempt["step"], attempt["outcome"]) == ("issue", "ok")
    assert waiting["held_event"] is None


async def test_states_tell_finished_failed_retrying_and_cancelled_apart(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    for number, step in (("F-1", "chase"), ("F-2", "explode"), ("F-3", "flaky"), ("F-4", "chase")):
        await start(client, {"row": {"number": number, "total": 1}, "step": step})
    await client.post("/workflows/invoice/cancel", json={"key": 4})
    await drain(Session)
    await client.post("/workflows/invoice/cancel", json={"key": 3})  # cancelled while retrying
    states = {
        key: (await client.get(f"/workflows/invoice/runs/{key}")).json()["state"]
        for key in (1, 2, 3, 4)
    }
    assert states == {1: "finished", 2: "failed", 3: "cancelled", 4: "cancelled"}
    failed = (await client.get("/workflows/invoice/runs", params={"state": "failed"})).json()
    assert [run["key"] for run in failed["runs"]] == ["2"]
    cancelled = (await client.get("/workflows/invoice/runs", params={"state": "cancelled"})).json()
    assert [run["key"] for run in cancelled["runs"]] == ["4", "3"]


async def test_runs_are_filtered_and_paged(
    client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    for n in range(5):
        await start(client, {"row": {"number": f"P-{n}", "total": n}, "step": "chase"})
    await start(client, {"row": {"number": "W-1", "total": 9}, "step": "issue"})
    await drain(Session, max_concurrency=1)

    async def keys(**params: Any) -> tuple[list[str], Any]:
        reply = await client.get("/workflows/invoice/runs", params=params)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        return [run["key"] for run in body["runs"]], body["next_offset"]

    assert await keys(limit=2) == (["6", "5"], 2)
    assert await keys(limit=2, offset=4) == (["2", "1"], None)
    assert await keys(state="waiting") == (["6"], None)
    assert await keys(next_step="chase") == (["6"], None)
    assert await keys(state="finished", limit=10) == (["5", "4", "3", "2", "1"], None)
    assert await keys(key="3") == (["3"], None)
    await start(client, {"row": {"number": "S-1", "total": 1}, "step": "chase"})
    assert (await keys(order="soonest", limit=1))[0] == ["7"]  # due now, before the deadline
    for bad in ({"state": "asleep"}, {"limit": 0}, {"order": "oldest"}, {"key": "x"}):
        reply = await client.get("/workflows/invoice/runs", params=bad)
        assert reply.status_code in (400, 422), bad


@pytest.fixture
def expense_events() -> Iterator[None]:
    configure_event_registry(examples.event_registry)
    try:
        yield
    finally:
        configure_event_registry(None)


async def test_events_are_published_in_one_transaction_and_kick_the_runtime(
    db: Database, expense_events: None
) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_app(Session, run_worker=False)
    kicks: list[str] = []
    app.state.kick = lambda: kicks.append("kick")
    event = {"event_type": "expense.submitted", "payload": {"expense_id": 7, "amount": 30}}
    async with serving(app) as client:
        one = await client.post("/events", json={**event, "event_id": "e-1"})
        assert one.json() == {"stored": ["e-1"], "duplicates": []}
        batch = {"events": [{**event, "event_id": "e-1"}, {**event, "event_id": "e-2"}]}
        two = await client.post("/events", json=batch)
        assert two.json() == {"stored": ["e-2"], "duplicates": ["e-1"]}
        bad = await client.post("/events", json={"events": [event, {"payload": {}}]})
        assert bad.status_code == 422
        nul = await client.post("/events", json={**event, "payload": {"x": "\u0000"}})
        assert nul.status_code == 400
    assert kicks == ["kick", "kick"]
    await drain(Session)
    expense = await fetch(Session, examples.Expense, 7)
    assert expense.status == "pending"


async def test_wake_is_200_caught_up_and_503_otherwise(db: Database) -> None:
    Session = await db.create(api.Base.metadata)
    async with serving(create_app(Session, run_worker=True)) as client:
        reply = await client.post("/wake", params={"timeout": 5})
        assert (reply.status_code, reply.json()) == (200, {"caught_up": True})
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.post("/wake")
        assert reply.status_code == 503
        assert "No worker" in reply.json()["detail"]
    app = create_app(Session, run_worker=False)
    asked: list[float] = []

    async def not_yet(timeout: float) -> bool:
        asked.append(timeout)
        return False

    app.state.wake = not_yet
    async with serving(app) as client:
        reply = await client.post("/wake", params={"timeout": 2})
    assert (reply.status_code, reply.json()["caught_up"], asked) == (503, False, [2.0])


async def test_drain_needs_a_drain_from_the_runtime(db: Database) -> None:
    Session = await db.create(api.Base.metadata)
    app = create_app(Session, run_worker=False)
    async with serving(app) as client:
        missing = await client.post("/drain")
        assert missing.status_code == 503 and "No drain" in missing.json()["detail"]

        async def drained() -> dict[str, int]:
            return {"processed": 3}

        app.state.drain = drained
        reply = await client.post("/drain")
    assert (reply.status_code, reply.json()) == (200, {"drained": {"processed": 3}})


async def test_the_schema_shows_each_steps_body(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    body = schema["paths"]["/workflows/invoice/deliver"]["post"]["requestBody"]
    one_of = body["content"]["application/json"]["schema"]["oneOf"]
    bodies = {b["properties"]["step"]["enum"][0]: b for b in one_of}
    assert set(bodies) == {"issue", "pay", "chase", "explode", "flaky", "tag", "anything"}
    ref = bodies["pay"]["properties"]["args"]["$ref"].rsplit("/", 1)[1]
    pay = schema["components"]["schemas"][ref]
    assert pay["properties"]["amount"]["type"] == "integer"
    assert pay["required"] == ["amount"] and pay["additionalProperties"] is False
    start_body = schema["paths"]["/workflows/invoice/start"]["post"]["requestBody"]
    row_ref = start_body["content"]["application/json"]["schema"]["oneOf"][0]["properties"]["row"]
    row = schema["components"]["schemas"][row_ref["$ref"].rsplit("/", 1)[1]]
    assert set(row["properties"]) == {"id", "number", "total", "due", "note", "status"}
    assert sorted(row["required"]) == ["number", "total"]
    assert schema["paths"]["/workflows/invoice/start"]["post"]["security"]


async def post_json(client: httpx.AsyncClient, url: str, body: Any) -> httpx.Response:
    """POST `body` as ASCII JSON, escapes kept: httpx would refuse a lone surrogate."""
    headers = {"Content-Type": "application/json"}
    return await client.post(url, content=json.dumps(body), headers=headers)


async def test_values_the_database_cannot_store_are_4xx(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        # Lone surrogates: JSON can escape them, UTF-8 and PostgreSQL cannot hold them.
        replies = [
            await post_json(
                client,
                "/workflows/onboarding/start",
                {"row": {"user_id": "\ud800", "email": "e"}, "step": "welcome"},
            ),
            await post_json(
                client,
                "/workflows/onboarding/start",
                {"row": {"user_id": "u", "email": "\u0000"}, "step": "welcome"},
            ),
            await post_json(
                client,
                "/workflows/onboarding/start",
                {"row": {"id": 10**30, "user_id": "u", "email": "e"}, "step": "welcome"},
            ),
            await post_json(
                client,
                "/workflows/onboarding/deliver",
                {
                    "key": 1,
                    "step": "activated",
                    "args": {"plan": "pro"},
                    "idempotency_key": "\ud800",
                },
            ),
            await post_json(client, "/events", {"event_type": "\ud800"}),
            await post_json(client, "/events", {"event_type": "a", "payload": {"x": "\ud800"}}),
            await post_json(client, "/workflows/research/cancel", {"where": {"companies": ["a"]}}),
            await client.get("/workflows/onboarding/runs", params={"key": str(10**30)}),
            await client.get(f"/workflows/onboarding/runs/{10**30}"),
        ]
    for reply in replies:
        assert reply.status_code in (400, 404, 422), (reply.request.url, reply.text)
        assert reply.json()["detail"]
