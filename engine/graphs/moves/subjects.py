"""Subjects: rows of the application's own tables that graph workflows run on.

A subject maps the `GraphSubject` mixin (its state column follows the graph);
an instance names it by table and primary key (as text).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sqlalchemy import Text, inspect
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.orm.attributes import set_committed_value

from engine.base.errors import ConfigurationError, NotFoundError
from engine.base.subclasses import mapped_subclasses


class GraphSubject:
    """Map onto your base: a row that graph workflows run on, its state column kept in sync."""

    # The column that mirrors the instance's state code; rename it with this attribute.
    __graph_state_column__: ClassVar[str] = "workflow_state"
    # The column naming the user who owns the row (None: it has no owner): who may submit it
    # where the template says owner, and who may not approve it where it forbids self-approval.
    __graph_owner_column__: ClassVar[str | None] = None

    workflow_state: Mapped[str | None] = mapped_column(Text, default=None)


def subject_class(subject_type: str) -> type[Any]:
    """The subject class mapped on table `subject_type`."""
    found = _subjects().get(subject_type)
    if found is None:
        raise NotFoundError(
            f"No graph subject is mapped on the table {subject_type!r}: map GraphSubject "
            "on the model (class Expense(Base, GraphSubject): ...)."
        )
    return found


def subject_types() -> list[str]:
    """The tables of every subject class mapped in this process."""
    return sorted(_subjects())


def _subjects() -> dict[str, type[Any]]:
    """The subject classes mapped in this process by table (the latest mapped wins)."""
    return {cls.__table__.name: cls for cls in mapped_subclasses(GraphSubject)}


def state_column(cls: type[Any]) -> str:
    """The name of the column a subject class keeps its state code in."""
    name: str = getattr(cls, "__graph_state_column__", "workflow_state")
    if name not in cls.__table__.c:
        raise ConfigurationError(
            f"{cls.__name__}.__graph_state_column__ names {name!r}, which is not a column."
        )
    return name


def subject_ref(row: Any) -> tuple[str, str]:
    """(table, key) naming a subject row: a one-column key as text, a composite as JSON."""
    cls = type(row)
    if not isinstance(row, GraphSubject):
        raise ConfigurationError(f"{cls.__name__} is not a GraphSubject: it cannot be submitted.")
    identity = inspect(row).identity
    if identity is None:
        raise ConfigurationError(f"This {cls.__name__} row has no primary key yet: flush it first.")
    return cls.__table__.name, stored_subject_key(identity)


def stored_subject_key(identity: tuple[Any, ...]) -> str:
    """A subject's primary key as a graph instance stores it: every part as text (a run's key
    in a URL is `engine.views.runs.key_text`; in the attempt log, `logged_key`)."""
    if len(identity) == 1:
        return str(identity[0])
    return json.dumps([str(part) for part in identity])


def key_values(cls: type[Any], key: str) -> tuple[Any, ...]:
    """The primary key values of `cls` that `stored_subject_key` wrote as `key`."""
    columns = list(cls.__table__.primary_key.columns)
    parts = [key] if len(columns) == 1 else json.loads(key)
    return tuple(
        column.type.python_type(part) if column.type.python_type is not str else part
        for column, part in zip(columns, parts, strict=True)
    )


def subject_owner(subject: Any) -> str | None:
    """The user who owns the subject row by its owner column; None without one, or blank."""
    column = getattr(type(subject), "__graph_owner_column__", None)
    if not column:
        return None
    owner = getattr(subject, column)
    return str(owner) if owner not in (None, "") else None


def show_state(subject: Any, code: str | None) -> None:
    """The subject row in hand shows the state just written, as if loaded with it."""
    cls = type(subject)
    column = cls.__table__.c[state_column(cls)]
    key = inspect(cls).get_property_by_column(column).key
    set_committed_value(subject, key, code)
