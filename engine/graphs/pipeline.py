"""The hot statements of a move, sent on psycopg's own connection, and the move's transaction.

A move is two round trips: the lock (`engine.graphs.locks`) goes out with
the BEGIN; the write, its notifications, the COMMIT and the outbox's NOTIFY
together. Both run on the driver's connection under SQLAlchemy's
(`fetch_all`, through `engine.graphs.wire`), with the text SQLAlchemy
compiles and the values it would be given, without its execution machinery
around each statement, and a move's transaction is the driver's too
(`driven`). Each piece here was a few percent of a move's client time in
bench/graphs.py (the transitions/s figure): psycopg parsing a long
statement again on every call (the text is numbered once,
`driver_statement`), escaping every array element with a regular
expression (`array_text`), psycopg's pipeline waiting on the socket and
writing once per statement, SQLAlchemy's begin and commit around a
transaction it does not send, and text results parsed back into ids and
times (rows come in binary). The NOTIFY goes after the COMMIT: inside the
transaction it would make every notifying transaction commit alone.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from engine.driver import pooled_of, translated
from engine.graphs.wire import Batch, Sent, dumped, rollback, statements_of
from engine.notify import notify_command

log = logging.getLogger("duly.graphs")

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


@contextlib.asynccontextmanager
async def driven(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose transaction its statements on the driver begin and end: BEGIN
    goes with the first (`fetch_all`), COMMIT with the last (`commit=True`).

    SQLAlchemy's begin() and commit() around them would each hop into its
    greenlet to do nothing the server sees. The transaction is the runtime's
    own from its first statement, so the prepared names its first batch
    proves serve its later ones (`engine.graphs.wire`). On a failure the
    transaction is rolled back here, on the driver (by a ROLLBACK of ours:
    psycopg's rollback() would deallocate every prepared statement), before
    the connection goes back to the pool (a transaction SQLAlchemy began
    meanwhile, for a statement of its own, ends with it, as the connection
    closes).
    """
    async with engine.connect() as conn:
        pooled = await pooled_of(conn)
        kept = statements_of(pooled.info)
        kept.driving, kept.trusted = True, False
        try:
            yield conn
        except BaseException:
            if not conn.invalidated:  # an invalidated one never goes back to the pool
                with contextlib.suppress(psycopg.Error):  # broken: the pool's to handle
                    driver = pooled.driver_connection
                    assert isinstance(driver, psycopg.AsyncConnection)
                    await rollback(driver)
            raise
        finally:
            kept.driving = kept.trusted = False


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
    conn: AsyncConnection,
    statements: Sequence[Statement],
    *,
    commit: bool = False,
    announce: Sequence[str] = (),
) -> list[list[dict[str, Any]]]:
    """Run `statements` (then COMMIT, if asked) in one round trip; each one's rows.

    They go out together (with the BEGIN of a transaction not yet begun) and
    their results are read at one sync point (`engine.graphs.wire`): a move's
    write, its notifications and its commit cost the client one wait instead
    of three. An error aborts the rest, the COMMIT included. Each statement's
    text is numbered once (`driver_statement`) and prepared on the server
    under a name of ours when its names can be trusted; a batch beginning its
    transaction that finds them deallocated is rolled back and sent again.

    `announce` (with `commit`) names the payloads to NOTIFY on the engine's
    channel just after the COMMIT, each in a transaction of its own, in the
    same round trip: a NOTIFY inside the transaction would hold PostgreSQL's
    one notification lock through the COMMIT's flush, so every notifying
    transaction of the database would commit one after the other (no group
    commit). The rows are committed before the workers are told, as before;
    a failed NOTIFY is logged, never the move's failure (its rows are
    committed, and the outbox is drained whether or not anyone is woken).
    """
    assert commit or not announce, "a NOTIFY after the COMMIT needs the COMMIT"
    pooled = await pooled_of(conn)
    driver = pooled.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    kept = statements_of(pooled.info)
    current: tuple[str, Any] = ("", {})
    try:
        sent = []
        for statement, params in statements:
            prepared = driver_statement(statement, conn.dialect)
            current = (prepared.text, params)
            values = [dumped(value, kept, driver) for value in prepared.values(params)]
            sent.append(Sent(prepared.text, values, params))
        notices = [notify_command(payload) for payload in announce]
        for attempt in (1, 2):
            batch = Batch(driver, kept, trusted=kept.trusted)
            outcome = await batch.run(sent, commit=commit, after=notices)
            if outcome.after_error is not None:
                log.warning("NOTIFY after a graph move's commit failed: %s", outcome.after_error)
            if outcome.error is None:
                # A transaction of the runtime's own, begun here: its names are proved.
                kept.trusted = kept.driving and (batch.begins or kept.trusted) and not commit
                return outcome.rows
            if outcome.missing:
                kept.forget()
                if batch.begins and attempt == 1:
                    await rollback(driver)  # nothing ran: send it all again, prepared afresh
                    continue
            failed = outcome.failed
            current = (failed.text, failed.params) if failed is not None else (current[0], {})
            raise outcome.error
        raise AssertionError("unreachable: the second attempt returns or raises")
    except psycopg.Error as exc:  # as SQLAlchemy would raise it (IntegrityError, ...)
        raise await translated(conn, pooled, exc, current) from exc
