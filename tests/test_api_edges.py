"""The HTTP app's edges, over real HTTP on a real database.

- a signed request is judged on its head before its body is read: a signature or timestamp
  of the wrong shape, a stale timestamp, a route no secret may sign, a length past the
  signed limit or none declared, each answered at once while the body never comes
  (test_a_signed_request_is_judged_on_its_head_before_its_body_is_read); a good head
  whose body stalls is 408 (test_a_signed_body_that_stalls_is_408), and the guard stops
  reading a streamed signed body at its limit
  (test_the_guard_stops_reading_a_streamed_signed_body_at_the_limit);
- the schema lists no table of the engine's own, and their paths are 404
  (test_no_internal_table_is_in_the_schema_and_its_paths_are_404);
- /metrics is documented as the text it serves (test_metrics_is_documented_as_text);
- a 405's Allow lists every method the path takes
  (test_a_405_allows_every_method_the_path_takes);
- a boolean is no integer in any request model
  (test_no_request_model_takes_a_boolean_for_a_number, and over HTTP
  test_a_boolean_for_a_number_is_422).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pkgutil
import re
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions import examples
from functions.app import create_app
from functions.http.guard import Guard, GuardSettings
from functions.identity.signatures import (
    MAX_SIGNED_BODY,
    Signers,
    SigningSecret,
    signature_of,
)
from functions.local.dev import create_dev_app
from tests.apps import api
from tests.conftest import Database
from tests.helpers import serving

TOKEN = "edges-token-of-the-api"
SECRET = "edges-secret-of-the-webhook"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
ANSWERED_AT_ONCE = 2.0  # seconds; the body would be waited for DULY_BODY_TIMEOUT_SECONDS (10)
REQUEST_MODULES = ("functions.requests", "functions.local.dev")


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(examples.Base.metadata, api.Base.metadata)


@pytest.fixture
async def client(
    Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", SECRET)
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client


def signed_head(path: str, body: bytes, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    signature = signature_of(SECRET, timestamp, "POST", path, "", body)
    return {"X-Duly-Timestamp": timestamp, "X-Duly-Signature": signature}


async def head_only(client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> bytes:
    """Send a POST's head and none of its body; what the server answers, and when."""
    url = httpx.URL(str(client.base_url))
    reader, writer = await asyncio.open_connection(url.host, url.port)
    lines = [f"POST {path} HTTP/1.1", f"Host: {url.host}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), timeout=15)
    finally:
        writer.close()


async def test_a_signed_request_is_judged_on_its_head_before_its_body_is_read(
    client: httpx.AsyncClient,
) -> None:
    body = b'{"event_type": "x.y"}'
    good = {**signed_head("/events", body), "Content-Length": str(len(body))}
    refused = {
        "a signature of another shape": ({**good, "X-Duly-Signature": "sha256=0"}, 401),
        "a timestamp of another shape": ({**good, "X-Duly-Timestamp": "soon"}, 401),
        "a stale timestamp": ({**good, **signed_head("/events", body, time.time() - 400)}, 401),
        "a body past the signed limit": ({**good, "Content-Length": str(MAX_SIGNED_BODY + 1)}, 413),
        "no length declared": (
            {k: v for k, v in good.items() if k != "Content-Length"}
            | {"Transfer-Encoding": "chunked"},
            411,
        ),
    }
    for name, (headers, status) in refused.items():
        started = time.monotonic()
        answer = await head_only(client, "/events", headers)
        took = time.monotonic() - started
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()), (name, answer[:200])
        assert took < ANSWERED_AT_ONCE, (name, took)
    # The same good head with its body is taken.
    taken = await client.post("/events", content=body, headers=good | JSON)
    assert taken.status_code == 200, taken.text


