"""`DurableWorkflowEngine`: executions as rows of a workflow table, run by duly's own workers.

    class Execution(Base, WorkflowExecutionRecord):
        __tablename__ = "duly_executions"

    durable = DurableWorkflowEngine()              # finds Execution through the connection
    durable.register(approval)                     # in every process that runs workers
    execution = await durable.start(approval, {"amount": 10})

An execution is a run whose step (`execute`, and `resume` after a wait) runs the handler
registered for its `workflow_id` in the worker's process and commits its outcome. Every
`WorkflowExecution` returned is a snapshot: workers may move the row on as soon as `start`
returns.
"""

from __future__ import annotations

import copy
import inspect
import json
import uuid
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import DateTime, Index, String, Table, Text, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, class_mapper, mapped_column
from sqlalchemy.sql import Executable

from engine.base.clock import DATABASE_TIME, db_now
from engine.base.errors import (
    ConfigurationError,
    InvalidWorkflowStateError,
    WorkflowExecutionError,
    WorkflowExecutionNotFoundError,
)
from engine.base.resolve import import_dotted
from engine.executions.local import RESUME_SIGNAL, WaitForResume
from engine.executions.state import (
    ACTIVE_STATES,
    WorkflowDefinition,
    WorkflowExecution,
    WorkflowState,
    require_state,
)
from engine.model.application import ambient_application, current_application
from engine.model.connection import current_connection
from engine.model.registry import EngineOwned
from engine.model.steps import step
from engine.runs.directives import WaitFor, wait_for
from engine.runs.workflow import Workflow

STATE_LENGTH = 16
STATEMENT_CACHE_SIZE = 64
STEP_RETRIES = 3
# JSON null and SQL NULL are one thing here: an output not written yet is NULL.
JSON_COLUMN = JSONB(none_as_null=True)


class WorkflowExecutionRecord(Workflow, EngineOwned):
    """Map onto your base: one row per execution, its state, and the run that moves it."""

    execution_id: Mapped[str] = mapped_column(Text, primary_key=True)
    workflow_id: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(Text, default="1")
    # Raw text: narrowed to WorkflowState when an engine returns it.
    state: Mapped[str] = mapped_column(String(STATE_LENGTH), default=WorkflowState.PENDING.value)
    input: Mapped[dict[str, Any]] = mapped_column(JSON_COLUMN, default=dict)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON_COLUMN, default=None)
    correlation_id: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # `metadata` is the declarative base's own attribute, so the column of that name maps here.
    execution_metadata: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSON_COLUMN, default=dict
    )
    # The insert's own SQL writes the database clock (a DEFAULT cannot read duly_clock);
    # the server default covers rows written by other means.
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=db_now(), server_default=func.now()
    )
    # A step that sets these commits the database's time (see engine.base.clock).
    updated_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None, info={DATABASE_TIME: True}
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None, info={DATABASE_TIME: True}
    )

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        table = cls.__dict__.get("__table__")
        if isinstance(table, Table):
            # One execution per workflow and correlation id: start()'s ON CONFLICT reuses it.
            Index(
                f"ux_{table.name}_correlation"[:63],
                table.c.workflow_id,
                table.c.correlation_id,
                unique=True,
                postgresql_where=table.c.correlation_id.isnot(None),
            )
            Index(f"ix_{table.name}_state"[:63], table.c.state, table.c.created_at)

    # Retries cover the engine's own writes failing (the database away for a moment):
    # a handler's exception is the execution's outcome, never a retry.
    @step(retries=STEP_RETRIES)
    async def execute(self) -> WaitFor | None:
        """Run the definition's handler on the execution's input."""
        return await run_handler(self, copy.deepcopy(dict(self.input or {})))

    @step(retries=STEP_RETRIES)
    async def resume(self, signal: Any = None) -> WaitFor | None:
        """Run the handler again, the resume signal in its input and metadata."""
        given = copy.deepcopy(dict(self.input or {}))
        if signal is not None:
            self.execution_metadata = {**(self.execution_metadata or {}), RESUME_SIGNAL: signal}
            given[RESUME_SIGNAL] = copy.deepcopy(signal)
        return await run_handler(self, given)


