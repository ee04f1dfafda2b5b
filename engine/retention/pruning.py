"""Counting and deleting what is past its retention period, one short transaction a batch.

    found = await count_prunable(connection, settings)   # the dry run: rows per table
    done = await prune(connection, settings)              # deletes the same, batch by batch

Both own their transactions (each statement its own) and read the cutoffs once, at their
start, from the database clock. A batch is one statement that deletes at most `batch_size`
rows with their companions, so a prune stopped anywhere leaves whole batches done; after a
batch that deleted rows the prune pauses `pause_ms`, so the workers' commits keep their pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    CTE,
    DateTime,
    Integer,
    Select,
    any_,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.clock import db_now
from engine.base.seen_signatures import SEEN_SIGNATURES_TABLE
from engine.base.sessions import SESSIONS_TABLE
from engine.model.connection import WorkflowConnection
from engine.partitions import count_partition, drop_partition, keep_partitions_ahead
from engine.retention.scans import (
    SESSIONS_KEPT_DAYS,
    Scan,
    prune_scans,
    sessions_scan,
    signature_scan,
    split_partitioned,
)
from engine.retention.settings import KINDS, RetentionSettings

BEGINNING = datetime(1, 1, 1, tzinfo=UTC)  # where every walk starts: before any row


@dataclass(frozen=True)
class TableRows:
    """One table's rows past their kind's retention period: counted, or deleted."""

    kind: str
    table: str
    rows: int
    days: int  # the retention period
    cutoff: datetime  # the rows finished before this instant


@dataclass(frozen=True)
class PruneResult:
    """What a dry run counted or a prune deleted, table by table."""

    applied: bool  # rows were deleted (else only counted)
    tables: tuple[TableRows, ...]
    kept: tuple[str, ...] = ()  # kinds kept for good (their period is `never`)
    batches: int = 0  # the transactions that deleted (0 for a dry run)
    complete: bool = True  # False when `max_batches` stopped the prune first
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        """Rows of every table."""
        return sum(t.rows for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        """As JSON values (times in ISO 8601)."""
        return {
            "applied": self.applied,
            "rows": self.rows,
            "batches": self.batches,
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
            "kept": list(self.kept),
            "tables": [
                {
                    "kind": t.kind,
                    "table": t.table,
                    "rows": t.rows,
                    "days": t.days,
                    "cutoff": t.cutoff.isoformat(),
                }
                for t in self.tables
            ],
        }


@dataclass(frozen=True)
class Batch:
    """One batch committed: what `prune` tells its `on_batch` callback."""

    kind: str
    table: str  # the table the batch walked (its companions' rows are counted in `deleted`)
    deleted: int  # rows this batch deleted, companions included
    batches: int  # batches committed so far
    rows: int  # rows deleted so far


@dataclass
class Walk:
    """A scan under way: its period and cutoff, and where its last batch stopped."""

    scan: Scan
    days: int
    cutoff: datetime
    after_at: datetime = BEGINNING
    after_key: Any = None  # None at the start: every key is after it
    reported: str | None = None  # the partitioned table whose partition `scan` walks

    @property
    def table_name(self) -> str:
        """The table the walk's rows are counted under."""
        return self.reported or self.scan.table.name


@dataclass(frozen=True)
class Plan:
    """What a prune does: partitions it drops, then walks it deletes batch by batch."""

    walks: list[Walk]
    drops: list[tuple[Walk, str]]  # a partition and the walk over its table it replaces
    kept: tuple[str, ...]  # kinds kept for good
    listed: list[Walk]  # the walks before partitions split them: every table they name

    def tally(self) -> Tally:
        """A tally listing every table, each with no rows yet."""
        tally = Tally()
        for walk in self.listed:
            for table in walk_tables(walk):
                tally.add(walk, table, 0)
        return tally


@dataclass
class Tally:
    """Rows per table, in the order the tables were first met."""

    tables: dict[str, TableRows] = field(default_factory=dict)

    def add(self, walk: Walk, table: str, rows: int) -> None:
        """Count `rows` more of `table`, met on `walk`."""
        before = self.tables.get(table)
        total = rows + (before.rows if before is not None else 0)
        self.tables[table] = TableRows(walk.scan.kind, table, total, walk.days, walk.cutoff)

    def counts(self, walk: Walk, row: Any) -> int:
        """Add a statement's counts (`removed`, `companion_<n>`) for `walk`; their sum."""
        found = [(walk.table_name, int(row.removed))]
        found += [
            (column.table.name, int(row._mapping[f"companion_{n}"]))
            for n, column in enumerate(walk.scan.companions)
        ]
        for table, rows in found:
            self.add(walk, table, rows)
        return sum(rows for _, rows in found)


