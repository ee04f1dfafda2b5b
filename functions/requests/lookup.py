"""Finding what a request names: a workflow, one that takes writes, a step, the outbox's tables.

A workflow is found by `engine.views.runs.find_workflow`, the one finder the
CLI uses too; a run's key is spelled by `key_text`, as URLs and replies
spell it. The outbox is a workflow table of its own: it takes events, not
starts or deliveries, and its event tables are found here for every door.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    EventRegistry,
    EventSettings,
    EventTables,
    NotFoundError,
    OutboxColumns,
    Step,
    WorkflowConnection,
    WorkflowInfo,
    find_workflow,
    get_event_registry,
    key_text,
    outbox_tables_of,
)
from functions.requests.errors import InputError, from_validation

__all__ = [
    "MAX_TEXT",
    "database_registry",
    "event_tables",
    "find_step",
    "find_workflow",
    "find_writable",
    "is_engine_table",
    "is_outbox",
    "key_text",
]

MAX_TEXT = 1000  # characters of a step's name, an event's type, name or source
StepName = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
STEP_NAME: TypeAdapter[str] = TypeAdapter(StepName)
NO_OUTBOX = (
    "This database has no outbox table: map WorkflowOutbox, WorkflowEventRecord and "
    "WorkflowDeliveryAttempt on your base and create their tables."
)


def is_outbox(info: WorkflowInfo) -> bool:
    """Whether `info` is the outbox's table (its rows are events, not runs)."""
    return issubclass(info.cls, OutboxColumns)


def is_engine_table(info: WorkflowInfo) -> bool:
    """Whether `info` is a table of the engine's own (the outbox, graph deadlines, durable
    executions) rather than one of the app's workflows."""
    return is_outbox(info) or info.engine_owned


def find_writable(connection: WorkflowConnection, name: str) -> WorkflowInfo:
    """The workflow `name`, if runs of it may be started and addressed: not a table of the
    engine's own (the outbox, graph deadlines, durable executions), which NotFoundError."""
    info = find_workflow(connection, name)
    if is_outbox(info):
        raise NotFoundError(f"{info.name} is the outbox: publish events with POST /events instead.")
    if info.engine_owned:
        raise NotFoundError(
            f"{info.name} is a table of the engine's own: its rows are moved through their own "
            "API (graph instances, executions), never started or addressed as runs."
        )
    return info


def find_step(info: WorkflowInfo, name: Any) -> Step[Any, Any]:
    """The step `name` of `info`; an InputError for a name no step could have."""
    try:
        checked = STEP_NAME.validate_python(name, strict=True)
    except ValidationError as exc:
        raise from_validation(exc, "step") from None
    found = info.steps.get(checked)
    if found is None:
        steps = ", ".join(info.steps) or "none"
        raise NotFoundError(f"Workflow {info.name} has no step {checked!r}; its steps: {steps}.")
    return found


def find_entry_step(info: WorkflowInfo, name: Any) -> Step[Any, Any]:
    """The step `name` of `info` when a run may be started at it from outside (an entry
    step, or any when `info` declares none); an InputError at `step` naming those it may."""
    found = find_step(info, name)
    if not info.starts_at(found):
        raise InputError.at(
            ("step",),
            f"{found.name} is not an entry step of {info.name}: a run starts at "
            f"{' or '.join(info.entry_steps)}.",
        )
    return found


def event_tables(workflows: Iterable[WorkflowInfo]) -> EventTables:
    """The outbox's event tables among `workflows`; NotFoundError when there is no outbox."""
    try:
        tables = outbox_tables_of(info.cls for info in workflows)
    except ConfigurationError as exc:  # the outbox is there, its record or delivery class not
        raise NotFoundError(str(exc)) from None
    if tables is None:
        raise NotFoundError(NO_OUTBOX)
    return tables


def database_registry(
    tables: EventTables, configured: EventRegistry | None = None
) -> DatabaseEventRegistry:
    """The configured DatabaseEventRegistry (`configured`, else the process's), else one
    for `tables`.

    Used to publish and replay, neither of which reads a setting, so the
    environment's are not parsed for it.
    """
    registry = configured if configured is not None else get_event_registry()
    if isinstance(registry, DatabaseEventRegistry):
        return registry
    return DatabaseEventRegistry(outbox=tables.outbox, settings=EventSettings())
