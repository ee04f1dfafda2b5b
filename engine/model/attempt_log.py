"""The attempt log: one row per step attempt, written in the same statement as its outcome.

The application maps `AttemptLog` on its own base, so its migrations carry the
table; a deployment that maps none pays nothing. It is partitioned a day a partition by
`finished_at` (in its primary key with `id`). Both commit paths write it
through `log_attempts`; only `row.history()` and the views read it. A failed
attempt also keeps its traceback and its arguments (NULL for an attempt that succeeded).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    cast,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.orm import Mapped, class_mapper, mapped_column

from engine.base.clock import db_now
from engine.base.subclasses import mapped_subclasses
from engine.partitions import partition_by_day

OUTCOMES = ("ok", "retry", "failed")
# What a step attempt records, in the order of the table's columns after `workflow`.
RECORD_FIELDS: tuple[tuple[str, Any], ...] = (
    ("run_key", Text),
    ("step", Text),
    ("attempt", Integer),
    ("outcome", Text),
    ("error", Text),
    ("took_ms", Float),
)
# What a failed attempt records too, after RECORD_FIELDS; a statement that logs only
# attempts that succeeded leaves them out (NULL), so they cost the hot path nothing.
FAILURE_FIELDS: tuple[tuple[str, Any], ...] = (
    ("traceback", Text),
    ("args", Text),  # JSON text, stored as JSON
)


def attempt_log_classes() -> list[type[Any]]:
    """Every AttemptLog class mapped in this process."""
    return mapped_subclasses(AttemptLog)


def run_key(row: object) -> str:
    """The run's primary key as the text the attempt log stores."""
    return logged_key(class_mapper(type(row)).primary_key_from_instance(row))


def logged_key(key: Sequence[Any]) -> str:
    """A primary key's values (a claim's key) as the attempt log stores them: JSON text
    (a run's key as a URL spells it is `engine.views.runs.key_text`)."""
    return json.dumps(key[0] if len(key) == 1 else list(key), default=str)


def recorded_fields(failures: bool) -> tuple[tuple[str, Any], ...]:
    """The fields a statement logs: RECORD_FIELDS, and FAILURE_FIELDS if it logs failures."""
    return (*RECORD_FIELDS, *FAILURE_FIELDS) if failures else RECORD_FIELDS


def log_attempts(
    attempt_log: type[Any], workflow: str, records: Sequence[Any], written: Any
) -> Insert:
    """INSERT one log row per row of `written` (a fenced write's RETURNING), so only what moved.

    `records` are the SQL values of RECORD_FIELDS, in order, then those of FAILURE_FIELDS
    for a statement that may log a failure.
    """
    fields = recorded_fields(len(records) > len(RECORD_FIELDS))
    values = [
        cast(value, JSON) if name == "args" else value
        for (name, _), value in zip(fields, records, strict=True)
    ]
    columns = ["workflow", *(name for name, _ in fields), "finished_at"]
    return insert(attempt_log.__table__).from_select(
        columns, select(literal(workflow), *values, db_now()).select_from(written)
    )


class AttemptLogColumns:
    """The attempt log's columns and registration, shared by both spellings."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        table = cls.__dict__.get("__table__")
        if isinstance(table, Table):
            Index(f"ix_{table.name}_run"[:63], table.c.workflow, table.c.run_key, table.c.id)
            # Retention walks the log oldest first, a batch at a time (engine.retention).
            Index(f"ix_{table.name}_finished"[:63], table.c.finished_at, table.c.id)
            # A partition a day by finished_at: pruning drops whole days (engine.partitions).
            partition_by_day(table, "finished_at")


class AttemptLog(AttemptLogColumns):
    """Map onto your own base to keep a row per step attempt."""

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow: Mapped[str] = mapped_column(String(63))
    run_key: Mapped[str] = mapped_column(Text)
    step: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    took_ms: Mapped[float] = mapped_column(Float)
    # In the primary key, as PostgreSQL wants the column a table is partitioned by.
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    # A failed attempt's (outcome retry or failed); NULL for one that succeeded.
    traceback: Mapped[str | None] = mapped_column(Text)
    args: Mapped[Any] = mapped_column(JSON(none_as_null=True), nullable=True)
