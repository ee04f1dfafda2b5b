"""A partition dropped whole: counted first (from PostgreSQL's statistics), then detached
and dropped in a short transaction that gives up rather than wait long for its table's lock.

Pruning (`engine.retention`) drops so every partition wholly older than its cutoff.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

LOCK_TIMEOUT = "2s"  # how long a detach waits for the table's lock before trying again
LOCK_TRIES = 3  # detaches tried before the partition is left to the next prune
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout


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


async def drop_partition(
    autocommit: AsyncEngine, engine: AsyncEngine, table: str, partition: str
) -> int | None:
    """Detach and drop one partition, a short transaction of `engine`'s (counted first on
    `autocommit`); the rows it held, or None when its table stayed locked (the next prune
    tries again).

    A plain DETACH, not CONCURRENTLY: PostgreSQL refuses that beside a default
    partition. It holds the table's lock for a catalog change only, and gives up
    after LOCK_TIMEOUT rather than queue the steps' commits behind it for long.
    """
    async with autocommit.connect() as conn:
        rows = await count_partition(conn, partition)
        quote = conn.dialect.identifier_preparer.quote
    parent, quoted = quote(table), quote(partition)
    for _ in range(LOCK_TRIES):
        try:
            async with engine.begin() as conn:
                await conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                await conn.execute(text(f"ALTER TABLE {parent} DETACH PARTITION {quoted}"))
                await conn.execute(text(f"DROP TABLE {quoted}"))
            return rows
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
    return None
