"""Events in, and work now: `POST /events`, `POST /wake` and `POST /drain`.

A publish stores its events through the outbox in one transaction (the
bodies of `functions.requests.events`, which the Lambda `publish` entry
takes too). A wake runs due work until caught up, through the Lambda
runtime's `app.state.wake` or this process's worker; a drain routes the
outbox through the runtime's `app.state.drain`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from engine import NotRunningError, wake
from functions.http.refusals import not_found, unavailable
from functions.http.state import call_state, connection_of, maybe_await
from functions.identity.access import allow
from functions.identity.principal import Role
from functions.requests.events import Publish, events_of
from functions.requests.lookup import database_registry, event_tables

MAX_WAKE_SECONDS = 900.0  # a wake waits at most as long as a Lambda runs
DEFAULT_WAKE_SECONDS = 25.0

router = APIRouter()


@router.post(
    "/events",
    responses=not_found("outbox table: this app maps none"),
    dependencies=[allow(Role.OPERATOR)],
)
async def publish_events(request: Request, body: Publish) -> dict[str, Any]:
    """Publish one event or a batch through the outbox in one transaction; the ids stored.

    An id already stored is answered among `duplicates` and stores nothing.
    """
    events = events_of(body)
    connection = connection_of(request)
    registry = database_registry(event_tables(connection.workflows))
    async with connection.sessionmaker() as session, session.begin():
        stored = await registry.publish_many(events, session=session)
    new = set(stored)
    duplicates = [event.event_id for event in events if event.event_id not in new]
    if stored:
        connection.kick(registry.tables().outbox_table.name)
        await call_state(request, "kick")
    return {"stored": stored, "duplicates": duplicates}


@router.post(
    "/wake",
    responses=unavailable("Not caught up in time, or no worker runs in this process"),
    dependencies=[allow(Role.OPERATOR)],
)
async def wake_up(
    request: Request,
    timeout: Annotated[float, Query(ge=0, le=MAX_WAKE_SECONDS)] = DEFAULT_WAKE_SECONDS,
) -> Any:
    """Run due work until caught up: 200 once it is, 503 when `timeout` seconds pass first.

    The Lambda runtime sets `app.state.wake`; otherwise the worker of this
    process is asked (`engine.wake`), and without one the answer is 503.
    """
    state_wake = getattr(request.app.state, "wake", None)
    try:
        caught_up = await maybe_await(
            state_wake(timeout) if state_wake is not None else wake(timeout)
        )
    except NotRunningError:
        detail = "No worker runs in this process, so nothing can be woken here."
        return JSONResponse({"caught_up": False, "detail": detail}, status_code=503)
    if not caught_up:
        detail = f"Not caught up within {timeout:g} seconds: more work remains."
        return JSONResponse({"caught_up": False, "detail": detail}, status_code=503)
    return {"caught_up": True}


@router.post(
    "/drain",
    responses=unavailable("No drain is configured in this app"),
    dependencies=[allow(Role.OPERATOR)],
)
async def drain_outbox(request: Request) -> Any:
    """Route the outbox now, through the drain the Lambda runtime sets (`app.state.drain`)."""
    drain = getattr(request.app.state, "drain", None)
    if drain is None:
        detail = (
            "No drain is configured in this app: the serverless runtime sets one; a process "
            "with a worker routes the outbox as it goes (or run `duly drain`)."
        )
        return JSONResponse({"detail": detail}, status_code=503)
    result = await maybe_await(drain())
    return {"drained": jsonable_encoder(result)}
