"""The instance lock a move takes first, and the reads of its live branches.

A move locks the instance and its branch and reads the live branches in one
statement; the instance row's version tells when that read is stale (the
lock waited for another writer), and the branches are read again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import BindParameter, Select, Uuid, and_, bindparam, literal_column, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.errors import NotFoundError, StateWorkflowError, WorkflowAlreadyCompletedError
from engine.graphs.moves.states import BRANCH_COLUMNS, BranchState, InstanceState
from engine.graphs.tables import ACTIVE, GraphTables


@lru_cache(maxsize=64)
def lock_branch_statement(tables: GraphTables) -> Select[Any]:
    """The instance and one of its branches, locked (:instance_id, :branch_id), with its live
    branches as this statement's snapshot had them, one row each.

    `locked_version` is the locked instance row's version (its xmin) and
    `seen_version` the one the snapshot saw: they differ exactly when a
    writer committed after the snapshot was taken (this statement waited for
    it), and every writer of an instance's branches and visits updates its
    row, so equal versions mean the live branches read here are current.
    """
    instances, branches, visits = (
        tables.table("instance"),
        tables.table("branch"),
        tables.table("visit"),
    )
    locked = instances.join(
        branches,
        and_(branches.c.id == _param("branch_id"), branches.c.instance_id == instances.c.id),
    )
    other = branches.alias("live_branch")
    current = and_(visits.c.branch_id == other.c.id, visits.c.is_current)
    live = (
        select(
            *(other.c[name].label(f"live_{name}") for name in BRANCH_COLUMNS),
            visits.c.id.label("live_visit_id"),
        )
        .select_from(other.outerjoin(visits, current))
        .where(other.c.instance_id == instances.c.id, other.c.status == ACTIVE)
        .lateral("live")
    )
    templates = tables.table("template")
    # Whether the instance's pinned version is the active one (notifications fall back to
    # the active version's assignment templates only when it is not).
    version_active = (
        select(templates.c.is_active).where(templates.c.id == instances.c.template_id)
    ).scalar_subquery()
    seen = instances.alias("seen")
    seen_version = (
        select(literal_column("seen.xmin::text")).where(seen.c.id == instances.c.id)
    ).scalar_subquery()
    return (
        select(
            instances,
            branches.c.status.label("branch_status"),
            branches.c.current_node_id.label("branch_node_id"),
            literal_column(f"{instances.name}.xmin::text").label("locked_version"),
            seen_version.label("seen_version"),
            version_active.label("version_active"),
            live,
        )
        .select_from(locked.outerjoin(live, true()))
        .where(instances.c.id == _param("instance_id"))
        .with_for_update(key_share=True, of=[instances, branches])
    )


@lru_cache(maxsize=64)
def lock_instance_statement(tables: GraphTables) -> Select[Any]:
    """The instance, locked (:instance_id)."""
    instances = tables.table("instance")
    return (
        select(instances)
        .where(instances.c.id == _param("instance_id"))
        .with_for_update(key_share=True)
    )


@lru_cache(maxsize=64)
def live_branches_statement(tables: GraphTables) -> Select[Any]:
    """The active branches of :instance_id, oldest first, each with its current visit."""
    branches, visits = tables.table("branch"), tables.table("visit")
    current = and_(visits.c.branch_id == branches.c.id, visits.c.is_current)
    return (
        select(branches, visits.c.id.label("visit_id"))
        .select_from(branches.outerjoin(visits, current))
        .where(branches.c.instance_id == _param("instance_id"), branches.c.status == ACTIVE)
        .order_by(branches.c.started_at, branches.c.number)
    )


@lru_cache(maxsize=64)
def branch_statement(tables: GraphTables) -> Select[Any]:
    """One branch by id (:branch_id), whatever its status."""
    branches = tables.table("branch")
    return select(branches).where(branches.c.id == _param("branch_id"))


@dataclass(frozen=True)
class Locked:
    """An instance and one of its branches, locked, with the instance's live branches."""

    instance: InstanceState
    branch_status: str
    branch_node_id: uuid.UUID | None
    live: list[BranchState]
    version_active: bool  # the instance's pinned version is the active one


async def lock_branch(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID, branch_id: uuid.UUID
) -> Locked:
    """Lock an active instance and its branch, and read its live branches as they now are.

    One statement when nobody wrote the instance while it waited for the lock
    (a second reads the live branches otherwise). NotFoundError: no such
    instance; WorkflowAlreadyCompletedError: it is not active;
    StateWorkflowError: the branch is not one of its branches.
    """
    params = {"instance_id": instance_id, "branch_id": branch_id}
    rows = (await conn.execute(lock_branch_statement(tables), params)).mappings().all()
    if not rows:
        instance = await lock_instance(conn, tables, instance_id)
        raise StateWorkflowError(f"Branch {branch_id} is not a branch of instance {instance.id}.")
    first = rows[0]
    instance = InstanceState.of(first)
    refuse_inactive(instance)
    if first["locked_version"] == first["seen_version"]:
        live = [BranchState.of(row, "live_") for row in rows if row["live_id"] is not None]
    else:  # a writer committed while this waited: read again, after the lock
        live = await live_branches(conn, tables, instance.id)
    return Locked(
        instance, first["branch_status"], first["branch_node_id"], live, first["version_active"]
    )


async def lock_instance(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> InstanceState:
    """Lock an instance (NotFoundError if there is none); it may be active or not."""
    row = (
        (await conn.execute(lock_instance_statement(tables), {"instance_id": instance_id}))
        .mappings()
        .first()
    )
    if row is None:
        raise NotFoundError(f"No graph workflow instance has the id {instance_id}.")
    return InstanceState.of(row)


def refuse_inactive(instance: InstanceState) -> None:
    """WorkflowAlreadyCompletedError unless the instance is still active."""
    if instance.state_status != ACTIVE:
        raise WorkflowAlreadyCompletedError(
            f"Workflow instance {instance.id} is {instance.state_status}: it takes no more "
            "transitions."
        )


async def live_branches(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> list[BranchState]:
    """The active branches of an instance (read after its lock), oldest first."""
    result = await conn.execute(live_branches_statement(tables), {"instance_id": instance_id})
    return [BranchState.of(row) for row in result.mappings()]


@lru_cache(maxsize=64)
def instance_branches_statement(tables: GraphTables) -> Select[Any]:
    """Every branch of :instance_id, whatever its status."""
    branches = tables.table("branch")
    return select(branches).where(branches.c.instance_id == _param("instance_id"))


async def instance_branches(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> list[BranchState]:
    """Every branch of an instance (a join walks the parents of nested forks)."""
    params = {"instance_id": instance_id}
    result = await conn.execute(instance_branches_statement(tables), params)
    return [BranchState.of(row) for row in result.mappings()]


async def read_branch(
    conn: AsyncConnection, tables: GraphTables, branch_id: uuid.UUID
) -> BranchState | None:
    """One branch, whatever its status (a join reads the parent its fork completed)."""
    row = (
        (await conn.execute(branch_statement(tables), {"branch_id": branch_id})).mappings().first()
    )
    return None if row is None else BranchState.of(row)


def _param(name: str) -> BindParameter[uuid.UUID]:
    return bindparam(name, type_=Uuid())
