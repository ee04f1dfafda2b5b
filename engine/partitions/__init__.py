"""Append-only tables range-partitioned by a time column, a UTC day a partition.

    partition_by_day(table, "finished_at")           # declared; create_all makes the first
    await keep_partitions_ahead(engine, table)       # the days ahead, made when missing
    op.execute(ensure_partitions_sql("its_log", "finished_at"))   # the same, in a revision
    for statement in partition_attempt_log("its_log"): op.execute(statement)

`days` declares, names, lists and makes partitions; `converting` turns an existing attempt
log into a partitioned one and back; `dropping` detaches and drops one whole, as pruning
does. docs/architecture.md ("Partitioned append-only tables") says why.
"""

from __future__ import annotations

from engine.partitions.converting import partition_attempt_log, unpartition_attempt_log
from engine.partitions.days import (
    DAYS_AHEAD,
    Partition,
    day_partition_name,
    default_partition_name,
    ensure_partitions_sql,
    keep_partitions_ahead,
    partition_by_day,
    partitions_of,
)
from engine.partitions.dropping import count_partition, drop_partition

__all__ = [
    "DAYS_AHEAD",
    "Partition",
    "count_partition",
    "day_partition_name",
    "default_partition_name",
    "drop_partition",
    "ensure_partitions_sql",
    "keep_partitions_ahead",
    "partition_attempt_log",
    "partition_by_day",
    "partitions_of",
    "unpartition_attempt_log",
]
