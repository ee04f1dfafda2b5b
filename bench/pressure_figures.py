"""What the pressure bench reads from the database: every figure and invariant of a phase.

Each function takes an autocommit psycopg connection of the bench's own and
runs read-only statements: pickup percentiles of a phase's runs (both times
are wall clock, `time.time()` on this machine), the size and dead tuples of
every table and index in the database (all of them duly's), the WAL position
and counters, the backlog, the claim's cost (pg_stat_statements), and what
became of every run: finished, still queued, lost or run twice.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.pressure_app import ATTEMPTS_TABLE, TABLE

Connection = psycopg.AsyncConnection[Any]
RECOVERY_BUCKET = 1.0  # seconds of offers whose pickup p99 is compared with the clean phase's
RECOVERY_RUN = 2  # consecutive buckets within bound that count as recovered
RECOVERY_BOUND = 1.2  # within 20% of the clean phase's p99
SLICES = 10  # equal slices of a phase, for drift within it

PICKUP = f"""
    SELECT count(*), count(started_at),
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY started_at - offered_at),
           max(started_at - offered_at), min(offered_at), max(offered_at),
           count(DISTINCT offered_at)
      FROM {TABLE} WHERE phase = %s"""
SLICED = f"""
    SELECT width_bucket(offered_at, %s, %s, {SLICES}) AS slice, count(*),
           percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - offered_at)
      FROM {TABLE} WHERE phase = %s GROUP BY slice ORDER BY slice"""
BUCKETS = f"""
    SELECT floor((offered_at - %s) / {RECOVERY_BUCKET})::int AS bucket,
           count(*) = count(started_at) AS complete,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - offered_at)
      FROM {TABLE} WHERE phase = %s GROUP BY bucket ORDER BY bucket"""
TABLES = """
    SELECT relname, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count,
           pg_relation_size(relid), pg_total_relation_size(relid)
      FROM pg_stat_user_tables ORDER BY relname"""
INDEXES = """
    SELECT indexrelname, relname, pg_relation_size(indexrelid)
      FROM pg_stat_user_indexes ORDER BY indexrelname"""
WAL = "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
WAL_IO = "SELECT sum(writes), sum(fsyncs) FROM pg_stat_io WHERE object = 'wal'"  # PostgreSQL 18
WAL_OLD = "SELECT wal_write, wal_sync FROM pg_stat_wal"  # before 18
BACKLOG = f"SELECT count(*) FROM {TABLE} WHERE next_step IS NOT NULL"
DONE = f"SELECT count(*) FROM {TABLE} WHERE next_step IS NULL"
STARTED_IN = f"SELECT count(*) FROM {TABLE} WHERE started_at >= %s AND started_at < %s"
UNFINISHED = f"SELECT count(*) FROM {TABLE} WHERE phase = ANY(%s) AND next_step IS NOT NULL"
# Each run of `phases` by what became of it. Unfinished runs are lost when no claim will take
# them (no wake_at) or when one passed them over: due (a claim moves wake_at to its lease's
# end) before %s, a moment the workers had caught up with the backlog two leases later.
OUTCOMES = f"""
    WITH runs AS (SELECT id, next_step, wake_at, ran FROM {TABLE} WHERE phase = ANY(%s)),
    ok AS (
        SELECT run_key, count(*) AS n FROM {ATTEMPTS_TABLE}
         WHERE workflow = '{TABLE}' AND outcome = 'ok' GROUP BY run_key
    )
    SELECT count(*),
           count(*) FILTER (WHERE r.next_step IS NOT NULL),
           count(*) FILTER (WHERE r.ran > 1 OR ok.n > 1),
           count(*) FILTER (WHERE r.next_step IS NULL AND (r.ran < 1 OR ok.n IS NULL)),
           count(*) FILTER (WHERE r.next_step IS NOT NULL AND r.wake_at IS NULL),
           count(*) FILTER (WHERE r.next_step IS NOT NULL AND r.wake_at < to_timestamp(%s))
      FROM runs r LEFT JOIN ok ON ok.run_key = r.id::text"""
# The claim: the statement that locks due probe rows (FOR UPDATE SKIP LOCKED) and leases them.
CLAIMS = """
    SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0), coalesce(sum(rows), 0)
      FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND query LIKE %s AND query LIKE %s"""
CLAIM_TEXT = ("%FOR UPDATE SKIP LOCKED%", f"%UPDATE {TABLE} SET%")
FAILED_ATTEMPTS = f"""
    SELECT count(*) FROM {ATTEMPTS_TABLE} a JOIN {TABLE} r ON a.run_key = r.id::text
     WHERE a.outcome <> 'ok' AND r.phase = ANY(%s)"""


async def one_row(conn: Connection, query: str, *params: Any) -> tuple[Any, ...]:
    cursor = await conn.execute(query, params or None)
    row = await cursor.fetchone()
    assert row is not None, query
    return tuple(row)


async def count(conn: Connection, query: str, *params: Any) -> int:
    return int((await one_row(conn, query, *params))[0])


async def pickup(conn: Connection, phase: str) -> dict[str, Any]:
    """Runs offered in `phase`, how many started, pickup p50/p99/max in milliseconds, and the
    producer's batches a second (a batch's rows share their `offered_at`)."""
    row = await one_row(conn, PICKUP, phase)
    offered, started, percentiles, longest, first, last, batches = row
    p50, p99 = percentiles if percentiles else (None, None)
    return {
        "offered": offered,
        "started": started,
        "pickup_p50_ms": None if p50 is None else p50 * 1000,
        "pickup_p99_ms": None if p99 is None else p99 * 1000,
        "pickup_max_ms": None if longest is None else longest * 1000,
        "offered_per_s": offered / (last - first) if offered > 1 and last > first else None,
        "batches_per_s": batches / (last - first) if batches > 1 and last > first else None,
    }


async def slices(conn: Connection, phase: str, began: float, ended: float) -> list[dict[str, Any]]:
    """Runs offered and pickup p99 in each of SLICES equal slices of the phase: its drift."""
    cursor = await conn.execute(SLICED, (began, ended, phase))
    return [
        {"slice": index, "offered": n, "pickup_p99_ms": None if p99 is None else p99 * 1000}
        for index, n, p99 in await cursor.fetchall()
    ]


async def p99_by_second(conn: Connection, phase: str, since: float) -> list[float | None]:
    """Pickup p99 (ms) of `phase`'s runs by the RECOVERY_BUCKET after `since` they were offered
    in, up to the first bucket still being offered or not all picked up."""
    cursor = await conn.execute(BUCKETS, (since, phase))
    series: list[float | None] = []
    for bucket, complete, p99 in await cursor.fetchall():
        if not complete or since + (bucket + 1) * RECOVERY_BUCKET > time.time():
            break  # every later bucket is not done either
        series += [None] * (bucket - len(series))  # seconds in which nothing was offered
        series.append(None if p99 is None else p99 * 1000)
    return series


def recovered_after(series: list[float | None], clean_p99_ms: float) -> float | None:
    """Seconds from which RECOVERY_RUN buckets in a row have a pickup p99 within
    RECOVERY_BOUND of the clean phase's; None if none yet."""
    bound, streak = clean_p99_ms * RECOVERY_BOUND, 0
    for bucket, p99 in enumerate(series):
        streak = streak + 1 if p99 is not None and p99 <= bound else 0
        if streak == RECOVERY_RUN:
            return float(bucket - RECOVERY_RUN + 1) * RECOVERY_BUCKET
    return None


