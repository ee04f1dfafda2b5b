"""Pruning a month of attempt-log rows by dropping day partitions, beside the DELETE path.

    python bench/partitions.py [--rows 10000000] [--kept 100000] [--json PATH]

It starts its own embedded PostgreSQL (fsync on) with two databases: one whose attempt
log is partitioned a day a partition (as `create_all` and duly_0009 make it), one with
the same log as a plain table (an app whose migrations did not convert it). Each gets
`--rows` rows finished over the 30 whole UTC days before the day of the retention cutoff
and `--kept` rows after it, by `INSERT ... SELECT generate_series`, then VACUUM ANALYZE.
Then `engine.retention.prune` (30 days, no pause) runs on each: its time, the WAL it
wrote and the dead tuples left in what remains of the log. bench/README.md says more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script, Python puts bench/ on the path

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine  # noqa: E402
from sqlalchemy.orm import DeclarativeBase  # noqa: E402

from engine import declare_engine_tables  # noqa: E402
from engine.model.connection import open_connection  # noqa: E402
from engine.partitions import day_partition_name, unpartition_attempt_log  # noqa: E402
from engine.retention import RetentionSettings, count_prunable, prune  # noqa: E402
from infra.embedded import start_embedded  # noqa: E402

PARTITIONED = "bench_parted_attempts"
PLAIN = "bench_plain_attempts"
DAYS = 30  # the retention period, and the days the month's rows are spread over
ROWS = 10_000_000  # the month's rows, all past the period
KEPT = 100_000  # rows within the period, which the prune keeps
DEAD_WAIT = 10.0  # seconds the DELETE path's dead tuples get to reach the statistics
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "partitions.json"
COLUMNS = "workflow, run_key, step, attempt, outcome, error, took_ms, finished_at"


class PartitionedBase(DeclarativeBase):
    """The partitioned log's base."""


class PlainBase(DeclarativeBase):
    """The plain log's base (created partitioned, then made plain as duly_0009's downgrade)."""


declare_engine_tables(PartitionedBase, events=False, names={"attempt_log": PARTITIONED})
declare_engine_tables(PlainBase, events=False, names={"attempt_log": PLAIN})


async def measure(partitioned_url: str, plain_url: str, rows: int, kept: int) -> dict[str, Any]:
    """Fill both databases, prune each; the figures of each path."""
    results: dict[str, Any] = {"rows": rows, "kept": kept, "days": DAYS}
    for path, url, base, table in (
        ("partitioned", partitioned_url, PartitionedBase, PARTITIONED),
        ("delete", plain_url, PlainBase, PLAIN),
    ):
        engine = create_async_engine(url)
        try:
            results[path] = await measure_one(engine, base, table, rows, kept)
        finally:
            await engine.dispose()
    return results


async def measure_one(
    engine: AsyncEngine, base: type[DeclarativeBase], table: str, rows: int, kept: int
) -> dict[str, Any]:
    """Create, fill, prune and inspect one log."""
    async with engine.begin() as conn:
        await conn.run_sync(base.metadata.create_all)
        if table == PLAIN:
            for statement in unpartition_attempt_log(table):
                await conn.execute(text(statement))
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
    cutoff_day = (now - timedelta(days=DAYS)).astimezone(UTC).date()
    month_start = datetime.combine(cutoff_day - timedelta(days=DAYS), datetime.min.time(), UTC)
    kept_start = month_start + timedelta(days=DAYS + 1)  # the day after the cutoff's
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    began = time.perf_counter()
    async with autocommit.connect() as conn:
        if table == PARTITIONED:  # the days before today, as keeping ahead made them then
            day = month_start.date()
            while day < now.astimezone(UTC).date():
                await create_day(conn, table, datetime.combine(day, datetime.min.time(), UTC))
                day += timedelta(days=1)
        await fill(conn, table, month_start, timedelta(days=DAYS), rows)
        await fill(conn, table, kept_start, now - timedelta(hours=1) - kept_start, kept)
        await conn.execute(text(f"VACUUM ANALYZE {table}"))
        fill_seconds = time.perf_counter() - began
        wal_before = (await conn.execute(text("SELECT pg_current_wal_lsn()"))).scalar_one()
    connection = await open_connection(async_sessionmaker(engine))
    settings = RetentionSettings(attempts_days=DAYS, pause_ms=0)
    started = time.perf_counter()
    counted = await count_prunable(connection, settings)  # the dry run: exact counts
    dry_seconds = time.perf_counter() - started
    started = time.perf_counter()
    done = await prune(connection, settings)
    seconds = time.perf_counter() - started
    deleted = sum(t.rows for t in done.tables if t.table == table)
    if sum(t.rows for t in counted.tables if t.table == table) != deleted:
        raise RuntimeError(f"{table}: the dry run counted other than the prune deleted")
    await engine.dispose()  # its backends exit, and with them their statistics are sent
    async with autocommit.connect() as conn:
        wal = await conn.scalar(
            text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:lsn AS pg_lsn))"),
            {"lsn": wal_before},
        )
        left = await conn.scalar(text(f"SELECT count(*) FROM {table}"))
        dead = await dead_tuples(conn, table, deleted if table == PLAIN else 0)
        partitions = await conn.scalar(
            text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
            {"t": table},
        )
    if deleted != rows or left != kept:
        raise RuntimeError(f"{table}: pruned {deleted} rows and left {left}, not {rows}, {kept}")
    return {
        "fill_s": round(fill_seconds, 1),
        "prune_s": round(seconds, 3),
        "dry_run_s": round(dry_seconds, 3),
        "deleted": deleted,
        "left": left,
        "transactions": done.batches,
        "wal_bytes": int(wal or 0),
        "dead_tuples_left": dead,
        "partitions_left": partitions,
    }


