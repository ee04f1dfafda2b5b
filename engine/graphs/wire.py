"""A batch of statements on libpq's pipeline: one write to the socket, one wait for the answers.

psycopg's own pipeline waits on the socket through the event loop and
writes once per statement it queues (a move's second round trip was eight
sends and as many event-loop turns); here every command of a batch is
queued in libpq, sent in one write and answered at one sync point: one
wait. Values go as text (the statement's casts type them, `dumped`), rows
come back in binary through psycopg's loaders, found once per statement.

*Prepared statements of our own.* A statement is prepared on the server on
first use under a name of ours (`duly_graph_<n>`), so its later runs skip
parse and plan. Such a name can vanish behind our back: psycopg sends
DEALLOCATE ALL when it rolls back a connection on which it prepared
statements of its own (the pool's reset, a SAVEPOINT rolled back), or runs
DROP or ALTER. A batch that begins its transaction can afford a missing
name (nothing ran yet: it is rolled back, every name forgotten, and sent
again, prepared afresh); a batch inside a transaction it did not begin
cannot, so it trusts the names only when told that this transaction began
with a batch that proved them (`Batch.trusted`: the runtime's own
transactions, `engine.graphs.pipeline.driven`), and otherwise sends its
statements unnamed. A connection whose psycopg `prepare_threshold` is None
(behind a pooler in transaction mode, where no prepared statement outlives
its transaction) gets no names at all, as psycopg would give it none.

One name alive proves every name prepared after it (DEALLOCATE ALL takes
them all, and nothing takes one of ours alone), so a beginning batch proves
the oldest (`ConnectionStatements.anchor`), by running it or by describing it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from typing import cast as typing_cast

import psycopg
from psycopg import pq
from psycopg.abc import PQGen, Transformer
from psycopg.adapt import PyFormat
from psycopg.adapt import Transformer as make_transformer
from psycopg.generators import fetch_many
from psycopg.pq.abc import PGconn, PGresult
from psycopg.waiting import Ready, Wait

PREPARED = "duly_graph_prepared"  # the key of a connection's statements in its pool record's info
MISSING_STATEMENT = b"26000"  # invalid_sql_statement_name: a name DEALLOCATE ALL took
IDLE = pq.TransactionStatus.IDLE


@dataclass
class ConnectionStatements:
    """What one driver connection keeps of the hot statements: each one's prepared name on
    the server, and its result's loaders and column names, learnt from its first result.

    Kept in the pooled connection's `info`, which lives and dies with the DBAPI
    connection (a server that lost the connection lost its statements too).
    """

    names: dict[str, bytes] = field(default_factory=dict)  # text: prepared name
    anchor: bytes | None = None  # the oldest of `names`: alive, it proves them all
    results: dict[str, tuple[Transformer, tuple[str, ...]]] = field(default_factory=dict)
    made: int = 0  # names handed out, so a name is never reused
    dumping: Transformer | None = None  # dumps what `dumped` does not spell itself
    driving: bool = False  # in `driven`: the transaction is the runtime's own
    trusted: bool = False  # this transaction began with a batch that proved the names

    def new_name(self) -> bytes:
        """A name never used on this connection."""
        self.made += 1
        return f"duly_graph_{self.made}".encode()

    def prepared(self, text: str, name: bytes) -> None:
        """The server holds `text` under `name` now."""
        self.names[text] = name
        if self.anchor is None:
            self.anchor = name

    def forget(self) -> None:
        """The server holds none of our names (DEALLOCATE ALL took them)."""
        self.names.clear()
        self.anchor = None
        self.trusted = False

    def rows(
        self, driver: psycopg.AsyncConnection[Any], text: str, result: PGresult
    ) -> list[dict[str, Any]]:
        """A result's rows as dicts keyed by its column names, loaded from binary."""
        found = self.results.get(text)
        if found is None:
            transformer: Transformer = make_transformer(driver)
            transformer.set_pgresult(result, format=pq.Format.BINARY)
            names = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
            self.results[text] = (transformer, names)
        else:
            transformer, names = found
            # The same statement, the same columns: the loaders found the first time serve.
            transformer.set_pgresult(result, set_loaders=False)
        return transformer.load_rows(
            0, result.ntuples, lambda values: dict(zip(names, values, strict=True))
        )


