"""Append-only tables range-partitioned by a time column, one partition a UTC day.

`partition_by_day(table, column)` declares a table so; `create_all` then makes its
default partition and the days from today to DAYS_AHEAD ahead. `keep_partitions_ahead`
makes any that are missing, in one catalog query when none is; `partitions_of` lists
a table's partitions with their bounds, which pruning drops whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("duly.partitions")

DAYS_AHEAD = 14  # days after today that always have a partition of their own
PERIOD = timedelta(days=1)  # what one partition holds
MAX_NAME_BYTES = 63  # PostgreSQL's longest identifier
DAY_SUFFIX = "_p%Y%m%d"  # a day's partition: `{table}_p20261202`
DEFAULT_SUFFIX = "_default"  # the partition that holds any row no day's partition takes
PARTITIONED_BY = "duly_partitioned_by"  # a table's `info` key: the column it is ranged by

# Every partition of :parent with its bounds, NULL for MINVALUE or MAXVALUE (and for the
# default partition). A bound prints as FROM ('2026-12-02 00:00:00+00') TO (...).
PARTITIONS_QUERY = """
SELECT c.relname AS name,
       pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default,
       CAST(nullif(btrim(m[1], ''''), 'MINVALUE') AS timestamptz) AS lower,
       CAST(nullif(btrim(m[2], ''''), 'MAXVALUE') AS timestamptz) AS upper
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                               'FROM \\((.*)\\) TO \\((.*)\\)') AS m ON true
WHERE i.inhparent = to_regclass(:parent)
"""

# Makes the default partition and each day's of [today, today + ahead] that no partition
# overlaps, under a lock per table so two at once make each once. Rows the default took
# for such a day move into it first (PostgreSQL refuses the day's partition otherwise).
ENSURE_PARTITIONS = """
DO $duly$
DECLARE
    parent text := {parent};
    ranged text := {column};
    spare text := {default};
    shift interval := interval '0';
    today date;
    day date;
    day_start timestamptz;
    day_end timestamptz;
    partition text;
    moved boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('duly partitions ' || parent));
    IF to_regclass('duly_clock') IS NOT NULL THEN  -- the database clock, as db_now() reads it
        EXECUTE 'SELECT coalesce((SELECT shift FROM duly_clock), interval ''0'')' INTO shift;
    END IF;
    today := ((now() + shift) AT TIME ZONE 'UTC')::date;
    IF NOT EXISTS (SELECT 1 FROM ({partitions}) AS p WHERE p.is_default) THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', spare, parent);
    END IF;
    FOR day IN SELECT generate_series(today, today + {ahead}, interval '1 day')::date LOOP
        day_start := day::timestamp AT TIME ZONE 'UTC';
        day_end := (day + 1)::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM ({partitions}) AS p WHERE NOT p.is_default
                AND coalesce(p.lower, '-infinity') < day_end
                AND coalesce(p.upper, 'infinity') > day_start
        );
        partition := left(parent, {name_room}) || to_char(day, '{day_format}');
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= $1 AND %I < $2)',
                       spare, ranged, ranged) INTO moved USING day_start, day_end;
        IF moved THEN
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', partition, parent);
            EXECUTE format('WITH taken AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 '
                           'RETURNING *) INSERT INTO %I SELECT * FROM taken',
                           spare, ranged, ranged, partition) USING day_start, day_end;
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           parent, partition, day_start, day_end);
        ELSE
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                           partition, parent, day_start, day_end);
        END IF;
    END LOOP;
END
$duly$
"""


@dataclass(frozen=True)
class Partition:
    """One partition of a table: its name and the range it holds (None for the default)."""

    name: str
    lower: datetime | None  # inclusive; None: from the beginning (MINVALUE)
    upper: datetime | None  # exclusive; None: for ever (MAXVALUE)
    is_default: bool = False  # the default partition: whatever no range takes

    def holds_only_before(self, cutoff: datetime) -> bool:
        """Whether every row this partition can hold is older than `cutoff`."""
        return not self.is_default and self.upper is not None and self.upper <= cutoff

    def holds_before(self, cutoff: datetime) -> bool:
        """Whether this partition can hold rows older than `cutoff`."""
        return self.is_default or self.lower is None or self.lower < cutoff


def partition_by_day(table: Table, column: str) -> None:
    """Declare `table` range-partitioned by `column` (part of its primary key), a UTC day a
    partition; `create_all` makes its first partitions."""
    table.dialect_kwargs["postgresql_partition_by"] = f"RANGE ({column})"
    table.info[PARTITIONED_BY] = column
    event.listen(table, "after_create", _create_first_partitions)


def _create_first_partitions(target: Table, connection: Connection, **kw: Any) -> None:
    connection.execute(text(ensure_partitions_sql(target.name, target.info[PARTITIONED_BY])))


def day_partition_name(parent: str, day: date) -> str:
    """The name of `parent`'s partition for `day`."""
    suffix = day.strftime(DAY_SUFFIX)
    return parent[: MAX_NAME_BYTES - len(suffix)] + suffix


