"""The schedules, `/console/schedules`: every scheduled run, and pause, resume or trigger one.

The list is `GET /schedules`'s; an action asks for a confirmation, then goes
through the request layer (`functions.requests.schedules`) as the API's does,
recorded as the session's principal, and refused as the API would refuse it
(a page with 409 while the run's step is running).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine import database_now
from functions.console.rendering import ConsolePage, connection_of, render
from functions.console.run_pages import run_url
from functions.identity.access import allow, principal_of
from functions.identity.principal import Role
from functions.requests import schedules
from functions.requests.lookup import find_writable

router = APIRouter(prefix="/schedules", route_class=ConsolePage)

Action = Literal["pause", "resume", "trigger"]
DONE = {
    "pause": "Paused: nothing fires until it is resumed.",
    "resume": "Resumed: it fires at its schedule's next occurrence.",
    "trigger": "Triggered: it fires now.",
}
QUESTIONS = {
    "pause": "Pause {workflow} run {key}? Nothing fires until it is resumed.",
    "resume": "Resume {workflow} run {key}? It fires at its schedule's next occurrence.",
    "trigger": "Trigger {workflow} run {key} now? It fires once, now; a cron keeps its times, "
    "an interval counts on from this firing, and a paused run stays paused.",
}
BUTTONS = {"pause": "Yes, pause it", "resume": "Yes, resume it", "trigger": "Yes, fire it now"}


@router.get("", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def schedules_page(
    request: Request, done: Annotated[Action | None, Query()] = None
) -> HTMLResponse:
    """Every scheduled run: its schedule, time zone, next and last firing, and its actions."""
    connection = connection_of(request)
    found = await schedules.scheduled_runs(connection)
    async with connection.autocommit.connect() as conn:
        now = await database_now(conn)
    context = {
        "title": "Schedules",
        "schedules": found,
        "now": now,
        "run_url": run_url,
        "note": DONE[done] if done else None,
    }
    return render(request, "schedules/list.html", context)


@router.post("/{action}", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def steer_schedule(request: Request, action: Action) -> Response:
    """Pause, resume or trigger the run the form names, after a confirmation."""
    form = await request.form()
    workflow, key = str(form.get("workflow") or ""), str(form.get("key") or "")
    if form.get("confirmed") != "yes":
        find_writable(connection_of(request), workflow)  # a workflow that is not: 404, no question
        context: dict[str, Any] = {
            "title": "Confirm",
            "question": QUESTIONS[action].format(workflow=workflow, key=key),
            "button": BUTTONS[action],
            "post_url": f"/console/schedules/{action}",
            "workflow": workflow,
            "key": key,
        }
        return render(request, "schedules/confirm.html", context)
    principal = principal_of(request)
    await schedules.steer(
        connection_of(request), workflow, key, action, actor=principal.id, via="console"
    )
    return RedirectResponse("/console/schedules?" + urlencode({"done": action}), status_code=303)
