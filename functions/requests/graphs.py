"""Graph workflows from outside: save, activate, submit, move and cancel, and what pages read.

`POST /graphs/...` and the console's forms take the same models and call
the same functions, over the process's `GraphRuntime`. A subject is named
by its table and its key as text. Who acts is the request's principal: a
body's `user` may name only the principal itself, unless the principal may
act for others (admin), whose moves the history records as on behalf.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from engine import (
    Actor,
    AvailableTransition,
    Design,
    DulyError,
    GraphRuntime,
    GraphTables,
    NotAllowedError,
    NotFoundError,
    SavedDesign,
    activate_template,
    key_values,
    save_design,
    subject_class,
)
from functions.identity.principal import Principal

MAX_COMMENT = 10_000  # characters of a move's comment or a cancel's reason
UserId = Annotated[str, StringConstraints(min_length=1, max_length=200)]
ACTIVE_ID = "Its template's active version (409 TEMPLATE_NOT_ACTIVE for any other)."
ACTED_FOR = "Who the action is for: absent, the caller; another user only for an admin."


def acting(principal: Principal, user: str | None = None) -> Actor:
    """Who acts when `principal` names `user` (None: itself); NotAllowedError, before
    anything is written, when it names another user and may not act for others.

    Acting as itself, the principal's groups count toward a state's groups; an
    admin acting for another user acts with that user's groups in the directory.
    The principal's roles (implied ones too) are what a template's role rule of
    who submits asks for.
    """
    roles = frozenset(role.value for role in principal.roles)
    if user is None or user == principal.id:
        return Actor(user=principal.id, groups=principal.groups, roles=roles)
    if not principal.may_act_for_others:
        raise NotAllowedError(f"{principal.shown} may not act as {user}.")
    return Actor(user=user, acted_by=principal.id, roles=roles)


class SubmitRequest(BaseModel):
    """A subject to submit: its table and key, who submits it, and which workflow."""

    model_config = ConfigDict(extra="forbid")

    subject_type: str = Field(description="The subject's table (a model mapping GraphSubject).")
    subject_key: str = Field(description="The subject's primary key, as text.")
    user: UserId | None = Field(None, description=ACTED_FOR)
    workflow: str | None = Field(None, description="The template's name (its active version).")
    template_id: uuid.UUID | None = Field(default=None, description=ACTIVE_ID)


class TransitionRequest(BaseModel):
    """A user's move of one branch to a target node (or a vote toward it)."""

    model_config = ConfigDict(extra="forbid")

    branch_id: uuid.UUID
    target_id: uuid.UUID = Field(description="The node to move to: a choice's `target_id`.")
    user: UserId | None = Field(None, description=ACTED_FOR)
    comment: Annotated[str, StringConstraints(max_length=MAX_COMMENT)] = ""
    source_node_id: uuid.UUID | None = Field(
        None, description="The state the user saw the branch on: refused if it moved since."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """The target's old name is refused naming the new one (a 422, nothing written)."""
        if isinstance(data, dict) and "target_node_id" in data:
            raise PydanticCustomError(
                "renamed_field", "target_node_id is now named target_id: send target_id."
            )
        return data


class CancelRequest(BaseModel):
    """Who cancels an instance, and why."""

    model_config = ConfigDict(extra="forbid")

    user: UserId | None = Field(None, description=ACTED_FOR)
    reason: Annotated[str, StringConstraints(max_length=MAX_COMMENT)] = ""


async def find_subject(Session: async_sessionmaker[AsyncSession], body: SubmitRequest) -> Any:
    """The subject row a submit names; NotFoundError when its table has no such row."""
    cls = subject_class(body.subject_type)
    try:
        key = key_values(cls, body.subject_key)
    except (ValueError, TypeError):
        raise DulyError(f"{body.subject_key!r} is not a key of {body.subject_type}.") from None
    async with Session() as session:
        subject = await session.get(cls, key)
    if subject is None:
        raise NotFoundError(f"No {body.subject_type} row has the key {body.subject_key!r}.")
    return subject


# -- the writes, as the API and the console make them ---------------------------------------


async def submit_subject(
    runtime: GraphRuntime,
    Session: async_sessionmaker[AsyncSession],
    body: SubmitRequest,
    principal: Principal,
) -> dict[str, Any]:
    """Submit the subject `body` names to a workflow, as `principal`: its instance, started."""
    actor = acting(principal, body.user)
    subject = await find_subject(Session, body)
    instance = await runtime.submit(
        subject, actor, template_name=body.workflow, template_id=body.template_id
    )
    return instance.to_dict()


async def save_version(runtime: GraphRuntime, design: Design) -> SavedDesign:
    """Save the designer's graph as a new inactive version of its name (its problems with it)."""
    async with runtime.engine.begin() as conn:
        return await save_design(conn, runtime.tables, design, runtime.conditions.names())


async def activate_version(runtime: GraphRuntime, template_id: uuid.UUID) -> dict[str, Any]:
    """Make this version the one new instances start on; refused while it is invalid."""
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


async def take_transition(
    runtime: GraphRuntime, instance_id: uuid.UUID, body: TransitionRequest, principal: Principal
) -> dict[str, Any]:
    """Move a branch (or vote toward a move, under a threshold), as `principal`."""
    outcome = await runtime.transition_branch(
        instance_id,
        body.branch_id,
        body.target_id,
        acting(principal, body.user),
        body.comment,
        source_node_id=body.source_node_id,
    )
    return outcome.to_dict()


async def cancel_instance(
    runtime: GraphRuntime, instance_id: uuid.UUID, body: CancelRequest, principal: Principal
) -> dict[str, Any]:
    """Cancel an active instance, as `principal`."""
    actor = acting(principal, body.user)
    return (await runtime.cancel(instance_id, actor, body.reason)).to_dict()


async def offered_transitions(
    runtime: GraphRuntime, instance_id: uuid.UUID, principal: Principal, user: str | None = None
) -> list[AvailableTransition]:
    """The moves `user` (None: the principal) may make now; another user only for an admin."""
    return await runtime.transitions_for(instance_id, acting(principal, user))


# -- what the console's pages read beside the runtime ---------------------------------------


async def recent_instances(
    conn: AsyncConnection, tables: GraphTables, limit: int
) -> list[dict[str, Any]]:
    """The newest `limit` instances with their template's name and version."""
    instances, versions = tables.table("instance"), tables.table("template")
    rows = await conn.execute(
        select(
            instances.c.id,
            instances.c.subject_type,
            instances.c.subject_key,
            instances.c.state_status,
            instances.c.state_code,
            instances.c.submitted_by,
            instances.c.submitted_at,
            versions.c.name,
            versions.c.version,
        )
        .join(versions, versions.c.id == instances.c.template_id)
        .order_by(instances.c.submitted_at.desc(), instances.c.id)
        .limit(limit)
    )
    return [dict(row._mapping) for row in rows]


async def stored_layout(
    conn: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> dict[str, Any]:
    """The designer JSON saved with a version: drawn as it is only while it matches."""
    versions = tables.table("template")
    design = (
        await conn.execute(select(versions.c.design).where(versions.c.id == template_id))
    ).scalar_one_or_none()
    return dict(design or {})


async def visited_states(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> dict[uuid.UUID, uuid.UUID]:
    """Each visit of the instance and the state it entered (visit id to node id)."""
    visits = tables.table("visit")
    rows = await conn.execute(
        select(visits.c.id, visits.c.node_id).where(visits.c.instance_id == instance_id)
    )
    return {row.id: row.node_id for row in rows}
