"""Converting an existing attempt log to one partitioned a day a partition, and back.

Statements for a revision to `op.execute` one by one (they render offline too), as
duly_0009 does for the example app's `workflow_attempt`; an app's own revisions call
them with their log's name. The old rows are not rewritten: the old table becomes one
partition, from the beginning to the end of the UTC day of its newest row (a CHECK
added first lets ATTACH skip its scan); going back copies the rows into a plain table.
"""

from __future__ import annotations

from engine.partitions.days import MAX_NAME_BYTES, ensure_partitions_sql

COLUMN = "finished_at"  # what the attempt log is partitioned by
UNPARTITIONED = "_unpartitioned"  # the old table's suffix once it is a partition
PARTITIONED = "_partitioned"  # the partitioned table's suffix while going back


def partition_attempt_log(table: str) -> list[str]:
    """`table` (an unpartitioned attempt log) made partitioned by finished_at, its rows kept."""
    old = _renamed(table, UNPARTITIONED)
    bound = _renamed(table, "_bound")
    return [
        f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE",
        *_set_aside(table, old),
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({COLUMN})",
        f"ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id",
        f"ALTER TABLE {old} ALTER COLUMN id DROP DEFAULT",
        f"ALTER TABLE {old} DROP CONSTRAINT {_renamed(table, '_pkey', old)}",
        *_key_and_indexes(table, f"id, {COLUMN}"),
        # The old rows: dropped with their table if there are none, else that table attached
        # whole, up to the end of the UTC day of its newest row (or of today).
        f"""
DO $duly$
DECLARE
    bound timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {old}) THEN
        DROP TABLE {old};
        RETURN;
    END IF;
    SELECT date_trunc('day', greatest(max({COLUMN}), now()) AT TIME ZONE 'UTC')
           AT TIME ZONE 'UTC' + interval '1 day'
    INTO bound FROM {old};
    EXECUTE format('ALTER TABLE {old} ADD CONSTRAINT {bound} CHECK ({COLUMN} < %L)', bound);
    EXECUTE format('ALTER TABLE {table} ATTACH PARTITION {old} '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    ALTER TABLE {old} DROP CONSTRAINT {bound};
END
$duly$
""",
        ensure_partitions_sql(table, COLUMN),
    ]


def unpartition_attempt_log(table: str) -> list[str]:
    """`table` (a partitioned attempt log) made a plain table again, its rows copied."""
    parted = _renamed(table, PARTITIONED)
    columns = (
        "id, workflow, run_key, step, attempt, outcome, error, took_ms, finished_at, "
        "traceback, args"
    )
    return [
        f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE",
        *_set_aside(table, parted),
        f"CREATE TABLE {table} (LIKE {parted} INCLUDING DEFAULTS)",
        f"ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id",
        f"ALTER TABLE {parted} ALTER COLUMN id DROP DEFAULT",
        f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {parted}",
        f"DROP TABLE {parted}",  # and its partitions
        *_key_and_indexes(table, "id"),
    ]


def _set_aside(table: str, aside: str) -> list[str]:
    """Rename `table`, its primary key and its two indexes, so their names are free."""
    return [
        f"ALTER TABLE {table} RENAME TO {aside}",
        f"ALTER TABLE {aside} RENAME CONSTRAINT {table}_pkey TO {_renamed(table, '_pkey', aside)}",
        *(
            f"ALTER INDEX {_index(table, kind)} RENAME TO {_index(aside, kind)}"
            for kind in ("run", "finished")
        ),
    ]


def _key_and_indexes(table: str, key: str) -> list[str]:
    """The attempt log's primary key and indexes, as the model declares them."""
    return [
        f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({key})",
        f"CREATE INDEX {_index(table, 'run')} ON {table} (workflow, run_key, id)",
        f"CREATE INDEX {_index(table, 'finished')} ON {table} ({COLUMN}, id)",
    ]


def _index(table: str, kind: str) -> str:
    return f"ix_{table}_{kind}"[:MAX_NAME_BYTES]


def _renamed(table: str, suffix: str, base: str | None = None) -> str:
    """`base` (or `table`) with `suffix`, cut to fit an identifier."""
    name = base or table
    return name[: MAX_NAME_BYTES - len(suffix)] + suffix