async def create_day(conn: Any, table: str, start: datetime) -> None:
    """The partition of the UTC day from `start`, if missing."""
    name = day_partition_name(table, start.date())
    end = start + timedelta(days=1)  # DDL takes no parameters: ISO times, quoted
    await conn.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} "
            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
        )
    )


async def fill(conn: Any, table: str, start: datetime, span: timedelta, rows: int) -> None:
    """`rows` log rows finished evenly over [start, start + span), server side."""
    await conn.execute(
        text(
            f"INSERT INTO {table} ({COLUMNS}) SELECT 'bench_noop', g::text, 'run', 1, 'ok', "
            "NULL, 1.0, CAST(:start AS timestamptz) + make_interval(secs => g * :step) "
            "FROM generate_series(0, :rows - 1) AS g"
        ),
        {"start": start, "step": span.total_seconds() / rows, "rows": rows},
    )


async def dead_tuples(conn: Any, table: str, expected: int) -> int:
    """The dead tuples of what is left of the log (each partition's), once the statistics
    show at least `expected` of them or DEAD_WAIT has passed."""
    query = text(
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
        "WHERE relid = to_regclass(:t) OR relid IN "
        "(SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(:t))"
    )
    deadline = time.monotonic() + DEAD_WAIT
    while True:
        dead = int(await conn.scalar(query, {"t": table}) or 0)
        if dead >= expected or time.monotonic() > deadline:
            return dead
        await asyncio.sleep(0.2)


def load_average() -> list[float]:
    with contextlib.suppress(OSError):
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return []


def format_results(results: dict[str, Any]) -> str:
    lines = [
        f"Pruning {results['rows']:,} attempt-log rows of {results['days']} days "
        f"(keeping {results['kept']:,}); load before: {results['load_before']}",
        f"{'path':<12} {'prune s':>9} {'dry run s':>9} {'txns':>6} {'WAL bytes':>14} "
        f"{'dead left':>10} {'parts left':>10} {'fill s':>8}",
    ]
    for path in ("partitioned", "delete"):
        r = results[path]
        lines.append(
            f"{path:<12} {r['prune_s']:>9.3f} {r['dry_run_s']:>9.3f} {r['transactions']:>6} "
            f"{r['wal_bytes']:>14,} {r['dead_tuples_left']:>10,} {r['partitions_left']:>10} "
            f"{r['fill_s']:>8.1f}"
        )
    return "\n".join(lines)


async def run(rows: int, kept: int) -> dict[str, Any]:
    server = start_embedded()
    try:
        admin = server.conninfo_for("postgres")
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            for name in ("bench_partitioned", "bench_plain"):
                await conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
                )
                await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        load = load_average()
        results = await measure(
            server.url_for("bench_partitioned"), server.url_for("bench_plain"), rows, kept
        )
        return {**results, "load_before": load, "load_after": load_average()}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="the month's rows")
    parser.add_argument("--kept", type=int, default=KEPT, help="rows within the period")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.rows, args.kept))
    print(format_results(results))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"JSON written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
