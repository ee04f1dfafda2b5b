"""Graph workflows over HTTP: templates (save, load, activate) and instances (submit, move).

JSON in and out, under `/graphs`. The routes parse, call the process's
`GraphRuntime` (engine.graphs) and shape the reply; a refusal of the
runtime is a `WorkflowTransitionError`, answered with its own status and
code by the app's error handler (400 for a refused transition, 409 for an
ended instance or a subject already in a workflow). The acting user is an
opaque id in the request: behind the app's write guard, the caller (a
backend that authenticated the person) says who acts.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine.errors import DulyError, NotFoundError
from engine.graphs.configure import get_graph_runtime
from engine.graphs.design.document import Design
from engine.graphs.design.versions import (
    activate_template,
    list_templates,
    load_design,
    save_design,
)
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.subjects import key_values, subject_class

router = APIRouter(prefix="/graphs", tags=["graph workflows"])

UserId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class SubmitRequest(BaseModel):
    """A subject to submit: its table and key, who submits it, and which workflow."""

    model_config = ConfigDict(extra="forbid")

    subject_type: str = Field(description="The subject's table (a model mapping GraphSubject).")
    subject_key: str = Field(description="The subject's primary key, as text.")
    user: UserId | None = None
    workflow: str | None = Field(None, description="The template's name (its active version).")
    template_id: uuid.UUID | None = None


class TransitionRequest(BaseModel):
    """A user's move of one branch to a target node (or a vote toward it)."""

    model_config = ConfigDict(extra="forbid")

    branch_id: uuid.UUID
    target_node_id: uuid.UUID
    user: UserId
    comment: Annotated[str, StringConstraints(max_length=10_000)] = ""
    source_node_id: uuid.UUID | None = Field(
        None, description="The state the user saw the branch on: refused if it moved since."
    )


class CancelRequest(BaseModel):
    """Who cancels an instance, and why."""

    model_config = ConfigDict(extra="forbid")

    user: UserId | None = None
    reason: Annotated[str, StringConstraints(max_length=10_000)] = ""


def _runtime() -> GraphRuntime:
    return get_graph_runtime()


# -- templates ------------------------------------------------------------------------------


@router.get("/templates")
async def graph_templates() -> dict[str, Any]:
    """Every version of every graph template."""
    runtime = _runtime()
    async with runtime.reading() as conn:
        return {"templates": await list_templates(conn, runtime.tables)}


@router.post("/templates")
async def save_graph_template(design: Design) -> dict[str, Any]:
    """Save the designer's graph as a new inactive version; its validation errors come back."""
    runtime = _runtime()
    async with runtime.engine.begin() as conn:
        saved = await save_design(conn, runtime.tables, design, runtime.conditions.names())
    return saved.response()


@router.get("/templates/{template_id}")
async def load_graph_template(template_id: uuid.UUID) -> dict[str, Any]:
    """The designer's graph of one version (its stored layout while it still matches)."""
    runtime = _runtime()
    async with runtime.reading() as conn:
        return await load_design(conn, runtime.tables, template_id)


@router.post("/templates/{template_id}/activate")
async def activate_graph_template(template_id: uuid.UUID) -> dict[str, Any]:
    """Make this version the one new instances start on; refused while it is invalid."""
    runtime = _runtime()
    async with runtime.engine.begin() as conn:
        graph = await activate_template(
            conn, runtime.tables, template_id, runtime.conditions.names()
        )
    return {
        "template_id": str(graph.template_id),
        "name": graph.name,
        "version": graph.version,
        "is_active": True,
    }


# -- instances ------------------------------------------------------------------------------


@router.post("/instances", status_code=201)
async def submit_subject(request: Request, body: SubmitRequest) -> dict[str, Any]:
    """Submit a subject to a workflow: its instance, started."""
    runtime = _runtime()
    cls = subject_class(body.subject_type)
    try:
        key = key_values(cls, body.subject_key)
    except (ValueError, TypeError) as exc:
        raise DulyError(f"{body.subject_key!r} is not a key of {body.subject_type}.") from exc
    async with request.app.state.Session() as session:
        subject = await session.get(cls, key)
    if subject is None:
        raise NotFoundError(f"No {body.subject_type} row has the key {body.subject_key!r}.")
    instance = await runtime.submit(
        subject, body.user, template_name=body.workflow, template_id=body.template_id
    )
    return instance.to_dict()


@router.get("/instances/{instance_id}")
async def graph_instance(instance_id: uuid.UUID) -> dict[str, Any]:
    """An instance with its active branches."""
    return (await _runtime().instance(instance_id)).to_dict()


@router.get("/instances/{instance_id}/transitions")
async def available_transitions(
    instance_id: uuid.UUID, user: Annotated[str, Query(min_length=1, max_length=200)]
) -> dict[str, Any]:
    """The transitions `user` may take now, per active branch, in the picker's order."""
    found = await _runtime().transitions_for(instance_id, user)
    return {"transitions": [choice.to_dict() for choice in found]}


@router.post("/instances/{instance_id}/transitions")
async def transition(instance_id: uuid.UUID, body: TransitionRequest) -> dict[str, Any]:
    """Move a branch (or vote toward a move, under a threshold)."""
    outcome = await _runtime().transition_branch(
        instance_id,
        body.branch_id,
        body.target_node_id,
        body.user,
        body.comment,
        source_node_id=body.source_node_id,
    )
    return outcome.to_dict()


@router.post("/instances/{instance_id}/cancel")
async def cancel_instance(instance_id: uuid.UUID, body: CancelRequest) -> dict[str, Any]:
    """Cancel an active instance."""
    return (await _runtime().cancel(instance_id, body.user, body.reason)).to_dict()


@router.get("/instances/{instance_id}/history")
async def instance_history(instance_id: uuid.UUID) -> dict[str, Any]:
    """The instance's audit trail, in the order it happened."""
    entries = await _runtime().history(instance_id)
    return {"history": [entry.to_dict() for entry in entries]}
