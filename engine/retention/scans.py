"""What is pruned, table by table: each kind's rows past the cutoff, walked through an index.

Attempt-log rows by when the attempt finished; outbox rows processed before the cutoff whose
every delivery succeeded, with their event records and delivery attempts; durable executions
that ended (completed, failed, cancelled) before it; seen signatures once they expire; the
console's sessions a day after. Dead letters stay until replayed; the workflow tables (the
application's rows) are never pruned. Tables are found on a `WorkflowConnection`: its attempt
log, and the outbox and execution tables among its workflows. A partitioned table's walk
is split into the partitions to drop whole and walks over those that straddle the cutoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, DateTime, MetaData, Table, bindparam, exists
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import BindParameter

from engine.base.seen_signatures import seen_signatures
from engine.base.sessions import console_sessions
from engine.events.records import OutboxColumns, tables_for
from engine.events.statuses import PROCESSED, SUCCEEDED
from engine.executions.durable import WorkflowExecutionRecord
from engine.executions.state import TERMINAL_STATES
from engine.model.connection import WorkflowConnection
from engine.partitions.days import Partition, partitions_of
from engine.retention.settings import ATTEMPTS, EVENTS, EXECUTIONS

SIGNATURES = "signatures"  # no retention period: a seen signature goes once it expires
SESSIONS = "sessions"  # the console's logins: no setting, they go a day after they expire
SESSIONS_KEPT_DAYS = 1  # days an expired (or ended) session is kept to look back on


def cutoff_parameter() -> BindParameter[Any]:
    """The cutoff every statement compares with: rows older than it are pruned."""
    return bindparam("duly_cutoff", type_=DateTime(timezone=True))


# eq=False: its fields are SQL expressions, which == would turn into more SQL.
@dataclass(frozen=True, eq=False)
class Scan:
    """One walk through a table's prunable rows, in the order of one of its indexes."""

    kind: str  # one of engine.retention.settings.KINDS, or SIGNATURES
    table: Table
    at: Column[Any]  # the time the walk follows: only rows before the cutoff
    key: Column[Any]  # unique in the table: breaks ties of `at`, names the row to companions
    where: tuple[ColumnElement[bool], ...]  # what else makes a row prunable (uses the cutoff)
    companions: tuple[Column[Any], ...] = ()  # other tables' columns holding `key`: deleted too

    def conditions(self) -> list[ColumnElement[bool]]:
        """Everything that makes a row of the table prunable now."""
        return [*self.where, self.at < cutoff_parameter()]


def prune_scans(connection: WorkflowConnection) -> list[Scan]:
    """The walks over every table of duly's own in the connection's database."""
    scans: list[Scan] = []
    if connection.attempt_log is not None:
        scans.append(attempt_scan(connection.attempt_log.__table__))
    for info in connection.workflows:
        if issubclass(info.cls, OutboxColumns):
            tables = tables_for(info.cls)
            scans.append(
                event_scan(tables.outbox_table, tables.record_table, tables.delivery_table)
            )
        elif issubclass(info.cls, WorkflowExecutionRecord):
            scans.extend(execution_scans(info.table))
    return scans


def attempt_scan(log: Table) -> Scan:
    """Attempt-log rows that finished before the cutoff."""
    return Scan(ATTEMPTS, log, log.c.finished_at, log.c.id, ())


def event_scan(outbox: Table, records: Table, deliveries: Table) -> Scan:
    """Processed outbox rows settled before the cutoff, all of whose routes succeeded."""
    owed = exists().where(
        deliveries.c.event_id == outbox.c.event_id, deliveries.c.status != SUCCEEDED
    )
    where = (
        outbox.c.status == PROCESSED,
        outbox.c.settled_at < cutoff_parameter(),
        ~owed,
    )
    companions = (deliveries.c.event_id, records.c.event_id)
    return Scan(EVENTS, outbox, outbox.c.created_at, outbox.c.event_id, where, companions)


def execution_scans(executions: Table) -> list[Scan]:
    """Executions that finished before the cutoff: one walk per terminal state."""
    c = executions.c
    ended = (c.next_step.is_(None), c.waiting_for.is_(None), c.claimed_until.is_(None))
    return [
        Scan(
            EXECUTIONS,
            executions,
            c.created_at,
            c.execution_id,
            (c.state == state.value, c.finished_at < cutoff_parameter(), *ended),
        )
        for state in TERMINAL_STATES
    ]


def signature_scan() -> Scan:
    """Seen signatures that expired before the cutoff (for them, the prune's start)."""
    table = seen_signatures
    return Scan(SIGNATURES, table, table.c.expires_at, table.c.digest, ())


def sessions_scan() -> Scan:
    """Console sessions that expired before the cutoff (an ended one has expired by then too:
    a session lasts hours, and the cutoff is a day back)."""
    c = console_sessions.c
    return Scan(SESSIONS, console_sessions, c.expires_at, c.id, ())


async def split_partitioned(
    conn: AsyncConnection, scan: Scan, cutoff: datetime
) -> tuple[list[str], list[Scan]] | None:
    """The partitions to drop and the walks that prune `scan`'s partitioned table; else None.

    `scan` must have no conditions but its cutoff and no companions (as the
    attempt log's), so that every row of a partition older than it is prunable.
    """
    if scan.where or scan.companions:
        return None
    partitions = await partitions_of(conn, scan.table.name)
    if partitions is None:
        return None
    drops = [p for p in partitions if p.holds_only_before(cutoff)]
    walked = [p for p in partitions if p.holds_before(cutoff) and p not in drops]
    return (
        [p.name for p in drops],
        [partition_scan(scan, p) for p in walked],
    )


def partition_scan(scan: Scan, partition: Partition) -> Scan:
    """`scan` over one partition of its table (its ctids are that partition's own)."""
    table = Table(
        partition.name,
        MetaData(),
        Column(scan.at.name, scan.at.type),
        Column(scan.key.name, scan.key.type),
    )
    return Scan(scan.kind, table, table.c[scan.at.name], table.c[scan.key.name], ())
