"""The outbox over HTTP: its summary, its events newest first, one event, dead-letter replay.

A database without an outbox table answers these 404; replaying one event
that is not dead-lettered is a 409 (the request is well formed, the
event's state refuses it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import (
    MAX_OUTBOX_OFFSET,
    EventTables,
    event_detail,
    list_outbox,
    outbox_summary as read_outbox_summary,
)
from functions.http.refusals import conflict, not_found
from functions.http.routes.runs import DEFAULT_LIMIT, MAX_LIMIT
from functions.http.segments import RawPathRoute
from functions.http.state import connection_of
from functions.identity.access import allow
from functions.identity.actors import actor_of
from functions.identity.principal import Role
from functions.requests import events
from functions.requests.events import MAX_EVENT_ID, ReplayRequest
from functions.requests.lookup import event_tables

# The statuses of engine's VIEW_STATUSES, for validation and the schema.
OutboxStatus = Literal["pending", "claimed", "processed", "failed", "dead_letter"]

router = APIRouter(
    route_class=RawPathRoute,  # an event id may hold `/`
    responses=not_found("outbox table in this database, or no such event"),
)


@router.get("/outbox", dependencies=[allow(Role.VIEWER)])
async def outbox_summary(request: Request) -> dict[str, Any]:
    """Outbox rows by status, the next due instant, and handlers with failing routes."""
    summary = await read_outbox_summary(_tables(request), engine=_reads(request))
    return jsonable_encoder(summary)


@router.get("/outbox/events", dependencies=[allow(Role.VIEWER)])
async def list_outbox_events(
    request: Request,
    status: OutboxStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    before: Annotated[str | None, Query(min_length=1, max_length=MAX_EVENT_ID)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OUTBOX_OFFSET)] = 0,
) -> dict[str, Any]:
    """Outbox rows newest first; `before` (the last id of a page) or `offset` pages on."""
    page = await list_outbox(
        _tables(request),
        status,
        limit=limit,
        before=before,
        offset=offset,
        engine=_reads(request),
    )
    return {"events": jsonable_encoder(page.rows), "next_before": page.next_before}


@router.get("/outbox/events/{event_id}", dependencies=[allow(Role.VIEWER)])
async def outbox_event(request: Request, event_id: str) -> dict[str, Any]:
    """One event as published, its outbox row and each route's delivery record."""
    detail = await event_detail(_tables(request), event_id, engine=_reads(request))
    return jsonable_encoder(detail)


@router.post("/outbox/dead-letters/replay", dependencies=[allow(Role.OPERATOR)])
async def replay_dead_letters(
    request: Request, body: ReplayRequest | None = None
) -> dict[str, Any]:
    """Make dead-lettered events due again: those of event_ids, or every one."""
    ids = None if body is None else body.event_ids
    replayed = await events.replay_dead_letters(_tables(request), ids, actor=actor_of(request))
    return {"replayed": replayed, "count": len(replayed)}


@router.post(
    "/outbox/events/{event_id}/replay",
    responses=conflict("The event is not dead-lettered: there is nothing to replay"),
    dependencies=[allow(Role.OPERATOR)],
)
async def replay_event(request: Request, event_id: str) -> dict[str, Any]:
    """Make one dead-lettered event due again; 409 when it is not dead-lettered."""
    tables, reads = _tables(request), _reads(request)
    replayed = await events.replay_event(tables, reads, event_id, actor=actor_of(request))
    return {"replayed": replayed, "count": len(replayed)}


def _tables(request: Request) -> EventTables:
    return event_tables(connection_of(request).workflows)


def _reads(request: Request) -> AsyncEngine:
    # Each read its own transaction: no BEGIN and COMMIT round trips.
    return connection_of(request).autocommit
