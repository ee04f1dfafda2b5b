"""The attempt log partitioned a UTC day a partition by finished_at (engine.partitions,
engine.retention's split of its walks).

- `create_all` makes it partitioned, with its default partition and a partition for each
  day from today to DAYS_AHEAD ahead: test_create_all_makes_the_days_ahead
- keeping ahead is one catalog query when nothing is missing, makes what is missing
  (and only that), and two at once make each partition once:
  test_keeping_ahead_is_one_query_when_nothing_is_missing,
  test_keeping_ahead_makes_what_is_missing_once_even_two_at_once
- a row at a day's boundary goes to the day it starts; a row with no day's partition is
  kept by the default one, and moved to its day when that day's partition is made:
  test_a_row_at_the_boundary_and_a_row_with_no_partition
- prune drops every partition wholly past the cutoff, deletes the straddling day's rows
  past it (and the default partition's), keeps the rest; the dry run counts the same:
  test_prune_drops_whole_days_and_deletes_the_straddling_remainder
- an attempt log that is not partitioned keeps the DELETE path, and keeping ahead does
  nothing to it: test_an_unpartitioned_log_keeps_the_delete_path
- `python bench/partitions.py`, small: both paths prune every row past the period, the
  partitioned one leaving no dead tuple: test_the_bench_measures_both_paths
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase

from bench.partitions import measure
from engine import declare_engine_tables
from engine.model.connection import open_connection
from engine.partitions import (
    DAYS_AHEAD,
    day_partition_name,
    default_partition_name,
    keep_partitions_ahead,
    partitions_of,
)
from engine.retention import Batch, PruneResult, RetentionSettings, count_prunable, prune
from engine.testing import move_clock
from tests.conftest import Database, Server, fresh_database
from tests.schema_helpers import insert_attempts, table_partitions

LOG = "parted_attempts"
Sessions = async_sessionmaker[AsyncSession]


class Base(DeclarativeBase):
    """These tests' own base: an attempt log and nothing else."""


tables = declare_engine_tables(Base, events=False, names={"attempt_log": LOG})
Log = tables.attempt_log


def today(db: Database) -> date:
    """The database clock's UTC date."""
    [(now,)] = db.sql("SELECT now() + coalesce((SELECT shift FROM duly_clock), interval '0')")
    assert isinstance(now, datetime)
    return now.astimezone(UTC).date()


def partitions(db: Database) -> list[str]:
    """The log's partitions, by name."""
    return table_partitions(db, LOG)


def days_from(first: date, count: int) -> list[str]:
    return [day_partition_name(LOG, first + timedelta(days=n)) for n in range(count)]


def where_rows_are(db: Database) -> dict[str, int]:
    """How many rows each partition holds."""
    rows = db.sql(f"SELECT tableoid::regclass::text, count(*) FROM {LOG} GROUP BY 1")
    return {str(name): int(str(count)) for name, count in rows}


def logged(result: PruneResult) -> int:
    """The rows of the log a dry run counted or a prune deleted."""
    return sum(t.rows for t in result.tables if t.table == LOG)


def record(batches: list[Batch]) -> Callable[[Batch], Awaitable[None]]:
    async def on_batch(batch: Batch) -> None:
        batches.append(batch)

    return on_batch


def waiting_on_advisory_locks(db: Database) -> int:
    """How many sessions wait for an advisory lock."""
    [(count,)] = db.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    return int(str(count))


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


async def test_create_all_makes_the_days_ahead(db: Database) -> None:
    await db.create(Base.metadata)
    [(kind,)] = db.sql("SELECT relkind FROM pg_class WHERE relname = %s", LOG)
    assert kind == "p"
    [(key,)] = db.sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s", f"{LOG}_pkey"
    )
    assert key == "PRIMARY KEY (id, finished_at)"
    expected = [*days_from(today(db), DAYS_AHEAD + 1), default_partition_name(LOG)]
    assert partitions(db) == sorted(expected)


async def test_keeping_ahead_is_one_query_when_nothing_is_missing(db: Database) -> None:
    Session = await db.create(Base.metadata)
    engine = Session.kw["bind"]
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    assert await keep_partitions_ahead(engine, Log.__table__) == []
    event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert "pg_inherits" in statements[0]


async def test_keeping_ahead_makes_what_is_missing_once_even_two_at_once(db: Database) -> None:
    Session = await db.create(Base.metadata)
    before = partitions(db)
    first = today(db)
    gone = [first + timedelta(days=n) for n in (3, DAYS_AHEAD)]
    for day in gone:
        db.sql(f"DROP TABLE {day_partition_name(LOG, day)}")
    db.sql(f"DROP TABLE {default_partition_name(LOG)}")
    assert len(partitions(db)) == len(before) - 3
    # Both find them missing, then wait on the table's lock (held here) to make them.
    lock = f"SELECT pg_advisory_lock(hashtext('duly partitions {LOG}'))"
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as holder:
        await holder.execute(lock)
        engines = [Session.kw["bind"], db.engine()]
        both = [asyncio.create_task(keep_partitions_ahead(e, Log.__table__)) for e in engines]
        while waiting_on_advisory_locks(db) < 2:
            await asyncio.sleep(0.01)
        await holder.execute(lock.replace("pg_advisory_lock", "pg_advisory_unlock"))
        made = await asyncio.gather(*both)
    assert made == [gone, gone]  # both saw them missing; the second found them made
    assert partitions(db) == before
    assert await keep_partitions_ahead(db.engine(), Log.__table__) == []
    # Opening a connection keeps the log ahead too, as every process does.
    db.sql(f"DROP TABLE {day_partition_name(LOG, first + timedelta(days=5))}")
    await open_connection(Session)
    assert partitions(db) == before


