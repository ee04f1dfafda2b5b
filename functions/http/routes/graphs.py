"""Graph workflows over HTTP: templates (save, load, activate) and instances (submit, move).

JSON in and out, under `/graphs`. The routes parse (the models of
`functions.requests.graphs`, the console's too), call the process's
`GraphRuntime` (engine.graphs) and shape the reply; a refusal of the
runtime is a `WorkflowTransitionError`, answered with its status and code
by `functions.http.errors` (400 for a refused transition; 409 for an ended
instance, a subject already in a workflow, a version that is not the active
one, a second vote; 403 for a forbidden self-approval or a submitter the
template does not take). The request's principal acts
(`functions.requests.graphs.acting`).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from engine import GraphRuntime, get_graph_runtime, list_templates, load_design
from functions.http.refusals import GraphRefusal, conflict, not_found
from functions.identity.access import allow, principal_of
from functions.identity.principal import Role
from functions.requests import graphs
from functions.requests.graphs import CancelRequest, SubmitRequest, TransitionRequest
from functions.requests.nesting import DesignBody

router = APIRouter(
    prefix="/graphs",
    tags=["graph workflows"],
    responses=not_found("graph workflows in this app, or no such template or instance"),
)
ENDED = conflict("The instance has ended", GraphRefusal)
VOTED = conflict(
    "The instance has ended (WORKFLOW_COMPLETED), or the caller has voted at this state "
    "already (ALREADY_VOTED)",
    GraphRefusal,
)
SUBMIT_REFUSED = conflict(
    "The subject is in a workflow already (SUBMISSION_ERROR), or the version named is not "
    "its template's active one (TEMPLATE_NOT_ACTIVE)",
    GraphRefusal,
)


def _runtime() -> GraphRuntime:
    return get_graph_runtime()


# -- templates ------------------------------------------------------------------------------


@router.get("/templates", dependencies=[allow(Role.VIEWER)])
async def graph_templates() -> dict[str, Any]:
    """Every version of every graph template."""
    runtime = _runtime()
    async with runtime.reading() as conn:
        return {"templates": await list_templates(conn, runtime.tables)}


@router.post("/templates", dependencies=[allow(Role.DESIGNER)])
async def save_graph_template(design: DesignBody) -> dict[str, Any]:
    """Save the designer's graph as a new inactive version; its validation errors come back."""
    return (await graphs.save_version(_runtime(), design)).response()


@router.get("/templates/{template_id}", dependencies=[allow(Role.VIEWER)])
async def load_graph_template(template_id: uuid.UUID) -> dict[str, Any]:
    """The designer's graph of one version (its stored layout while it still matches)."""
    runtime = _runtime()
    async with runtime.reading() as conn:
        return await load_design(conn, runtime.tables, template_id)


@router.post("/templates/{template_id}/activate", dependencies=[allow(Role.DESIGNER)])
async def activate_graph_template(template_id: uuid.UUID) -> dict[str, Any]:
    """Make this version the one new instances start on; refused while it is invalid."""
    return await graphs.activate_version(_runtime(), template_id)


# -- instances ------------------------------------------------------------------------------


@router.post(
    "/instances",
    status_code=201,
    responses=SUBMIT_REFUSED,
    dependencies=[allow(Role.VIEWER)],
)
async def submit_subject(request: Request, body: SubmitRequest) -> dict[str, Any]:
    """Submit a subject to a workflow's active version, as the caller: its instance, started.

    The template says who may submit (403 SUBMITTER_NOT_ALLOWED for others).
    """
    principal = principal_of(request)
    return await graphs.submit_subject(_runtime(), request.app.state.Session, body, principal)


@router.get("/instances/{instance_id}", dependencies=[allow(Role.VIEWER)])
async def graph_instance(instance_id: uuid.UUID) -> dict[str, Any]:
    """An instance with its active branches."""
    return (await _runtime().instance(instance_id)).to_dict()


@router.get("/instances/{instance_id}/transitions", dependencies=[allow(Role.VIEWER)])
async def available_transitions(
    request: Request,
    instance_id: uuid.UUID,
    user: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    """The transitions the caller (or, for an admin, `user`) may take now, in the picker's order."""
    found = await graphs.offered_transitions(_runtime(), instance_id, principal_of(request), user)
    return {"transitions": [choice.to_dict() for choice in found]}


@router.post(
    "/instances/{instance_id}/transitions", responses=VOTED, dependencies=[allow(Role.VIEWER)]
)
async def transition(
    request: Request, instance_id: uuid.UUID, body: TransitionRequest
) -> dict[str, Any]:
    """Move a branch (or vote toward a move, under a threshold), as the caller: one vote a
    person a state's visit."""
    return await graphs.take_transition(_runtime(), instance_id, body, principal_of(request))


@router.post(
    "/instances/{instance_id}/cancel", responses=ENDED, dependencies=[allow(Role.OPERATOR)]
)
async def cancel_instance(
    request: Request, instance_id: uuid.UUID, body: CancelRequest
) -> dict[str, Any]:
    """Cancel an active instance, as the caller."""
    return await graphs.cancel_instance(_runtime(), instance_id, body, principal_of(request))


@router.get("/instances/{instance_id}/history", dependencies=[allow(Role.VIEWER)])
async def instance_history(instance_id: uuid.UUID) -> dict[str, Any]:
    """The instance's audit trail, in the order it happened."""
    entries = await _runtime().history(instance_id)
    return {"history": [entry.to_dict() for entry in entries]}
