"""The hot statements on the driver's own connection: SQLAlchemy's text, not its execution path.

A claim or a fast-path commit is compiled by SQLAlchemy once, then sent on the psycopg
connection under the SQLAlchemy connection (in its transaction when it has one): ~50 us of
client CPU a statement against ~150 through SQLAlchemy's execution path. What SQLAlchemy
gives a statement stays: its bind and result processors, its error classes, invalidation
of a lost connection's pool generation, and the cursor-execute events. Arrays travel in
binary. A statement SQLAlchemy renders again at each execution (an expanding IN list) goes
through SQLAlchemy.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, cast

import psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import ARRAY, TypeEngine

from engine.base.errors import InternalError

STATEMENT_CACHE_SIZE = 512
Processor = Callable[[Any], Any]


class Prepared:
    """A statement compiled once: its text, defaults, bind processors and result types."""

    __slots__ = ("bind_processors", "defaults", "result_processors", "result_types", "text")

    def __init__(
        self,
        text: str,
        defaults: dict[str, Any],
        bind_processors: tuple[tuple[str, Processor], ...],
        result_types: tuple[TypeEngine[Any], ...],
    ) -> None:
        self.text = text
        self.defaults = defaults
        self.bind_processors = bind_processors
        self.result_types = result_types
        # Found from the first result's column types (a numeric's depends on them).
        self.result_processors: tuple[tuple[int, Processor], ...] | None = None


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def prepare(statement: Executable, dialect: Dialect) -> Prepared | None:
    """Compile `statement` for `dialect` once; None if SQLAlchemy renders it per execution."""
    compiled = cast(ClauseElement, statement).compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    if compiled.post_compile_params or compiled.literal_execute_params:
        return None  # an expanding IN list, a literal rendered with its value
    processors = []
    text = str(compiled)
    for bind, name in compiled.bind_names.items():
        sent_as = compiled.escaped_bind_names.get(name, name)
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors.append((sent_as, process))
        if isinstance(bind.type, ARRAY):
            text = text.replace(f"%({sent_as})s", f"%({sent_as})b")
    exported = getattr(statement, "exported_columns", ())
    return Prepared(
        text,
        dict(compiled.params),
        tuple(processors),
        tuple(column.type for column in exported),
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def row_class(names: tuple[str, ...]) -> type[tuple[Any, ...]]:
    """A named tuple of these columns that also answers `_mapping`, as SQLAlchemy's Row does."""
    base = collections.namedtuple("DriverRow", names, rename=True)  # type: ignore[misc]

    def mapping(self: tuple[Any, ...]) -> Mapping[str, Any]:
        return dict(zip(names, self, strict=True))

    return type("DriverRow", (base,), {"__slots__": (), "_mapping": property(mapping)})


async def fetch(
    conn: AsyncConnection, statement: Executable, params: Mapping[str, Any]
) -> list[Any]:
    """Run `statement` with `params` on `conn`'s driver connection; its rows (none: empty)."""
    prepared = prepare(statement, conn.dialect)
    if prepared is None:
        return list((await conn.execute(statement, params)).all())
    values = {**prepared.defaults, **params}
    for name, process in prepared.bind_processors:
        if name in values:  # a missing value is psycopg's error to raise, as through SQLAlchemy
            values[name] = process(values[name])
    sync = conn.sync_connection
    assert sync is not None  # an AsyncConnection entered or awaited is started
    autocommit = sync.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    if not autocommit and not conn.in_transaction():
        await conn.begin()  # as SQLAlchemy's autobegin: its commit() and rollback() apply
    pooled = await pooled_of(conn)
    driver = pooled.driver_connection
    assert driver is not None  # a connection checked out of the pool has its driver's
    context = SimpleNamespace()  # what listeners may note between before and after
    cursor = None
    try:
        cursor = driver.cursor()
        for listener in sync.dispatch.before_cursor_execute:
            listener(sync, cursor, prepared.text, values, context, False)
        await cursor.execute(prepared.text, values)
        described = cursor.description
        raw = await cursor.fetchall() if described else []
    except psycopg.Error as exc:
        raise await translated(conn, pooled, exc, (prepared.text, values), cursor) from exc
    finally:
        if cursor is not None:
            await cursor.close()
    for listener in sync.dispatch.after_cursor_execute:
        listener(sync, cursor, prepared.text, values, context, False)
    if not described:
        return []
    return _rows(prepared, conn.dialect, described, raw)


