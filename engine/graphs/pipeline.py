"""The hot statements of a move, sent on psycopg's own connection, and the move's transaction.

A move is two round trips: the lock (`engine.graphs.locks`) goes out with
the BEGIN, the write, its notifications and the COMMIT together. Both run
on the driver's connection under SQLAlchemy's (`fetch_all`), with the text
SQLAlchemy compiles and the values it would be given, without its
execution machinery around each statement, and a move's transaction is the
driver's too (`driven`). Each piece here was a few percent of a move's
client time in bench/graphs.py (the transitions/s figure): psycopg parsing
a long statement again on every call (raw cursors take it numbered once),
escaping every array element with a regular expression (`array_text`),
describing every result column anew (`_dict_rows`), making a cursor and its
adapters per statement (`_cursor`), SQLAlchemy's begin and commit around a
transaction it does not send, and text results parsed back into ids and
times (rows come in binary).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import AsyncRowFactory, RowMaker
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from engine.driver import pooled_of, translated

# A pyformat placeholder, or a percent sign SQLAlchemy doubled for pyformat.
PYFORMAT = re.compile(r"%\(([^)]+)\)s|%%")


@dataclass(frozen=True)
class DriverStatement:
    """A statement as the driver takes it: `$n` placeholders, the name each one is given by,
    and the parameters' default values. Built once per statement: nothing is parsed per call."""

    text: str
    names: tuple[str, ...]  # the parameter for $1, $2, ...
    defaults: dict[str, Any]
    required: frozenset[str]  # the parameters a call must give (no value of their own)

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """The values of $1, $2, ... from `params` (and the defaults); lists as array text."""
        if not self.required <= params.keys():
            missing = sorted(self.required - params.keys())
            raise KeyError(f"The statement needs values for its parameters {missing}.")
        values = list(self.slots)
        for name, value in params.items():
            at = self.positions.get(name)
            if at is not None:
                values[at] = array_text(value) if type(value) is list else value
        return values

    @cached_property
    def slots(self) -> tuple[Any, ...]:
        """Each placeholder's default value, in order (None where it has none)."""
        found = (self.defaults.get(name) for name in self.names)
        return tuple(array_text(value) if type(value) is list else value for value in found)

    @cached_property
    def positions(self) -> dict[str, int]:
        """Each parameter's place among the placeholders."""
        return {name: at for at, name in enumerate(self.names)}


def array_text(values: list[Any]) -> Any:
    """A list as PostgreSQL's array text, which the statement's cast (`$1::UUID[]`) reads;
    the list itself when an element is of a kind not spelled here.

    psycopg's array dumper escapes every element with a regular expression;
    the hot statements send a dozen short arrays a transaction (keys, the
    outbox's columns), and two replaces do the same for text.
    """
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif isinstance(value, uuid.UUID | int) and not isinstance(value, bool):
            parts.append(str(value))
        elif isinstance(value, datetime) and value.tzinfo is not None:
            parts.append('"' + value.isoformat() + '"')
        else:
            return values
    return "{" + ",".join(parts) + "}"


@lru_cache(maxsize=512)
def driver_statement(statement: ClauseElement, dialect: Dialect) -> DriverStatement:
    """A statement's text for the driver, numbered (`$1`), and its parameters' defaults."""
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    # Parameters SQLAlchemy renders at execution (IN lists, literals) would need its own path.
    assert not compiled.post_compile_params and not compiled.literal_execute_params
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = PYFORMAT.sub(number, str(compiled))
    required = frozenset(name for name, bind in compiled.binds.items() if bind.required)
    return DriverStatement(text, tuple(names), dict(compiled.params), required & set(names))


Statement = tuple[ClauseElement, Mapping[str, Any]]

# Each statement's result columns, by its text: read from the first result, then kept.
_columns: dict[str, tuple[str, ...]] = {}


def _dict_rows(text: str) -> AsyncRowFactory[dict[str, Any]]:
    """Rows as dicts keyed by the statement's column names, learnt once per statement
    (psycopg's dict_row describes every column of every result anew)."""

    def factory(cursor: Any) -> RowMaker[dict[str, Any]]:
        names = _columns.get(text)
        if names is None:
            result = cursor.pgresult
            assert result is not None
            names = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
            _columns[text] = names
        return lambda values: dict(zip(names, values, strict=True))

    return factory


