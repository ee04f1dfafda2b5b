"""duly_0009: the example app's attempt log converted to partitioned by day, and back.

- upgrading a log with rows keeps every row, makes the old table one partition up to the
  end of its newest row's UTC day (not rewritten: the same relfilenode) and the days after
  it, new rows go to their day, and autogenerate finds nothing to change:
  test_the_upgrade_keeps_the_rows_in_one_partition
- downgrading copies every row back into a plain table, the schema as duly_0008 made it,
  ids going on from the same sequence: test_the_downgrade_gives_back_a_plain_table
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.partitions import DAYS_AHEAD, day_partition_name, default_partition_name
from infra.schema.migrate import migrations_for
from tests.conftest import Database, Server, fresh_database
from tests.schema_helpers import HEAD, insert_attempts, schema, table_partitions, version

EXAMPLES = "functions.examples"
LOG = "workflow_attempt"
BEFORE = "duly_0008"


def rows(db: Database) -> list[tuple[object, ...]]:
    return db.sql(f"SELECT id, finished_at FROM {LOG} ORDER BY id")


def partitions(db: Database) -> list[str]:
    """The log's partitions, by name."""
    return table_partitions(db, LOG)


def now(db: Database) -> datetime:
    [(at,)] = db.sql("SELECT now()")
    assert isinstance(at, datetime)
    return at


async def test_the_upgrade_keeps_the_rows_in_one_partition(db: Database) -> None:
    migrations = migrations_for(EXAMPLES, None, db.url)
    engine = db.engine()
    await migrations.upgrade(engine, BEFORE)
    at = now(db)
    insert_attempts(db, LOG, "lookup", at - timedelta(days=40), at - timedelta(days=3), at)
    before = rows(db)
    [(file,)] = db.sql(f"SELECT pg_relation_filenode('{LOG}')")

    assert await migrations.upgrade(engine) == ((BEFORE,), (HEAD,))
    assert rows(db) == before
    old = f"{LOG}_unpartitioned"
    [(bound,)] = db.sql(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = %s", old
    )
    tomorrow = (at.astimezone(UTC) + timedelta(days=1)).date()
    assert bound == f"FOR VALUES FROM (MINVALUE) TO ('{tomorrow} 00:00:00+00')"
    assert db.sql(f"SELECT pg_relation_filenode('{old}')") == [(file,)]  # not rewritten
    days = [day_partition_name(LOG, tomorrow + timedelta(days=n)) for n in range(DAYS_AHEAD)]
    assert partitions(db) == sorted([old, default_partition_name(LOG), *days])
    insert_attempts(db, LOG, "lookup", at + timedelta(days=1))
    [(where,)] = db.sql(f"SELECT tableoid::regclass::text FROM {LOG} ORDER BY id DESC LIMIT 1")
    assert where == day_partition_name(LOG, (at + timedelta(days=1)).astimezone(UTC).date())
    [(last,)] = db.sql(f"SELECT max(id) FROM {LOG}")
    assert last == 4  # the same sequence, going on
    assert await migrations.check(engine) == []


async def test_the_downgrade_gives_back_a_plain_table(db: Database, server: Server) -> None:
    migrations = migrations_for(EXAMPLES, None, db.url)
    engine = db.engine()
    await migrations.upgrade(engine)
    at = now(db)
    insert_attempts(db, LOG, "lookup", at - timedelta(days=100), at, at + timedelta(days=2))
    before = rows(db)

    assert await migrations.downgrade(engine, BEFORE) == (BEFORE,)
    assert version(db) == [BEFORE]
    assert rows(db) == before
    assert partitions(db) == []
    async with fresh_database(server) as reference:
        await migrations_for(EXAMPLES, None, reference.url).upgrade(reference.engine(), BEFORE)
        assert schema(db) == schema(reference)
    insert_attempts(db, LOG, "lookup", at)
    [(last,)] = db.sql(f"SELECT max(id) FROM {LOG}")
    assert last == 4
    # And up again: the rows back in one partition.
    await migrations.upgrade(engine)
    assert len(rows(db)) == 4
    assert f"{LOG}_unpartitioned" in partitions(db)
