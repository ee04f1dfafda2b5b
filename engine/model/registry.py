"""The registry of mapped workflow classes: what the engine knows of each table.

Mapping a class with the `Workflow` mixin registers it here, with its steps,
the names a row may call each by (its own and its `aliases`, from before a
rename), its limit and the partial indexes its claims use. Every other module looks
workflows up here; none of them needs the mixin itself, which is why this
registry is a module of its own below everything that claims, commits or
addresses runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Index, Table
from sqlalchemy.orm import Mapper, class_mapper

from engine.base.errors import ConfigurationError, NotAWorkflowError
from engine.base.owned_tables import declare_owned_tables
from engine.model.due import scheduled
from engine.model.limits import Limit, check_limit
from engine.model.steps import Step

ENGINE_COLUMNS = (
    "next_step",
    "next_args",
    "wake_at",
    "attempts",
    "last_error",
    "claimed_until",
    "waiting_for",
    "pending_event",
    "recent_event_keys",
    "parent",
    "children_left",
    "wf_version",
)
INDEX_NAME_LENGTH = 63  # PostgreSQL truncates longer identifiers


class EngineOwned:
    """The mark of a mixin whose rows are the engine's own due work (the outbox, graph
    deadlines, durable executions): reached through their own API, never started or
    addressed as runs by a caller."""


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per mapped class
class WorkflowInfo:
    """What the engine needs to know about one mapped workflow class."""

    cls: type[Any]
    table: Table
    mapper: Mapper[Any]
    steps: dict[str, Step[Any, Any]]
    # Every name a row's next_step may carry, each step's own and its aliases: one lookup.
    named: dict[str, Step[Any, Any]]
    limit: Limit | None = None  # from the class's __workflow_limit__
    logged: bool = True  # from __workflow_attempt_log__: whether its attempts are logged

    @property
    def name(self) -> str:
        """The table name, which is how runs and notifications name a workflow."""
        return self.table.name

    @property
    def engine_owned(self) -> bool:
        """Whether its rows are the engine's own (an `EngineOwned` mixin's), not callers' runs."""
        return issubclass(self.cls, EngineOwned)

    @property
    def entry_steps(self) -> tuple[str, ...]:
        """The steps declared `@step(entry=True)`; empty when none is, and all may start runs."""
        return tuple(name for name, found in self.steps.items() if found.entry)

    def starts_at(self, step: Step[Any, Any]) -> bool:
        """Whether a door may start a run at `step`: an entry step, or any when none is declared."""
        return step.entry or not self.entry_steps

    def resolve(self, name: str | None) -> Step[Any, Any] | None:
        """The step a row naming `name` runs (by its name or an alias), or None if none has it."""
        return self.named.get(name) if name is not None else None


_registry: dict[type[Any], WorkflowInfo] = {}


def registered_workflows() -> list[WorkflowInfo]:
    """Every workflow class mapped in this process, in the order they were mapped."""
    return list(_registry.values())


def workflow_info(cls: type[Any]) -> WorkflowInfo:
    """The engine's record of a mapped workflow class."""
    try:
        return _registry[cls]
    except KeyError:
        raise NotAWorkflowError(f"{cls.__name__} is not a mapped workflow.") from None


def register_workflow(cls: type[Any]) -> WorkflowInfo:
    """Record a newly mapped workflow class, its steps and limit, and declare its indexes."""
    mapper = class_mapper(cls)
    table = mapper.local_table
    if not isinstance(table, Table):
        raise NotAWorkflowError(f"Workflow {cls.__name__} must be mapped to a table.")
    steps: dict[str, Step[Any, Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Step):
                steps[name] = value
    named = _names_of(cls, steps)
    waiting = scheduled(table.c.next_step)
    # The due rows of every claim and of every "when is the next work due" question.
    _index_once(table, "due", table.c.wake_at, where=waiting)
    limit = getattr(cls, "__workflow_limit__", None)
    if limit is not None:
        limit = check_limit(limit, table, cls.__name__)
        column = table.c[limit.by]
        # Which groups have work scheduled, and since when: one probe per group.
        _index_once(table, f"due_by_{limit.by}", column, table.c.wake_at, where=waiting)
        # How many of a group are running: only leased rows are in it.
        leased = table.c.claimed_until.isnot(None)
        _index_once(table, f"running_by_{limit.by}", column, where=leased)
    declare_owned_tables(table.metadata)
    logged = bool(getattr(cls, "__workflow_attempt_log__", True))
    info = WorkflowInfo(
        cls=cls,
        table=table,
        mapper=mapper,
        steps=steps,
        named=named,
        limit=limit,
        logged=logged,
    )
    _registry[cls] = info
    return info


def _names_of(cls: type[Any], steps: dict[str, Step[Any, Any]]) -> dict[str, Step[Any, Any]]:
    """Each step by its name and by its aliases; an alias another name already holds is refused."""
    named: dict[str, Step[Any, Any]] = dict(steps)
    for step in steps.values():
        for alias in step.aliases:
            holder = named.get(alias)
            if holder is None:
                named[alias] = step
                continue
            if holder is step:
                why = "that is its own name"
            elif alias in steps:
                why = f"step {cls.__name__}.{holder.name} has that name"
            else:
                why = f"it is already an alias of {cls.__name__}.{holder.name}"
            raise ConfigurationError(
                f"Step {cls.__name__}.{step.name} cannot take the alias {alias!r}: {why}, so a "
                "row naming it could not say which step to run."
            )
    return named


def _index_once(table: Table, suffix: str, *columns: Any, where: Any) -> None:
    """Declare the partial index `ix_<table>_<suffix>` on `table`, unless it already has it."""
    name = f"ix_{table.name}_{suffix}"[:INDEX_NAME_LENGTH]
    if name not in {index.name for index in table.indexes}:
        Index(name, *columns, postgresql_where=where)
