"""The outbox, `/console/outbox`: its open rows, events with their routes, dead letters, replay.

Reads are `engine.events.views`'s (the queries of `GET /outbox/...`) and the
overview's count of open rows; a replay, of one event or of every dead
letter, asks for a confirmation and then replays through the request
layer (`functions.requests.events`), as the JSON API does, so it is
refused as the API would refuse it (409 for an event not dead-lettered).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine import VIEW_STATUSES, EventTables, database_now, event_detail, list_outbox, open_outbox
from functions.console.rendering import ConsolePage, connection_of, render
from functions.identity.access import allow
from functions.identity.actors import console_actor
from functions.identity.principal import Role
from functions.requests import events
from functions.requests.errors import ConflictError
from functions.requests.lookup import event_tables

router = APIRouter(prefix="/outbox", route_class=ConsolePage)

PAGE = 50  # events a page
OutboxStatus = Literal["pending", "claimed", "processed", "failed", "dead_letter"]
DONE = {
    "replayed": "Replayed {count} event(s): due again now.",
}


def event_url(event_id: str) -> str:
    """The console's page of one event."""
    return f"/console/outbox/events/{quote(event_id, safe='')}"


@router.get("", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def outbox_page(
    request: Request,
    status: Annotated[OutboxStatus | None, Query()] = None,
    before: Annotated[str | None, Query(max_length=200)] = None,
    done: Annotated[str | None, Query(max_length=20)] = None,
    count: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> HTMLResponse:
    """The outbox's open rows and failing handlers, and a page of its events, newest first."""
    connection = connection_of(request)
    tables = _tables(request)
    summary = await open_outbox(connection, tables)
    page = await list_outbox(
        tables, status, limit=PAGE, before=before or None, engine=connection.autocommit
    )
    query = {"status": status} if status else {}
    next_url = None
    if page.next_before is not None:
        next_url = "?" + urlencode({**query, "before": page.next_before})
    note = DONE.get(done or "")
    context = {
        "title": "Outbox",
        "summary": summary,
        "page": page,
        "status": status,
        "statuses": VIEW_STATUSES,
        "next_url": next_url,
        "first_url": "?" + urlencode(query) if before else None,
        "event_url": event_url,
        "now": summary.now,
        "note": note.format(count=count) if note else None,
    }
    return render(request, "outbox/list.html", context)


@router.post("/replay", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def replay_all(request: Request) -> Response:
    """Replay every dead letter, after a confirmation (`POST /outbox/dead-letters/replay`)."""
    tables = _tables(request)
    form = await request.form()
    if form.get("confirmed") != "yes":
        summary = await open_outbox(connection_of(request), tables)
        dead = summary.counts.get("dead_letter", 0)
        question = f"Replay every dead-lettered event ({dead:,} now)? Each is due again at once."
        return _confirm(request, question, "/console/outbox/replay", "/console/outbox")
    replayed = await events.replay_dead_letters(tables, None, actor=console_actor(request))
    return _replayed("/console/outbox", len(replayed))


@router.post("/events/{event_id}/replay", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def replay_one(request: Request, event_id: str) -> Response:
    """Replay one dead-lettered event, after a confirmation (`POST /outbox/events/{id}/replay`)."""
    tables = _tables(request)
    form = await request.form()
    if form.get("confirmed") != "yes":
        detail = await event_detail(tables, event_id, engine=connection_of(request).autocommit)
        kind = detail.event.event_type if detail.event else "event"
        question = f"Replay {kind} {event_id}? Its dead-lettered routes run again now."
        target = event_url(event_id)
        return _confirm(request, question, f"{target}/replay", target)
    try:
        reads, actor = connection_of(request).autocommit, console_actor(request)
        replayed = await events.replay_event(tables, reads, event_id, actor=actor)
    except ConflictError as exc:
        context: dict[str, Any] = {"title": "Nothing to replay", "status": 409}
        context["message"] = str(exc)
        return render(request, "error.html", context, status_code=409)
    return _replayed(event_url(event_id), len(replayed))


@router.get(
    "/events/{event_id:path}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def event_page(
    request: Request,
    event_id: str,
    done: Annotated[str | None, Query(max_length=20)] = None,
    count: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> HTMLResponse:
    """One event: as published, its outbox row, and each route's delivery."""
    connection = connection_of(request)
    tables = _tables(request)
    detail = await event_detail(tables, event_id, engine=connection.autocommit)
    async with connection.autocommit.connect() as conn:
        now = await database_now(conn)
    note = DONE.get(done or "")
    context: dict[str, Any] = {
        "title": f"Event {event_id}",
        "event_id": event_id,
        "detail": detail,
        "now": now,
        "replayable": detail.outbox is not None and detail.outbox.status == "dead_letter",
        "event_url": event_url(event_id),
        "note": note.format(count=count) if note else None,
    }
    return render(request, "outbox/event.html", context)


def _confirm(request: Request, question: str, post_url: str, back_url: str) -> HTMLResponse:
    context: dict[str, Any] = {
        "title": "Confirm",
        "question": question,
        "action": "replay",
        "step": None,
        "typed": {},
        "options": {},
        "post_url": post_url,
        "back_url": back_url,
    }
    return render(request, "runs/confirm.html", context)


def _replayed(target: str, count: int) -> RedirectResponse:
    query = urlencode({"done": "replayed", "count": count})
    return RedirectResponse(f"{target}?{query}", status_code=303)


def _tables(request: Request) -> EventTables:
    return event_tables(connection_of(request).workflows)
