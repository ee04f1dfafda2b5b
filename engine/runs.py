"""Starting runs: insert the row and its first step in one transaction, or nothing.

A row that hits a unique constraint is not inserted (`ON CONFLICT DO NOTHING`),
so a key never starts two runs; the insert and its NOTIFY commit together.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from sqlalchemy.dialects.postgresql import insert

from engine.clock import db_now
from engine.connection import current_connection
from engine.errors import DulyError
from engine.notify import notify
from engine.rows import refresh_row
from engine.steps import Call, Step, as_call, check_owner
from engine.workflow import ENGINE_COLUMNS, workflow_info


async def start_run(row: Any, target: Step[Any, Any] | Call[Any]) -> bool:
    """Insert `row` with `target` due now; False (and nothing written) on a unique conflict."""
    info = workflow_info(type(row))
    call = as_call(target)
    check_owner(call, info.cls)
    state = inspect(row)
    if not state.transient:
        raise DulyError(
            f"This {info.cls.__name__} row is already in the database: start() inserts a new "
            "row; address an existing run with a handle instead."
        )
    values: dict[Any, Any] = {
        prop.columns[0]: state.dict[prop.key]
        for prop in info.mapper.column_attrs
        if prop.key in state.dict and prop.key not in ENGINE_COLUMNS
    }
    table = info.table
    statement = (
        insert(table)
        .values(values)
        .values(
            next_step=call.step.name,
            next_args=call.encoded,
            wake_at=db_now(),
            attempts=0,
            wf_version=0,
        )
        .on_conflict_do_nothing()
        .returning(*table.c)
    )
    connection = current_connection()
    async with connection.engine.begin() as conn:
        inserted = (await conn.execute(statement)).first()
        if inserted is None:
            return False
        await conn.execute(notify(table.name))
    refresh_row(info, row, inserted._mapping)
    from sqlalchemy.orm import make_transient_to_detached

    make_transient_to_detached(row)
    connection.kick(table.name)
    return True
