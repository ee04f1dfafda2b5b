"""Starting runs: insert the row and its first step in one transaction, or nothing.

A row that hits a unique constraint is not inserted (`ON CONFLICT DO NOTHING`),
so a key never starts two runs; the insert and its NOTIFY commit together.
`start_many` inserts a batch of rows a statement at a time, the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache, partial
from itertools import groupby
from typing import Any

from sqlalchemy import Row, bindparam, cast, func, inspect, literal, select, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_clock_now, db_now
from engine.base.errors import DulyError, InvalidArgumentError
from engine.base.notify import announcement, notify
from engine.model.connection import current_connection
from engine.model.effects import StepEffects, current_effects
from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo, workflow_info
from engine.model.rows import detach_inserted
from engine.model.steps import Call, Step, as_call, check_owner


async def start_run(row: Any, target: Step[Any, Any] | Call[Any]) -> bool:
    """Insert `row` with `target` due now; False (and nothing written) on a unique conflict."""
    info = workflow_info(type(row))
    call = as_call(target)
    check_owner(call, info.cls)
    statement, params = start_statement(info, row, call)
    effects = current_effects()
    if effects is not None:  # in a step body: the run starts with the step's commit, or never
        inserted = (await (await effects.connection()).execute(statement, params)).first()
        if inserted is not None:
            _due_when_committed(effects, info, [inserted])
    else:
        async with current_connection().autocommit.connect() as conn:
            inserted = (await conn.execute(statement, params)).first()
    if inserted is None:
        return False
    detach_inserted(info, row, inserted._mapping)
    _kick_when_committed(info.name)
    return True


START_BATCH = 1000  # rows one INSERT of `start_many` carries at most
RUN_START_COLUMNS = ("next_step", "next_args", "parent")  # engine columns a start gives


async def start_many(
    rows: Sequence[Any], target: Step[Any, Any] | Call[Any] | Sequence[Step[Any, Any] | Call[Any]]
) -> list[bool]:
    """Insert runs of one workflow, each with its first step due now, a batch per statement.

    `target` is one step (or call) for every row, or one per row. The answer
    says, row by row, which started: a row hitting a unique key starts none,
    as with `start()`. Each INSERT commits with its NOTIFY; workers are
    kicked once.
    """
    if not rows:
        return []
    info = workflow_info(type(rows[0]))
    if any(type(row) is not info.cls for row in rows):
        raise InvalidArgumentError(f"start_many() starts runs of one workflow: {info.name}'s.")
    if isinstance(target, Step | Call):
        calls = [as_call(target)] * len(rows)
    elif len(target) == len(rows):
        calls = [as_call(each) for each in target]
    else:
        raise InvalidArgumentError(
            f"start_many() takes one target, or one per row: {len(target)} for {len(rows)} rows."
        )
    for call in {id(call): call for call in calls}.values():
        check_owner(call, info.cls)
    values = [run_values(info, row, call) for row, call in zip(rows, calls, strict=True)]
    started = [False] * len(rows)
    # Rows given the same columns share a statement; each batch is its own transaction.
    order = sorted(range(len(rows)), key=lambda at: values[at][0])
    for given, same in groupby(order, key=lambda at: values[at][0]):
        indexes = list(same)
        for first in range(0, len(indexes), START_BATCH):
            batch = indexes[first : first + START_BATCH]
            statement, params = insert_runs(info, given, [values[at][1] for at in batch])
            inserted = await _insert_batch(info, statement, params)
            for at, values_of in _matched(info, given, [rows[at] for at in batch], inserted):
                started[batch[at]] = True
                detach_inserted(info, rows[batch[at]], values_of)
    if any(started):
        _kick_when_committed(info.name)
    return started


async def _insert_batch(info: WorkflowInfo, statement: Executable, params: Any) -> list[Row[Any]]:
    """Insert one batch of runs and its NOTIFY together: in their own transaction, or a step's."""
    effects = current_effects()
    if effects is not None:
        inserted = await _insert_announced(await effects.connection(), info, statement, params)
        _due_when_committed(effects, info, inserted)
        return inserted
    async with current_connection().engine.begin() as conn:
        return await _insert_announced(conn, info, statement, params)


