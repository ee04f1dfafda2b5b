"""The Workflow mixin: an ordinary SQLAlchemy table whose rows are runs.

The mixin adds the twelve engine columns as ordinary mapped columns (so
Alembic sees them), a partial index on each table's due rows (so a claim costs
the same with a million waiting rows as with ten), and the methods a row needs
to start itself and read its history. Mapping a workflow registers it, and its
steps, with the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from sqlalchemy import JSON, ColumnElement, DateTime, Index, Integer, String, Table, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, Mapper, mapped_column
from sqlalchemy.orm import class_mapper as _class_mapper

from engine.clock import declare_clock_table
from engine.limits import Limit, check_limit
from engine.steps import Call, Step

if TYPE_CHECKING:
    from engine.handles import Handle
    from engine.history import AttemptLog

W = TypeVar("W")

STEP_NAME_LENGTH = 200
JSON_TYPE = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

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


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per mapped class
class WorkflowInfo:
    """What the engine needs to know about one mapped workflow class."""

    cls: type[Any]
    table: Table
    mapper: Mapper[Any]
    steps: dict[str, Step[Any, Any]]
    limit: Limit | None = None  # from the class's __workflow_limit__

    @property
    def name(self) -> str:
        """The table name, which is how runs and notifications name a workflow."""
        return self.table.name


_registry: dict[type[Any], WorkflowInfo] = {}


def registered_workflows() -> list[WorkflowInfo]:
    """Every workflow class mapped in this process, in the order they were mapped."""
    return list(_registry.values())


def workflow_info(cls: type[Any]) -> WorkflowInfo:
    """The engine's record of a mapped workflow class."""
    try:
        return _registry[cls]
    except KeyError:
        raise TypeError(f"{cls.__name__} is not a mapped workflow.") from None


def _register(cls: type[Any]) -> None:
    mapper = _class_mapper(cls)
    table = mapper.local_table
    if not isinstance(table, Table):
        raise TypeError(f"Workflow {cls.__name__} must be mapped to a table.")
    steps: dict[str, Step[Any, Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Step):
                steps[name] = value
    scheduled = table.c.next_step.isnot(None)
    # The due rows of every claim and of every "when is the next work due" question.
    _index_once(table, "due", table.c.wake_at, where=scheduled)
    limit = getattr(cls, "__workflow_limit__", None)
    if limit is not None:
        limit = check_limit(limit, table, cls.__name__)
        column = table.c[limit.by]
        # Which groups have work scheduled, and since when: one probe per group.
        _index_once(table, f"due_by_{limit.by}", column, table.c.wake_at, where=scheduled)
        # How many of a group are running: only leased rows are in it.
        leased = table.c.claimed_until.isnot(None)
        _index_once(table, f"running_by_{limit.by}", column, where=leased)
    declare_clock_table(table.metadata)
    _registry[cls] = WorkflowInfo(cls=cls, table=table, mapper=mapper, steps=steps, limit=limit)


def _index_once(table: Table, suffix: str, *columns: Any, where: Any) -> None:
    """Declare the partial index `ix_<table>_<suffix>` on `table`, unless it already has it."""
    name = f"ix_{table.name}_{suffix}"[:63]
    if name not in {index.name for index in table.indexes}:
        Index(name, *columns, postgresql_where=where)


class WorkflowMethods:
    """What every workflow row can do; the columns come from `Workflow`."""

    __workflow_abstract__: ClassVar[bool] = True
    __workflow_limit__: ClassVar[Limit | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # Declarative bases map the class before this runs; unmapped mixins are skipped.
        if "__mapper__" in cls.__dict__:
            _register(cls)

    @classmethod
    def by(cls, *where: ColumnElement[bool]) -> Handle[Self]:
        """The runs of this workflow matching `where`, to run, cancel or read."""
        from engine.handles import Handle

        return Handle(cls, where)

    def children(self, model: type[W]) -> Handle[W]:
        """The runs of `model` this run fanned out, to read (or run, or cancel)."""
        from engine.fanout import children_of
        from engine.handles import Handle

        info = workflow_info(type(self))
        key = tuple(info.mapper.primary_key_from_instance(self))
        return Handle(model, [children_of(info, key, model)])

    async def start(self, target: Step[Self, []] | Call[Self]) -> bool:
        """Insert this row and run `target` on it; False when a unique key already had a run."""
        from engine.runs import start_run

        return await start_run(self, target)

    async def history(self) -> list[AttemptLog]:
        """Every attempt this run has made, oldest first (needs a mapped AttemptLog)."""
        from engine.history import read_history

        return await read_history(self)


class Workflow(WorkflowMethods):
    """Mix into a declarative model to make its rows workflow runs."""

    next_step: Mapped[str | None] = mapped_column(String(STEP_NAME_LENGTH), default=None)
    next_args: Mapped[dict[str, Any] | None] = mapped_column(JSON_TYPE, default=None)
    wake_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    waiting_for: Mapped[str | None] = mapped_column(String(STEP_NAME_LENGTH), default=None)
    pending_event: Mapped[dict[str, Any] | None] = mapped_column(JSON_TYPE, default=None)
    recent_event_keys: Mapped[list[str] | None] = mapped_column(JSON_TYPE, default=None)
    parent: Mapped[dict[str, Any] | None] = mapped_column(JSON_TYPE, default=None)
    children_left: Mapped[int | None] = mapped_column(Integer, default=None)
    wf_version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
