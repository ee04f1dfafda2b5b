"""What the server spent on a stretch of work: WAL bytes, WAL writes and flushes, CPU seconds.

Two readings of the whole server; their difference is what ran on it meanwhile
(the bench's server runs one measurement at a time). The CPU counts exited
backends too, and leaves out the reading connection's own backend, which may
also poll. pg_walinspect splits the WAL between two positions by record kind.
bench/README.md says how each figure is read.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import children_of
from infra.embedded import EmbeddedPostgres

Connection = psycopg.AsyncConnection[Any]
WAL_POSITION = "SELECT pg_current_wal_lsn()::text, pg_backend_pid()"
WAL_IO = "SELECT sum(writes)::bigint, sum(fsyncs)::bigint FROM pg_stat_io WHERE object = 'wal'"
WAL_IO_BEFORE_18 = "SELECT wal_write, wal_sync FROM pg_stat_wal"
WAL_BY_KIND = """
    SELECT "resource_manager/record_type", count, combined_size, fpi_size
      FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0
     ORDER BY combined_size DESC"""
SETTLE_EVERY = 0.1  # seconds between readings while the statistics settle
SETTLE_READINGS = 3  # equal readings in a row that count as settled
SETTLE_LIMIT = 5.0  # seconds at most spent settling


@dataclass(frozen=True)
class ServerReading:
    """The server's WAL position, its WAL writes and flushes so far, and its CPU so far."""

    lsn: str
    wal_writes: int | None  # None where the server keeps no such counter
    wal_syncs: int | None
    cpu_seconds: float  # every server process's, exited backends included
    reader_cpu_seconds: float  # the reading connection's own backend's


def cpu_of(stat: str, *, with_children: bool = False) -> float:
    """User + system CPU seconds from a /proc/PID/stat line (and its reaped children's)."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu_total(server: EmbeddedPostgres) -> float:
    """The CPU seconds of every server process so far, backends that have exited included.

    The live children of the postmaster, plus the postmaster's own time and its
    reaped children's (a backend's time joins the postmaster's when it exits),
    so the difference of two readings misses nobody. 0.0 where there is no /proc.
    """
    postmaster = server.postmaster_pid
    if postmaster is None:
        return 0.0
    try:
        total = cpu_of(Path(f"/proc/{postmaster}/stat").read_text(), with_children=True)
    except OSError:
        return 0.0
    # A backend gone since the listing has its time in the postmaster's children's.
    for _, fields in children_of(postmaster):
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds of one process so far; 0.0 where it cannot be read."""
    try:
        return cpu_of(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return 0.0


async def read_server(server: EmbeddedPostgres, conn: Connection) -> ServerReading:
    """One reading, on `conn` (autocommit), whose backend's own CPU is read beside it."""
    lsn, reader = await one_row(conn, WAL_POSITION)
    try:
        writes, syncs = await one_row(conn, WAL_IO)
    except psycopg.errors.UndefinedColumn:
        writes, syncs = await one_row(conn, WAL_IO_BEFORE_18)
    return ServerReading(
        lsn=str(lsn),
        wal_writes=None if writes is None else int(writes),
        wal_syncs=None if syncs is None else int(syncs),
        cpu_seconds=server_cpu_total(server),
        reader_cpu_seconds=process_cpu(int(reader)),
    )


async def settled_reading(server: EmbeddedPostgres, conn: Connection) -> ServerReading:
    """A reading once the WAL counters stop moving: a backend reports its counts when it
    exits or about once a second, the WAL writer every wal_writer_delay."""
    deadline = time.monotonic() + SETTLE_LIMIT
    reading = await read_server(server, conn)
    same = 1
    while same < SETTLE_READINGS and time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_EVERY)
        latest = await read_server(server, conn)
        moved = (latest.wal_writes, latest.wal_syncs) != (reading.wal_writes, reading.wal_syncs)
        same = 1 if moved else same + 1
        reading = latest
    return reading


async def cost_between(
    conn: Connection, before: ServerReading, after: ServerReading, lsn_after: str | None = None
) -> dict[str, Any]:
    """What the server spent from `before` to `after`: WAL bytes (to `lsn_after` if given),
    WAL writes and syncs, and CPU seconds without the reading backend's."""
    end = lsn_after or after.lsn
    (wal_bytes,) = await one_row(conn, "SELECT pg_wal_lsn_diff(%s, %s)", end, before.lsn)
    return {
        "wal_bytes": int(wal_bytes),
        "wal_writes": difference(before.wal_writes, after.wal_writes),
        "wal_syncs": difference(before.wal_syncs, after.wal_syncs),
        "server_cpu_seconds": (after.cpu_seconds - before.cpu_seconds)
        - (after.reader_cpu_seconds - before.reader_cpu_seconds),
    }


