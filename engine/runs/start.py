"""Starting runs: insert the row and its first step in one transaction, or nothing.

A row that hits a unique constraint is not inserted (`ON CONFLICT DO NOTHING`),
so a key never starts two runs; the insert and its NOTIFY commit together.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, inspect, select
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.errors import DulyError
from engine.base.notify import announcement
from engine.model.connection import current_connection
from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo, workflow_info
from engine.model.rows import refresh_row
from engine.model.steps import Call, Step, as_call, check_owner


async def start_run(row: Any, target: Step[Any, Any] | Call[Any]) -> bool:
    """Insert `row` with `target` due now; False (and nothing written) on a unique conflict."""
    info = workflow_info(type(row))
    call = as_call(target)
    check_owner(call, info.cls)
    statement, params = start_statement(info, row, call)
    connection = current_connection()
    async with connection.autocommit.connect() as conn:
        inserted = (await conn.execute(statement, params)).first()
    if inserted is None:
        return False
    refresh_row(info, row, inserted._mapping)
    make_transient_to_detached(row)
    connection.kick(info.name)
    return True


def start_statement(
    info: WorkflowInfo, row: Any, call: Call[Any]
) -> tuple[Executable, dict[str, Any]]:
    """The statement that starts `row` with `call`, and its parameters."""
    given, params = run_values(info, row, call)
    return _start_statement(info, given), params


def run_values(
    info: WorkflowInfo, row: Any, call: Call[Any], parent: dict[str, Any] | None = None
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The columns `row` was given, and the parameters of the insert that starts it.

    `parent` is the reference of the run that fanned this one out, if any.
    """
    state = inspect(row)
    if not state.transient:
        raise DulyError(
            f"This {info.cls.__name__} row is already in the database: start() inserts a new "
            "row; address an existing run with a handle instead."
        )
    given = {
        prop.columns[0].name: state.dict[prop.key]
        for prop in info.mapper.column_attrs
        if prop.key in state.dict and prop.key not in ENGINE_COLUMNS
    }
    params = {f"v_{name}": value for name, value in given.items()}
    params.update(next_step=call.step.name, next_args=call.encoded, parent=parent)
    return tuple(sorted(given)), params


def insert_run(info: WorkflowInfo, given: tuple[str, ...]) -> Insert:
    """INSERT of one run with its first step due now; a row hitting any unique key is skipped."""
    table = info.table
    return (
        insert(table)
        .values({table.c[name]: bindparam(f"v_{name}", type_=table.c[name].type) for name in given})
        .values(
            next_step=bindparam("next_step", type_=table.c.next_step.type),
            next_args=bindparam("next_args", type_=table.c.next_args.type),
            parent=bindparam("parent", type_=table.c.parent.type),
            wake_at=db_now(),
            attempts=0,
            wf_version=0,
        )
        # Any unique constraint: a key that already has a run starts none.
        .on_conflict_do_nothing()
    )


@lru_cache(maxsize=1024)
def _start_statement(info: WorkflowInfo, given: tuple[str, ...]) -> Executable:
    """The insert for one table and one set of given columns, built once.

    One statement on an autocommit connection: the row and the NOTIFY commit
    together, and a conflict (the CTE returns nothing) announces nothing.
    """
    started = insert_run(info, given).returning(*info.table.c).cte("started")
    announced = announcement(info.table.name).label("duly_notified")
    return select(started, announced)
