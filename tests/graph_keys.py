"""Graph workflows over HTTP with named keys: the example app served, each caller its key.

`served_with_keys` serves `duly dev`'s app with the expense example and
DULY_API_KEYS for `KEYS` (viewers; ops an admin, dora a designer; gail's key
says finance), with the admin token too unless told otherwise. The rest are
the calls graph tests make with those keys.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions.expense_graph import EXPENSE_APPROVAL
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Role
from functions.local.dev import create_dev_app, install_example_graph
from tests.helpers import serving

PAGES = "/console/graphs"
TOKEN = "graph-admin-token-of-some-length"
NAMES = ("sam", "mia", "max", "mallory", "gail", "ops", "vic", "fred", "fay", "dora")
KEYS = {name: new_key() for name in NAMES}
ROLES = {"ops": Role.ADMIN, "dora": Role.DESIGNER}
GROUPS = {"gail": frozenset({"finance"})}


def keys_setting() -> str:
    """DULY_API_KEYS for KEYS: viewers, but ops (admin) and dora (designer); gail in finance."""
    entries = [
        ApiKey(
            name=name,
            roles=frozenset({ROLES.get(name, Role.VIEWER)}),
            groups=GROUPS.get(name, frozenset()),
            sha256=digest_of(key),
        ).entry()
        for name, key in KEYS.items()
    ]
    return json.dumps(entries)


def bearer(name: str) -> dict[str, str]:
    """The Authorization header of a key (or of the admin token, "api-token")."""
    return {"Authorization": f"Bearer {TOKEN if name == 'api-token' else KEYS[name]}"}


@asynccontextmanager
async def served_with_keys(
    Session: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
    *,
    token: bool = True,
) -> AsyncIterator[httpx.AsyncClient]:
    """The example app on `Session`'s database (`examples.Base`'s tables made), served with
    the keys (and the admin token), its graph installed."""
    monkeypatch.setenv("DULY_API_KEYS", keys_setting())
    if token:
        monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    async with serving(create_dev_app(Session)) as client:
        await install_example_graph()
        yield client


async def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


async def new_claim(client: httpx.AsyncClient, owner: str, amount: int = 250) -> dict[str, Any]:
    """An expense claim of `owner`'s, created by duly dev's example route (an operator's)."""
    body = {"title": "Trip", "amount": amount, "submitted_by": owner}
    created = await client.post("/dev/expense-claims", json=body, headers=bearer("ops"))
    return dict(await ok(created, 201))


def submit_body(claim: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The body submitting `claim` to the expense workflow (or as `more` says)."""
    body = {
        "subject_type": claim["subject_type"],
        "subject_key": claim["subject_key"],
        "workflow": EXPENSE_APPROVAL,
    }
    return {**body, **more}


async def submitted_by(client: httpx.AsyncClient, name: str, amount: int = 250) -> dict[str, Any]:
    """`name`'s own claim created, then submitted with `name`'s key: its instance."""
    claim = await new_claim(client, name, amount)
    instance: dict[str, Any] = await ok(
        await client.post("/graphs/instances", json=submit_body(claim), headers=bearer(name)), 201
    )
    assert instance["submitted_by"] == name
    return instance


async def offered(
    client: httpx.AsyncClient, instance_id: str, name: str, user: str | None = None
) -> httpx.Response:
    query = {} if user is None else {"user": user}
    return await client.get(
        f"/graphs/instances/{instance_id}/transitions", params=query, headers=bearer(name)
    )


async def history(client: httpx.AsyncClient, instance_id: str) -> list[dict[str, Any]]:
    found = await ok(
        await client.get(f"/graphs/instances/{instance_id}/history", headers=bearer("sam"))
    )
    return list(found["history"])


def choice(transitions: dict[str, Any], label: str) -> dict[str, Any]:
    [found] = [t for t in transitions["transitions"] if t["display_name"] == label]
    return dict(found)


def move_body(chosen: dict[str, Any], user: str | None = None) -> dict[str, Any]:
    body = {"branch_id": chosen["branch_id"], "target_id": chosen["target_id"]}
    return body if user is None else {**body, "user": user}