async def pooled_of(conn: AsyncConnection) -> PoolProxiedConnection:
    """The pooled DBAPI connection under `conn` (checked out, so it has one)."""
    sync = conn.sync_connection
    if sync is not None and not sync.closed and not sync.invalidated:
        # The pooled connection in hand: no hop into SQLAlchemy's greenlet to fetch it.
        return sync.connection
    return await conn.get_raw_connection()


async def translated(
    conn: AsyncConnection,
    pooled: PoolProxiedConnection,
    exc: psycopg.Error,
    sent: tuple[str, Any],
    cursor: Any = None,
) -> StatementError:
    """`exc`, raised by the driver for the statement and values `sent`, as SQLAlchemy would
    raise it (an IntegrityError is an IntegrityError), after what SQLAlchemy does when a
    statement finds its connection lost: every connection the pool opened as long ago is
    recycled at its next checkout (the server that dropped this one dropped them too: a
    restart), and this one is invalidated now."""
    driver = pooled.driver_connection
    lost = conn.dialect.is_disconnect(exc, driver, cursor)  # type: ignore[arg-type]
    if lost:
        pool = getattr(conn.sync_engine, "pool", None)
        if pool is not None:
            pool._invalidate(pooled, exc, _checkin=False)  # marks the generation; no I/O
        await conn.invalidate()
    return DBAPIError.instance(
        sent[0], sent[1], exc, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
    )


# SQLSTATEs of a server going away: connection exceptions (class 08), and an
# administrator's or a crash's shutdown, or a server not yet accepting connections (57P01-03).
LOST_SERVER_STATES = ("08", "57P01", "57P02", "57P03")


def lost_connection(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) says the database went away.

    That is SQLAlchemy's verdict on a statement's error (`connection_invalidated`),
    or a psycopg error with no SQLSTATE (the socket closed, a connection refused)
    or one of `LOST_SERVER_STATES`. A query cancelled or out of memory is not.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError):
            if current.connection_invalidated:
                return True
            if isinstance(current.orig, BaseException):
                current = current.orig
                continue
        if isinstance(current, psycopg.OperationalError | psycopg.InterfaceError):
            state = current.sqlstate
            if state is None or state.startswith(LOST_SERVER_STATES):
                return True
        current = current.__cause__ or current.__context__
    return False


def _rows(
    prepared: Prepared, dialect: Dialect, described: Sequence[Any], raw: list[tuple[Any, ...]]
) -> list[Any]:
    processors = prepared.result_processors
    if processors is None:
        processors = prepared.result_processors = _result_processors(prepared, dialect, described)
    make = row_class(tuple(column.name for column in described))
    if not processors:
        return [tuple.__new__(make, values) for values in raw]
    rows = []
    for values in raw:
        converted = list(values)
        for position, process in processors:
            converted[position] = process(converted[position])
        rows.append(tuple.__new__(make, converted))
    return rows


def _result_processors(
    prepared: Prepared, dialect: Dialect, described: Sequence[Any]
) -> tuple[tuple[int, Processor], ...]:
    types = prepared.result_types
    if len(types) != len(described):
        raise InternalError(
            f"The statement returns {len(described)} columns but declares {len(types)}: "
            "run it through SQLAlchemy."
        )
    found = []
    for position, (type_, column) in enumerate(zip(types, described, strict=True)):
        process = type_.dialect_impl(dialect).result_processor(dialect, column.type_code)
        if process is not None:
            found.append((position, process))
    return tuple(found)