def default_partition_name(parent: str) -> str:
    """The name of `parent`'s default partition."""
    return parent[: MAX_NAME_BYTES - len(DEFAULT_SUFFIX)] + DEFAULT_SUFFIX


def ensure_partitions_sql(parent: str, column: str, ahead: int = DAYS_AHEAD) -> str:
    """The DO block that makes `parent`'s missing partitions (see ENSURE_PARTITIONS)."""
    suffix_room = len(date(2000, 1, 1).strftime(DAY_SUFFIX))
    return ENSURE_PARTITIONS.format(
        parent=_literal(parent),
        column=_literal(column),
        default=_literal(default_partition_name(parent)),
        partitions=PARTITIONS_QUERY.replace(":parent", "parent"),
        ahead=int(ahead),
        name_room=MAX_NAME_BYTES - suffix_room,
        day_format=DAY_SUFFIX.replace("%Y%m%d", "YYYYMMDD"),
    )


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# One statement for a table: whether it is partitioned, the database clock's now (as
# db_now() reads it), and a row per partition (one row of NULLs when it has none).
LOOK_AHEAD_QUERY = f"""
SELECT t.relkind = 'p' AS partitioned,
       now() + coalesce((SELECT shift FROM duly_clock), interval '0') AS now,
       p.name, p.is_default, p.lower, p.upper
FROM pg_class t
LEFT JOIN ({PARTITIONS_QUERY}) AS p ON true
WHERE t.oid = to_regclass(:parent)
ORDER BY p.lower NULLS FIRST
"""


async def look_ahead(
    conn: AsyncConnection, parent: str
) -> tuple[list[Partition] | None, datetime | None]:
    """`parent`'s partitions, oldest first (the default first), or None when it is not a
    partitioned table (say an attempt log its migrations did not convert); and the
    database clock's now (None when the table is missing). One catalog query."""
    rows = (await conn.execute(text(LOOK_AHEAD_QUERY), {"parent": parent})).all()
    if not rows or not rows[0].partitioned:
        return None, rows[0].now if rows else None
    found = [Partition(r.name, r.lower, r.upper, r.is_default) for r in rows if r.name]
    return found, rows[0].now


async def partitions_of(conn: AsyncConnection, parent: str) -> list[Partition] | None:
    """`parent`'s partitions, oldest first; None when it is not a partitioned table."""
    return (await look_ahead(conn, parent))[0]


def missing_days(partitions: list[Partition], today: date, ahead: int = DAYS_AHEAD) -> list[date]:
    """The days of [today, today + ahead] no partition overlaps."""
    ranges = [(p.lower, p.upper) for p in partitions if not p.is_default]
    missing = []
    for offset in range(ahead + 1):
        day = today + timedelta(days=offset)
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + PERIOD
        overlaps = (
            (low is None or low < end) and (high is None or high > start) for low, high in ranges
        )
        if not any(overlaps):
            missing.append(day)
    return missing


async def keep_partitions_ahead(engine: AsyncEngine, table: Table) -> list[date]:
    """Make the partitions `table` lacks for today and DAYS_AHEAD ahead (and its default).

    Owns its transaction. Nothing happens for a table that is not partitioned, and
    when none is missing it costs one catalog query. Two callers at once make each
    partition once. A database error (a role that may not create tables, a missing
    `duly_clock`) is logged, not raised: until a partition is made, its rows go to
    the default one.
    Returns the days that were missing.
    """
    column = table.info.get(PARTITIONED_BY)
    if column is None:
        return []
    async with engine.connect() as conn:
        try:
            found, now = await look_ahead(conn, table.name)
        except DBAPIError as exc:  # no duly_clock, say: the process goes on without
            log.warning("Could not read the partitions of %s: %s", table.name, exc)
            return []
        if found is None or now is None:
            return []
        missing = missing_days(found, now.astimezone(UTC).date())
        if not missing and any(p.is_default for p in found):
            return []
        await conn.rollback()  # the catalog reads' transaction: the DDL gets its own
        try:
            async with conn.begin():
                await conn.execute(text(ensure_partitions_sql(table.name, column)))
        except DBAPIError as exc:
            log.warning("Could not make the partitions of %s: %s", table.name, exc)
        return missing