async def relations(conn: Connection) -> dict[str, dict[str, Any]]:
    """Every table's live and dead tuples, updates (HOT among them), size; every index's size."""
    found: dict[str, dict[str, Any]] = {}
    for name, live, dead, updates, hot, autovacuums, size, total in await (
        await conn.execute(TABLES)
    ).fetchall():
        found[name] = {
            "kind": "table",
            "live_tuples": live,
            "dead_tuples": dead,
            "updates": updates,
            "hot_updates": hot,
            "autovacuums": autovacuums,
            "bytes": size,
            "total_bytes": total,
        }
    for name, table, size in await (await conn.execute(INDEXES)).fetchall():
        found[name] = {"kind": "index", "table": table, "bytes": size}
    return found


async def wal_counters(conn: Connection) -> dict[str, Any]:
    """The WAL's insert position and cumulative counters (writes and syncs where kept)."""
    lsn, records, fpi, wal_bytes = await one_row(conn, WAL)
    try:
        writes, syncs = await one_row(conn, WAL_IO)
    except psycopg.errors.UndefinedColumn:
        writes, syncs = await one_row(conn, WAL_OLD)
    return {
        "lsn": lsn,
        "records": int(records),
        "fpi": int(fpi),
        "bytes": int(wal_bytes),
        "writes": None if writes is None else int(writes),
        "syncs": None if syncs is None else int(syncs),
    }


async def wal_between(
    conn: Connection, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """The WAL written between two readings: bytes (by LSN), records, full pages, writes, syncs."""
    (written,) = await one_row(conn, "SELECT pg_wal_lsn_diff(%s, %s)", after["lsn"], before["lsn"])
    delta: dict[str, int | None] = {"bytes": int(written)}
    for key in ("records", "fpi", "writes", "syncs"):
        ok = before[key] is not None and after[key] is not None
        delta[key] = after[key] - before[key] if ok else None
    return delta


async def invariants(
    conn: Connection, phases: list[str], passed_over_before: float | None
) -> dict[str, int]:
    """Runs tagged with `phases` and what became of them, from the database alone.

    `passed_over_before` is a time.time(): an unfinished run due before it counts as lost
    (None: no such moment, the workers never caught up, so none counts so).
    """
    runs, unfinished, ran_twice, finished_unrun, never_due, passed_over = await one_row(
        conn, OUTCOMES, phases, passed_over_before
    )
    failed = await count(conn, FAILED_ATTEMPTS, phases)
    return {
        "runs": runs,
        "lost": finished_unrun + never_due + passed_over,
        "finished_unrun": finished_unrun,
        "never_due": never_due,
        "passed_over": passed_over,
        "still_queued": unfinished - never_due - passed_over,
        "ran_twice": ran_twice,
        "failed_attempts": failed,
    }


async def claim_counters(conn: Connection) -> dict[str, float] | None:
    """pg_stat_statements' cumulative calls, time and rows of the claim; None without it."""
    try:
        calls, total_ms, rows = await one_row(conn, CLAIMS, *CLAIM_TEXT)
    except psycopg.errors.UndefinedTable:
        return None
    return {"calls": int(calls), "total_ms": float(total_ms), "rows": int(rows)}


def claim_between(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float | None]:
    """The claims made between two readings: how many, mean ms a call, rows a call."""
    if before is None or after is None:
        return {"calls": None, "mean_ms": None, "rows_per_call": None}
    calls = after["calls"] - before["calls"]
    total, rows = after["total_ms"] - before["total_ms"], after["rows"] - before["rows"]
    return {
        "calls": calls,
        "mean_ms": total / calls if calls else None,
        "rows_per_call": rows / calls if calls else None,
    }