async def run_handler(row: WorkflowExecutionRecord, given: dict[str, Any]) -> WaitFor | None:
    """The body of both steps: the handler's outcome written on the row (committed by the step).

    A row that is no longer active (cancelled before its step ran) runs nothing.
    """
    if row.state not in (WorkflowState.PENDING, WorkflowState.RUNNING, WorkflowState.WAITING):
        return None
    # Written at once (not with the step's commit), so status() says running while it runs.
    async with current_connection().autocommit.connect() as conn:
        statement = running_statement(table_of(type(row)))
        running = (await conn.execute(statement, {"duly_id": row.execution_id})).first()
    row.state = WorkflowState.RUNNING.value
    if running is not None:
        row.started_at = running.started_at
    row.updated_at = _marked_now()
    definition = definition_for(type(row), row.workflow_id)
    if definition is None:
        error = (
            f"No definition of workflow {row.workflow_id!r} is registered in this worker's "
            "process: register it on a DurableWorkflowEngine in every process that runs workers."
        )
        return _finish(row, WorkflowState.FAILED, error=error)
    try:
        result: object = None if definition.handler is None else definition.handler(given)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        return _finish(row, WorkflowState.FAILED, error=f"{exc}")
    if isinstance(result, WaitForResume):
        row.state = WorkflowState.WAITING.value
        return wait_for(type(row).resume)
    output = dict(result) if isinstance(result, Mapping) else {}
    try:
        output = json.loads(json.dumps(output))
    except (TypeError, ValueError) as exc:
        return _finish(row, WorkflowState.FAILED, error=f"The handler's output is not JSON: {exc}.")
    return _finish(row, WorkflowState.COMPLETED, output=output)


def _finish(
    row: WorkflowExecutionRecord,
    state: WorkflowState,
    *,
    output: dict[str, Any] | None = None,
    error: str | None = None,
) -> WaitFor | None:
    now = _marked_now()
    row.state = state.value
    row.output = output if output is not None else {}
    row.error = error
    row.updated_at = now
    row.finished_at = now
    return None  # the run ends


def definition_for(record: type[Any], workflow_id: str) -> WorkflowDefinition | None:
    """The definition a worker runs for `workflow_id` on `record`'s rows, if one is registered
    on the current application (its engines that registered, the latest first)."""
    app = current_application()
    registering = app.durable_engines if app is not None else []
    engines = [ref() for ref in reversed(registering)]
    for engine in engines:
        if engine is not None and engine.serves(record):
            found: WorkflowDefinition | None = engine.definitions.get(workflow_id)
            if found is not None:
                return found
    return None