async def _insert_announced(
    conn: AsyncConnection, info: WorkflowInfo, statement: Executable, params: Any
) -> list[Row[Any]]:
    inserted = list((await conn.execute(statement, params)).all())
    if inserted:
        await conn.execute(notify(info.table.name))
    return inserted


def _due_when_committed(effects: StepEffects, info: WorkflowInfo, inserted: Sequence[Any]) -> None:
    """Make runs a step started due at its commit, not when its transaction began.

    Their `wake_at` is the transaction's time, which may lie well before the commit
    makes them visible: below a busy worker's claim floor, found only by its probe.
    """
    if not inserted:
        return
    columns = info.mapper.primary_key
    keys = [tuple(row._mapping[column.name] for column in columns) for row in inserted]
    restamp = (
        update(info.table)
        .where(tuple_(*columns).in_(keys))
        .values(wake_at=db_clock_now())
        .execution_options(synchronize_session=False)
    )

    async def restamped(conn: AsyncConnection) -> None:
        await conn.execute(restamp)

    effects.before_commit(restamped)


def _kick_when_committed(workflow: str) -> None:
    """Wake this process's workers for `workflow` now, or once the step running commits."""
    kick = partial(current_connection().kick, workflow)
    effects = current_effects()
    if effects is None:
        kick()
    else:
        effects.after_commit(kick)


def insert_runs(
    info: WorkflowInfo, given: tuple[str, ...], params: Sequence[dict[str, Any]]
) -> tuple[Executable, Any]:
    """The INSERT of many runs (`run_values` parameters each), returning those it inserted,
    and its parameters.

    One array per column, `unnest`ed; a table given an array column (which
    `unnest` would flatten) takes one row's INSERT with every row's parameters,
    which SQLAlchemy sends as multi-row VALUES.
    """
    if any(isinstance(info.table.c[name].type, ARRAY) for name in given):
        return insert_run(info, given).returning(*info.table.c), list(params)
    arrays = {f"a_{name}": [row[f"v_{name}"] for row in params] for name in given}
    arrays.update({f"a_{name}": [row[name] for row in params] for name in RUN_START_COLUMNS})
    return _unnested_insert(info, given), arrays


@lru_cache(maxsize=1024)
def _unnested_insert(info: WorkflowInfo, given: tuple[str, ...]) -> Executable:
    """INSERT of many runs from one array per column (`a_{column}`: a list, an item a run).

    Its text is the same whatever the batch's size, so it is built, sent and
    planned like one row's, and the due time is read once.
    """
    table = info.table
    names = [*given, *RUN_START_COLUMNS]
    arrays = [
        cast(bindparam(f"a_{name}", type_=ARRAY(table.c[name].type)), ARRAY(table.c[name].type))
        for name in names
    ]
    rows = func.unnest(*arrays).table_valued(*names).render_derived(name="batch")
    values = select(*rows.c, db_now(), literal(0), literal(0))
    return (
        insert(table)
        .from_select([*names, "wake_at", "attempts", "wf_version"], values)
        .on_conflict_do_nothing()  # any unique key: as for one run
        .returning(*table.c)
    )


def _matched(
    info: WorkflowInfo, given: tuple[str, ...], rows: Sequence[Any], inserted: Sequence[Row[Any]]
) -> list[tuple[int, Any]]:
    """Which of `rows` each inserted row is: (its index, the inserted values).

    PostgreSQL returns the rows in the order the VALUES gave them; rows a
    unique key skipped are missing, so a row is matched to the next inserted
    one holding the values it was given.
    """
    if len(inserted) == len(rows):
        return [(at, found._mapping) for at, found in enumerate(inserted)]
    keys = {prop.columns[0].name: prop.key for prop in info.mapper.column_attrs}
    matched: list[tuple[int, Any]] = []
    pending = iter(inserted)
    found = next(pending, None)
    for at, row in enumerate(rows):
        if found is None:
            break
        state = inspect(row).dict
        if all(found._mapping[name] == state[keys[name]] for name in given):
            matched.append((at, found._mapping))
            found = next(pending, None)
    return matched


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
