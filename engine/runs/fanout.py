"""Fan-out: a step that splits its run into many, and the parent that waits for them all.

`fan_out(children, then=step)` starts the children inside the parent's own
commit, so a parent whose row was taken over mid-step starts none; a child
that hits a unique constraint is not started and not counted. The parent
holds nothing open meanwhile: `children_left` counts the children still
going, and the commit that finishes the last of them (success, giving up, or
`cancel()`) makes the parent's `then` step due.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import and_, bindparam, case, cast, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.errors import NotFoundError, StepError
from engine.base.notify import notify
from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo, registered_workflows, workflow_info
from engine.model.rows import key_arguments, key_clause, key_parameters
from engine.model.steps import Call, Step, as_call, check_owner
from engine.runs.start import insert_run, run_values


@dataclass(frozen=True)
class Child:
    """A run to start as part of a fan-out: a new row and its first step."""

    row: Any
    call: Call[Any]


@dataclass(frozen=True)
class FanOut:
    """Start `children`, then run `then` once the last of them has finished."""

    children: tuple[Child, ...]
    then: Call[Any]


def child(row: Any, target: Step[Any, Any] | Call[Any]) -> Child:
    """A child run: `row` (a new, unsaved row of a workflow) started with `target`."""
    call = as_call(target)
    check_owner(call, type(row))
    return Child(row, call)


def fan_out(children: Iterable[Child], then: Step[Any, Any] | Call[Any]) -> FanOut:
    """Split the run into `children`; `then` runs once after all of them finish."""
    collected = tuple(children)
    for item in collected:
        if not isinstance(item, Child):
            raise StepError(f"fan_out() takes child(row, step) items, not {item!r}.")
    return FanOut(collected, as_call(then))


def parent_reference(info: WorkflowInfo, key: tuple[Any, ...]) -> dict[str, Any]:
    """How a child names its parent run in its `parent` column."""
    return {"table": info.name, "key": json.loads(json.dumps(list(key), default=str))}


def parent_info(reference: dict[str, Any], near: WorkflowInfo) -> WorkflowInfo:
    """The workflow a parent reference points at, preferring one on the child's own base."""
    candidates = [i for i in registered_workflows() if i.name == reference["table"]]
    if not candidates:
        raise NotFoundError(f"No mapped workflow has table {reference['table']!r}.")
    same_base = [i for i in candidates if i.table.metadata is near.table.metadata]
    return (same_base or candidates)[-1]


def children_of(info: WorkflowInfo, key: tuple[Any, ...], model: type[Any]) -> Any:
    """WHERE clause for the runs of `model` that this run fanned out."""
    column = workflow_info(model).table.c.parent
    reference = bindparam(None, parent_reference(info, key), type_=JSONB)
    return cast(column, JSONB) == cast(reference, JSONB)


async def start_children(
    conn: AsyncConnection, fan: FanOut, parent: WorkflowInfo, key: tuple[Any, ...]
) -> int:
    """Insert the children in the caller's transaction; how many were started.

    Children of one table given the same columns go in one multi-row INSERT
    (SQLAlchemy batches the rows into VALUES lists), and each table that got
    a child is announced once, at the commit.
    """
    reference = parent_reference(parent, key)
    batches: dict[tuple[WorkflowInfo, tuple[str, ...]], list[dict[str, Any]]] = {}
    for item in fan.children:
        info = workflow_info(type(item.row))
        given, params = run_values(info, item.row, item.call, parent=reference)
        batches.setdefault((info, given), []).append(params)
    started = 0
    announced: set[str] = set()
    for (info, given), rows in batches.items():
        inserted = len((await conn.execute(children_statement(info, given), rows)).all())
        started += inserted
        if inserted and info.name not in announced:
            announced.add(info.name)
            await conn.execute(notify(info.name))
    return started


@lru_cache(maxsize=256)
def children_statement(info: WorkflowInfo, given: tuple[str, ...]) -> Executable:
    """Children of one table inserted, due now; RETURNING counts those not skipped."""
    return insert_run(info, given).returning(*info.mapper.primary_key)


async def count_children(
    conn: AsyncConnection, parent: WorkflowInfo, key: tuple[Any, ...], started: int
) -> None:
    """Set the parent's count of children; with none started, its `then` is due now."""
    statement = count_statement(parent)
    params = key_arguments(key) | {"started": started}
    await conn.execute(statement, params)
    if started == 0:
        await conn.execute(notify(parent.name))


async def children_finished(
    conn: AsyncConnection, references: Iterable[dict[str, Any]], near: WorkflowInfo
) -> None:
    """Count down the parents of children that just finished, one UPDATE per parent.

    The last child of a parent makes its `then` due, and announces it.
    """
    counts = Counter(json.dumps(reference, sort_keys=True) for reference in references)
    for text, finished in counts.items():
        reference = json.loads(text)
        parent = parent_info(reference, near)
        params = key_arguments(reference["key"])
        params["finished"] = finished
        row = (await conn.execute(finished_statement(parent), params)).first()
        if row is not None and row.children_left == 0:
            await conn.execute(notify(parent.name))


@lru_cache(maxsize=256)
def count_statement(info: WorkflowInfo) -> Executable:
    """The parent's count of children started; with none, its `then` is due now."""
    table = info.table
    started = bindparam("started", type_=table.c.children_left.type)
    return (
        update(table)
        .where(key_clause(info, key_parameters(info)))
        .values(
            children_left=started,
            wake_at=case((started == 0, db_now()), else_=None),
        )
    )


@lru_cache(maxsize=256)
def finished_statement(info: WorkflowInfo) -> Executable:
    """A parent's count of children going, less those that just finished; at 0, `then` is due."""
    table = info.table
    left = table.c.children_left - bindparam("finished", type_=table.c.children_left.type)
    return (
        update(table)
        .where(key_clause(info, key_parameters(info)), table.c.children_left > 0)
        .values(
            children_left=left,
            # The last child makes `then` due, if the parent still has it scheduled.
            wake_at=case(
                (and_(left <= 0, scheduled(table.c.next_step)), db_now()),
                else_=table.c.wake_at,
            ),
        )
        .returning(table.c.children_left)
    )