class DurableWorkflowEngine:
    """Executions as rows of a `WorkflowExecutionRecord` table, run by the workers."""

    def __init__(self, *, executions: type[Any] | str | None = None) -> None:
        self._executions = _record_class(executions) if executions is not None else None
        self._definitions: dict[str, WorkflowDefinition] = {}

    @property
    def definitions(self) -> Mapping[str, WorkflowDefinition]:
        """The definitions this engine's workers run, by workflow id."""
        return dict(self._definitions)

    def register(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        """Let this process's workers run `definition` (a later one for its id replaces it)."""
        self._definitions[definition.workflow_id] = definition
        registering = ambient_application().durable_engines
        registering[:] = [r for r in registering if r() not in (None, self)]
        registering.append(weakref.ref(self))
        return definition

    def serves(self, record: type[Any]) -> bool:
        """Whether this engine's executions may be rows of `record`."""
        return self._executions is None or issubclass(record, self._executions)

    def record_class(self) -> type[WorkflowExecutionRecord]:
        """The execution table's class: the one given, or the connection's."""
        if self._executions is not None:
            return self._executions
        found = [
            info.cls
            for info in current_connection().workflows
            if issubclass(info.cls, WorkflowExecutionRecord)
        ]
        if not found:
            raise ConfigurationError(
                "No execution table in the workflow database: map WorkflowExecutionRecord on "
                "your base (class Execution(Base, WorkflowExecutionRecord)) and create it."
            )
        cls: type[WorkflowExecutionRecord] = found[-1]
        return cls

    async def start(
        self,
        definition: WorkflowDefinition,
        input_data: Mapping[str, Any] | None = None,
        *,
        correlation_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WorkflowExecution:
        """Queue an execution of `definition` (pending, its `execute` step due now).

        A non-empty `correlation_id` already used for this workflow returns
        that execution, whatever its state, and ignores the new input and
        metadata. Input and metadata must be JSON.
        """
        record = self.record_class()
        given = _json_copy(dict(input_data or {}), "input")
        extra = _json_copy(dict(metadata or {}), "metadata")
        for _ in range(2):  # a second try only if the conflicting row vanished meanwhile
            row = _new_row(
                record,
                execution_id=str(uuid.uuid4()),
                workflow_id=definition.workflow_id,
                version=definition.version,
                state=WorkflowState.PENDING.value,
                input=given,
                correlation_id=correlation_id or None,
                execution_metadata=extra,
            )
            if await row.start(record.execute):
                return execution_of(_columns(row))
            existing = await self._fetch(
                correlated_statement(table_of(record)),
                {"duly_workflow": definition.workflow_id, "duly_correlation": correlation_id},
            )
            if existing is not None:
                return existing
        raise WorkflowExecutionError(
            f"Could not start workflow {definition.workflow_id!r} with correlation id "
            f"{correlation_id!r}: its execution conflicts but cannot be read."
        )

    async def status(self, execution_id: str) -> WorkflowExecution:
        """The execution as the database has it now."""
        return await self._get(self.record_class(), execution_id)

    async def resume(self, execution_id: str, signal: Any = None) -> WorkflowExecution:
        """Wake a waiting execution: its `resume` step runs the handler again with `signal`."""
        record = self.record_class()
        current = await self._get(record, execution_id)
        require_state(current, "resume", (WorkflowState.WAITING,))
        signal = _json_copy(signal, "resume signal", execution_id)
        handle = record.by(record.execution_id == execution_id)
        if not await handle.deliver(record.resume(signal)):
            after = await self._get(record, execution_id)
            require_state(after, "resume", (WorkflowState.WAITING,))
            # Still waiting in its state column, but the wait was taken: another resume's
            # signal is on its way to the handler, or a cancel is ending the run.
            raise InvalidWorkflowStateError(
                f"Cannot resume execution {execution_id}: another resume or a cancel of it is "
                "under way.",
                execution_id=execution_id,
                operation="resume",
                state=after.state.value,
                expected=(WorkflowState.WAITING.value,),
            )
        metadata = dict(current.metadata)
        if signal is not None:
            metadata[RESUME_SIGNAL] = signal
        # The step writes the same when it runs; this says running until it does.
        resumed = await self._fetch(
            resumed_statement(table_of(record)),
            {"duly_id": execution_id, "duly_metadata": metadata},
        )
        return resumed if resumed is not None else await self._get(record, execution_id)

    async def cancel(self, execution_id: str, reason: str | None = None) -> WorkflowExecution:
        """End an active execution; its `error` says why.

        The run is ended first, so a handler still running commits nothing;
        if the state cannot be written after that, calling cancel again does it.
        """
        record = self.record_class()
        current = await self._get(record, execution_id)
        require_state(current, "cancel", ACTIVE_STATES)
        await record.by(record.execution_id == execution_id).cancel()
        cancelled = await self._fetch(
            cancelled_statement(table_of(record)),
            {"duly_id": execution_id, "duly_reason": reason},
        )
        if cancelled is not None:
            return cancelled
        after = await self._get(record, execution_id)
        require_state(after, "cancel", ACTIVE_STATES)  # it finished before the run was ended
        return after

    async def _get(
        self, record: type[WorkflowExecutionRecord], execution_id: str
    ) -> WorkflowExecution:
        found = await self._fetch(read_statement(table_of(record)), {"duly_id": execution_id})
        if found is None:
            raise WorkflowExecutionNotFoundError(
                f"No workflow execution has the id {execution_id!r}.", execution_id=execution_id
            )
        return found

    async def _fetch(
        self, statement: Executable, params: dict[str, Any]
    ) -> WorkflowExecution | None:
        async with current_connection().autocommit.connect() as conn:
            row = (await conn.execute(statement, params)).first()
        return None if row is None else execution_of(row._mapping)


def execution_of(columns: Mapping[Any, Any]) -> WorkflowExecution:
    """A snapshot of an execution row (by column name), its state narrowed to WorkflowState."""
    execution_id = columns["execution_id"]
    try:
        state = WorkflowState(columns["state"])
    except ValueError:
        raise WorkflowExecutionError(
            f"Execution {execution_id} has the state {columns['state']!r}, which is not one of "
            f"{', '.join(s.value for s in WorkflowState)}.",
            execution_id=execution_id,
        ) from None
    return WorkflowExecution(
        execution_id=execution_id,
        workflow_id=columns["workflow_id"],
        state=state,
        input_data=copy.deepcopy(columns["input"] or {}),
        output_data=copy.deepcopy(columns["output"] or {}),
        correlation_id=columns["correlation_id"],
        started_at=columns["started_at"],
        updated_at=columns["updated_at"] or columns["created_at"],
        finished_at=columns["finished_at"],
        error=columns["error"],
        metadata=copy.deepcopy(columns["metadata"] or {}),
    )


def _new_row(record: type[WorkflowExecutionRecord], **values: Any) -> WorkflowExecutionRecord:
    """An instance of the application's mapped class (its base's constructor takes columns)."""
    return cast(Callable[..., WorkflowExecutionRecord], record)(**values)


def _columns(row: WorkflowExecutionRecord) -> dict[str, Any]:
    """A mapped row's values by column name (`metadata`, not `execution_metadata`)."""
    mapper = class_mapper(type(row))
    return {prop.columns[0].name: getattr(row, prop.key) for prop in mapper.column_attrs}


def table_of(record: type[Any]) -> Table:
    """The table a mapped execution class is mapped to."""
    table = getattr(record, "__table__", None)
    if not isinstance(table, Table):
        raise ConfigurationError(f"{record.__name__} is not mapped to a table.")
    return table


def _record_class(value: type[Any] | str) -> type[WorkflowExecutionRecord]:
    cls = import_dotted(value.strip()) if isinstance(value, str) else value
    if not (
        isinstance(cls, type)
        and issubclass(cls, WorkflowExecutionRecord)
        and isinstance(cls.__dict__.get("__table__"), Table)
    ):
        raise ConfigurationError(
            f"executions must be a mapped WorkflowExecutionRecord class, not {cls!r}."
        )
    return cls


def _json_copy(value: Any, what: str, execution_id: str | None = None) -> Any:
    """`value` as the database will store it; WorkflowExecutionError when it is not JSON."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise WorkflowExecutionError(
            f"The execution's {what} must be JSON: {exc}.", execution_id=execution_id
        ) from exc


def _marked_now() -> datetime:
    """A value for a DATABASE_TIME column: it marks the column set; the commit writes the
    database's time instead."""
    return datetime.now(UTC)


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def read_statement(table: Table) -> Executable:
    """The execution with the id :duly_id."""
    return select(table).where(table.c.execution_id == bindparam("duly_id", type_=Text))


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def correlated_statement(table: Table) -> Executable:
    """The execution of workflow :duly_workflow with correlation id :duly_correlation."""
    return select(table).where(
        table.c.workflow_id == bindparam("duly_workflow", type_=Text),
        table.c.correlation_id == bindparam("duly_correlation", type_=Text),
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def running_statement(table: Table) -> Executable:
    """Mark :duly_id running as its handler starts, unless it ended meanwhile."""
    return (
        update(table)
        .where(
            table.c.execution_id == bindparam("duly_id", type_=Text),
            table.c.state.in_([WorkflowState.PENDING.value, WorkflowState.WAITING.value]),
        )
        .values(
            state=WorkflowState.RUNNING.value,
            started_at=func.coalesce(table.c.started_at, db_now()),
            updated_at=db_now(),
        )
        .returning(table.c.started_at)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def resumed_statement(table: Table) -> Executable:
    """Say running, with the signal in metadata, once a resume's event is accepted.

    Only while the run's wait is taken and not armed again: a handler that
    already ran and waits again is left waiting.
    """
    return (
        update(table)
        .where(
            table.c.execution_id == bindparam("duly_id", type_=Text),
            table.c.state == WorkflowState.WAITING.value,
            table.c.waiting_for.is_(None),
        )
        .values(
            {
                table.c.state: WorkflowState.RUNNING.value,
                table.c["metadata"]: bindparam("duly_metadata", type_=JSON_COLUMN),
                table.c.updated_at: db_now(),
            }
        )
        .returning(*table.c)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def cancelled_statement(table: Table) -> Executable:
    """Record :duly_id cancelled with :duly_reason, if it is still active."""
    return (
        update(table)
        .where(
            table.c.execution_id == bindparam("duly_id", type_=Text),
            table.c.state.in_([state.value for state in ACTIVE_STATES]),
        )
        .values(
            state=WorkflowState.CANCELLED.value,
            error=bindparam("duly_reason", type_=Text),
            updated_at=db_now(),
            finished_at=db_now(),
        )
        .returning(*table.c)
    )
