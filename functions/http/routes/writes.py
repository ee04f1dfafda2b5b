"""Writes to runs: `POST /workflows/{name}/start`, `deliver`, `run` and `cancel`.

Each route hands its body (a model of `functions.requests.runs`) to the
request layer, which the console and the Lambda `deliver` entry call too;
a run made due is kicked on runtimes where nothing else would run it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from functions.http.refusals import conflict, not_found
from functions.http.state import call_state, connection_of
from functions.identity.access import allow
from functions.identity.actors import actor_of
from functions.identity.principal import Role
from functions.requests import runs
from functions.requests.lookup import find_writable
from functions.requests.runs import CancelRequest, DeliverRequest, RunRequest, StartRequest

ADDRESSED = not_found("workflow or step")

router = APIRouter()


@router.post(
    "/workflows/{name}/start",
    status_code=201,
    responses={
        **ADDRESSED,
        **conflict("A run with one of these unique values exists already"),
    },
    dependencies=[allow(Role.OPERATOR)],
)
async def start_workflow(request: Request, name: str, body: StartRequest) -> dict[str, Any]:
    """Insert a run and its first step; 409 when a unique key of the row already has a run."""
    info = find_writable(connection_of(request), name)
    started = await runs.start_run(info, body, actor=actor_of(request))
    await call_state(request, "kick")  # on Lambda nothing else runs the step now due
    return started


@router.post("/workflows/{name}/deliver", responses=ADDRESSED, dependencies=[allow(Role.OPERATOR)])
async def deliver_to_workflow(request: Request, name: str, body: DeliverRequest) -> dict[str, Any]:
    """Deliver an event to the addressed runs; what each did with it, counted apart.

    `taken`: runs that were waiting for it and go on now; `held`: runs on
    their way to a wait that keep it until they wait (and drop it if they
    end, fail or wait for another step first); `accepted`: both; `refused`: the others
    by reason (`unknown_key`, `waiting_for_other_step`, `deadline_passed`,
    `deduplicated`, `holding_another_event`, `finished`, ...); `message`:
    a sentence that says it all.
    """
    info = find_writable(connection_of(request), name)
    delivered = await runs.deliver_event(info, body)
    if delivered:
        await call_state(request, "kick")
    return runs.delivery_answer(info, delivered)


@router.post("/workflows/{name}/run", responses=ADDRESSED, dependencies=[allow(Role.OPERATOR)])
async def run_on_workflow(request: Request, name: str, body: RunRequest) -> dict[str, Any]:
    """Run a step now on the addressed runs, replacing what was scheduled; how many."""
    info = find_writable(connection_of(request), name)
    addressed = await runs.run_step(info, body, actor=actor_of(request))
    if addressed:
        await call_state(request, "kick")
    return {"workflow": info.name, "addressed": addressed}


@router.post(
    "/workflows/{name}/cancel",
    responses=not_found("workflow"),
    dependencies=[allow(Role.OPERATOR)],
)
async def cancel_workflow(request: Request, name: str, body: CancelRequest) -> dict[str, Any]:
    """End the addressed runs where they stand; how many were live."""
    info = find_writable(connection_of(request), name)
    cancelled = await runs.cancel_runs(info, body, actor=actor_of(request))
    return {"workflow": info.name, "cancelled": cancelled}
