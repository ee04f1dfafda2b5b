"""The schema of a test's database as pg_catalog has it, and where Alembic says it is."""

from __future__ import annotations

from datetime import datetime

from tests.conftest import Database

# The schema as pg_catalog has it: every column (position, type, NOT NULL, default), every
# constraint and index as PostgreSQL prints its definition, every sequence; alembic's own
# bookkeeping table aside.
SCHEMA = """
SELECT 'column', c.relname, a.attnum || ' ' || a.attname,
       format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public'
UNION ALL
SELECT 'index', tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'sequence', sequencename, data_type::text, increment_by::text
FROM pg_sequences WHERE schemaname = 'public'
"""


def schema(db: Database) -> set[tuple[object, ...]]:
    return {row for row in db.sql(SCHEMA) if row[1] != "alembic_version"}


def tables(db: Database) -> set[str]:
    rows = db.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {str(name) for (name,) in rows}


def version(db: Database) -> list[str]:
    return [str(num) for (num,) in db.sql("SELECT version_num FROM alembic_version")]


HEAD = "duly_0009"  # duly's newest own revision (the attempt log partitioned by day)


def table_partitions(db: Database, table: str) -> list[str]:
    """The partitions of `table`, by name."""
    rows = db.sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        table,
    )
    return [str(name) for (name,) in rows]


def insert_attempts(db: Database, table: str, workflow: str, *times: datetime) -> None:
    """One attempt-log row of `workflow` in `table`, finished at each of `times`."""
    for at in times:
        db.sql(
            f"INSERT INTO {table} (workflow, run_key, step, attempt, outcome, took_ms, "
            "finished_at) VALUES (%s, '1', 'run', 1, 'ok', 1.0, %s)",
            workflow,
            at,
        )
