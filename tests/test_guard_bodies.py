"""The guard looks at the credential before the body, and a body may not take forever.

- a wrong bearer token is refused before one byte of the body is read:
  test_a_wrong_token_is_refused_before_the_body_is_read
- a body that stalls is 408 after DULY_BODY_TIMEOUT_SECONDS when the app reads it (a
  bearer's): test_a_body_that_stalls_is_408; when the guard does (a signed request's, once
  its head holds), tests/test_api_edges.py: test_a_signed_body_that_stalls_is_408
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from functions.app import create_app
from functions.http.guard import Guard, GuardSettings
from functions.identity.authenticate import Credentials

TOKEN = "a-token-of-the-guard-tests"


def scope_of(method: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw, "query_string": b""}


async def test_a_wrong_token_is_refused_before_the_body_is_read() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"{}", "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = Guard(app, GuardSettings(credentials=Credentials(token=TOKEN)))
    for authorization in ("Bearer wrong-token", "Basic eDp5", ""):
        headers = {"authorization": authorization} if authorization else {}
        sent.clear()
        await guard(scope_of("POST", "/events", headers), receive, send)
        assert sent[0]["status"] == 401
    assert (pulled, reached) == (0, [])


async def stalled() -> dict[str, Any]:
    await asyncio.Event().wait()  # a client that sends its headers and then nothing
    raise AssertionError("never")


async def answer_of(app: Any, scope: dict[str, Any]) -> tuple[int, float]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    started = time.monotonic()
    await asyncio.wait_for(app(scope, stalled, send), timeout=10)
    return sent[0]["status"], time.monotonic() - started


async def test_a_body_that_stalls_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DULY_BODY_TIMEOUT_SECONDS", "0.3")
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    engine = create_async_engine("postgresql+psycopg://")  # never reached: the body comes first
    app = create_app(async_sessionmaker(engine), run_worker=False)
    length = {"content-type": "application/json", "content-length": "100"}
    bearer = scope_of("POST", "/events", {**length, "authorization": f"Bearer {TOKEN}"})
    status, took = await answer_of(app, bearer)
    assert status == 408
    assert 0.25 < took < 5
