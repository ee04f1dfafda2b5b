"""Rows a step writes in the same statement as its outcome, only if the outcome lands.

    commit_with(Companion(deliveries, rows, conflict=("event_id", "route"), ...))

A step body calls `commit_with` to have rows inserted (or upserted) by its commit: never
when the write is fenced, the attempt fails, or the commit does not happen. The rows travel
as arrays, so a companion's columns must be of the plain types `array_type` knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Double,
    Float,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
    Time,
    Unicode,
    UnicodeText,
    bindparam,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import TypeEngine

from engine.base.clock import db_now
from engine.base.errors import NotInStepError, UnsupportedTypeError

# Column types whose values go through an array as they are (exact classes: a subclass,
# an Enum or a TypeDecorator, may bind differently), and text, which goes as `text`.
PLAIN_TYPES: tuple[type[TypeEngine[Any]], ...] = (
    Integer,
    BigInteger,
    SmallInteger,
    Float,
    Double,
    Boolean,
    DateTime,
    Date,
    Time,
)
TEXT_TYPES: tuple[type[TypeEngine[Any]], ...] = (String, Text, Unicode, UnicodeText)
POSITION = "duly_position"  # the array of which write each companion row belongs to


def array_parameter(name: str, element: TypeEngine[Any]) -> BindParameter[Any]:
    """An array parameter; the psycopg dialect renders its type as a cast (`%(name)s::TEXT[]`),
    so it needs no CAST around it (the statement stays short enough for psycopg's cache)."""
    return bindparam(name, type_=ARRAY(element))


@lru_cache(maxsize=1024)
def array_type(column: Any) -> TypeEngine[Any] | None:
    """The element type a column's values travel in as an array, or None when not plain.

    Text of any length travels as `text` and is assigned to the column, so
    PostgreSQL checks a `varchar(n)`'s length as an assignment does (a cast
    would truncate).
    """
    kind = type(column.type)
    if kind in TEXT_TYPES:
        return Text()
    if kind in PLAIN_TYPES:
        return column.type  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class CompanionShape:
    """What a companion's statement depends on: the table, its columns, its conflict rule."""

    table: Table
    columns: tuple[str, ...]  # given by each row
    conflict: tuple[str, ...] = ()  # a unique key: upsert on it (nothing: plain INSERT)
    summed: tuple[str, ...] = ()  # on conflict: the stored value plus the new one
    stamped: tuple[str, ...] = ()  # set to the database time of the commit


@dataclass(frozen=True)
class Companion:
    """Rows for one table, written with the commit of the step that attached them."""

    shape: CompanionShape
    rows: tuple[tuple[Any, ...], ...]  # values in the order of shape.columns

    def __post_init__(self) -> None:
        check_shape(self.shape)


@lru_cache(maxsize=256)
def check_shape(shape: CompanionShape) -> None:
    """Refuse a shape with a column that cannot travel as an array (checked once a shape)."""
    table = shape.table
    plain = [name for name in shape.columns if array_type(table.c[name]) is not None]
    if len(plain) != len(shape.columns):
        raise UnsupportedTypeError(
            f"A companion of {table.name} can carry only plain columns, not "
            f"{sorted(set(shape.columns) - set(plain))}."
        )


_attached: ContextVar[list[Companion] | None] = ContextVar("duly_companions", default=None)


def commit_with(companion: Companion) -> None:
    """Write `companion`'s rows in the commit of the step attempt running now."""
    attached = _attached.get()
    if attached is None:
        raise NotInStepError("commit_with() is for a step body: no step attempt is running.")
    attached.append(companion)


class Collecting:
    """Collect what the step body running inside attaches with `commit_with`.

    A class rather than a generator: every step attempt enters one, and a
    generator-based context manager costs several times as much.
    """

    __slots__ = ("_token", "attached")

    def __enter__(self) -> list[Companion]:
        self.attached: list[Companion] = []
        self._token = _attached.set(self.attached)
        return self.attached

    def __exit__(self, *exc: object) -> None:
        _attached.reset(self._token)


def companion_parameters(
    shape: CompanionShape, prefix: str, companions: Sequence[tuple[int, Companion]]
) -> dict[str, list[Any]]:
    """The arrays of `shape`'s rows from (write position, companion) pairs."""
    params: dict[str, list[Any]] = {f"{prefix}{POSITION}": []}
    params.update({f"{prefix}{name}": [] for name in shape.columns})
    for position, companion in companions:
        for row in companion.rows:
            params[f"{prefix}{POSITION}"].append(position)
            for name, value in zip(shape.columns, row, strict=True):
                params[f"{prefix}{name}"].append(value)
    return params


def unnest_arrays(arrays: dict[str, list[Any]]) -> dict[str, list[Any] | None]:
    """`arrays` (the arguments of one multi-array unnest()) with each array of only NULLs
    sent as one NULL.

    unnest() pads a shorter array (and a NULL one is empty) with NULLs to the
    longest one's length, so the rows are the same; psycopg dumps an array
    element by element, ~0.4 us each, and most of a statement's arrays (the
    errors, the waits, the deadlines of steps that have none) are all NULL.
    Only for statements whose every row has a non-NULL value in some array
    (a key, a position).
    """
    return {
        name: None if all(value is None for value in values) else values
        for name, values in arrays.items()
    }


def companion_insert(shape: CompanionShape, prefix: str, landed: Any = None) -> Insert:
    """The INSERT of `shape`'s rows from arrays named `<prefix><column>`.

    `landed` is a selectable of the positions whose writes landed (the fenced
    UPDATE's RETURNING); rows of other positions are not written. Without it,
    every row given is written (the caller has kept only landed ones).
    """
    table = shape.table
    element_types: list[tuple[str, Any]] = [(POSITION, Integer())] + [
        (name, array_type(table.c[name])) for name in shape.columns
    ]
    arrays = [array_parameter(f"{prefix}{name}", type_) for name, type_ in element_types]
    given = func.unnest(*arrays).table_valued(*(name for name, _ in element_types))
    given = given.render_derived(name=f"{prefix}given", with_types=False)
    rows = select(*(given.c[name] for name in shape.columns), *(db_now() for _ in shape.stamped))
    if landed is not None:
        rows = rows.where(given.c[POSITION].in_(landed))
    statement = insert(table).from_select([*shape.columns, *shape.stamped], rows)
    if not shape.conflict:
        return statement
    excluded = statement.excluded
    updates = {
        name: (table.c[name] + excluded[name]) if name in shape.summed else excluded[name]
        for name in (*shape.columns, *shape.stamped)
        if name not in shape.conflict
    }
    return statement.on_conflict_do_update(index_elements=list(shape.conflict), set_=updates)


@lru_cache(maxsize=64)
def companion_statement(shape: CompanionShape) -> Insert:
    """The INSERT of `shape`'s rows on their own (arrays named after the columns), built once."""
    return companion_insert(shape, "")


async def write_companions(conn: AsyncConnection, attached: Sequence[Companion]) -> None:
    """Write companions on their own, one statement a shape (inside the caller's transaction).

    For writes that could not carry them in their own statement; the caller
    passes only the companions of writes that landed.
    """
    for shape in companion_shapes(attached):
        given = [(0, c) for c in attached if c.shape == shape]
        await conn.execute(companion_statement(shape), companion_parameters(shape, "", given))


def companion_shapes(companions: Sequence[Companion]) -> tuple[CompanionShape, ...]:
    """The distinct shapes of `companions`, in a stable order: part of a statement's shape."""
    return tuple(sorted({c.shape for c in companions}, key=lambda shape: shape.table.name))