def statements_of(info: dict[Any, Any]) -> ConnectionStatements:
    """The hot statements' state of the connection whose pool record's info is `info`."""
    found = info.get(PREPARED)
    if found is None:
        found = info[PREPARED] = ConnectionStatements()
    assert isinstance(found, ConnectionStatements)
    return found


def dumped(value: Any, kept: ConnectionStatements, driver: Any) -> bytes | None:
    """A value as the text PostgreSQL reads for the statement's parameter (its type is the
    statement's: `$1::UUID`, or what its place says); psycopg's text dumpers otherwise."""
    kind = type(value)
    if value is None:
        return None
    if kind is str:
        return typing_cast(str, value).encode()
    if kind is uuid.UUID or kind is int:
        return str(value).encode()
    if kind is bool:
        return b"t" if value else b"f"
    if kind is datetime and value.tzinfo is not None:
        return typing_cast(datetime, value).isoformat().encode()
    if kept.dumping is None:
        kept.dumping = make_transformer(driver)
    found = kept.dumping.get_dumper(value, PyFormat.TEXT).dump(value)
    return None if found is None else bytes(found)


def begin_command(driver: psycopg.AsyncConnection[Any]) -> bytes:
    """The BEGIN psycopg would send for the connection's transaction characteristics."""
    parts = ["BEGIN"]
    if driver.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + driver.isolation_level.name.replace("_", " "))
    if driver.read_only is not None:
        parts.append("READ ONLY" if driver.read_only else "READ WRITE")
    if driver.deferrable is not None:
        parts.append("DEFERRABLE" if driver.deferrable else "NOT DEFERRABLE")
    return " ".join(parts).encode()


def exchange(pgconn: PGconn, count: int) -> PQGen[list[list[PGresult]]]:
    """Send what libpq holds (flushed, one write when it fits the socket) and read `count`
    commands' results: the client waits once for the server's answers."""
    while pgconn.flush() != 0:
        while not (ready := (yield Wait.RW)):
            continue
        if ready & Ready.R:
            pgconn.consume_input()
    results = []
    for _ in range(count):
        results.append((yield from fetch_many(pgconn)))
    return results


@dataclass(frozen=True)
class Sent:
    """One statement of a batch: its `$n` text, and what it was given (for errors)."""

    text: str
    values: list[bytes | None]
    params: Mapping[str, Any]


@dataclass
class Outcome:
    """A batch's rows per statement, or the first error and the statement it came from."""

    rows: list[list[dict[str, Any]]]
    error: psycopg.Error | None = None
    failed: Sent | None = None
    missing: bool = False  # the error is a name DEALLOCATE ALL took
    after_error: psycopg.Error | None = None  # of a command after the COMMIT (committed)


