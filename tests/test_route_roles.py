"""Every route says who may call it, and each role gets exactly what the HTTP reference says.

- every API and console route declares its least role (`allow`):
  test_every_route_declares_its_least_role
- docs/reference/http.md's table is the routes' own: test_the_reference_table_is_the_routes
- a key of each role walks every route: 403 below the route's role, through at or above it;
  no credential is 401 everywhere but the public routes: test_each_role_gets_what_the_table_says
- the console's forms, each role logged in with its key: test_each_role_posts_the_forms_it_may
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import httpx
import pytest

from functions import examples
from functions.app import route_roles
from functions.identity.access import PUBLIC, declared_routes
from functions.identity.keys import ApiKey, digest_of, new_key
from functions.identity.principal import Principal, Role, Via
from functions.local.dev import create_dev_app
from tests.conftest import Database
from tests.helpers import csrf_of, serving

HTTP_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "http.md"
TABLE = re.compile(r"^## Who may call what\n.*?\n(?P<table>\| Least role \|.*?)\n\n", re.S | re.M)
# A value for each path parameter the routes have: good enough to pass routing.
PARAMETERS = {
    "name": "onboarding",
    "workflow": "onboarding",
    "key": "1",
    "action": "cancel",
    "template_id": str(uuid.uuid4()),
    "instance_id": str(uuid.uuid4()),
    "event_id": str(uuid.uuid4()),
}


def role_keys(monkeypatch: pytest.MonkeyPatch) -> dict[Role, str]:
    """A named key of each role, in DULY_API_KEYS: the keys by role."""
    keys = {role: new_key() for role in Role}
    entries = [
        ApiKey(f"key-{role.value}", frozenset({role}), frozenset(), digest_of(key)).entry()
        for role, key in keys.items()
    ]
    monkeypatch.setenv("DULY_API_KEYS", json.dumps(entries))
    return keys


def concrete(path: str) -> str:
    """`path` with each `{parameter}` (and `{parameter:path}`) filled in."""
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: PARAMETERS[m.group(1)], path)


def test_every_route_declares_its_least_role() -> None:
    app = create_dev_app(examples_sessionmaker(), run_worker=False)
    undeclared = [f"{m} {p}" for m, p, role in declared_routes(app.routes) if role is None]
    assert undeclared == []
    assert len(declared_routes(app.routes)) > 60


def test_the_reference_table_is_the_routes() -> None:
    found = TABLE.search(HTTP_PAGE.read_text())
    assert found is not None, "docs/reference/http.md has no route roles table"
    assert found["table"] == route_roles(), "run python docs/reference.py"


def examples_sessionmaker() -> object:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    return async_sessionmaker(create_async_engine("postgresql+psycopg://"))


async def test_each_role_gets_what_the_table_says(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = role_keys(monkeypatch)
    Session = await db.create(examples.Base.metadata)
    app = create_dev_app(Session, run_worker=False)
    walked = 0
    async with serving(app) as client:
        for method, path, declared in declared_routes(app.routes):
            if method == "HEAD":
                continue
            url = concrete(path)
            form = method == "POST" and path.startswith("/console")
            anonymous = await client.request(method, url, json={} if method == "POST" else None)
            if form:
                continue  # a console form: its session's CSRF token first (the login tests)
            if declared == PUBLIC:
                assert anonymous.status_code not in (401, 403, 500), (method, path)
                continue
            if path.startswith("/console"):  # a page sends a person to the login form
                assert anonymous.status_code == 303, (method, path, anonymous.text)
            else:
                assert anonymous.status_code == 401, (method, path, anonymous.text)
            needed = Role(declared)
            for role, key in keys.items():
                reply = await client.request(
                    method,
                    url,
                    json={} if method == "POST" else None,
                    headers={"Authorization": f"Bearer {key}"},
                )
                holder = Principal(id="x", roles=frozenset({role}), via=Via.API_KEY)
                if holder.has(needed):
                    assert reply.status_code not in (401, 403, 500), (
                        role,
                        method,
                        path,
                        reply.text,
                    )
                else:
                    assert reply.status_code == 403, (role, method, path, reply.text)
                    assert f"needs the {needed.value} role" in reply.text
                walked += 1
    assert walked > 150


async def test_the_metrics_token_reads_metrics_and_nothing_else(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    scraper = "a-token-for-the-scraper-only"
    monkeypatch.setenv("DULY_METRICS_TOKEN", scraper)
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        bearer = {"Authorization": f"Bearer {scraper}"}
        metrics = await client.get("/metrics", headers=bearer)
        assert metrics.status_code == 200, metrics.text
        assert (await client.get("/metrics")).status_code == 401
        for path in ("/workflows", "/outbox/events", "/openapi.json"):
            refused = await client.get(path, headers=bearer)
            assert refused.status_code == 403, (path, refused.text)
            assert "held to other routes" in refused.json()["detail"]


async def test_each_role_posts_the_forms_it_may(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = role_keys(monkeypatch)
    Session = await db.create(examples.Base.metadata)
    app = create_dev_app(Session, run_worker=False)
    forms = [
        (path, Role(declared))
        for method, path, declared in declared_routes(app.routes)
        if method == "POST" and path.startswith("/console") and declared != PUBLIC
    ]
    assert len(forms) >= 8
    async with serving(app) as server:
        for role, key in keys.items():
            async with httpx.AsyncClient(base_url=server.base_url, trust_env=False) as client:
                data = {"csrf_token": csrf_of(await client.get("/console/login")), "token": key}
                assert (await client.post("/console/login", data=data)).status_code == 303
                csrf = csrf_of(await client.get("/console/outbox"))
                holder = Principal(id="x", roles=frozenset({role}), via=Via.API_KEY)
                for path, needed in forms:
                    sent = {"csrf_token": csrf}
                    reply = await client.post(concrete(path), data=sent)
                    if holder.has(needed):
                        assert reply.status_code not in (401, 403, 500), (role, path, reply.text)
                    else:
                        assert reply.status_code == 403, (role, path, reply.text)
                        assert f"needs the {needed.value} role" in reply.text
