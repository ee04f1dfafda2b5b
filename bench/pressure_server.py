"""The pressure bench's server and database: set up for the bench, and described in its report.

The embedded server gets room for the idle connections, pg_stat_statements
(the claim's cost is read from it) and memory and WAL room as a team would give
a server of its own (SIZED: PostgreSQL's defaults of 128 MB of shared buffers
and 1 GB of WAL between checkpoints suit a laptop, and a backlog of millions
of runs outgrows them), with a restart when any is missing; the database is
made fresh with the probes' and the attempt log's tables.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import create_async_engine

from bench import pressure_faults as faults
from bench.pressure_app import Base
from infra.embedded import EmbeddedPostgres

DATABASE = "pressure"
SPARE_CONNECTIONS = 200  # max_connections beyond the idle ones: workers, producer, bench
STATEMENTS = "pg_stat_statements"  # the extension the claim's cost is read from
SIZED = {"shared_buffers": "2GB", "max_wal_size": "4GB"}  # of this machine's 24 GB


async def create_database(server: EmbeddedPostgres, url: str) -> None:
    """The bench's database, fresh, with the probes' and the attempt log's tables."""
    async with await faults.connect(server.conninfo_for("postgres")) as conn:
        await conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
    finally:
        await engine.dispose()
    async with await faults.connect(server.conninfo_for(DATABASE)) as conn:
        with contextlib.suppress(psycopg.Error):  # without it, the claim's cost is not read
            await conn.execute(f"CREATE EXTENSION IF NOT EXISTS {STATEMENTS}")


def setting(conn: psycopg.Connection[Any], name: str) -> str:
    """One server setting's value, as pg_settings shows it."""
    row = conn.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,)).fetchone()
    assert row is not None, name
    return str(row[0])


def prepare_server(server: EmbeddedPostgres, idle: int) -> int:
    """Room for the idle connections beside everything else, pg_stat_statements loaded (the
    claim's cost) and the SIZED settings; restarts the server if any needs it.
    max_connections then."""
    wanted = idle + SPARE_CONNECTIONS
    with psycopg.connect(server.conninfo_for("postgres"), autocommit=True) as conn:
        current = int(setting(conn, "max_connections"))
        preloaded = setting(conn, "shared_preload_libraries")
        restart = False
        if current < wanted:
            conn.execute(f"ALTER SYSTEM SET max_connections = {wanted}")
            current, restart = wanted, True
        for name, value in SIZED.items():
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            if row is None or row[0] != value:
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                restart = True
        if STATEMENTS not in preloaded:
            libraries = ", ".join(filter(None, [preloaded, STATEMENTS]))
            conn.execute(f"ALTER SYSTEM SET shared_preload_libraries = '{libraries}'")
            restart = True
    if restart:
        server.restart()
    return current


async def server_settings(conn: psycopg.AsyncConnection[Any]) -> dict[str, str]:
    """The server's version and the settings its commits and connections depend on."""
    cursor = await conn.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
        (
            [
                "server_version",
                "fsync",
                "synchronous_commit",
                "max_connections",
                "autovacuum",
                *SIZED,
            ],
        ),
    )
    return dict(await cursor.fetchall())


def load_average() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes); empty where there is no /proc."""
    with contextlib.suppress(OSError):
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return []
