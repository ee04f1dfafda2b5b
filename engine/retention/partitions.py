"""Pruning a partitioned table: drop each partition wholly older than the cutoff, walk the rest.

`split_partitioned` turns a walk over a partitioned table into the partitions to drop
and one walk per partition that still holds rows before the cutoff (the day
that straddles it, and the default partition): those are deleted batch by batch as an
unpartitioned table is. A table that is not partitioned keeps its one walk.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, MetaData, Table, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.partitions import Partition, partitions_of
from engine.model.connection import WorkflowConnection
from engine.retention.scans import Scan

LOCK_TIMEOUT = "2s"  # how long a detach waits for the table's lock before trying again
LOCK_TRIES = 3  # detaches tried before the partition is left to the next prune
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout


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


async def count_partition(conn: AsyncConnection, partition: str) -> int:
    """The rows of one partition: PostgreSQL's count from its last VACUUM or ANALYZE, or,
    for a partition never analyzed, counted.

    A day's partition is analyzed by autovacuum while it fills, long before it is
    old enough to drop; counting ten million rows would cost more than the drop.
    """
    quoted = conn.dialect.identifier_preparer.quote(partition)
    known = await conn.scalar(
        text("SELECT reltuples FROM pg_class WHERE oid = CAST(:partition AS regclass)"),
        {"partition": quoted},
    )
    if known is not None and known >= 0:
        return round(float(known))
    return int(await conn.scalar(text(f"SELECT count(*) FROM {quoted}")) or 0)


async def drop_partition(connection: WorkflowConnection, table: str, partition: str) -> int | None:
    """Detach and drop one partition, a short transaction of its own; the rows it held,
    or None when its table stayed locked (the next prune tries again).

    A plain DETACH, not CONCURRENTLY: PostgreSQL refuses that beside a default
    partition. It holds the table's lock for a catalog change only, and gives up
    after LOCK_TIMEOUT rather than queue the steps' commits behind it for long.
    """
    async with connection.autocommit.connect() as conn:
        rows = await count_partition(conn, partition)
        quote = conn.dialect.identifier_preparer.quote
    parent, quoted = quote(table), quote(partition)
    for _ in range(LOCK_TRIES):
        try:
            async with connection.engine.begin() as conn:
                await conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                await conn.execute(text(f"ALTER TABLE {parent} DETACH PARTITION {quoted}"))
                await conn.execute(text(f"DROP TABLE {quoted}"))
            return rows
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
    return None