async def test_a_route_no_secret_may_sign_is_refused_before_the_body(
    Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [{"name": "refunds", "secret": SECRET, "routes": ["POST /events"]}]
    monkeypatch.setenv("DULY_WEBHOOK_SECRETS", json.dumps(held))
    async with serving(create_app(Session, run_worker=False)) as client:
        path = "/workflows/invoice/start"
        headers = {**signed_head(path, b"{}"), "Content-Length": "2"}
        started = time.monotonic()
        answer = await head_only(client, path, headers)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert b"No signing secret may sign POST /workflows/invoice/start" in answer
        assert time.monotonic() - started < ANSWERED_AT_ONCE


async def test_a_signed_body_that_stalls_is_408(
    Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("DULY_BODY_TIMEOUT_SECONDS", "0.5")
    async with serving(create_app(Session, run_worker=False)) as client:
        headers = {**signed_head("/events", b"{}"), "Content-Length": "100"}
        answer = await head_only(client, "/events", headers)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


async def test_the_guard_stops_reading_a_streamed_signed_body_at_the_limit(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    signers = Signers((SigningSecret("webhook", SECRET, None),))
    guard = Guard(app, GuardSettings(signers=signers, max_body_bytes=4096))
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b" " * 1024, "more_body": pulled < 1000}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    head = [(k.lower().encode(), v.encode()) for k, v in signed_head("/events", b"").items()]
    state = SimpleNamespace(connection=SimpleNamespace(engine=Session.kw["bind"]))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/events",
        "headers": head,
        "query_string": b"",
        "app": SimpleNamespace(state=state),
    }
    await guard(scope, receive, send)
    assert (pulled, reached, sent[0]["status"]) == (5, [], 413)  # 5 KiB read of 1000


async def test_no_internal_table_is_in_the_schema_and_its_paths_are_404(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json", headers=BEARER)).json()
    assert "/workflows/invoice/start" in schema["paths"]
    internal = ("duly_graph_timers", "duly_outbox")
    assert [path for path in schema["paths"] if any(name in path for name in internal)] == []
    for name in internal:
        for action, body in (
            ("start", {"step": "x"}),
            ("deliver", {"step": "x", "key": 1}),
            ("run", {"step": "x", "key": 1}),
            ("cancel", {"key": 1}),
        ):
            reply = await client.post(f"/workflows/{name}/{action}", json=body, headers=BEARER)
            assert reply.status_code == 404, (name, action, reply.text)


async def test_metrics_is_documented_as_text(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json", headers=BEARER)).json()
    documented = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(documented) == ["text/plain"]
    served = await client.get("/metrics", headers=BEARER)
    assert served.status_code == 200, served.text
    assert served.headers["content-type"].startswith("text/plain")


async def test_a_405_allows_every_method_the_path_takes(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json", headers=BEARER)).json()
    patterns = {
        re.compile(re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"): {m.upper() for m in operations}
        for path, operations in schema["paths"].items()
    }
    for path in schema["paths"]:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        taken = set().union(*(m for p, m in patterns.items() if p.match(concrete)))
        reply = await client.options(concrete, headers=BEARER)
        assert reply.status_code == 405, (concrete, reply.text)
        allowed = {method.strip() for method in reply.headers["allow"].split(",")}
        assert allowed == taken, concrete
    static = await client.options("/docs/assets/swagger-ui.css")  # static files: their own
    assert (static.status_code, static.headers["allow"]) == (405, "GET, HEAD")


def request_models() -> list[type[BaseModel]]:
    """Every pydantic model a door parses a request into."""
    modules = []
    for name in REQUEST_MODULES:
        module = importlib.import_module(name)
        modules.append(module)
        if hasattr(module, "__path__"):
            inside = pkgutil.iter_modules(module.__path__, f"{name}.")
            modules.extend(importlib.import_module(found.name) for found in inside)
    return [
        value
        for module in modules
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseModel)
        and value.__module__ == module.__name__
    ]


def test_no_request_model_takes_a_boolean_for_a_number() -> None:
    checked = []
    for model in request_models():
        for name, field in model.model_fields.items():
            hint = str(field.annotation)
            if not re.search(r"\b(int|float)\b", hint) or "list[" in hint:
                continue
            with pytest.raises(ValidationError) as refused:
                model.model_validate({field.alias or name: False})
            problems = {error["loc"][0] for error in refused.value.errors()}
            assert (field.alias or name) in problems, (model, name)
            checked.append(f"{model.__name__}.{name}")
    assert "NewExpense.amount" in checked and "Confirmed.expected" in checked, checked


async def test_a_boolean_for_a_number_is_422(db: Database) -> None:
    Session = await db.create(examples.Base.metadata, api.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False, examples=True)) as client:
        for path, body in (
            ("/dev/expenses", {"expense_id": False, "amount": 1}),
            ("/dev/clock", {"days": True}),
            ("/workflows/invoice/start", {"row": {"number": "B", "total": False}, "step": "chase"}),
            ("/workflows/invoice/run", {"key": False, "step": "chase"}),
        ):
            reply = await client.post(path, json=body)
            assert reply.status_code == 422, (path, reply.text)
            problems = reply.json()["detail"]
            assert problems and all(set(p) == {"loc", "msg", "type"} for p in problems), problems