async def count_prunable(
    connection: WorkflowConnection, settings: RetentionSettings
) -> PruneResult:
    """Count, per table, what `prune` with the same settings would delete now (a dry run)."""
    started = time.monotonic()
    planned = await plan(connection, settings)
    tally = planned.tally()  # every table listed, even with nothing to prune
    async with connection.autocommit.connect() as conn:
        for walk, partition in planned.drops:
            tally.add(walk, walk.table_name, await count_partition(conn, partition))
        for walk in planned.walks:
            row = await conn.execute(count_statement(walk.scan), {"duly_cutoff": walk.cutoff})
            tally.counts(walk, row.one())
    return PruneResult(
        False, tuple(tally.tables.values()), planned.kept, seconds=time.monotonic() - started
    )


async def prune(
    connection: WorkflowConnection,
    settings: RetentionSettings,
    *,
    max_batches: int | None = None,
    on_batch: Callable[[Batch], Awaitable[None]] | None = None,
) -> PruneResult:
    """Delete what is past its retention period, `settings.batch_size` rows a transaction.

    With `max_batches`, each walk makes at most that many batches (so no
    table waits for another's backlog, and the pass's length is bounded);
    the result says whether anything was left. `on_batch` is awaited after
    each batch commits. A partitioned table's partitions wholly past the cutoff are
    detached and dropped first, each a batch; its partitions made ahead (as
    `keep_partitions_ahead`) before that.
    """
    started = time.monotonic()
    if connection.attempt_log is not None:
        await keep_partitions_ahead(connection.engine, connection.attempt_log.__table__)
    planned = await plan(connection, settings)
    tally = planned.tally()
    batches = deleted = 0
    deleted_last = False
    complete = True
    for walk, partition in planned.drops:
        dropped = await drop_partition(
            connection.autocommit, connection.engine, walk.table_name, partition
        )
        if dropped is None:  # its table stayed locked: the next prune drops it
            complete = False
            continue
        batches += 1
        deleted += dropped
        tally.add(walk, walk.table_name, dropped)
        if on_batch is not None:
            await on_batch(Batch(walk.scan.kind, walk.table_name, dropped, batches, deleted))
    for walk in planned.walks:
        statement = batch_statement(walk.scan)
        made = 0
        while True:
            if max_batches is not None and made >= max_batches:
                complete = False
                break
            params = {
                "duly_cutoff": walk.cutoff,
                "duly_after_at": walk.after_at,
                "duly_after_key": walk.after_key,
                "duly_batch_size": settings.batch_size,
            }
            if deleted_last and settings.pause_ms:
                # After a batch that deleted: the disk (its WAL) and a CPU are the workers'.
                await asyncio.sleep(settings.pause_ms / 1000)
            async with connection.autocommit.connect() as conn:  # one statement, committed
                row = (await conn.execute(statement, params)).one()
            made += 1
            batches += 1
            now_deleted = tally.counts(walk, row)
            deleted += now_deleted
            deleted_last = now_deleted > 0
            if on_batch is not None:
                table = walk.table_name
                await on_batch(Batch(walk.scan.kind, table, now_deleted, batches, deleted))
            if row.chosen < settings.batch_size:
                break  # the walk reached the cutoff
            walk.after_at, walk.after_key = row.last_at, row.last_key
    return PruneResult(
        True,
        tuple(tally.tables.values()),
        planned.kept,
        batches=batches,
        complete=complete,
        seconds=time.monotonic() - started,
    )


async def plan(connection: WorkflowConnection, settings: RetentionSettings) -> Plan:
    """The walks to make, each with its cutoff from the database clock; the kinds kept.

    Seen signatures are walked whenever their table exists, up to now: past its
    expiry a signature is refused by its timestamp alone. The console's sessions
    likewise, a day back: an expired session opens nothing either.
    """
    signatures = func.to_regclass(literal(SEEN_SIGNATURES_TABLE)).isnot(None)
    sessions = func.to_regclass(literal(SESSIONS_TABLE)).isnot(None)
    async with connection.autocommit.connect() as conn:
        row = (await conn.execute(select(db_now(), signatures, sessions))).one()
    now, signatures_kept, sessions_kept = row
    assert isinstance(now, datetime)
    walks = []
    for scan in prune_scans(connection):
        days = settings.days_for(scan.kind)
        if days is not None:
            walks.append(Walk(scan, days, now - timedelta(days=days)))
    if signatures_kept:
        walks.append(Walk(signature_scan(), 0, now))
    if sessions_kept:
        cutoff = now - timedelta(days=SESSIONS_KEPT_DAYS)
        walks.append(Walk(sessions_scan(), SESSIONS_KEPT_DAYS, cutoff))
    kept = tuple(kind for kind in KINDS if settings.days_for(kind) is None)
    async with connection.autocommit.connect() as conn:
        split, drops = await split_walks(conn, walks)
    return Plan(split, drops, kept, walks)