async def test_a_row_at_the_boundary_and_a_row_with_no_partition(db: Database) -> None:
    Session = await db.create(Base.metadata)
    first = today(db)
    tomorrow = midnight(first + timedelta(days=1))
    far = midnight(first + timedelta(days=DAYS_AHEAD + 30))
    insert_attempts(db, LOG, "w", tomorrow, tomorrow - timedelta(microseconds=1), far)
    assert where_rows_are(db) == {
        day_partition_name(LOG, first): 1,
        day_partition_name(LOG, first + timedelta(days=1)): 1,
        default_partition_name(LOG): 1,  # kept, not lost: no day's partition holds it yet
    }
    # When its day's partition is made (the clock reaches it), the row moves there.
    await move_clock(Session, far - midnight(first))
    assert far.date() in await keep_partitions_ahead(db.engine(), Log.__table__)
    assert where_rows_are(db)[day_partition_name(LOG, far.date())] == 1
    assert default_partition_name(LOG) not in where_rows_are(db)
    assert db.sql(f"SELECT count(*) FROM {LOG}") == [(3,)]


async def test_prune_drops_whole_days_and_deletes_the_straddling_remainder(
    db: Database,
) -> None:
    Session = await db.create(Base.metadata)
    # The clock at noon, 40 days back: keeping ahead makes days -40 to -26 (counted from
    # the day the clock is then put back to).
    [(now,)] = db.sql("SELECT now()")
    assert isinstance(now, datetime)
    noon = midnight(now.astimezone(UTC).date()) + timedelta(hours=12)
    await move_clock(Session, noon - now - timedelta(days=40))
    await keep_partitions_ahead(db.engine(), Log.__table__)
    await move_clock(Session, timedelta(days=40))
    cutoff = noon - timedelta(days=30)  # within a few seconds: the test takes less
    old = [cutoff - timedelta(days=d, hours=1) for d in range(10)]  # days -31 to -40, -30
    straddling_old = cutoff - timedelta(hours=2)  # day -30, before the cutoff
    straddling_new = cutoff + timedelta(hours=2)  # day -30, after it
    new = [cutoff + timedelta(days=d) for d in range(1, 4)]
    long_ago = cutoff - timedelta(days=400)  # no day's partition: the default one
    insert_attempts(db, LOG, "w", *old, straddling_old, straddling_new, *new, long_ago)
    dropped = set(days_from(cutoff.date() - timedelta(days=10), 10))  # days -40 to -31
    assert dropped <= set(partitions(db))
    past = len(old) + 2  # and straddling_old, long_ago

    connection = await open_connection(Session)
    settings = RetentionSettings(attempts_days=30, pause_ms=0, batch_size=2)
    counted = await count_prunable(connection, settings)
    assert logged(counted) == past
    walked: list[Batch] = []
    done = await prune(connection, settings, on_batch=record(walked))
    assert logged(done) == past
    assert done.complete
    # Ten days dropped, a batch each (day -40 empty); then the default partition's row, and
    # the straddling day's two rows before the cutoff, batch by batch.
    assert [b.deleted for b in walked if b.table == LOG] == [0] + [1] * 9 + [1, 2, 0]
    assert not dropped & set(partitions(db))
    assert day_partition_name(LOG, cutoff.date()) in partitions(db)
    left = db.sql(f"SELECT finished_at FROM {LOG} ORDER BY finished_at")
    assert [at for (at,) in left] == [straddling_new, *new]
    assert logged(await count_prunable(connection, settings)) == 0


async def test_an_unpartitioned_log_keeps_the_delete_path(db: Database) -> None:
    Session = await db.create(Base.metadata)
    # The log as an app whose migrations did not convert it has it: a plain table.
    db.sql(f"ALTER TABLE {LOG} RENAME TO parted_old")
    db.sql(f"CREATE TABLE {LOG} (LIKE parted_old INCLUDING ALL)")
    db.sql(f"ALTER SEQUENCE {LOG}_id_seq OWNED BY {LOG}.id")
    db.sql("DROP TABLE parted_old")
    assert partitions(db) == []
    [(now,)] = db.sql("SELECT now()")
    assert isinstance(now, datetime)
    insert_attempts(
        db, LOG, "w", *(now - timedelta(days=40 + n) for n in range(5)), now - timedelta(days=1)
    )

    engine = db.engine()
    async with engine.connect() as conn:
        assert await partitions_of(conn, LOG) is None
    assert await keep_partitions_ahead(engine, Log.__table__) == []
    connection = await open_connection(Session)
    assert partitions(db) == []
    settings = RetentionSettings(attempts_days=30, pause_ms=0, batch_size=2)
    counted = await count_prunable(connection, settings)
    assert logged(counted) == 5
    walked: list[Batch] = []
    done = await prune(connection, settings, on_batch=record(walked))
    assert logged(done) == 5
    assert [b.deleted for b in walked if b.table == LOG] == [2, 2, 1]  # batches, as before
    assert db.sql(f"SELECT count(*) FROM {LOG}") == [(1,)]


async def test_the_bench_measures_both_paths(server: Server) -> None:
    async with fresh_database(server) as parted, fresh_database(server) as plain:
        results = await measure(parted.url, plain.url, rows=3_000, kept=30)
    # measure() refuses a prune that deleted other than the month's rows, or left others.
    partitioned, deleted = results["partitioned"], results["delete"]
    assert partitioned["deleted"] == deleted["deleted"] == 3_000
    assert partitioned["dead_tuples_left"] == 0
    assert partitioned["partitions_left"] > 0 and deleted["partitions_left"] == 0