def difference(before: int | None, after: int | None) -> int | None:
    """after - before, None where either reading lacks the counter."""
    return None if before is None or after is None else after - before


def per_unit(cost: dict[str, Any], units: int, unit: str) -> dict[str, Any]:
    """The cost of one `unit` (a step, a commit): bytes, writes, syncs, server CPU in µs."""

    def each(value: float | None) -> float | None:
        return None if value is None or units <= 0 else value / units

    cpu = each(cost["server_cpu_seconds"])
    return {
        unit + "s": units,
        f"wal_bytes_per_{unit}": each(cost["wal_bytes"]),
        f"wal_writes_per_{unit}": each(cost["wal_writes"]),
        f"wal_syncs_per_{unit}": each(cost["wal_syncs"]),
        f"server_cpu_us_per_{unit}": None if cpu is None else cpu * 1e6,
    }


def cost_lines(
    key: str, label: str, cost: dict[str, Any], unit: str
) -> list[tuple[str, str, float | None, str]]:
    """The report's lines (key, metric, value, unit) for the cost of one `unit` of work."""
    return [
        (f"{key}_wal_bytes_per_{unit}", f"{label}: WAL bytes/{unit}",
         cost[f"wal_bytes_per_{unit}"], f"B/{unit}"),
        (f"{key}_wal_syncs_per_{unit}", f"{label}: WAL flushes (fsyncs)/{unit}",
         cost[f"wal_syncs_per_{unit}"], f"syncs/{unit}"),
        (f"{key}_wal_writes_per_{unit}", f"{label}: WAL writes/{unit}",
         cost[f"wal_writes_per_{unit}"], f"writes/{unit}"),
        (f"{key}_server_cpu_us_per_{unit}", f"{label}: server CPU/{unit}",
         cost[f"server_cpu_us_per_{unit}"], f"µs/{unit}"),
    ]  # fmt: skip


def beside_cost(step: dict[str, Any], commit: dict[str, Any] | None, what: str) -> list[str]:
    """For each of cost_lines' lines of a step, the same figure of a commit of `what`, and
    the step's as a multiple of it ("" where there is none)."""
    found = []
    for figure, unit in (("wal_bytes", "B"), ("wal_syncs", "syncs"), ("wal_writes", "writes"),
                         ("server_cpu_us", "µs")):  # fmt: skip
        mine = step.get(f"{figure}_per_step")
        theirs = None if commit is None else commit.get(f"{figure}_per_commit")
        if mine is None or not theirs:
            found.append("")
            continue
        shown = f"{theirs:,.2f}" if unit in ("syncs", "writes") else f"{theirs:,.0f}"
        found.append(f"{what}: {shown} {unit}/commit (x{mine / theirs:.2f})")
    return found


async def install_wal_reader(conn: Connection) -> bool:
    """Create pg_walinspect in the connection's database; False where the server lacks it."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return False
    return True


async def wal_by_kind(
    conn: Connection, start: str, end: str, units: int, least_share: float = 0.01
) -> list[dict[str, Any]]:
    """The WAL from `start` to `end` by record kind ("Heap/UPDATE"), per unit of work,
    largest first; kinds under `least_share` of the bytes are summed as "other"."""
    rows = await (await conn.execute(WAL_BY_KIND, (start, end))).fetchall()
    total = sum(int(size) for _, _, size, _ in rows) or 1
    kinds: list[dict[str, Any]] = []
    other = {"kind": "other", "records": 0, "bytes": 0, "fpi_bytes": 0}
    for kind, records, size, fpi in rows:
        entry = {"kind": kind, "records": int(records), "bytes": int(size), "fpi_bytes": int(fpi)}
        if int(size) / total < least_share:
            for key in ("records", "bytes", "fpi_bytes"):
                other[key] += entry[key]
        else:
            kinds.append(entry)
    if other["records"]:
        kinds.append(other)
    for entry in kinds:
        entry["records_per_unit"] = entry["records"] / units if units else None
        entry["bytes_per_unit"] = entry["bytes"] / units if units else None
    return kinds


async def one_row(conn: Connection, query: str, *params: Any) -> tuple[Any, ...]:
    cursor = await conn.execute(query, params or None)
    row = await cursor.fetchone()
    assert row is not None, query
    return tuple(row)
