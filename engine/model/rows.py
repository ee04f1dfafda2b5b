"""Workflow rows as detached ORM instances, built and refreshed from Core results.

The engine claims and commits with SQLAlchemy Core (one statement each), and
hands steps an ordinary instance of the user's class with every column
loaded. Changes a step makes to its row are read back from the instance's
attribute history and written by the engine's own fenced UPDATE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, and_, bindparam, inspect
from sqlalchemy.orm import ColumnProperty, make_transient_to_detached
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo


def build_row(info: WorkflowInfo, values: Sequence[Any]) -> Any:
    """A detached instance of the workflow class holding `values`, one per column of the
    table in its order (as a claim's RETURNING gives them)."""
    row = info.mapper.class_manager.new_instance()
    # A new instance has no history yet, so its loaded state is just its dict: filling
    # it directly is what loading does, and costs a fraction of one attribute event each.
    loaded = instance_state(row).dict
    for key, position in _attribute_positions(info):
        loaded[key] = values[position]
    make_transient_to_detached(row)
    return row


def claimed_key(info: WorkflowInfo, values: Sequence[Any]) -> tuple[Any, ...]:
    """The primary key of the row whose `values` are in the table's column order."""
    return tuple(values[position] for position in _key_positions(info))


@lru_cache(maxsize=1024)
def _attribute_positions(info: WorkflowInfo) -> tuple[tuple[str, int], ...]:
    """(attribute key, position in the table's columns) of each column the class maps."""
    positions = _column_positions(info)
    return tuple(
        (prop.key, positions[prop.columns[0]])
        for prop in info.mapper.column_attrs
        if prop.columns[0] in positions
    )


@lru_cache(maxsize=1024)
def _key_positions(info: WorkflowInfo) -> tuple[int, ...]:
    """The positions of the primary key's columns among the table's, in key order."""
    positions = _column_positions(info)
    return tuple(positions[column] for column in info.mapper.primary_key)


def _column_positions(info: WorkflowInfo) -> dict[Any, int]:
    """Each of the table's columns by its position (as a claim's RETURNING orders them)."""
    return {column: i for i, column in enumerate(info.table.c)}


def detach_inserted(info: WorkflowInfo, row: object, values: Mapping[Any, Any]) -> None:
    """A transient row as its INSERT committed it: each column in `values` (keyed by column
    name) set, then the whole row committed and detached."""
    # A transient row has no history to keep: writing its dict, then committing it all, is
    # what `refresh_row` and `make_transient_to_detached` do, without an event per column.
    instance_state(row).dict.update(
        {key: values[name] for name, key in _column_keys(info) if name in values}
    )
    make_transient_to_detached(row)


@lru_cache(maxsize=1024)
def _column_keys(info: WorkflowInfo) -> tuple[tuple[str, str], ...]:
    """(column name, attribute key) of each column the class maps."""
    return tuple((prop.columns[0].name, prop.key) for prop in info.mapper.column_attrs)


def refresh_row(info: WorkflowInfo, row: object, values: Mapping[Any, Any]) -> None:
    """Set the columns present in `values` (keyed by column name) as the row's committed state."""
    for prop in info.mapper.column_attrs:
        name = prop.columns[0].name
        if name in values:
            set_committed_value(row, prop.key, values[name])


def user_changes(info: WorkflowInfo, row: object) -> dict[str, Any]:
    """The columns a step changed on its row, by column name."""
    state = inspect(row)
    changes: dict[str, Any] = {}
    # committed_state holds exactly the attributes set since the row was loaded.
    for key in state.committed_state:
        prop = info.mapper.attrs.get(key)
        if isinstance(prop, ColumnProperty) and key not in ENGINE_COLUMNS:
            changes[prop.columns[0].name] = state.dict[key]
    return changes


def key_clause(info: WorkflowInfo, key: tuple[Any, ...]) -> ColumnElement[bool]:
    """WHERE clause selecting the row with primary key `key`."""
    return and_(
        *(column == value for column, value in zip(info.mapper.primary_key, key, strict=True))
    )


def key_parameters(info: WorkflowInfo, prefix: str = "k") -> tuple[BindParameter[Any], ...]:
    """Bind parameters for a primary key, named `prefix0`, `prefix1`...: a statement built once."""
    return tuple(
        bindparam(f"{prefix}{i}", type_=column.type)
        for i, column in enumerate(info.mapper.primary_key)
    )


def key_arguments(key: Sequence[Any], prefix: str = "k") -> dict[str, Any]:
    """The values of `key_parameters`, for one row's key."""
    return {f"{prefix}{i}": value for i, value in enumerate(key)}
