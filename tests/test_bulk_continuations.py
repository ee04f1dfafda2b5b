"""A bulk action's `next` over real HTTP: only the caller's last one goes on.

- forged, altered, replayed, another principal's: test_only_the_callers_last_next_goes_on
- a `next` whose window came back empty is spent too: test_an_empty_window_spends_its_next
- malformed pieces are 400, never 500: test_malformed_continuations_are_400
- each action audits under its command's name: test_each_action_audits_as_its_command
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions.app import create_app
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Role
from tests.apps import chores
from tests.bulk_helpers import add_failed, audit
from tests.conftest import Database
from tests.helpers import serving

RETRY = {"action": "retry", "step": "work", "args": {"label": "again"}}
URL = "/workflows/chore/bulk"

pytestmark = pytest.mark.usefixtures("open_writes")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(chores.Base.metadata)


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Two operators' bearer tokens, `a` and `b`."""
    tokens = {name: new_key() for name in ("a", "b")}
    entries = [
        ApiKey(f"key-{name}", frozenset({Role.OPERATOR}), frozenset(), digest_of(token)).entry()
        for name, token in tokens.items()
    ]
    monkeypatch.setenv("DULY_API_KEYS", json.dumps(entries))
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 2)
    monkeypatch.setattr("functions.requests.bulk.BUDGET", 0.0)  # one batch a request
    return tokens


@pytest.fixture
async def client(
    Session: async_sessionmaker[AsyncSession], keys: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def decoded(text: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return document


def encoded(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


def written(db: Database) -> tuple[list[Any], list[Any]]:
    """Every run's step and every audit record: what a refused `next` must leave alone."""
    runs = db.sql("SELECT id, next_step, next_args, last_error, wake_at FROM chore ORDER BY id")
    return runs, db.sql("SELECT id, action, detail FROM duly_audit ORDER BY id")


async def test_only_the_callers_last_next_goes_on(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    keys: dict[str, str],
) -> None:
    await add_failed(Session, 7)
    a, b = bearer(keys["a"]), bearer(keys["b"])
    dry = (await client.post(URL, json={**RETRY, "filter": {"q": "id<=4"}}, headers=a)).json()
    assert (dry["expected"], dry["upto"]) == (4, "4")
    body = {**RETRY, "filter": {"q": "id<=4"}}
    first = await client.post(URL, json={**body, "expected": 4, "upto": "4"}, headers=a)
    assert (first.json()["done"], first.json()["finished"]) == (2, False), first.text
    given = first.json()["next"]
    before = written(db)

    # Past what the dry run confirmed, under a bulk id of the caller's choosing.
    forged = decoded(given) | {"b": "f0f0f0f0f0f0", "u": [7], "t": 7}
    altered = given[:20] + ("A" if given[20] != "A" else "B") + given[21:]
    for name, text, headers in (
        ("forged", encoded(forged), a),
        ("another's", given, b),
        ("altered", altered, a),
    ):
        refused = await client.post(URL, json={**body, "next": text}, headers=headers)
        assert 400 <= refused.status_code < 500, (name, refused.text)
        assert written(db) == before, name
    forging = await client.post(URL, json={**body, "next": encoded(forged)}, headers=a)
    assert forging.status_code == 409, "well formed, but not what this bulk action gave"

    second = await client.post(URL, json={**body, "next": given}, headers=a)
    assert (second.status_code, second.json()["done"]) == (200, 4), second.text
    assert second.json()["next"] is None, "the walk's last batch knows it is the last"
    after = written(db)
    replayed = await client.post(URL, json={**body, "next": given}, headers=a)
    assert replayed.status_code == 409, replayed.text
    assert "newest `next`" in replayed.json()["detail"]
    # The ended walk's position, rebuilt from what the answers and the audit show.
    ended = decoded(given) | {"d": 4, "n": 2, "a": [4], "r": after[1][-1][0]}
    reopened = await client.post(URL, json={**body, "next": encoded(ended)}, headers=a)
    assert reopened.status_code == 409, reopened.text
    assert written(db) == after
    assert [r[1] for r in after[0]] == ["work"] * 4 + [None] * 3, "nothing past the dry run"
    assert {r[2]["bulk"] for r in after[1]} == {first.json()["bulk_id"]}


async def test_an_empty_window_spends_its_next(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    keys: dict[str, str],
) -> None:
    await add_failed(Session, 4)
    a = bearer(keys["a"])
    body = {**RETRY, "filter": {"error": "boom"}}
    first = await client.post(URL, json={**body, "expected": 4, "upto": "4"}, headers=a)
    given = first.json()["next"]
    db.sql("UPDATE chore SET last_error = 'RuntimeError: other' WHERE id > 2")  # moved on
    emptied = await client.post(URL, json={**body, "next": given}, headers=a)
    assert (emptied.json()["done"], emptied.json()["next"]) == (2, None), emptied.text
    db.sql("UPDATE chore SET last_error = 'RuntimeError: boom' WHERE id > 2")  # match again
    replayed = await client.post(URL, json={**body, "next": given}, headers=a)
    assert replayed.status_code == 409, replayed.text
    assert [r[1] for r in written(db)[0]] == ["work", "work", None, None]
    assert [(r[4], r[5]["batch"]) for r in await audit(db)] == [(2, 1), (0, 2)]


async def test_malformed_continuations_are_400(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    keys: dict[str, str],
) -> None:
    await add_failed(Session, 5)
    a = bearer(keys["a"])
    first = await client.post(URL, json={**RETRY, "expected": 5, "upto": "5"}, headers=a)
    given = decoded(first.json()["next"])
    before = written(db)
    for change in (
        {"u": None},
        {"a": None},
        {"u": [{"id": 1}]},
        {"u": []},
        {"d": "2"},
        {"n": True},
        {"r": None},
        {"r": -1},
        {"r": 2**70},
        {"b": 5},
    ):
        reply = await client.post(URL, json={**RETRY, "next": encoded(given | change)}, headers=a)
        assert reply.status_code == 400, (change, reply.text)
        assert "not a bulk action's continuation" in reply.json()["detail"]
    for text in ("W10", encoded({}), "!!!!"):  # a list, an empty document, not base64
        reply = await client.post(URL, json={**RETRY, "next": text}, headers=a)
        assert reply.status_code == 400, (text, reply.text)
    assert written(db) == before


async def test_each_action_audits_as_its_command(
    db: Database,
    client: httpx.AsyncClient,
    Session: async_sessionmaker[AsyncSession],
    keys: dict[str, str],
) -> None:
    await add_failed(Session, 3)
    a = bearer(keys["a"])
    for body in (
        {**RETRY, "filter": {"key": "1"}},
        {"action": "run", "step": "work", "filter": {"key": "2"}},
        {"action": "cancel", "filter": {"key": "2"}},  # scheduled again by the run
    ):
        reply = await client.post(URL, json={**body, "expected": 1, "upto": "3"}, headers=a)
        assert reply.status_code == 200, reply.text
    # The replay's `bulk.replay`: test_bulk_http.py; `duly bulk retry`'s: test_bulk_cli.py.
    assert [(r[2], r[4]) for r in await audit(db)] == [
        ("bulk.retry", 1), ("bulk.run", 1), ("bulk.cancel", 1),
    ]  # fmt: skip