CURSORS = "duly_graph_cursors"  # the key of a connection's cursors in its pool record's info


def _cursor(
    info: dict[Any, Any], driver: psycopg.AsyncConnection[Any], text: str
) -> psycopg.AsyncRawCursor[Any]:
    """The driver connection's cursor for `text`: made once, so psycopg's adaptation of its
    parameters and rows (a transformer, found per cursor and query) is made once too.

    Kept in the pooled connection's `info`, which lives and dies with the
    DBAPI connection (a cursor holds its connection: a dictionary keyed by
    connections would keep every one alive).
    """
    mine: dict[str, psycopg.AsyncRawCursor[Any]] = info.setdefault(CURSORS, {})
    cursor = mine.get(text)
    if cursor is None or cursor.closed:
        cursor = mine[text] = psycopg.AsyncRawCursor(driver, row_factory=_dict_rows(text))
    return cursor


async def driver_of(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under `conn` (checked out, so it has one)."""
    driver = (await pooled_of(conn)).driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return driver


@contextlib.asynccontextmanager
async def driven(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose transaction its statements on the driver begin and end: BEGIN
    goes with the first (`fetch_all`), COMMIT with the last (`commit=True`).

    SQLAlchemy's begin() and commit() around them would each hop into its
    greenlet to do nothing the server sees. On a failure the transaction is
    rolled back here, on the driver, before the connection goes back to the
    pool (a transaction SQLAlchemy began meanwhile, for a statement of its
    own, ends with it, as the connection closes).
    """
    async with engine.connect() as conn:
        try:
            yield conn
        except BaseException:
            if not conn.invalidated:  # an invalidated one never goes back to the pool
                with contextlib.suppress(psycopg.Error):  # broken: the pool's to handle
                    await (await driver_of(conn)).rollback()
            raise


async def fetch(
    conn: AsyncConnection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Run a statement of the hot path on the driver's own connection; its rows as dicts.

    The same text and values SQLAlchemy would send, without its execution
    machinery around each statement. The connection's transaction is the
    caller's; the transaction's first statement goes out with its BEGIN, in
    one round trip.
    """
    [rows] = await fetch_all(conn, [(statement, params)])
    return rows


async def fetch_all(
    conn: AsyncConnection, statements: Sequence[Statement], *, commit: bool = False
) -> list[list[dict[str, Any]]]:
    """Run `statements` (then COMMIT, if asked) in one round trip; each one's rows.

    psycopg's pipeline mode sends them together (with the BEGIN of a
    transaction not yet begun) and reads the results at one sync point, the
    pipeline's end: a move's write, its notifications and its commit cost
    the client one wait instead of three. An error aborts the rest, the
    COMMIT included. Raw cursors, one per statement and connection, take the
    text numbered once (`driver_statement`): psycopg neither parses nor
    rewrites a statement per call, finds its adapters once, and prepares it
    after a few uses (generic plans).
    """
    pooled = await pooled_of(conn)
    driver = pooled.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    cursors = []
    current: tuple[str, Any] = ("", {})
    try:
        async with driver.pipeline():
            for statement, params in statements:
                prepared = driver_statement(statement, conn.dialect)
                current = (prepared.text, params)
                cursor = _cursor(pooled.info, driver, prepared.text)
                if cursor in cursors:  # the same statement twice: each needs its own results
                    cursor = psycopg.AsyncRawCursor(driver, row_factory=_dict_rows(prepared.text))
                # Rows in binary: ids and times are copied, not printed and parsed again.
                await cursor.execute(prepared.text, prepared.values(params), binary=True)
                cursors.append(cursor)
            if commit:
                # Queued like the rest (the driver's commit() would sync the pipeline first).
                current = ("COMMIT", {})
                await _cursor(pooled.info, driver, "COMMIT").execute("COMMIT", prepare=False)
        # Leaving the pipeline synced it: every result is in.
        results = []
        for cursor in cursors:
            result = cursor.pgresult
            tuples = result is not None and result.status == pq.ExecStatus.TUPLES_OK
            results.append(await cursor.fetchall() if tuples else [])
        return results
    except psycopg.Error as exc:  # as SQLAlchemy would raise it (IntegrityError, ...)
        raise await translated(conn, pooled, exc, current) from exc