async def split_walks(
    conn: AsyncConnection, walks: list[Walk]
) -> tuple[list[Walk], list[tuple[Walk, str]]]:
    """Each walk over a partitioned table split into its partitions to drop and its
    partitions to walk (`split_partitioned`); the others as they are."""
    kept: list[Walk] = []
    drops: list[tuple[Walk, str]] = []
    for walk in walks:
        split = await split_partitioned(conn, walk.scan, walk.cutoff)
        if split is None:
            kept.append(walk)
            continue
        partitions, scans = split
        drops += [(walk, partition) for partition in partitions]
        table = walk.scan.table.name
        kept += [Walk(scan, walk.days, walk.cutoff, reported=table) for scan in scans]
    return kept, drops


def walk_tables(walk: Walk) -> Iterable[str]:
    """The tables a walk deletes from: its own, then its companions'."""
    yield walk.table_name
    for column in walk.scan.companions:
        yield column.table.name


def count_statement(scan: Scan) -> Select[Any]:
    """How many rows the scan finds past :duly_cutoff, and how many companion rows they have."""
    prunable = select(scan.key.label("key")).where(*scan.conditions()).cte("prunable")
    companions = [
        select(func.count())
        .select_from(column.table)
        .where(column.in_(select(prunable.c.key)))
        .scalar_subquery()
        .label(f"companion_{n}")
        for n, column in enumerate(scan.companions)
    ]
    return select(count(prunable).label("removed"), *companions)


def batch_statement(scan: Scan) -> Select[Any]:
    """One batch: choose, delete with companions, and say where the walk stopped.

    Parameters: :duly_cutoff, :duly_batch_size, and the last row the previous
    batch chose, :duly_after_at and :duly_after_key (BEGINNING and None first).
    """
    table = scan.table
    after_at = scan.at >= bindparam("duly_after_at", type_=DateTime(timezone=True))
    past = or_(
        scan.at > bindparam("duly_after_at", type_=DateTime(timezone=True)),
        scan.key > bindparam("duly_after_key", type_=scan.key.type),
    )
    # The next rows in index order after the previous batch's last, past the cutoff.
    chosen = (
        select(literal_column("ctid").label("row_id"), scan.at.label("at"), scan.key.label("key"))
        .where(*scan.conditions(), after_at, past)
        .order_by(scan.at, scan.key)
        .limit(bindparam("duly_batch_size", type_=Integer))
        .cte("chosen")
    )
    # Deleted by their ctid (a TID scan); the conditions are checked again on each row, so
    # a row that moved since it was chosen (an execution run again, say) is left alone.
    chosen_ids = func.array(select(chosen.c.row_id).scalar_subquery())  # ARRAY(SELECT ...)
    removed = (
        delete(table)
        .where(literal_column("ctid") == any_(chosen_ids), *scan.conditions())
        .returning(scan.key.label("key"))
        .cte("removed")
    )
    companions = [
        delete(column.table)
        .where(column.in_(select(removed.c.key)))
        .returning(column)
        .cte(f"removed_{n}")
        for n, column in enumerate(scan.companions)
    ]
    last = select(chosen.c.at, chosen.c.key).order_by(chosen.c.at.desc(), chosen.c.key.desc())
    return select(
        count(chosen).label("chosen"),
        last.with_only_columns(chosen.c.at).limit(1).scalar_subquery().label("last_at"),
        last.with_only_columns(chosen.c.key).limit(1).scalar_subquery().label("last_key"),
        count(removed).label("removed"),
        *(count(cte).label(f"companion_{n}") for n, cte in enumerate(companions)),
    )


def count(cte: CTE) -> Any:
    """The number of rows of `cte`, as a scalar subquery."""
    return select(func.count()).select_from(cte).scalar_subquery()
