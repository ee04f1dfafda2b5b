"""The Workflow mixin: an ordinary SQLAlchemy table whose rows are runs.

The mixin adds the twelve engine columns as ordinary mapped columns (so
Alembic sees them) and the methods a row needs to start itself, address its
runs and read its history. Mapping a workflow registers it, its steps and
the partial indexes its claims use (`engine.model.registry`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Self, TypeVar

from sqlalchemy import JSON, ColumnElement, DateTime, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from engine.model.attempt_log import AttemptLog
from engine.model.limits import Limit
from engine.model.registry import register_workflow, workflow_info
from engine.model.steps import Call, Step
from engine.runs.fanout import children_of
from engine.runs.handles import Handle
from engine.runs.history import read_history
from engine.runs.keys import RunKey
from engine.runs.start import start_run

W = TypeVar("W")

STEP_NAME_LENGTH = 200
JSON_TYPE = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class WorkflowMethods:
    """What every workflow row can do; the columns come from `Workflow`."""

    __workflow_abstract__: ClassVar[bool] = True
    __workflow_limit__: ClassVar[Limit | None] = None
    # False: this workflow's attempts are not written to the attempt log (a workflow that
    # keeps its own record of what its steps did, as the outbox keeps delivery attempts).
    __workflow_attempt_log__: ClassVar[bool] = True

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # Declarative bases map the class before this runs; unmapped mixins are skipped.
        if "__mapper__" in cls.__dict__:
            register_workflow(cls)

    @classmethod
    def by(cls, *where: ColumnElement[bool]) -> Handle[Self]:
        """The runs of this workflow matching `where`, to run, cancel or read."""
        return Handle(cls, where)

    @classmethod
    def by_key(cls, *values: Any) -> Handle[Self]:
        """The one run whose primary key holds `values` (or a door's parsed `RunKey`), to
        deliver to, run, cancel or read; its delivery reuses a statement built once."""
        if len(values) == 1 and isinstance(values[0], RunKey):
            return Handle(cls, (), values[0])
        return Handle(cls, (), RunKey(workflow_info(cls).name, values))

    def children(self, model: type[W]) -> Handle[W]:
        """The runs of `model` this run fanned out, to read (or run, or cancel)."""
        info = workflow_info(type(self))
        key = tuple(info.mapper.primary_key_from_instance(self))
        return Handle(model, [children_of(info, key, model)])

    async def start(self, target: Step[Self, []] | Call[Self]) -> bool:
        """Insert this row and run `target` on it; False when a unique key already had a run."""
        return await start_run(self, target)

    async def history(self) -> list[AttemptLog]:
        """Every attempt this run has made, oldest first (needs a mapped AttemptLog)."""
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
