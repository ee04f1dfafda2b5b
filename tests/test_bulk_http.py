"""Bulk actions over real HTTP: the dry run, the confirmation, an apply that goes on.

- runs: test_a_retry_is_dry_run_confirmed_and_applied_with_continuations
- a search (the runs pages' language): test_a_search_narrows_the_runs_acted_on
- the confirmation: test_an_apply_refuses_more_runs_than_confirmed
- bad bodies are 4xx, never 500: test_bad_bodies_are_refused_and_write_nothing
- roles: test_a_viewer_is_refused_and_an_operator_is_named_in_the_audit
- dead letters: test_dead_letters_matching_a_filter_are_replayed
- the console: test_the_console_counts_confirms_and_posts_on_to_the_end
- on Lambda, the time budget ends before the invocation: test_the_budget_follows_a_lambdas_deadline
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import Request

from functions.app import create_app
from functions.http.routes.bulk import budget_of
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Role
from functions.requests import bulk
from tests.apps import chores, outbox
from tests.apps.chores import Chore
from tests.bulk_helpers import (
    CHARGE,
    add_failed,
    audit,
    dead_letters,
    event,
    publish,
)
from tests.conftest import Database
from tests.helpers import csrf_of, serving

RETRY = {"action": "retry", "step": "work", "args": {"label": "again"}}


pytestmark = pytest.mark.usefixtures("open_writes")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(chores.Base.metadata)


async def steps(Session: async_sessionmaker[AsyncSession]) -> list[str | None]:
    async with Session() as session:
        return list((await session.scalars(select(Chore.next_step).order_by(Chore.id))).all())


async def test_a_retry_is_dry_run_confirmed_and_applied_with_continuations(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 2)
    monkeypatch.setattr("functions.requests.bulk.BUDGET", 0.0)  # one batch a request
    await add_failed(Session, 5)
    dry = await client.post("/workflows/chore/bulk", json=RETRY)
    assert dry.status_code == 200, dry.text
    assert dry.json() == {
        "workflow": "chore", "dry_run": True, "expected": 5, "held": 0, "upto": "5",
        "action": "retry",
    }  # fmt: skip
    assert await steps(Session) == [None] * 5, "a dry run writes nothing"
    body: dict[str, Any] = {**RETRY, "expected": 5, "upto": "5"}
    answers = []
    while True:
        reply = await client.post("/workflows/chore/bulk", json=body)
        assert reply.status_code == 200, reply.text
        answers.append(reply.json())
        if reply.json()["next"] is None:
            break
        body = {**RETRY, "next": reply.json()["next"]}
    assert [(a["done"], a["batches"], a["finished"]) for a in answers] == [
        (2, 1, False), (4, 2, False), (5, 3, True),
    ]  # fmt: skip
    assert len({a["bulk_id"] for a in answers}) == 1
    assert await steps(Session) == ["work"] * 5
    trail = await audit(db)
    assert [(r[0], r[1], r[2], r[4]) for r in trail] == [("local", "http", "bulk.retry", 2)] * 2 + [
        ("local", "http", "bulk.retry", 1)
    ]
    other = await client.post(
        "/workflows/chore/bulk", json={**RETRY, "args": {}, "next": body["next"]}
    )
    assert other.status_code == 409, other.text


async def test_a_search_narrows_the_runs_acted_on(
    db: Database, client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    await add_failed(Session, 4)
    body = {**RETRY, "filter": {"q": "id>=3 error:boom"}}
    dry = await client.post("/workflows/chore/bulk", json=body)
    assert (dry.json()["expected"], dry.json()["upto"]) == (2, "4")
    done = await client.post("/workflows/chore/bulk", json={**body, "expected": 2, "upto": "4"})
    assert done.json()["done"] == 2 and await steps(Session) == [None, None, "work", "work"]
    [row] = await audit(db)
    assert db.sql("SELECT subject FROM duly_audit") == [
        ({"state": "failed", "error": "boom", "columns": ["id >= 3"]},)
    ]
    assert row[4] == 2
    unread = await client.post("/workflows/chore/bulk", json={**RETRY, "filter": {"q": "id>>3"}})
    assert unread.status_code == 422 and unread.json()["detail"][0]["loc"] == [
        "body", "filter", "q",
    ]  # fmt: skip


async def test_an_apply_refuses_more_runs_than_confirmed(
    db: Database, client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    await add_failed(Session, 3)
    reply = await client.post("/workflows/chore/bulk", json={**RETRY, "expected": 2, "upto": "3"})
    assert reply.status_code == 409
    assert "the dry run counted 2" in reply.json()["detail"]
    assert await steps(Session) == [None] * 3 and await audit(db) == []


async def test_bad_bodies_are_refused_and_write_nothing(
    db: Database, client: httpx.AsyncClient, Session: async_sessionmaker[AsyncSession]
) -> None:
    await add_failed(Session, 1)
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("/workflows/chore/bulk", {"action": "explode"}, 422),
        ("/workflows/chore/bulk", {"action": "run"}, 422),
        ("/workflows/chore/bulk", {"action": "run", "step": "nope"}, 404),
        ("/workflows/chore/bulk", {**RETRY, "args": {"label": 3}}, 422),
        ("/workflows/chore/bulk", {"action": "cancel", "step": "work"}, 422),
        ("/workflows/chore/bulk", {**RETRY, "filter": {"state": "running"}}, 422),
        ("/workflows/chore/bulk", {**RETRY, "action": "run", "filter": {"state": "asleep"}}, 400),
        ("/workflows/chore/bulk", {**RETRY, "filter": {"colour": "red"}}, 422),
        ("/workflows/chore/bulk", {**RETRY, "filter": {"key": "x"}}, 400),
        ("/workflows/chore/bulk", {**RETRY, "expected": -1, "upto": "1"}, 422),
        ("/workflows/chore/bulk", {**RETRY, "expected": 1, "upto": "one"}, 422),
        ("/workflows/chore/bulk", {**RETRY, "next": "not-a-continuation"}, 400),
        ("/workflows/chore/bulk", {**RETRY, "filter": {"error": "x" * 1001}}, 422),
        ("/workflows/nothing/bulk", RETRY, 404),
        ("/outbox/dead-letters/bulk", {}, 404),
    ]
    for path, body, status in cases:
        reply = await client.post(path, json=body)
        assert reply.status_code == status, (body, reply.text)
    assert await steps(Session) == [None] and await audit(db) == []


async def test_a_viewer_is_refused_and_an_operator_is_named_in_the_audit(
    db: Database, Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {role: new_key() for role in (Role.VIEWER, Role.OPERATOR)}
    entries = [
        ApiKey(f"key-{role.value}", frozenset({role}), frozenset(), digest_of(key)).entry()
        for role, key in keys.items()
    ]
    monkeypatch.setenv("DULY_API_KEYS", json.dumps(entries))
    await add_failed(Session, 1)
    async with serving(create_app(Session, run_worker=False)) as client:

        def bearer(role: Role) -> dict[str, str]:
            return {"authorization": f"Bearer {keys[role]}"}

        seen = await client.post("/workflows/chore/bulk", json=RETRY, headers=bearer(Role.VIEWER))
        assert seen.status_code == 403
        body = {**RETRY, "expected": 1, "upto": "1"}
        done = await client.post("/workflows/chore/bulk", json=body, headers=bearer(Role.OPERATOR))
        assert done.status_code == 200, done.text
        assert (done.json()["done"], done.json()["finished"]) == (1, True)
    [(actor, via, action, workflow, count, _)] = await audit(db)
    assert (actor, via, action, workflow, count) == (
        "key-operator",
        "http",
        "bulk.retry",
        "chore",
        1,
    )


@pytest.mark.usefixtures("failing_registry")
async def test_dead_letters_matching_a_filter_are_replayed(db: Database) -> None:
    Session = await db.create(outbox.Base.metadata)
    await publish(Session, event("order.placed", "p1"))
    await dead_letters(Session, "c1", "c2", "c3")
    async with serving(create_app(Session, run_worker=False)) as client:
        none = await client.post(
            "/outbox/dead-letters/bulk", json={"filter": {"event_name": "order_placed"}}
        )
        assert none.json()["expected"] == 0
        chosen = {"filter": {"error": "PAYMENT PROVIDER", "route": "nope"}}
        assert (await client.post("/outbox/dead-letters/bulk", json=chosen)).json()["expected"] == 0
        matching = {
            "filter": {"event_name": "order_charged", "error": "payment provider", "route": CHARGE}
        }
        dry = await client.post("/outbox/dead-letters/bulk", json=matching)
        assert dry.json() == {"outbox": "duly_outbox", "dry_run": True, "expected": 3, "upto": "c3"}
        applied = await client.post(
            "/outbox/dead-letters/bulk", json={**matching, "expected": 3, "upto": "c3"}
        )
        assert applied.status_code == 200, applied.text
        assert (applied.json()["done"], applied.json()["finished"]) == (3, True)
        counts = (await client.get("/outbox")).json()["counts"]
        assert (counts["pending"], counts["dead_letter"]) == (3, 0)
    [(actor, via, action, _, count, detail)] = await audit(db)
    assert (actor, via, action, count, detail["skipped"]) == ("local", "http", "bulk.replay", 3, 0)


async def test_the_console_counts_confirms_and_posts_on_to_the_end(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 2)
    monkeypatch.setattr("functions.requests.bulk.BUDGET", 0.0)
    await add_failed(Session, 3)
    listed = await client.get("/console/runs/chore", params={"state": "failed"})
    link = 'href="/console/bulk/chore?q=&amp;state=failed&amp;step=&amp;key=&amp;error="'
    assert link in listed.text
    page = await client.get("/console/bulk/chore", params={"state": "failed"})
    assert page.status_code == 200 and 'value="retry" selected' in page.text
    token = csrf_of(page)
    form = {"csrf_token": token, "action": "retry", "step": "work", "args": '{"label": "c"}'}
    form["filter.state"] = "failed"
    dry = await client.post("/console/bulk/chore", data=form)
    assert dry.status_code == 200 and "3 chore run(s) match" in dry.text
    assert 'name="expected" value="3"' in dry.text and await steps(Session) == [None] * 3
    confirmed = {**form, "confirmed": "yes", "expected": "3", "upto": "3"}
    more = await client.post("/console/bulk/chore", data={**confirmed, "expected": "1"})
    assert more.status_code == 409 and "the dry run counted 1" in more.text
    first = await client.post("/console/bulk/chore", data=confirmed)
    assert "2 of 3 done, 0 skipped" in first.text and 'hx-trigger="load' in first.text
    cont = re.search(r'name="next" value="([^"]+)"', first.text)
    assert cont is not None
    rest = await client.post(
        "/console/bulk/chore",
        data={**form, "confirmed": "yes", "next": cont[1]},
        headers={"HX-Request": "true"},
    )
    assert rest.text.lstrip().startswith('<div id="bulk-progress">')
    assert "3 of 3 done, 0 skipped" in rest.text and "finished" in rest.text
    assert await steps(Session) == ["work"] * 3
    assert {(r[0], r[1]) for r in await audit(db)} == {("local", "console")}
    bad = await client.post("/console/bulk/chore", data={**form, "args": "[1"})
    assert bad.status_code == 400 and "args" in bad.text


class LambdaContext:
    """What mangum puts in the scope: the invocation's context, with its time left."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_the_budget_follows_a_lambdas_deadline() -> None:
    def budget(scope: dict[str, Any]) -> float:
        return budget_of(Request({"type": "http", "headers": [], **scope}))

    assert budget({}) == bulk.BUDGET
    assert budget({"aws.context": LambdaContext(60_000)}) == bulk.BUDGET
    assert budget({"aws.context": LambdaContext(4_500)}) == pytest.approx(2.5)
    assert budget({"aws.context": LambdaContext(500)}) == 0.0, "one batch, then the answer"