class Batch:
    """The commands of one round trip, queued in libpq's pipeline, then sent and read."""

    def __init__(
        self,
        driver: psycopg.AsyncConnection[Any],
        kept: ConnectionStatements,
        *,
        trusted: bool,
    ) -> None:
        self.driver, self.kept = driver, kept
        self.pgconn = driver.pgconn
        self.begins = self.pgconn.transaction_status == IDLE and not driver.autocommit
        # Named statements: proved by this batch (it begins its transaction), or trusted;
        # never on a connection told not to prepare (a pooler in transaction mode).
        preparing = driver.prepare_threshold is not None
        self.named = preparing and (self.begins or trusted)
        self.sent: list[Sent] = []
        self.commands: list[tuple[str, Any]] = []  # (kind, what): what each result answers

    async def run(
        self, statements: Sequence[Sent], *, commit: bool, after: Sequence[bytes] = ()
    ) -> Outcome:
        """Queue `statements` (with BEGIN if the transaction is not begun, COMMIT if asked,
        and the plain commands `after` it, each its own transaction), send them, wait
        once, and read every result."""
        pgconn, kept = self.pgconn, self.kept
        async with self.driver.lock:
            pgconn.enter_pipeline_mode()
            try:
                if self.begins:
                    pgconn.send_query_params(begin_command(self.driver), None)
                    self.commands.append(("command", None))
                    anchor = kept.anchor
                    if anchor is not None and anchor not in self._names(statements):
                        pgconn.send_describe_prepared(anchor)
                        self.commands.append(("command", None))
                for sent in statements:
                    self._queue(sent)
                if commit:
                    pgconn.send_query_params(b"COMMIT", None)
                    self.commands.append(("command", None))
                    for command in after:
                        pgconn.send_query_params(command, None)
                        self.commands.append(("after", None))
                pgconn.pipeline_sync()
                results = await self.driver.wait(exchange(pgconn, len(self.commands) + 1))
            finally:
                leave_pipeline(pgconn)
        return self._read(results)

    def _names(self, statements: Sequence[Sent]) -> set[bytes]:
        found = (self.kept.names.get(sent.text) for sent in statements)
        return {name for name in found if name is not None}

    def _queue(self, sent: Sent) -> None:
        pgconn, kept = self.pgconn, self.kept
        binary = pq.Format.BINARY
        if not self.named:
            pgconn.send_query_params(sent.text.encode(), sent.values, result_format=binary)
            self.commands.append(("rows", len(self.sent)))
            self.sent.append(sent)
            return
        name = kept.names.get(sent.text)
        if name is None:
            name = kept.new_name()
            pgconn.send_prepare(name, sent.text.encode())
            self.commands.append(("prepare", (sent.text, name)))
        pgconn.send_query_prepared(name, sent.values, result_format=binary)
        self.commands.append(("rows", len(self.sent)))
        self.sent.append(sent)

    def _read(self, results: list[list[PGresult]]) -> Outcome:
        outcome = Outcome(rows=[[] for _ in self.sent])
        for (kind, what), found in zip(self.commands, results, strict=False):
            result = found[-1]
            if kind == "after":  # the transaction is committed: its error is only told
                if result.status == pq.ExecStatus.FATAL_ERROR and outcome.after_error is None:
                    encoding = self.driver.info.encoding
                    outcome.after_error = psycopg.errors.error_from_result(
                        result, encoding=encoding
                    )
            elif result.status == pq.ExecStatus.FATAL_ERROR:
                if outcome.error is None:
                    encoding = self.driver.info.encoding
                    outcome.error = psycopg.errors.error_from_result(result, encoding=encoding)
                    state = result.error_field(pq.DiagnosticField.SQLSTATE)
                    outcome.missing = state == MISSING_STATEMENT
                    outcome.failed = self.sent[what] if kind == "rows" else None
            elif kind == "prepare" and result.status == pq.ExecStatus.COMMAND_OK:
                text, name = what
                self.kept.prepared(text, name)
            elif kind == "rows" and result.status == pq.ExecStatus.TUPLES_OK:
                outcome.rows[what] = self.kept.rows(self.driver, self.sent[what].text, result)
        return outcome


def leave_pipeline(pgconn: PGconn) -> None:
    """Leave pipeline mode; a connection left mid-exchange (its task cancelled, its socket
    broken) is closed, since what it would answer next is unknown: the pool discards it."""
    if pgconn.pipeline_status == pq.PipelineStatus.OFF:
        return
    try:
        pgconn.exit_pipeline_mode()
    except psycopg.Error:
        pgconn.finish()


async def rollback(driver: psycopg.AsyncConnection[Any]) -> None:
    """ROLLBACK sent by us, not by psycopg's rollback(), which also deallocates every
    statement on the connection when it prepared any of its own."""
    if driver.pgconn.transaction_status == IDLE:
        return
    async with driver.lock:
        driver.pgconn.send_query_params(b"ROLLBACK", None)
        [found] = await driver.wait(exchange(driver.pgconn, 1))
    if found and found[-1].status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(found[-1], encoding=driver.info.encoding)
