"""The schedules: `GET /schedules`, one workflow's, and pause, resume or trigger a run's.

Reads and actions go through `functions.requests.schedules`, as the console's
page and `duly schedules` do; an action is recorded as the request's principal.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request

from functions.http.refusals import conflict, not_found
from functions.http.segments import RawPathRoute
from functions.http.state import call_state, connection_of
from functions.identity.access import allow, principal_of
from functions.identity.principal import Role
from functions.requests import schedules

Action = Literal["pause", "resume", "trigger"]

router = APIRouter(route_class=RawPathRoute)  # a run key may hold `/`


@router.get("/schedules", dependencies=[allow(Role.VIEWER)])
async def list_all_schedules(request: Request) -> dict[str, Any]:
    """Every scheduled run of every workflow: its schedule, next and last firing, paused."""
    found = await schedules.scheduled_runs(connection_of(request))
    return {"schedules": [run.to_dict() for run in found]}


@router.get(
    "/workflows/{name}/schedules",
    responses=not_found("workflow"),
    dependencies=[allow(Role.VIEWER)],
)
async def list_workflow_schedules(request: Request, name: str) -> dict[str, Any]:
    """The scheduled runs of one workflow."""
    found = await schedules.scheduled_runs(connection_of(request), name)
    return {"workflow": name, "schedules": [run.to_dict() for run in found]}


@router.post(
    "/workflows/{name}/runs/{key}/schedule/{action}",
    responses={
        **not_found("workflow, or scheduled run"),
        **conflict("The run's step is running now: try again once it has committed"),
    },
    dependencies=[allow(Role.OPERATOR)],
)
async def steer_schedule(request: Request, name: str, key: str, action: Action) -> dict[str, Any]:
    """Pause (nothing fires), resume (at the schedule's next occurrence) or trigger (fire
    now) a scheduled run; 409 while its step runs."""
    principal = principal_of(request)
    steered = await schedules.steer(
        connection_of(request), name, key, action, actor=principal.id, via="http"
    )
    if action != "pause" and steered["changed"]:
        await call_state(request, "kick")  # on Lambda nothing else runs what is due now
    return steered
